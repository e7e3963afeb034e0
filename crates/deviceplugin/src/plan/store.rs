//! The pods bound to this node, kept compactly for the handshake: identity, the containers
//! that use our resource in the kubelet's admission order, and the scheduler's plan.
//!
//! Fed by a watch on pods with `spec.nodeName=<node>` ([`crate::plan::kube`] in production,
//! an in-memory feed in tests) into the one watch-fed store ([`gpuplace_model::RelistStore`],
//! shared with the scheduler's pod store). Readers take cheap snapshots; a counter tells waiters that
//! something changed (the handshake waits on it when the kubelet admits a pod this store has
//! not heard of yet).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use gpuplace_model::{
    ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Assignment, ContainerKind, ContainerNeed,
    MILLI_PER_GPU, NeedOfContainerError, ObjectKey, RelistStore, SHARE_RESOURCE, need_of_container,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::watch;

/// Namespace and name: how the kubelet's PodResources API names a pod.
pub type PodName = ObjectKey;

/// What the handshake keeps of one pod bound to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Containers asking for our resource, in admission order (init containers first).
    pub containers: Vec<ContainerNeed>,
    /// The scheduler's plan for this node, or why it cannot be used; `None` without one.
    pub plan: Option<Result<Assignment, String>>,
    /// The raw `gpuplace.io/allocated` annotation the node last wrote.
    pub allocated: Option<String>,
    /// Phase Succeeded or Failed: the kubelet holds nothing for it.
    pub finished: bool,
}

impl NodePod {
    /// Keeps what the handshake needs of `pod`; `resource` is e.g. `nvidia.com/gpu`.
    pub fn from_pod(pod: &Pod, resource: &str, node: &str) -> NodePod {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let mut containers = Vec::new();
        if let Some(spec) = spec {
            for c in spec.init_containers.iter().flatten() {
                let kind = if c.restart_policy.as_deref() == Some("Always") {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                };
                push_need(&mut containers, c, resource, kind);
            }
            for c in &spec.containers {
                push_need(&mut containers, c, resource, ContainerKind::App);
            }
        }
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        let plan = annotation(ASSIGNMENT_ANNOTATION).map(|text| {
            Assignment::from_json(&text)
                .map_err(|e| e.to_string())
                .and_then(|a| {
                    if a.node == node {
                        Ok(a)
                    } else {
                        Err(format!(
                            "the assignment names node {:?}, not this node {node:?}",
                            a.node
                        ))
                    }
                })
        });
        NodePod {
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            containers,
            plan,
            allocated: annotation(ALLOCATED_ANNOTATION),
            finished: matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
        }
    }

    pub fn key(&self) -> PodName {
        (self.namespace.clone(), self.name.clone())
    }

    /// The usable plan, if any.
    pub fn assignment(&self) -> Option<&Assignment> {
        self.plan.as_ref().and_then(|p| p.as_ref().ok())
    }

    /// Planned device IDs of container `name` (empty without a plan for it).
    pub fn planned(&self, name: &str) -> Vec<String> {
        self.assignment()
            .and_then(|a| a.container(name))
            .map(|c| c.devices.iter().map(|d| d.id.clone()).collect())
            .unwrap_or_default()
    }
}

/// What a container asks of `resource` (whole devices) or of the share resource (slices,
/// as milli-GPU of one GPU), read as the scheduler reads it
/// ([`gpuplace_model::need_of_container`]). The scheduler never places a container that asks
/// both, or a share above one GPU; another scheduler may, and the kubelet then hands it
/// whole devices (or at most one GPU's slices), which is what is kept.
fn push_need(out: &mut Vec<ContainerNeed>, c: &Container, resource: &str, kind: ContainerKind) {
    let quantity = |name: &str| {
        let resources = c.resources.as_ref()?;
        resources
            .requests
            .as_ref()
            .and_then(|r| r.get(name))
            .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))
            .map(|q| q.0.as_str())
    };
    let need = match need_of_container(&c.name, kind, resource, quantity) {
        Ok(need) => need,
        Err(NeedOfContainerError::MixedShare { .. }) => {
            let whole = |name: &str| (name != SHARE_RESOURCE).then(|| quantity(name)).flatten();
            need_of_container(&c.name, kind, resource, whole)
                .ok()
                .flatten()
        }
        Err(NeedOfContainerError::ShareTooLarge(_)) => Some(ContainerNeed {
            name: c.name.clone(),
            kind,
            count: 1,
            milli: MILLI_PER_GPU,
        }),
        // The API server refuses such quantities: nothing the kubelet would hand out.
        Err(_) => None,
    };
    out.extend(need);
}

