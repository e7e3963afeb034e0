//! Filter, Score and Reserve for the members of one unit (a pod is a unit of one), and
//! Permit: the part of the cycle before PostFilter, in one sequence for every driver.
//!
//! For each member in order: the driver's Filter (and the preferences that narrow the
//! nodes) gives the nodes it may go to; a queue's per-model limits narrow them; a moved
//! pod's replacement is tried only on the node its move planned (its planned devices while
//! they have room, else the policy's choice there), and waits when that node cannot take it
//! yet (the pods there still leaving: its planned place is held for it and comes free as
//! they go; the driver drops the plan after a while, and then it goes anywhere); a member
//! nominated by a plan that evicted or moved pods for it (preemption, reclaim, make-room)
//! goes to its nominated node first when it has room there, the policy choosing its
//! devices on it (as kube-scheduler tries a nominated node first: the plan counted on that
//! node, and for a gang on every member taking its own), else anywhere; every other member
//! goes anywhere the mask allows; core's [`Placer`] scores and chooses; the driver's
//! Reserve takes the place on the state the next members are decided on. A member that
//! fits nowhere does not stop the others (the trial says how many
//! fit and why the last one that did not). [`permit`] then says whether the unit binds.

use gpuplace_model::Request;

use crate::fit::Unschedulable;
use crate::placer::{Decision, Placer};
use crate::state::ClusterState;

/// What Filter left for a member.
pub trait Feasible {
    /// The nodes it may go to; `None`: every node.
    fn mask(&self) -> Option<&[bool]>;
}

/// Filter's answer as a plain mask (`None`: every node), for drivers whose Filter has
/// nothing more to say.
#[derive(Clone, Copy, Debug)]
pub struct Nodes<'a>(pub Option<&'a [bool]>);

impl Feasible for Nodes<'_> {
    fn mask(&self) -> Option<&[bool]> {
        self.0
    }
}

/// A unit's members as one driver sees them: its Filter and Reserve around core's Score.
pub trait Members {
    /// What Filter leaves for a member (the driver explains a failure with it).
    type Filtered: Feasible;
    /// What the driver keeps for a member placed.
    type Placed;
    /// Why a member was not placed, in the driver's words.
    type Unfit;
    /// How many members the unit has.
    fn count(&self) -> usize;
    /// The state the members are decided on (with the members placed before reserved).
    fn state(&self) -> &ClusterState;
    /// Member `i`'s request; `Err` when its requests are wrong.
    fn request(&self, i: usize) -> Result<&Request, Self::Unfit>;
    /// Filter for member `i`; `Err` when it can go nowhere whatever happens.
    fn filter(&mut self, i: usize) -> Result<Self::Filtered, Self::Unfit>;
    /// The node a move planned for member `i` (it replaces a moved pod), if any.
    fn steer(&self, i: usize) -> Option<usize>;
    /// The place a move planned for member `i` (node and devices), if any.
    fn planned(&self, i: usize) -> Option<Decision>;
    /// The node a plan that evicted or moved pods for member `i` nominated it to, if any.
    fn nominated(&self, i: usize) -> Option<usize>;
    /// Reserve: member `i`'s place taken on the state; `Err` when it cannot be.
    fn reserve(&mut self, i: usize, chosen: Decision) -> Result<Self::Placed, Self::Unfit>;
    /// Why member `i` fits on none of the nodes Filter left.
    fn unfit(&self, i: usize, why: Unschedulable, filtered: &Self::Filtered) -> Self::Unfit;
    /// Why member `i`, a moved pod's replacement, waits: its planned node `node` cannot
    /// take it yet (`why`, on that node alone; Filter left `filtered`).
    fn awaits_planned(
        &self,
        i: usize,
        node: usize,
        why: Unschedulable,
        filtered: &Self::Filtered,
    ) -> Self::Unfit;
}

