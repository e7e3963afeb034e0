//! Evicted pods in the timeline replay keep their place until they are gone: the kubelet
//! stops them within their grace period, and only the Pod's deletion tells the scheduler
//! that their devices are free (its cache holds a terminating pod's devices). A plan that
//! evicts takes what it planned on the victims' places at once (a nominee's places, a moved
//! pod's replacement's, as the scheduler holds them); what no plan took of a victim's place
//! stays taken until its grace period is over and a later round sees it free, never in the
//! round that evicted it. A leaving pod promised to no waiting nominee (its nominee started
//! elsewhere, or rebalancing moved it) is room that frees itself for any later search, as
//! the scheduler's preemption counts a terminating pod (core's `Candidates::freeing`).

use std::cmp::Reverse;

use gpuplace_core::ClusterState;
use gpuplace_core::preempt::Amounts;
use gpuplace_model::Request;

use crate::timeline::options::Ms;

/// What is left of an evicted pod's place once its plan took its part: its node's CPU and
/// memory and each GPU's milli that are still its until it is gone.
#[derive(Clone, Debug, Default)]
pub(super) struct Remains {
    pub(super) node: usize,
    pub(super) request: Request,
    pub(super) gpus: Vec<(usize, u32)>,
}

impl Remains {
    pub(super) fn new(node: usize, request: Request, gpus: Vec<(usize, u32)>) -> Remains {
        Remains {
            node,
            request,
            gpus,
        }
    }

    /// Whether nothing is held.
    pub(super) fn is_empty(&self) -> bool {
        self.request.cpu_milli == 0 && self.request.memory_mib == 0 && self.gpus.is_empty()
    }

    /// GPU milli, CPU milli and memory MiB held.
    pub(super) fn amounts(&self) -> Amounts {
        [
            self.gpus.iter().map(|&(_, m)| u64::from(m)).sum(),
            self.request.cpu_milli,
            self.request.memory_mib,
        ]
    }
}

/// A nominee's place owed to pods leaving: the part, until when, and the job a search
/// counts it of once the nominee no longer waits (none: never offered).
#[derive(Clone, Debug)]
pub(super) struct Owed {
    pub(super) part: Remains,
    pub(super) until: Ms,
    pub(super) owner: Option<u32>,
}

/// Whose a leaving place is, for the victim search: the evicted job (its priority and
/// queue say which searches may count on it), and the nominee whose plan evicted it, if
/// that nominee still waits (the scheduler offers a terminating pod promised to no
/// nominee to any search as room that frees itself, and one promised to none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) job: u32,
    pub(super) promised: Option<u32>,
}

impl Owner {
    /// Whether a search may count on the place as freeing itself.
    pub(super) fn offered(&self) -> bool {
        self.promised.is_none()
    }
}

/// One held place: what is left, until when, whose.
#[derive(Debug, Default)]
struct Slot {
    remains: Remains,
    at: Ms,
    owner: Option<Owner>,
}

/// Evicted pods on their way out.
#[derive(Debug, Default)]
pub(super) struct Leaving {
    /// Evicted by the plan being carried out; their remains are taken once it is.
    evicted: Vec<u32>,
    /// Places still held by gone-soon pods, by when they are gone (index into `slots`).
    gone: std::collections::BinaryHeap<Reverse<(Ms, u32)>>,
    slots: Vec<Slot>,
    /// Slots given back (reused, so a long replay's slots stay as many as the pods
    /// leaving at once).
    free: Vec<u32>,
    /// Nominees whose promises end at a time (started where nominated: once their
    /// Binding is seen).
    promise_ends: Vec<(Ms, u32)>,
}

impl Leaving {
    /// When the next evicted pod is gone, or the next promise ends (an event: what a
    /// search may count on changes then).
    pub(super) fn next(&self) -> Option<Ms> {
        let ends = self.promise_ends.iter().map(|(at, _)| *at).min();
        self.gone
            .peek()
            .map(|g| g.0.0)
            .into_iter()
            .chain(ends)
            .min()
    }

    /// `job` was evicted by the plan being carried out (its place was given back for the
    /// plan to take its part).
    pub(super) fn evicted(&mut self, job: u32) {
        self.evicted.push(job);
    }

    /// The jobs the plan being carried out evicted so far.
    pub(super) fn evicting(&self) -> &[u32] {
        &self.evicted
    }

