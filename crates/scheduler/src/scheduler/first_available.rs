//! A claim pod whose claims list `firstAvailable` subrequests is met the first way that
//! has a place now, as kube-scheduler's allocator tries the subrequests in order; when no
//! way has one, the pod waits (and PostFilter plans) for the first way, its preferred.

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
    /// first of its alternatives that has a place, where the first way has none.
    pub(super) fn first_available(
        &mut self,
        snapshot: &Snapshot,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        deciding: &Deciding<'_>,
    ) -> Option<Arc<PodInfo>> {
        let alternatives = crate::k8s::dra::store::alternatives(pod);
        if alternatives.is_empty() || self.has_place(snapshot, verdicts, pod, deciding) {
            return None;
        }
        alternatives
            .into_iter()
            .find(|alternative| self.has_place(snapshot, verdicts, alternative, deciding))
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
