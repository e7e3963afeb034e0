//! One profile of stages that every driver calls for a pod: the filters in kube-scheduler's
//! order, then the preferences that narrow the candidates before core places. A profile is
//! built once per configuration (the scheduler's, the extender's, a `defrag --plan` run);
//! what a round knows (its claims and volumes) comes with each pod's [`FilterInput`].

use std::borrow::Cow;
use std::sync::Arc;

use gpuplace_core::ClusterState;

use gpuplace_core::Unschedulable;

use super::filter::{
    Filtered, Verdicts, explain, filter_nodes, with_interpod, with_preferences, with_volumes,
};
use crate::framework::volumes::VolumeIndex;
use crate::k8s::demand::PodDemand;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Scalars, Snapshot};

/// What the filters read for one pod.
pub struct FilterInput<'a> {
    pub snapshot: &'a Snapshot,
    /// Claims and volumes of this round (empty when no pending pod has claims).
    pub volumes: &'a VolumeIndex,
    /// Extended resources still free (a gang's trial takes from a copy).
    pub scalars: &'a Scalars,
    pub pod: &'a PodInfo,
    pub demand: &'a PodDemand,
    /// Pods planned on nodes earlier in the same trial (a gang's members placed before
    /// this one), not yet in the snapshot: the terms about other pods must see them.
    pub planned: &'a [(usize, Arc<PodInfo>)],
}

impl<'a> FilterInput<'a> {
    /// A pod alone on `snapshot` (no trial's members placed before it).
    pub fn alone(
        snapshot: &'a Snapshot,
        volumes: &'a VolumeIndex,
        pod: &'a PodInfo,
        demand: &'a PodDemand,
    ) -> Self {
        FilterInput {
            snapshot,
            volumes,
            scalars: &snapshot.scalars,
            pod,
            demand,
            planned: &[],
        }
    }
}

/// A profile with what this round knows beside the snapshot (its claims and volumes).
#[derive(Clone, Copy)]
pub struct Filtering<'a> {
    pub profile: &'a Profile,
    pub volumes: &'a VolumeIndex,
}

impl Filtering<'_> {
    /// [`Profile::filter_alone`] with this round's volumes.
    pub fn filter_alone<'v>(
        &self,
        snapshot: &Snapshot,
        verdicts: &'v Verdicts,
        pod: &PodInfo,
    ) -> Result<Cow<'v, Filtered>, String> {
        self.profile
            .filter_alone(snapshot, self.volumes, verdicts, pod)
    }
}

/// What a claim pod short of GPUs is short of, in kube-scheduler's "Insufficient ..." and
/// "node(s) had no ..." phrases.
pub const CLAIMED_GPUS: &str = "GPUs for its ResourceClaims";

/// The stages of one scheduling profile, as configured.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The whole-GPU resource name, in the messages that explain a pod fits nowhere.
    gpu_resource: String,
}

impl Profile {
    /// The profile for a scheduler whose whole-GPU resource is `gpu_resource`.
    pub fn new(gpu_resource: &str) -> Self {
        Profile {
            gpu_resource: gpu_resource.to_string(),
        }
    }

    /// Filter for `pod` alone on `snapshot`: the nodes it may go to, or why none (its
    /// requests are wrong, or a claim rules out every node).
    pub fn filter_alone<'v>(
        &self,
        snapshot: &Snapshot,
        volumes: &VolumeIndex,
        verdicts: &'v Verdicts,
        pod: &PodInfo,
    ) -> Result<Cow<'v, Filtered>, String> {
        let demand = pod.demand.as_ref().map_err(Clone::clone)?;
        self.filter(
            verdicts,
            &FilterInput::alone(snapshot, volumes, pod, demand),
        )
    }

    /// Why a pod fits on none of the `nodes` nodes, `filtered` saying which its filters
    /// rejected, as kube-scheduler words it.
    /// A pod that claims its GPUs through DRA is short of claimable GPUs, not of the
    /// device plugin's resource.
    pub fn explain(
        &self,
        why: Unschedulable,
        filtered: &Filtered,
        nodes: usize,
        claims: bool,
    ) -> String {
        let resource = if claims {
            CLAIMED_GPUS
        } else {
            self.gpu_resource.as_str()
        };
        explain(why, &filtered.rejected, nodes, resource)
    }

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
        let filtered =
            super::claim_selectors::with_claim_selectors(filtered, input.snapshot, input.pod);
        let filtered = with_volumes(filtered, input.snapshot, input.volumes, input.pod)?;
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
