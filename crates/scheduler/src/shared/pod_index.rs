//! The pods as the cluster cache last took them: followed change by change from the pod
//! store's feed, so the reservations can be checked against the same moment the state
//! reflects, a rebuild has every pod at hand, and FGD's workload (the pods' shapes) is
//! counted as pods come and go instead of over every pod. So are the pods that could be
//! moved (opted in, controlled, bound and running): make-room has nothing to search while
//! there are none, and asks [`PodIndex::movable_candidates`] before it walks every placed
//! pod.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuplace_core::fairshare::Res;
use gpuplace_core::{ShapeCounts, TargetWorkload};
use gpuplace_model::{Change, ObjectKey};

use crate::api::PodLookup;
use crate::k8s::pod_info::PodInfo;

/// The share of pods FGD's workload covers with its most popular shapes (the paper's 0.95).
const WORKLOAD_COVERAGE: f64 = 0.95;

/// Pods by namespace and name, with their shapes counted, and what running pods hold by
/// namespace and queue label (queues' usage without a walk over every pod).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: BTreeMap<ObjectKey, Arc<PodInfo>>,
    shapes: ShapeCounts,
    holding: BTreeMap<HolderKey, Res>,
    /// Pods that opted in to moves, have a controller and run bound (see
    /// [`movable_candidate`]).
    movable: usize,
}

/// Whether `pod` is one make-room or rebalancing may move at some point: what
/// `defrag::may_move` asks of it, less its age and the round's own exclusions.
fn movable_candidate(pod: &PodInfo) -> bool {
    pod.movable && pod.controller.is_some() && pod.is_active_bound() && !pod.deleting
}

/// A namespace and the queue its pods' label names (`None`: no label).
pub type HolderKey = (String, Option<String>);

/// What `pod` holds, if it is bound and running, and under which key.
fn holding_of(pod: &PodInfo) -> Option<(HolderKey, Res)> {
    if !pod.is_active_bound() || pod.deleting {
        return None;
    }
    let demand = pod.demand.as_ref().ok()?;
    let label = pod.labels.get(crate::k8s::queue::QUEUE_LABEL).cloned();
    Some((
        (pod.key.namespace.clone(), label),
        Res::of(&demand.request, None),
    ))
}

fn key_of(pod: &PodInfo) -> ObjectKey {
    (pod.key.namespace.clone(), pod.key.name.clone())
}

impl PodIndex {
    /// Every pod anew (the feed could not say what changed).
    pub fn reset(&mut self, pods: &[Arc<PodInfo>]) {
        self.pods = pods.iter().map(|p| (key_of(p), Arc::clone(p))).collect();
        self.shapes = ShapeCounts::default();
        self.holding.clear();
        self.movable = pods.iter().filter(|p| movable_candidate(p)).count();
        for pod in pods {
            if let Ok(demand) = &pod.demand {
                self.shapes.add(&demand.request);
            }
            self.hold(pod);
        }
    }

    fn hold(&mut self, pod: &PodInfo) {
        if let Some((key, res)) = holding_of(pod) {
            self.holding.entry(key).or_default().add(&res);
        }
    }

    fn unhold(&mut self, pod: &PodInfo) {
        if let Some((key, res)) = holding_of(pod)
            && let Some(sum) = self.holding.get_mut(&key)
        {
            sum.sub(&res);
            if sum.is_zero() {
                self.holding.remove(&key);
            }
        }
    }

    /// What running pods hold, by namespace and queue label.
    pub fn holding(&self) -> &BTreeMap<HolderKey, Res> {
        &self.holding
    }

    /// One pod changed.
    pub fn apply(&mut self, change: &Change<PodInfo>) {
        if let Some(before) = &change.before {
            if let Ok(demand) = &before.demand {
                self.shapes.remove(&demand.request);
            }
            self.unhold(before);
            self.movable = self
                .movable
                .saturating_sub(usize::from(movable_candidate(before)));
        }
        match &change.after {
            Some(after) => {
                self.movable += usize::from(movable_candidate(after));
                if let Ok(demand) = &after.demand {
                    self.shapes.add(&demand.request);
                }
                self.hold(after);
                self.pods.insert(change.key.clone(), Arc::clone(after));
            }
            None => {
                self.pods.remove(&change.key);
            }
        }
    }

