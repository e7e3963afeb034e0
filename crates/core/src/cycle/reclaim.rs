//! Reclaim's plan: the victim search's plans (preemption's, for a pod or a whole gang)
//! checked against every queue's guarantee. A plan that would take some queue below its
//! guarantee is searched again without that queue's pods on the nodes it took them from,
//! up to [`MAX_PLANS`] times. With usage over time, the queue that has used most against
//! its fair share ([`prefer_most_used`]) is asked first: a plan that takes only its pods is
//! searched before one that may take anyone's. The scheduler and the simulator both plan
//! reclaim here.

use crate::ClusterState;
use crate::fairshare::{Entitlement, Loss, Picker, Res};
use crate::preempt::Candidates;

/// Plans tried before giving up (each drops one queue's pods on the nodes it lost them).
pub const MAX_PLANS: usize = 32;

/// What evicting each of the victim search's units takes, read when a plan asks: its
/// queue (`unit_queue`, a gang's from its first member), the nodes its pods are on and
/// what they hold (GPUs by their model). Read on demand, not made for every unit: a
/// reclaim searches thousands of units and checks a few plans (making a queue's
/// resources for each was 15% of a share-heavy replay with queues).
#[derive(Clone, Copy, Debug)]
pub struct Takes<'c, 'a> {
    state: &'c ClusterState,
    candidates: &'c Candidates<'a>,
    unit_queue: &'c [usize],
}

impl<'c, 'a> Takes<'c, 'a> {
    pub fn new(
        state: &'c ClusterState,
        candidates: &'c Candidates<'a>,
        unit_queue: &'c [usize],
    ) -> Takes<'c, 'a> {
        Takes {
            state,
            candidates,
            unit_queue,
        }
    }

    /// How many units (those with a queue).
    pub fn len(&self) -> usize {
        self.candidates.units.len().min(self.unit_queue.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unit `u`'s queue.
    pub fn queue(&self, u: usize) -> usize {
        self.unit_queue[u]
    }

    /// What evicting unit `u` takes from its queue.
    pub fn res(&self, u: usize) -> Res {
        let mut res = Res::default();
        for h in self.candidates.members(u) {
            res.add(&held(self.state, h));
        }
        res
    }

    /// The nodes unit `u`'s pods are on (repeats possible).
    pub fn nodes(&self, u: usize) -> impl Iterator<Item = usize> + 'c {
        self.candidates.members(u).iter().map(|h| h.node)
    }
}

/// What a victim holds, as its queue counts it (GPUs by its node's model).
fn held(state: &ClusterState, h: &crate::preempt::Holder<'_>) -> Res {
    Res::of(h.request, Some(state.inventory(h.node).gpu_model()))
}

/// What evicting each pod of `units` takes from its unit's queue (`unit_queue`), pod by
/// pod, units in the order given and each unit's members in order: a driver takes off
/// its queues only what the pods it evicted held (a refused eviction leaves its pod
/// counted). Their sum over whole units is [`losses`]'.
pub fn victim_losses(
    state: &ClusterState,
    candidates: &Candidates<'_>,
    unit_queue: &[usize],
    units: &[usize],
) -> Vec<Loss> {
    units
        .iter()
        .flat_map(|&u| {
            candidates.members(u).iter().map(move |h| Loss {
                queue: unit_queue[u],
                res: held(state, h),
            })
        })
        .collect()
}

/// A plan that keeps every queue at its guarantee (what it takes from each victim:
/// [`victim_losses`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WithinGuarantees<P> {
    pub plan: P,
}

/// What evicting `units` (of `takes`) takes from each queue.
pub fn losses(takes: &Takes<'_, '_>, units: &[usize]) -> Vec<Loss> {
    let mut losses: Vec<Loss> = Vec::new();
    for &u in units {
        let (queue, res) = (takes.queue(u), takes.res(u));
        match losses.iter_mut().find(|l| l.queue == queue) {
            Some(l) => l.res.add(&res),
            None => losses.push(Loss { queue, res }),
        }
    }
    losses
}

/// Marks queue `v`'s units on the nodes the plan's `units` took its pods from.
fn exclude(takes: &Takes<'_, '_>, units: &[usize], v: usize, excluded: &mut [bool]) {
    let nodes: Vec<usize> = units
        .iter()
        .filter(|&&u| takes.queue(u) == v)
        .flat_map(|&u| takes.nodes(u))
        .collect();
    for u in 0..takes.len().min(excluded.len()) {
        if takes.queue(u) == v && takes.nodes(u).any(|n| nodes.contains(&n)) {
            excluded[u] = true;
        }
    }
}

/// The queue among `takes`' units whose standing with usage over time is furthest past its
/// fair share (`None` without usage over time, or with victims of one queue only).
pub fn prefer_most_used<U>(takes: &Takes<'_, '_>, picker: &Picker<'_, U>) -> Option<usize> {
    if !picker.uses_usage() {
        return None;
    }
    let mut queues: Vec<usize> = (0..takes.len()).map(|u| takes.queue(u)).collect();
    queues.sort_unstable();
    queues.dedup();
    if queues.len() < 2 {
        return None;
    }
    queues.into_iter().max_by(|&a, &b| {
        picker
            .over_share(a)
            .total_cmp(&picker.over_share(b))
            .then(b.cmp(&a))
    })
}