/// One trial of a unit's members.
#[derive(Debug)]
pub struct Trial<P, U> {
    /// The members placed, by position, in order.
    pub placed: Vec<(usize, P)>,
    /// Why the last member that was not placed was not.
    pub failure: Option<U>,
}

impl<P, U> Trial<P, U> {
    /// A trial that placed nothing and says why.
    pub fn failed(failure: Option<U>) -> Self {
        Trial {
            placed: Vec::new(),
            failure,
        }
    }
}

/// `mask` (`None`: every one of `nodes` nodes) narrowed to node `n`.
pub fn steer_mask(mask: Option<&[bool]>, n: usize, nodes: usize) -> Vec<bool> {
    let mut only = mask.map_or_else(|| vec![true; nodes], <[bool]>::to_vec);
    only.iter_mut().enumerate().for_each(|(i, a)| *a &= i == n);
    only
}

/// Filter, Score and Reserve for every member of `members` in order, within `narrow` (the
/// nodes whose models the unit's queue may still take; `None`: every node).
pub fn trial<M: Members>(
    members: &mut M,
    placer: &mut Placer,
    narrow: Option<&[bool]>,
) -> Trial<M::Placed, M::Unfit> {
    let mut out = Trial::failed(None);
    for i in 0..members.count() {
        match place(members, placer, narrow, i) {
            Ok(placed) => out.placed.push((i, placed)),
            Err(why) => out.failure = Some(why),
        }
    }
    out
}

/// One member: Filter, the limits' narrowing, Score (on its planned node first), Reserve.
fn place<M: Members>(
    members: &mut M,
    placer: &mut Placer,
    narrow: Option<&[bool]>,
    i: usize,
) -> Result<M::Placed, M::Unfit> {
    let filtered = members.filter(i)?;
    let narrowed: Option<Vec<bool>> = narrow.map(|narrow| {
        let mut m = filtered
            .mask()
            .map_or_else(|| vec![true; narrow.len()], <[bool]>::to_vec);
        m.iter_mut().zip(narrow).for_each(|(a, n)| *a &= *n);
        m
    });
    let mask = narrowed.as_deref().or(filtered.mask());
    // A planned node that Filter or the limits refuse is no place to wait for.
    let steer = members
        .steer(i)
        .filter(|&n| mask.is_none_or(|m| m.get(n) == Some(&true)));
    let on_steer = match steer {
        Some(n) => {
            let only = steer_mask(mask, n, members.state().len());
            let request = members.request(i)?;
            let state = members.state();
            // The plan's own devices while they have room (nothing to score: the move
            // counted on them); else the policy's choice on the planned node; else it
            // waits for its planned place, not placed elsewhere meanwhile.
            match members.planned(i).filter(|d| {
                only.get(d.node).copied().unwrap_or(false)
                    && state.can_apply(d.node, request, &d.gpus)
            }) {
                Some(d) => Some(d),
                None => match placer.choose(state, request, Some(&only)) {
                    Ok(d) => Some(d),
                    Err(why) => return Err(members.awaits_planned(i, n, why, &filtered)),
                },
            }
        }
        None => None,
    };
    let chosen = match on_steer {
        Some(d) => d,
        None => {
            let request = members.request(i)?;
            let state = members.state();
            // Its nominated node while it has room there (the policy's devices on it, as
            // kube-scheduler tries a nominated node first), else the policy's choice
            // anywhere.
            let on_nominated = members
                .nominated(i)
                .filter(|&n| mask.is_none_or(|m| m.get(n) == Some(&true)))
                .and_then(|n| {
                    let only = steer_mask(mask, n, state.len());
                    placer.choose(state, request, Some(&only)).ok()
                });
            match on_nominated {
                Some(d) => d,
                None => match placer.choose(state, request, mask) {
                    Ok(d) => d,
                    Err(why) => return Err(members.unfit(i, why, &filtered)),
                },
            }
        }
    };
    members.reserve(i, chosen)
}