    /// How many pods could be moved (opted in, controlled, bound and running); make-room
    /// and rebalancing have nothing to search while there are none.
    pub fn movable_candidates(&self) -> usize {
        self.movable
    }

    /// Every pod, sorted by namespace and name.
    pub fn all(&self) -> Vec<Arc<PodInfo>> {
        self.pods.values().cloned().collect()
    }

    /// FGD's target workload: the shapes of the pods the cluster runs and is asked to run
    /// (as [`TargetWorkload::from_requests`] over every pod's request).
    pub fn workload(&self) -> Arc<TargetWorkload> {
        Arc::new(self.shapes.workload(WORKLOAD_COVERAGE))
    }
}

impl PodLookup for PodIndex {
    fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodInfo>> {
        self.pods.get(&(namespace.to_string(), name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::pod_info::PodInfo;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, gpus: u32) -> Arc<PodInfo> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap();
        Arc::new(PodInfo::from_pod(&pod, "nvidia.com/gpu"))
    }

    #[test]
    fn followed_changes_count_the_same_workload_as_a_fresh_count() {
        let a = pod("a", 1);
        let b = pod("b", 2);
        let c = pod("c", 1);
        let mut index = PodIndex::default();
        index.reset(&[Arc::clone(&a), Arc::clone(&b)]);
        index.apply(&Change {
            key: key_of(&b),
            before: Some(b),
            after: Some(pod("b", 4)),
        });
        index.apply(&Change {
            key: key_of(&c),
            before: None,
            after: Some(Arc::clone(&c)),
        });
        index.apply(&Change {
            key: key_of(&a),
            before: Some(a),
            after: None,
        });
        let now = [Arc::clone(index.pod("ns", "b").unwrap()), c];
        assert_eq!(index.all().len(), 2);
        let requests: Vec<_> = now
            .iter()
            .map(|p| p.demand.as_ref().unwrap().request.clone())
            .collect();
        let fresh = TargetWorkload::from_requests(&requests, WORKLOAD_COVERAGE);
        assert_eq!(*index.workload(), fresh);
        assert!(index.pod("ns", "a").is_none());
    }

    /// A pod that opted in to moves, with a ReplicaSet, bound to `node` (or pending).
    fn movable(name: &str, node: Option<&str>) -> Arc<PodInfo> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "labels": {"gpuplace.io/movable": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "rs-1", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        Arc::new(PodInfo::from_pod(&pod, "nvidia.com/gpu"))
    }

    #[test]
    fn movable_candidates_follow_binding_and_deletion() {
        let mut index = PodIndex::default();
        index.reset(&[pod("plain", 1), movable("m1", Some("n1"))]);
        assert_eq!(index.movable_candidates(), 1);
        let change = |before: Option<Arc<PodInfo>>, after: Option<Arc<PodInfo>>| {
            let key = key_of(before.as_ref().or(after.as_ref()).unwrap());
            Change { key, before, after }
        };
        // A pending pod that opted in is no candidate until it is bound.
        let pending = movable("m2", None);
        index.apply(&change(None, Some(Arc::clone(&pending))));
        assert_eq!(index.movable_candidates(), 1);
        index.apply(&change(Some(pending), Some(movable("m2", Some("n2")))));
        assert_eq!(index.movable_candidates(), 2);
        let m1 = Arc::clone(index.pod("ns", "m1").unwrap());
        index.apply(&change(Some(m1), None));
        assert_eq!(index.movable_candidates(), 1);
        // The same as a fresh count.
        let mut fresh = PodIndex::default();
        fresh.reset(&index.all());
        assert_eq!(fresh.movable_candidates(), index.movable_candidates());
    }
}