/// The first plan `search` finds (given the units excluded so far) whose losses keep every
/// queue at its guarantee as `entitled` says; `takes` describes the search's units and
/// `units_of` gives a plan's evicted units. With `prefer`, a plan that takes only that
/// queue's units is searched first.
pub fn plan_within_guarantees<P>(
    takes: &Takes<'_, '_>,
    entitled: &Entitlement<'_>,
    prefer: Option<usize>,
    mut search: impl FnMut(&[bool]) -> Option<P>,
    units_of: impl Fn(&P) -> &[usize],
) -> Option<WithinGuarantees<P>> {
    if let Some(q) = prefer {
        let others: Vec<bool> = (0..takes.len()).map(|u| takes.queue(u) != q).collect();
        if let Some(found) = plan_from(takes, entitled, others, &mut search, &units_of) {
            return Some(found);
        }
    }
    plan_from(
        takes,
        entitled,
        vec![false; takes.len()],
        &mut search,
        &units_of,
    )
}

fn plan_from<P>(
    takes: &Takes<'_, '_>,
    entitled: &Entitlement<'_>,
    mut excluded: Vec<bool>,
    search: &mut impl FnMut(&[bool]) -> Option<P>,
    units_of: &impl Fn(&P) -> &[usize],
) -> Option<WithinGuarantees<P>> {
    for _ in 0..MAX_PLANS {
        let plan = search(&excluded)?;
        let losses = losses(takes, units_of(&plan));
        match entitled.check(&losses) {
            Ok(()) => return Some(WithinGuarantees { plan }),
            Err(v) => exclude(takes, units_of(&plan), v, &mut excluded),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairshare::{QueueSpec, QueueTree, fair_shares};
    use crate::preempt::Holder;
    use gpuplace_model::{NodeInventory, Request};

    fn gpus(n: u64) -> Res {
        Res {
            dims: [n * 1000, 0, 0],
            models: Vec::new(),
        }
    }

    #[test]
    fn with_usage_the_queue_that_used_most_is_asked_first() {
        let mut taker = QueueSpec::open("taker");
        taker.guaranteed.dims[0] = Some(4000);
        let tree = QueueTree::build(vec![
            taker,
            QueueSpec::open("heavy"),
            QueueSpec::open("light"),
        ]);
        let (t, heavy, light) = (
            tree.index("taker").unwrap(),
            tree.index("heavy").unwrap(),
            tree.index("light").unwrap(),
        );
        let mut held = vec![Res::default(); tree.len()];
        held[heavy] = gpus(4);
        held[light] = gpus(4);
        let mut demand = held.clone();
        demand[t] = gpus(4);
        let fair = fair_shares(&tree, &[8000, 0, 0], &demand);
        // Both hold 4 now; heavy held 8 on average lately, light 2.
        let mut means = vec![Some([0.0; 3]); tree.len()];
        means[heavy] = Some([8000.0, 0.0, 0.0]);
        means[light] = Some([2000.0, 0.0, 0.0]);
        let picker: Picker<'_, ()> = Picker::new(&tree, &held, fair.clone()).with_usage(&means);
        // One pod of one GPU each, light's unit first, both on node 0.
        let state = ClusterState::new(vec![NodeInventory::uniform(
            "n", 32_000, 256_000, 8, "A100",
        )])
        .unwrap();
        let one = Request {
            gpu_count: 1,
            gpu_milli: 1000,
            ..Default::default()
        };
        let (first, second) = ([(0, 1000)], [(1, 1000)]);
        let mut candidates = Candidates::default();
        for gpus in [&first[..], &second[..]] {
            candidates.push_unit(
                0,
                0,
                [Holder {
                    node: 0,
                    request: &one,
                    gpus,
                    budgets: Vec::new(),
                }],
            );
        }
        let unit_queue = [light, heavy];
        let taken = Takes::new(&state, &candidates, &unit_queue);
        assert_eq!(taken.res(1).dims[0], 1000);
        assert_eq!(taken.nodes(0).collect::<Vec<_>>(), vec![0]);
        assert_eq!(prefer_most_used(&taken, &picker), Some(heavy));
        let entitled = Entitlement::new(&tree, picker.allocations(), t, &gpus(1)).unwrap();
        // A search that takes the first unit not excluded: light's is first in the list.
        let search = |excluded: &[bool]| excluded.iter().position(|e| !e).map(|u| vec![u]);
        let found = plan_within_guarantees(&taken, &entitled, Some(heavy), search, |p| p).unwrap();
        assert_eq!(found.plan, vec![1], "heavy's unit");
        let found = plan_within_guarantees(&taken, &entitled, None, search, |p| p).unwrap();
        assert_eq!(found.plan, vec![0], "without usage: the search's own order");
        // Without usage over time nothing is preferred.
        let plain: Picker<'_, ()> = Picker::new(&tree, &held, fair);
        assert_eq!(prefer_most_used(&taken, &plain), None);
    }
}