    /// The jobs the plan just carried out evicted.
    pub(super) fn take_evicted(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.evicted)
    }

    /// What the plan did not take of an evicted pod's place (`node`, `request`, `gpus`)
    /// stays its until `at`: taken in `state` now. Its slot.
    pub(super) fn hold(
        &mut self,
        state: &mut ClusterState,
        place: &Remains,
        at: Ms,
        owner: Option<Owner>,
    ) -> u32 {
        let remains = take_free(state, place);
        self.hold_taken(remains, at, owner)
    }

    /// `remains`, already taken in the state, stay taken until `at`. Its slot.
    pub(super) fn hold_taken(&mut self, remains: Remains, at: Ms, owner: Option<Owner>) -> u32 {
        let slot = Slot { remains, at, owner };
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() as u32 - 1
            }
        };
        self.gone.push(Reverse((at, index)));
        index
    }

    /// Evicted pods whose grace period is over by `now` are gone: their remains come back
    /// to `state`; what each held and whose it was.
    pub(super) fn gone_due(
        &mut self,
        state: &mut ClusterState,
        now: Ms,
    ) -> Vec<(Remains, Option<Owner>)> {
        let mut out = Vec::new();
        while let Some(&Reverse((at, index))) = self.gone.peek()
            && at <= now
        {
            self.gone.pop();
            let slot = std::mem::take(&mut self.slots[index as usize]);
            self.free.push(index);
            let r = slot.remains;
            let given = state.release(r.node, &r.request, &r.gpus);
            debug_assert!(given.is_ok(), "an evicted pod's remains: {given:?}");
            out.push((r, slot.owner));
        }
        out
    }

    /// The places a search may count on as freeing themselves (slot, remains, owner job).
    pub(super) fn offered(&self) -> impl Iterator<Item = (u32, &Remains, u32)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let owner = s.owner.filter(Owner::offered)?;
            Some((i as u32, &s.remains, owner.job))
        })
    }

    /// Slot `slot`'s remains, when it goes and its owner.
    pub(super) fn slot(&self, slot: u32) -> Option<(&Remains, Ms, Option<Owner>)> {
        let s = self.slots.get(slot as usize)?;
        Some((&s.remains, s.at, s.owner))
    }

    /// The nomination of `unit` ended: the places promised to it are offered from now on;
    /// their slots.
    pub(super) fn release_promises(&mut self, unit: u32) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(owner) = &mut s.owner
                && owner.promised == Some(unit)
            {
                owner.promised = None;
                out.push(i as u32);
            }
        }
        out
    }

    /// Slot `slot`'s place is promised to nominee `unit` from now on.
    pub(super) fn promise(&mut self, slot: u32, unit: u32) {
        if let Some(owner) = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.owner.as_mut())
        {
            owner.promised = Some(unit);
        }
    }

    /// The promises to `unit` end at `at`.
    pub(super) fn end_promise_at(&mut self, unit: u32, at: Ms) {
        self.promise_ends.push((at, unit));
    }

    /// The nominees whose promises end by `now` (taken).
    pub(super) fn promises_due(&mut self, now: Ms) -> Vec<u32> {
        if self.promise_ends.is_empty() {
            return Vec::new();
        }
        let mut due = Vec::new();
        self.promise_ends.retain(|&(at, unit)| {
            let ends = at <= now;
            if ends {
                due.push(unit);
            }
            !ends
        });
        due
    }

    /// Gives slot `slot`'s remains back to `state` for a plan to take its part of them
    /// ([`Self::keep`] takes what the plan left).
    pub(super) fn lend(&mut self, state: &mut ClusterState, slot: u32) {
        if let Some(s) = self.slots.get(slot as usize) {
            let r = &s.remains;
            let given = state.release(r.node, &r.request, &r.gpus);
            debug_assert!(given.is_ok(), "a leaving place lent: {given:?}");
        }
    }

    /// What a plan left of slot `slot`'s remains (lent) stays the leaving pod's: taken in
    /// `state` again, as far as it is free.
    pub(super) fn keep(&mut self, state: &mut ClusterState, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.remains = take_free(state, &s.remains);
        }
    }
}

