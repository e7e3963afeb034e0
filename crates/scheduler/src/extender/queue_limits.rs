//! Queues in extender mode: kube-scheduler orders its own queue, so the extender cannot
//! serve queues by their fair share or reclaim for them; it enforces what it can decide
//! alone: a pod whose queue is missing or cannot take pods, or whose queue (or an ancestor)
//! would pass its limit of GPUs, CPU or memory, fits no node (filter) and is not bound
//! (bind, where reservations made since the filter are counted). Per-model limits are not
//! enforced here: the model is known only once a node is chosen.
//!
//! What queues hold comes from the pod index's running totals by namespace and queue label
//! plus the reservations not yet seen bound: no walk over the pods on the call path.

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::fairshare::{Picker, Res};

use crate::api::{ClusterView, PodLookup};
use crate::k8s::pod_info::PodInfo;
use crate::scheduler::Reservations;
use crate::shared::pod_index::PodIndex;
use crate::shared::queues::Queues;

/// The queues as the extender's view defines them.
pub(super) struct QueueLimits {
    queues: Queues,
    defined: bool,
}

impl QueueLimits {
    pub(super) fn new(gpu_resource: &str) -> QueueLimits {
        QueueLimits {
            queues: Queues::new(gpu_resource),
            defined: false,
        }
    }

    pub(super) fn refresh(&mut self, view: &ClusterView) {
        self.queues.refresh(view);
        self.defined = self.queues.defined(view);
    }

    /// Why `pod` may not be placed now for its queue's sake, if so.
    pub(super) fn refused(
        &self,
        pod: &PodInfo,
        index: &PodIndex,
        reservations: &Reservations,
        known: &HashMap<String, Arc<PodInfo>>,
    ) -> Option<String> {
        let labelled = pod.labels.contains_key(crate::k8s::queue::QUEUE_LABEL);
        if !self.defined && !labelled {
            return None;
        }
        let q = match self.queues.of(pod) {
            Ok(q) => q,
            Err(e) => return Some(e.to_string()),
        };
        let tree = self.queues.tree();
        let mut held = vec![Res::default(); tree.len()];
        for ((namespace, label), res) in index.holding() {
            if let Ok(q) = self.queues.of_key(namespace, label.as_deref()) {
                held[q].add(res);
            }
        }
        for r in reservations.iter() {
            let bound = index
                .pod(&r.key.namespace, &r.key.name)
                .is_some_and(|p| p.key.uid == r.key.uid && p.is_active_bound());
            if bound || r.key.uid == pod.key.uid {
                continue;
            }
            let owner = known
                .get(&r.key.uid)
                .map(|p| p.as_ref())
                .or_else(|| index.pod(&r.key.namespace, &r.key.name).map(|p| p.as_ref()));
            if let Some(Ok(q)) = owner.map(|p| self.queues.of(p)) {
                held[q].add(&Res::of(&r.request, None));
            }
        }
        let picker: Picker<'_, ()> = Picker::new(&tree, &held, Vec::new());
        let asked = Res::of(&pod.demand.as_ref().ok()?.request, None);
        picker.limit_hit(q, &asked).map(|hit| hit.to_string())
    }
}