/// How many of a unit's members count toward its minimum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quorum {
    /// Members already bound or reserved.
    pub bound: u32,
    /// Members waiting (tried in this cycle).
    pub waiting: u32,
    /// The unit's minimum (a pod: 1; a gang: its `minMember`).
    pub min_member: u32,
}

impl Quorum {
    /// A single pod.
    pub const ONE: Quorum = Quorum {
        bound: 0,
        waiting: 1,
        min_member: 1,
    };

    /// Whether `placed` members more reach the minimum.
    pub fn reached_with(&self, placed: usize) -> bool {
        self.bound + placed as u32 >= self.min_member
    }
}

/// Permit's answer for a unit after its trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permit {
    /// Enough members placed: they bind (all at once for a gang).
    Allow,
    /// Too few members exist to reach the minimum: nothing binds and nothing is evicted
    /// for it; it waits for its members.
    MembersMissing,
    /// The members are there but too few fit: PostFilter may make room.
    Unfit,
}

/// Permit for a unit whose trial placed `placed` members.
pub fn permit(quorum: Quorum, placed: usize) -> Permit {
    if quorum.reached_with(placed) {
        // With nothing placed this binds nothing: the minimum stands on bound members.
        Permit::Allow
    } else if quorum.bound + quorum.waiting < quorum.min_member {
        Permit::MembersMissing
    } else {
        Permit::Unfit
    }
}