/// Takes in `state` what is free of `place` (its CPU, memory and each GPU's milli, as
/// far as they go): what was taken.
fn take_free(state: &mut ClusterState, place: &Remains) -> Remains {
    let free = state.node(place.node);
    let remains = Remains {
        node: place.node,
        request: Request {
            cpu_milli: place.request.cpu_milli.min(free.cpu_free),
            memory_mib: place.request.memory_mib.min(free.memory_free),
            ..Request::default()
        },
        gpus: place
            .gpus
            .iter()
            .map(|&(g, milli)| (g, milli.min(free.gpu_free[g])))
            .filter(|&(_, milli)| milli > 0)
            .collect(),
    };
    let taken = state.apply(place.node, &remains.request, &remains.gpus);
    // Only what is free is taken: cannot fail.
    debug_assert!(taken.is_ok(), "a leaving pod's remains: {taken:?}");
    remains
}

#[cfg(test)]
mod tests {
    use gpuplace_model::NodeInventory;

    use super::*;

    fn state() -> ClusterState {
        ClusterState::new(vec![NodeInventory::uniform("n", 8_000, 8_192, 2, "T4")]).expect("state")
    }

    /// A pod's place on node 0: 1,000 CPU milli, 1,024 MiB and `gpus`.
    fn place(gpus: Vec<(usize, u32)>) -> Remains {
        let request = Request {
            cpu_milli: 1_000,
            memory_mib: 1_024,
            ..Request::default()
        };
        Remains::new(0, request, gpus)
    }

    #[test]
    fn only_places_promised_to_no_waiting_nominee_are_offered() {
        let mut state = state();
        let mut leaving = Leaving::default();
        let owner = |job, promised| Some(Owner { job, promised });
        let a = leaving.hold(
            &mut state,
            &place(vec![(0, 1000)]),
            Ms(30),
            owner(7, Some(3)),
        );
        let b = leaving.hold(&mut state, &place(vec![(1, 500)]), Ms(40), owner(8, None));
        leaving.hold(&mut state, &place(vec![(1, 200)]), Ms(50), None);
        let offered = |l: &Leaving| l.offered().map(|(s, _, job)| (s, job)).collect::<Vec<_>>();
        assert_eq!(offered(&leaving), vec![(b, 8)]);
        // Nominee 3 started elsewhere: its victim's place is offered from now on.
        assert_eq!(leaving.release_promises(3), vec![a]);
        assert_eq!(offered(&leaving), vec![(a, 7), (b, 8)]);
        // A plan counted on b: promised to its nominee 4.
        leaving.promise(b, 4);
        assert_eq!(offered(&leaving), vec![(a, 7)]);
        // Gone by 40 s: a and b come back to the state, whose they were said.
        let gone = leaving.gone_due(&mut state, Ms(40));
        let owners: Vec<_> = gone.iter().map(|(_, o)| o.map(|o| o.job)).collect();
        assert_eq!(owners, vec![Some(7), Some(8)]);
        assert_eq!(state.node(0).gpu_free, vec![1000, 800]);
        assert_eq!(leaving.next(), Some(Ms(50)));
    }

    #[test]
    fn a_lent_place_keeps_what_the_plan_left_of_it() {
        let mut state = state();
        let mut leaving = Leaving::default();
        let owner = Some(Owner {
            job: 1,
            promised: None,
        });
        let slot = leaving.hold(&mut state, &place(vec![(0, 600), (1, 400)]), Ms(9), owner);
        assert_eq!(state.node(0).gpu_free, vec![400, 600]);
        leaving.lend(&mut state, slot);
        assert_eq!(state.node(0).gpu_free, vec![1000, 1000]);
        // The plan takes all of GPU 0 and half the CPU left.
        let plan = Request {
            cpu_milli: 7_500,
            ..Request::default()
        };
        state.apply(0, &plan, &[(0, 1000)]).expect("plan");
        leaving.keep(&mut state, slot);
        let (kept, at, _) = leaving.slot(slot).expect("slot");
        assert_eq!(kept.gpus, vec![(1, 400)]);
        assert_eq!(kept.request.cpu_milli, 500);
        assert_eq!(kept.amounts(), [400, 500, 1_024]);
        assert_eq!(at, Ms(9));
        assert_eq!(state.node(0).gpu_free, vec![0, 600]);
    }

    #[test]
    fn a_promise_ends_at_its_time_and_is_an_event() {
        let mut leaving = Leaving::default();
        leaving.end_promise_at(5, Ms(12));
        assert_eq!(leaving.next(), Some(Ms(12)));
        assert!(leaving.promises_due(Ms(11)).is_empty());
        assert_eq!(leaving.promises_due(Ms(12)), vec![5]);
        assert_eq!(leaving.next(), None);
    }
}
