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

    /// GPU milli, CPU milli and memory MiB held.
    pub(super) fn amounts(&self) -> Amounts {
        [
            self.gpus.iter().map(|&(_, m)| u64::from(m)).sum(),
            self.request.cpu_milli,
            self.request.memory_mib,
        ]
    }
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
