//! A claim pod whose claims list `firstAvailable` subrequests is met the first way that
//! has a place now, as kube-scheduler's allocator tries the subrequests in order; when no
//! way has one, the pod waits (and PostFilter plans) for the first way, its preferred. A
//! claim asking all of a node's GPUs (`allocationMode: All`) is a way for each size of
//! node, the smallest first.

use std::sync::Arc;

use gpuplace_core::cycle::place;

use super::Scheduler;
use super::round_state::Deciding;
use crate::api::ClusterApi;
use crate::framework::Filtering;
use crate::framework::filter::Verdicts;
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::{OnSnapshot, ReserveOn, Steered};
use crate::snapshot::Snapshot;

impl<A: ClusterApi> Scheduler<A> {
    /// The way of meeting `pod`'s claims to decide it by, when it is not the first: the
    /// first of its alternatives that has a place, where the first way has none. A pod
    /// whose first way asks all of a node's GPUs is decided, when no way has a place, by
    /// its first way sized for the smallest node (what it is told).
    pub(super) fn first_available(
        &mut self,
        snapshot: &Snapshot,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        deciding: &Deciding<'_>,
    ) -> Option<Arc<PodInfo>> {
        use crate::k8s::dra::store::{alternatives, has_ways, node_sizes};
        if !has_ways(pod) || self.has_place(snapshot, verdicts, pod, deciding) {
            return None;
        }
        let ways = alternatives(pod, &node_sizes(&snapshot.state));
        let found = ways
            .iter()
            .find(|way| self.has_place(snapshot, verdicts, way, deciding))
            .cloned();
        found.or_else(|| pod.demand.is_err().then(|| ways.first().cloned())?)
    }

    /// Whether `pod` fits somewhere on `snapshot` as it is, its filters and its queue's
    /// per-model limits applied (nothing is reserved).
    fn has_place(
        &mut self,
        snapshot: &Snapshot,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        deciding: &Deciding<'_>,
    ) -> bool {
        let steered = Steered::new();
        let mut members = OnSnapshot::new(
            snapshot,
            Filtering {
                profile: &self.profile,
                volumes: &deciding.round.volumes,
            },
            vec![(pod, verdicts)],
            &steered,
            ReserveOn::Assume,
        );
        !place::trial(&mut members, &mut self.placer, deciding.narrow)
            .placed
            .is_empty()
    }
}