#[derive(Default)]
struct Inner {
    pods: RelistStore<NodePod>,
    /// Pods deleted from the API that the kubelet may still list while they terminate
    /// (kept as finished, so they are known and never taken for the pod being admitted),
    /// with the order they were deleted in, for pruning.
    gone: HashMap<PodName, (u64, Arc<NodePod>)>,
    deletions: u64,
}

/// How many deleted pods are remembered.
const GONE_KEPT: usize = 4096;

/// The node's pods, shared by the watch that feeds it and the handshake that reads it.
#[derive(Clone)]
pub struct NodePods {
    inner: Arc<RwLock<Inner>>,
    changes: watch::Sender<u64>,
    resource: String,
    node: String,
}

impl NodePods {
    pub fn new(resource: &str, node: &str) -> NodePods {
        NodePods {
            inner: Arc::default(),
            changes: watch::channel(0).0,
            resource: resource.to_string(),
            node: node.to_string(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// A pod was added or changed.
    pub fn apply(&self, pod: &Pod) {
        let info = Arc::new(NodePod::from_pod(pod, &self.resource, &self.node));
        let mut inner = self.write();
        inner.gone.remove(&info.key());
        inner.pods.apply(info.key(), info);
        drop(inner);
        self.bump();
    }

    /// A pod was deleted.
    pub fn delete(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let mut inner = self.write();
        if let Some(pod) = inner.pods.remove(&key) {
            let mut tombstone = (*pod).clone();
            tombstone.finished = true;
            inner.deletions += 1;
            let at = inner.deletions;
            inner.gone.insert(key, (at, Arc::new(tombstone)));
            if inner.gone.len() > GONE_KEPT {
                let cut = at.saturating_sub(GONE_KEPT as u64 / 2);
                inner.gone.retain(|_, (n, _)| *n > cut);
            }
        }
        drop(inner);
        self.bump();
    }

    /// A relist begins: pods are collected aside and swapped in whole by [`relist_done`](Self::relist_done).
    pub fn begin_relist(&self) {
        self.write().pods.begin_relist();
    }

    pub fn relisted(&self, pod: &Pod) {
        let info = Arc::new(NodePod::from_pod(pod, &self.resource, &self.node));
        self.write().pods.relisted(info.key(), info);
    }

    pub fn relist_done(&self) {
        self.write().pods.relist_done();
        self.bump();
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>> {
        self.read()
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every pod, shared (live ones only).
    pub fn snapshot(&self) -> BTreeMap<PodName, Arc<NodePod>> {
        self.read().pods.items().clone()
    }

    /// A live pod or, marked finished, a recently deleted one the kubelet may still list.
    pub fn get_or_deleted(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>> {
        let key = (namespace.to_string(), name.to_string());
        let inner = self.read();
        inner
            .pods
            .get(&key)
            .or_else(|| inner.gone.get(&key).map(|(_, p)| p))
            .cloned()
    }

    /// The live pods for which `keep` holds.
    pub fn matching(&self, keep: impl Fn(&NodePod) -> bool) -> Vec<Arc<NodePod>> {
        self.read()
            .pods
            .values()
            .filter(|p| keep(p))
            .cloned()
            .collect()
    }

    /// Changes counter, for waiting on the next change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn len(&self) -> usize {
        self.read().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_gpu_containers_in_admission_order_and_the_plan() {
        let plan = json!({"node": "n1", "policy": "fgd", "time": "t", "containers": [
            {"name": "a", "devices": [{"index": 0, "id": "GPU-0", "milli": 1000}]}]});
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                "annotations": {"gpuplace.io/assignment": plan.to_string()}},
            "spec": {
                "initContainers": [
                    {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
                    {"name": "cpu-only"}
                ],
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        let info = NodePod::from_pod(&pod, "nvidia.com/gpu", "n1");
        let kinds: Vec<(&str, ContainerKind)> = info
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("i", ContainerKind::Init),
                ("s", ContainerKind::Sidecar),
                ("a", ContainerKind::App)
            ]
        );
        assert_eq!(info.planned("a"), ["GPU-0"]);
        assert!(info.planned("i").is_empty());
        let elsewhere = NodePod::from_pod(&pod, "nvidia.com/gpu", "n2");
        assert!(
            elsewhere
                .plan
                .unwrap()
                .unwrap_err()
                .contains("not this node")
        );
    }
}