/// Among one trial per domain (with the fragmentation each leaves), the one to keep: among
/// those reaching the minimum, the one leaving the least fragmentation (the first of
/// equals); else the one placing the most members (the first of equals), with why members
/// did not fit in the first such trial that placed the most.
pub fn keep_best<P, U: Clone>(
    trials: impl IntoIterator<Item = (Trial<P, U>, f64)>,
    quorum: Quorum,
) -> (Option<Trial<P, U>>, Option<U>) {
    let mut best: Option<(Trial<P, U>, f64)> = None;
    let mut failure: Option<U> = None;
    for (trial, frag) in trials {
        let enough = quorum.reached_with(trial.placed.len());
        if !enough {
            let most = best.as_ref().map_or(0, |(b, _)| b.placed.len());
            if failure.is_none() || trial.placed.len() > most {
                failure = trial.failure.clone();
            }
            if best.as_ref().is_none_or(|(b, _)| {
                !quorum.reached_with(b.placed.len()) && trial.placed.len() > b.placed.len()
            }) {
                best = Some((trial, frag));
            }
            continue;
        }
        let better = match &best {
            Some((b, f)) if quorum.reached_with(b.placed.len()) => frag < *f,
            _ => true,
        };
        if better {
            best = Some((trial, frag));
        }
    }
    (best.map(|(t, _)| t), failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use gpuplace_model::NodeInventory;

    fn gpus(count: u32) -> Request {
        Request {
            cpu_milli: 100,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: 1000,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    struct Mask(Option<Vec<bool>>);

    impl Feasible for Mask {
        fn mask(&self) -> Option<&[bool]> {
            self.0.as_deref()
        }
    }

    /// Members on a live state: a mask per member, steers, and what was asked.
    struct Live {
        state: ClusterState,
        requests: Vec<Request>,
        masks: Vec<Option<Vec<bool>>>,
        steers: Vec<Option<usize>>,
        nominated: Vec<Option<usize>>,
    }

    impl Members for Live {
        type Filtered = Mask;
        type Placed = Decision;
        type Unfit = String;
        fn count(&self) -> usize {
            self.requests.len()
        }
        fn state(&self) -> &ClusterState {
            &self.state
        }
        fn request(&self, i: usize) -> Result<&Request, String> {
            Ok(&self.requests[i])
        }
        fn filter(&mut self, i: usize) -> Result<Mask, String> {
            Ok(Mask(self.masks[i].clone()))
        }
        fn steer(&self, i: usize) -> Option<usize> {
            self.steers[i]
        }
        fn planned(&self, _: usize) -> Option<Decision> {
            None
        }
        fn nominated(&self, i: usize) -> Option<usize> {
            self.nominated[i]
        }
        fn reserve(&mut self, i: usize, chosen: Decision) -> Result<Decision, String> {
            self.state
                .apply(chosen.node, &self.requests[i], &chosen.gpus)
                .map_err(|e| e.to_string())?;
            Ok(chosen)
        }
        fn unfit(&self, i: usize, why: Unschedulable, _: &Mask) -> String {
            format!("member {i}: {why}")
        }
        fn awaits_planned(&self, i: usize, node: usize, why: Unschedulable, _: &Mask) -> String {
            format!("member {i} awaits node {node}: {why}")
        }
    }

    fn live(nodes: usize, requests: Vec<Request>) -> Live {
        let inv = (0..nodes)
            .map(|n| NodeInventory::uniform(&format!("n{n}"), 64_000, 1024, 8, "A100"))
            .collect();
        let k = requests.len();
        Live {
            state: ClusterState::new(inv).unwrap(),
            requests,
            masks: vec![None; k],
            steers: vec![None; k],
            nominated: vec![None; k],
        }
    }

    #[test]
    fn members_are_reserved_in_order_and_one_that_fits_nowhere_does_not_stop_the_rest() {
        let mut m = live(1, vec![gpus(6), gpus(4), gpus(2)]);
        let t = trial(&mut m, &mut Placer::new(Policy::BestFit, 1), None);
        let placed: Vec<usize> = t.placed.iter().map(|(i, _)| *i).collect();
        assert_eq!(placed, vec![0, 2]);
        assert!(t.failure.unwrap().starts_with("member 1"));
        assert_eq!(m.state.gpu_allocated_milli(), 8000);
    }

    #[test]
    fn filter_limits_and_steers_choose_the_node() {
        let mut m = live(3, vec![gpus(1), gpus(1), gpus(1)]);
        // Filter leaves nodes 1 and 2; the limits leave 0 and 2: node 2 only.
        m.masks[0] = Some(vec![false, true, true]);
        // A steer to node 1 wins over the score; one to a node the limits refuse does not.
        m.steers[1] = Some(1);
        m.steers[2] = Some(1);
        m.masks[2] = Some(vec![true, true, true]);
        let narrow = [true, false, true];
        let mut placer = Placer::new(Policy::BestFit, 1);
        let t = trial(&mut m, &mut placer, Some(&narrow));
        assert_eq!(t.placed[0].1.node, 2);
        assert_ne!(t.placed[1].1.node, 1);
        let t = trial(&mut m, &mut placer, None);
        assert_eq!(t.placed[1].1.node, 1);
        assert_eq!(steer_mask(None, 1, 3), vec![false, true, false]);
    }

    #[test]
    fn a_replacement_waits_for_its_planned_node_rather_than_going_elsewhere() {
        let mut m = live(2, vec![gpus(2)]);
        // Node 0, its planned node, has one GPU free until the pods there leave.
        m.state
            .apply(0, &gpus(7), &(0..7).map(|g| (g, 1000)).collect::<Vec<_>>())
            .unwrap();
        m.steers[0] = Some(0);
        let mut placer = Placer::new(Policy::BestFit, 1);
        let t = trial(&mut m, &mut placer, None);
        assert!(t.placed.is_empty(), "not placed on node 1 meanwhile");
        let failure = t.failure.unwrap();
        assert!(failure.starts_with("member 0 awaits node 0"), "{failure}");
        // Once they are gone it goes there.
        m.state
            .release(0, &gpus(7), &(0..7).map(|g| (g, 1000)).collect::<Vec<_>>())
            .unwrap();
        let t = trial(&mut m, &mut placer, None);
        assert_eq!(t.placed[0].1.node, 0);
    }

    #[test]
    fn nominated_members_go_to_their_nominated_nodes_first_and_else_anywhere() {
        // Node 0 has GPUs 6 and 7 free, node 1 GPU 7. Worst-fit alone puts the one-GPU
        // member on node 0 and the two-GPU member then fits nowhere; the plan that
        // nominated them counted on each taking its own place.
        let mut m = live(2, vec![gpus(1), gpus(2)]);
        let taken = |n: usize| (0..n).map(|g| (g, 1000)).collect::<Vec<_>>();
        m.state.apply(0, &gpus(6), &taken(6)).unwrap();
        m.state.apply(1, &gpus(7), &taken(7)).unwrap();
        let mut placer = Placer::new(Policy::WorstFit, 1);
        let before = m.state.clone();
        let t = trial(&mut m, &mut placer, None);
        assert_eq!(t.placed.len(), 1, "without nominations one member fits");
        m.state = before.clone();
        m.nominated = vec![Some(1), Some(0)];
        let t = trial(&mut m, &mut placer, None);
        let got: Vec<(usize, Vec<(usize, u32)>)> = (t.placed.iter())
            .map(|(_, d)| (d.node, d.gpus.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(1, vec![(7, 1000)]), (0, vec![(6, 1000), (7, 1000)])]
        );
        // A nominated node without room, or outside the mask, is no place: the policy
        // chooses anywhere.
        m.state = before.clone();
        m.state.apply(1, &gpus(1), &[(7, 1000)]).unwrap();
        m.nominated = vec![Some(1), None];
        let t = trial(&mut m, &mut placer, None);
        assert_eq!(t.placed[0].1.node, 0, "worst-fit's choice");
        m.state = before;
        m.nominated = vec![Some(1), None];
        m.masks[0] = Some(vec![true, false]);
        let t = trial(&mut m, &mut placer, None);
        assert_eq!(t.placed[0].1.node, 0, "node 1 is outside its mask");
    }

    #[test]
    fn permit_allows_a_reached_minimum_and_tells_missing_members_from_too_few_fitting() {
        assert_eq!(permit(Quorum::ONE, 1), Permit::Allow);
        assert_eq!(permit(Quorum::ONE, 0), Permit::Unfit);
        let gang = Quorum {
            bound: 1,
            waiting: 2,
            min_member: 4,
        };
        assert_eq!(permit(gang, 2), Permit::MembersMissing);
        let gang = Quorum {
            bound: 1,
            waiting: 3,
            min_member: 4,
        };
        assert_eq!(permit(gang, 2), Permit::Unfit);
        assert_eq!(permit(gang, 3), Permit::Allow);
        let done = Quorum {
            bound: 4,
            waiting: 1,
            min_member: 4,
        };
        assert_eq!(permit(done, 0), Permit::Allow);
    }

    #[test]
    fn the_best_trial_reaches_the_minimum_with_least_fragmentation_else_places_most() {
        let q = Quorum {
            bound: 0,
            waiting: 2,
            min_member: 2,
        };
        let t = |n: usize, why: &str| Trial::<usize, String> {
            placed: (0..n).map(|i| (i, i)).collect(),
            failure: (!why.is_empty()).then(|| why.to_string()),
        };
        let (best, failure) = keep_best([(t(1, "a"), 0.0), (t(2, ""), 5.0), (t(2, ""), 3.0)], q);
        assert_eq!(best.unwrap().placed.len(), 2);
        assert_eq!(failure.as_deref(), Some("a"));
        let (best, failure) = keep_best([(t(0, "a"), 0.0), (t(1, "b"), 0.0), (t(1, "c"), 0.0)], q);
        let best = best.unwrap();
        assert_eq!((best.placed.len(), best.failure.as_deref()), (1, Some("b")));
        assert_eq!(failure.as_deref(), Some("b"));
        let (best, failure) = keep_best(Vec::<(Trial<usize, String>, f64)>::new(), q);
        assert!(best.is_none() && failure.is_none());
    }
}
