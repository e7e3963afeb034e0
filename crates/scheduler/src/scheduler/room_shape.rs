//! What a make-room search that found nothing is remembered by (core's `RoomMemo` keys).

use crate::k8s::pod_info::PodInfo;

/// What a make-room search is remembered by: the pod's request and the node terms that
/// filter it (not the round's mask: that follows the nodes' free CPU and memory, and the
/// simulator's shapes are requests alone). Pods with terms on other pods (affinity, spread,
/// ports), claims or extended resources are not remembered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoomShape {
    request: gpuplace_model::Request,
    terms: std::sync::Arc<str>,
}

impl RoomShape {
    pub fn of(pod: &PodInfo, demand: &crate::k8s::demand::PodDemand) -> Option<RoomShape> {
        let plain = pod.placement.is_none() && pod.claims.is_empty() && demand.extended.is_empty();
        plain.then(|| RoomShape {
            request: demand.request.clone(),
            terms: pod.filter_key.clone(),
        })
    }
}
