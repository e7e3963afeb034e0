//! A unit's members in the timeline replay, as core's cycle places them
//! ([`gpuplace_core::cycle::place::trial`]): no Filter beyond the state (the trace's pods
//! have no selectors, taints or volumes), no steers (a moved pod's replacement starts on its
//! planned place when it is re-created), a nominee's nodes tried first, Reserve on the
//! live state.

use gpuplace_core::cycle::place::{self, Nodes};
use gpuplace_core::{ClusterState, Decision, Unschedulable};
use gpuplace_model::Request;

use super::units::{Job, Placed};
use crate::trace::TracePod;

/// A unit's members (jobs) on the replay's live state.
pub(super) struct Members<'a> {
    pub state: &'a mut ClusterState,
    pub pods: &'a [TracePod],
    pub jobs: &'a [Job],
    pub members: &'a [u32],
    /// A nominee's nodes by job (tried first).
    pub nominated: &'a [(u32, usize)],
}

impl place::Members for Members<'_> {
    type Filtered = Nodes<'static>;
    type Placed = Placed;
    type Unfit = ();

    fn count(&self) -> usize {
        self.members.len()
    }

    fn state(&self) -> &ClusterState {
        self.state
    }

    fn request(&self, i: usize) -> Result<&Request, ()> {
        let job = self.members[i] as usize;
        Ok(&self.pods[self.jobs[job].pod as usize].request)
    }

    /// Every node: the trace's pods have no selectors, taints or volumes.
    fn filter(&mut self, _: usize) -> Result<Nodes<'static>, ()> {
        Ok(Nodes(None))
    }

    fn steer(&self, _: usize) -> Option<usize> {
        None
    }

    fn planned(&self, _: usize) -> Option<Decision> {
        None
    }

    fn nominated(&self, i: usize) -> Option<usize> {
        let job = self.members[i];
        self.nominated
            .iter()
            .find(|(j, _)| *j == job)
            .map(|&(_, n)| n)
    }

    fn reserve(&mut self, i: usize, chosen: Decision) -> Result<Placed, ()> {
        let job = self.members[i] as usize;
        let request = &self.pods[self.jobs[job].pod as usize].request;
        self.state
            .apply(chosen.node, request, &chosen.gpus)
            .map_err(|_| ())?;
        Ok(Placed {
            node: chosen.node,
            gpus: chosen.gpus,
        })
    }

    fn unfit(&self, _: usize, _: Unschedulable, _: &Nodes<'static>) {}

    fn awaits_planned(&self, _: usize, _: usize, _: Unschedulable, _: &Nodes<'static>) {}
}
