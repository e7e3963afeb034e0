//! One profile of stages that every driver calls for a pod: the filters in kube-scheduler's
//! order, then the preferences that narrow the candidates before core places.

use std::borrow::Cow;
use std::sync::Arc;

use gpuplace_core::ClusterState;

use super::filter::{
    Filtered, Verdicts, filter_nodes, with_interpod, with_preferences, with_volumes,
};
use crate::framework::volumes::VolumeIndex;
use crate::k8s::demand::PodDemand;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Scalars, Snapshot};

/// What the filters read for one pod.
pub struct FilterInput<'a> {
    pub snapshot: &'a Snapshot,
    /// Extended resources still free (a gang's trial takes from a copy).
    pub scalars: &'a Scalars,
    pub pod: &'a PodInfo,
    pub demand: &'a PodDemand,
    /// Pods planned on nodes earlier in the same trial (a gang's members placed before
    /// this one), not yet in the snapshot: the terms about other pods must see them.
    pub planned: &'a [(usize, Arc<PodInfo>)],
}

/// The stages of one scheduling profile, with what they read beyond the snapshot.
pub struct Profile<'a> {
    /// Claims and volumes of this round (empty when no pending pod has claims).
    pub volumes: &'a VolumeIndex,
}

impl Profile<'_> {
    /// PreFilter and Filter: node verdicts (taints, selectors, node affinity, readiness,
    /// cordon), extended resources still free, volumes, then the terms about other pods.
    /// `Err` when the pod can go nowhere whatever is evicted (an unbound or conflicting
    /// claim), with kube-scheduler's message.
    /// `verdicts` are the node verdicts for the pod's terms ([`super::filter::VerdictCache`]).
    pub fn filter<'v>(
        &self,
        verdicts: &'v Verdicts,
        input: &FilterInput<'_>,
    ) -> Result<Cow<'v, Filtered>, String> {
        let filtered = filter_nodes(input.scalars, verdicts, input.demand);
        let filtered = with_volumes(filtered, input.snapshot, self.volumes, input.pod)?;
        Ok(with_interpod(
            filtered,
            input.snapshot,
            input.pod,
            input.planned,
        ))
    }

    /// Score's first half: the pod's preferences (preferred node affinity, preferred terms
    /// about other pods, soft taints) narrow the filtered nodes to those that rank best and
    /// fit on `state`; core then places within them.
    pub fn prefer<'v>(
        &self,
        filtered: Cow<'v, Filtered>,
        input: &FilterInput<'_>,
        state: &ClusterState,
    ) -> Cow<'v, Filtered> {
        with_preferences(
            filtered,
            input.snapshot,
            state,
            input.pod,
            &input.demand.request,
            input.planned,
        )
    }
}
