//! Evicted pods in the timeline replay keep their place until they are gone: the kubelet
//! stops them within their grace period, and only the Pod's deletion tells the scheduler
//! that their devices are free (its cache holds a terminating pod's devices). A plan that
//! evicts takes what it planned on the victims' places at once (a nominee's places, a moved
//! pod's replacement's, as the scheduler holds them); what no plan took of a victim's place
//! stays taken until its grace period is over and a later round sees it free, never in the
//! round that evicted it.

use std::cmp::Reverse;

use gpuplace_core::ClusterState;
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
}

/// Evicted pods on their way out.
#[derive(Debug, Default)]
pub(super) struct Leaving {
    /// Evicted by the plan being carried out; their remains are taken once it is.
    evicted: Vec<u32>,
    /// Places still held by gone-soon pods, by when they are gone (index into `remains`).
    gone: std::collections::BinaryHeap<Reverse<(Ms, u32)>>,
    remains: Vec<Remains>,
    /// Slots of `remains` given back (reused, so a long replay's slots stay as many as
    /// the pods leaving at once).
    free: Vec<u32>,
}

impl Leaving {
    /// When the next evicted pod is gone.
    pub(super) fn next(&self) -> Option<Ms> {
        self.gone.peek().map(|g| g.0.0)
    }

    /// `job` was evicted by the plan being carried out (its place was given back for the
    /// plan to take its part).
    pub(super) fn evicted(&mut self, job: u32) {
        self.evicted.push(job);
    }

    /// The jobs the plan just carried out evicted.
    pub(super) fn take_evicted(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.evicted)
    }

    /// What the plan did not take of an evicted pod's place (`node`, `request`, `gpus`)
    /// stays its until `at`: taken in `state` now.
    pub(super) fn hold(
        &mut self,
        state: &mut ClusterState,
        node: usize,
        request: &Request,
        gpus: &[(usize, u32)],
        at: Ms,
    ) {
        let free = state.node(node);
        let remains = Remains {
            node,
            request: Request {
                cpu_milli: request.cpu_milli.min(free.cpu_free),
                memory_mib: request.memory_mib.min(free.memory_free),
                ..Request::default()
            },
            gpus: gpus
                .iter()
                .map(|&(g, milli)| (g, milli.min(free.gpu_free[g])))
                .filter(|&(_, milli)| milli > 0)
                .collect(),
        };
        let taken = state.apply(node, &remains.request, &remains.gpus);
        // Only what is free is taken: cannot fail.
        debug_assert!(taken.is_ok(), "an evicted pod's remains: {taken:?}");
        self.hold_taken(remains, at);
    }

    /// `remains`, already taken in the state, stay taken until `at`.
    pub(super) fn hold_taken(&mut self, remains: Remains, at: Ms) {
        let index = match self.free.pop() {
            Some(i) => {
                self.remains[i as usize] = remains;
                i
            }
            None => {
                self.remains.push(remains);
                self.remains.len() as u32 - 1
            }
        };
        self.gone.push(Reverse((at, index)));
    }

    /// Evicted pods whose grace period is over by `now` are gone: their remains come back
    /// to `state`; the nodes they were on.
    pub(super) fn gone_due(&mut self, state: &mut ClusterState, now: Ms) -> Vec<u32> {
        let mut nodes = Vec::new();
        while let Some(&Reverse((at, index))) = self.gone.peek()
            && at <= now
        {
            self.gone.pop();
            let r = std::mem::take(&mut self.remains[index as usize]);
            self.free.push(index);
            let given = state.release(r.node, &r.request, &r.gpus);
            debug_assert!(given.is_ok(), "an evicted pod's remains: {given:?}");
            nodes.push(r.node as u32);
        }
        nodes
    }
}
