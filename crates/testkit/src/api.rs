//! An in-memory Kubernetes API for the scheduler's tests, with the API server's rules that
//! the scheduler relies on: every write bumps a cluster-wide resourceVersion; a patch with a
//! stale resourceVersion is a 409 Conflict; binding a pod that is already bound (or whose
//! UID differs) is a 409; a deleted pod is a 404.
//!
//! Its view goes through the scheduler's own [`PodCache`] fed the way a watch feeds it: a
//! full list first, then the pods changed since the resourceVersion it last saw (each at its
//! latest version, deletions by key), and a fresh list when that resourceVersion has been
//! compacted away (the API server's 410 Gone).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpuplace_scheduler::cache::PodCache;
use gpuplace_scheduler::gang::{PodGroup, PodGroupStatus};
use gpuplace_scheduler::{ApiError, ClusterApi, ClusterView, EventRecord, PodKey};
use k8s_openapi::api::core::v1::{Node, Pod};

struct Store {
    version: u64,
    nodes: BTreeMap<String, Arc<Node>>,
    pods: BTreeMap<(String, String), Arc<Pod>>,
    groups: BTreeMap<(String, String), Arc<PodGroup>>,
    events: Vec<EventRecord>,
    bindings: Vec<(PodKey, String)>,
    /// Faults to inject: the next N binds fail with a conflict.
    fail_binds: usize,
    /// The scheduler's side: pods as its watch cache holds them.
    cache: PodCache,
    /// Pods changed at each resourceVersion (the watch history), oldest first.
    pod_log: std::collections::VecDeque<(u64, (String, String))>,
    /// History at or below this resourceVersion is compacted: a watch from there is Gone.
    compacted: u64,
    /// The resourceVersion the cache has caught up to (0: never listed).
    cache_rv: u64,
    relists: usize,
    /// Every pod change ever (resourceVersion, key), for node-side watches.
    changes: Vec<(u64, (String, String))>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            version: 0,
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            groups: BTreeMap::new(),
            events: Vec::new(),
            bindings: Vec::new(),
            fail_binds: 0,
            cache: PodCache::new("nvidia.com/gpu"),
            pod_log: std::collections::VecDeque::new(),
            compacted: 0,
            cache_rv: 0,
            relists: 0,
            changes: Vec::new(),
        }
    }
}

impl Store {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Bumps the resourceVersion for a change of pod `key` and records it in the history.
    fn bump_pod(&mut self, key: &(String, String)) -> String {
        let rv = self.bump();
        self.pod_log.push_back((self.version, key.clone()));
        self.changes.push((self.version, key.clone()));
        rv
    }

    /// Applies `change` to the stored pod `key` as one write: a new resourceVersion, recorded
    /// in the history and on the pod (copy on write: views keep the version they saw).
    fn write_pod(&mut self, key: &(String, String), change: impl FnOnce(&mut Pod)) {
        let rv = self.bump_pod(key);
        if let Some(pod) = self.pods.get_mut(key).map(Arc::make_mut) {
            change(pod);
            pod.metadata.resource_version = Some(rv);
        }
    }

    /// Brings the pod cache up to date: a watch from its resourceVersion, or a relist when
    /// that part of the history is gone. History the cache has seen is then compacted.
    fn sync_cache(&mut self) {
        if self.cache_rv == 0 || self.cache_rv < self.compacted {
            self.cache.begin_relist();
            for pod in self.pods.values() {
                self.cache.relisted(pod);
            }
            self.cache.relist_done();
            self.relists += 1;
        } else {
            for (rv, key) in &self.pod_log {
                if *rv <= self.cache_rv {
                    continue;
                }
                match self.pods.get(key) {
                    Some(pod) => self.cache.apply(pod),
                    None => self.cache.delete_key(&key.0, &key.1),
                }
            }
        }
        self.cache_rv = self.version;
        while self
            .pod_log
            .front()
            .is_some_and(|(rv, _)| *rv <= self.cache_rv)
        {
            self.pod_log.pop_front();
        }
        self.compacted = self.compacted.max(self.cache_rv);
    }
}

/// The API server, shared by clones.
#[derive(Clone)]
pub struct MemoryApi {
    store: Arc<Mutex<Store>>,
    /// The resourceVersion of the last pod change, for watchers to wait on.
    pod_version: tokio::sync::watch::Sender<u64>,
    /// Likewise for Nodes.
    node_version: tokio::sync::watch::Sender<u64>,
}

impl Default for MemoryApi {
    fn default() -> Self {
        MemoryApi {
            store: Arc::default(),
            pod_version: tokio::sync::watch::channel(0).0,
            node_version: tokio::sync::watch::channel(0).0,
        }
    }
}

/// A pod change as a watch on some pods delivers it: the pod at its latest version, or
/// `None` once it is deleted.
pub type PodChange = ((String, String), Option<Arc<Pod>>);

fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// An API whose pod cache counts `gpu_resource` as the GPU resource.
    pub fn with_gpu_resource(gpu_resource: &str) -> Self {
        let api = Self::default();
        lock(&api.store).cache = PodCache::new(gpu_resource);
        api
    }

    /// Creates or replaces a node (resourceVersion assigned).
    pub fn put_node(&self, mut node: Node) {
        let mut s = lock(&self.store);
        node.metadata.resource_version = Some(s.bump());
        let name = node.metadata.name.clone().unwrap_or_default();
        s.nodes.insert(name, Arc::new(node));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    /// Deletes a Node; a Node created again under the name starts with only what its
    /// creator writes (no annotations or labels of other writers survive).
    pub fn delete_node(&self, name: &str) {
        let mut s = lock(&self.store);
        s.nodes.remove(name);
        s.bump();
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    pub fn node(&self, name: &str) -> Option<Node> {
        lock(&self.store).nodes.get(name).map(|n| (**n).clone())
    }

    /// Merges annotations and labels into a Node (a JSON merge patch of metadata).
    pub fn merge_node_metadata(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> Result<Node, ApiError> {
        let mut s = lock(&self.store);
        let rv = s.bump();
        let node = s
            .nodes
            .get_mut(name)
            .map(Arc::make_mut)
            .ok_or_else(|| ApiError::NotFound(format!("node {name}")))?;
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        node.metadata.resource_version = Some(rv);
        let out = node.clone();
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
        Ok(out)
    }

    /// Waits until a Node changes after version `since`; returns the version now.
    pub async fn wait_node_change(&self, since: u64) -> u64 {
        let mut rx = self.node_version.subscribe();
        let _ = rx.wait_for(|v| *v > since).await;
        *rx.borrow()
    }

    /// Creates or replaces a pod; a missing UID, namespace or timestamp is filled in.
    pub fn put_pod(&self, mut pod: Pod) {
        let mut s = lock(&self.store);
        let key = (
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let rv = s.bump_pod(&key);
        pod.metadata.resource_version = Some(rv.clone());
        let ns = pod
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = pod.metadata.name.clone().unwrap_or_default();
        pod.metadata
            .uid
            .get_or_insert_with(|| format!("uid-{ns}-{name}-{rv}"));
        s.pods.insert((ns, name), Arc::new(pod));
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        if s.pods.remove(&key).is_some() {
            s.bump_pod(&key);
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// A graceful delete: the pod gets a deletionTimestamp and stays until its kubelet has
    /// stopped it and deletes it for good ([`delete_pod`](Self::delete_pod)).
    pub fn delete_pod_gracefully(&self, namespace: &str, name: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        let bound = s
            .pods
            .get(&key)
            .is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
        if !bound {
            drop(s);
            self.delete_pod(namespace, name);
            return;
        }
        s.write_pod(&key, |p| {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        });
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// Pod changes after resourceVersion `since` (each key once, at its latest version)
    /// and the resourceVersion they reach.
    pub fn pod_changes_since(&self, since: u64) -> (Vec<PodChange>, u64) {
        let s = lock(&self.store);
        let start = s.changes.partition_point(|(rv, _)| *rv <= since);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (_, key) in &s.changes[start..] {
            if seen.insert(key.clone()) {
                out.push((key.clone(), s.pods.get(key).cloned()));
            }
        }
        let reached = s
            .changes
            .last()
            .map(|(rv, _)| *rv)
            .unwrap_or(since)
            .max(since);
        (out, reached)
    }

    /// Waits until a pod changes after resourceVersion `since`.
    pub async fn wait_pod_change(&self, since: u64) {
        let mut rx = self.pod_version.subscribe();
        let _ = rx.wait_for(|v| *v > since).await;
    }

    /// Sets one annotation on a pod whose UID is `uid` (a merge patch guarded by the UID).
    pub fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let pod_key = (namespace.to_string(), name.to_string());
        let current = s
            .pods
            .get(&pod_key)
            .ok_or_else(|| ApiError::NotFound(format!("{namespace}/{name}")))?;
        if current.metadata.uid.as_deref() != Some(uid) {
            return Err(ApiError::Conflict(format!(
                "{namespace}/{name}: uid precondition failed"
            )));
        }
        s.write_pod(&pod_key, |p| {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.to_string(), value.to_string());
        });
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    /// Sets a pod's phase (what the kubelet reports), e.g. `Failed` after a refused admission.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        if s.pods.contains_key(&key) {
            s.write_pod(&key, |p| {
                p.status.get_or_insert_with(Default::default).phase = Some(phase.to_string());
            });
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// Records an Event (the node agent's Warnings land here too).
    pub fn record_event(&self, event: EventRecord) {
        let mut s = lock(&self.store);
        s.bump();
        s.events.push(event);
    }

    pub fn put_group(&self, mut group: PodGroup) {
        let mut s = lock(&self.store);
        group.metadata.resource_version = Some(s.bump());
        let ns = group
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = group.metadata.name.clone().unwrap_or_default();
        s.groups.insert((ns, name), Arc::new(group));
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        lock(&self.store)
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| (**p).clone())
    }

    pub fn pods(&self) -> Vec<Pod> {
        lock(&self.store)
            .pods
            .values()
            .map(|p| (**p).clone())
            .collect()
    }

    pub fn group(&self, namespace: &str, name: &str) -> Option<PodGroup> {
        lock(&self.store)
            .groups
            .get(&(namespace.to_string(), name.to_string()))
            .map(|g| (**g).clone())
    }

    pub fn events(&self) -> Vec<EventRecord> {
        lock(&self.store).events.clone()
    }

    pub fn bindings(&self) -> Vec<(PodKey, String)> {
        lock(&self.store).bindings.clone()
    }

    /// Compacts the watch history up to now, as etcd does: the cache's next view must
    /// relist (unless it has already seen everything).
    pub fn compact_history(&self) {
        let mut s = lock(&self.store);
        s.compacted = s.version;
        s.pod_log.clear();
    }

    /// How many full lists the pod cache has needed.
    pub fn relists(&self) -> usize {
        lock(&self.store).relists
    }

    /// Makes the next `n` binds fail with a 409 (another writer won).
    pub fn fail_next_binds(&self, n: usize) {
        lock(&self.store).fail_binds = n;
    }
}

impl ClusterApi for MemoryApi {
    async fn view(&self) -> Result<ClusterView, ApiError> {
        let mut guard = lock(&self.store);
        let s = &mut *guard;
        s.sync_cache();
        Ok(ClusterView {
            nodes: s.nodes.values().cloned().collect(),
            pods: s.cache.view(),
            groups: s.groups.values().cloned().collect(),
        })
    }

    async fn patch_assignment(
        &self,
        pod: &PodKey,
        resource_version: &str,
        assignment: Option<&str>,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let key = (pod.namespace.clone(), pod.name.clone());
        let current = s
            .pods
            .get(&key)
            .ok_or_else(|| ApiError::NotFound(pod.to_string()))?;
        if current.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
            return Err(ApiError::NotFound(format!("{pod} (uid changed)")));
        }
        if !resource_version.is_empty()
            && current.metadata.resource_version.as_deref() != Some(resource_version)
        {
            return Err(ApiError::Conflict(format!(
                "{pod}: the object has been modified; please apply your changes to the latest version and try again"
            )));
        }
        s.write_pod(&key, |p| {
            let annotations = p.metadata.annotations.get_or_insert_with(Default::default);
            match assignment {
                Some(text) => {
                    annotations.insert(
                        gpuplace_scheduler::demand::ASSIGNMENT_ANNOTATION.into(),
                        text.into(),
                    );
                }
                None => {
                    annotations.remove(gpuplace_scheduler::demand::ASSIGNMENT_ANNOTATION);
                }
            }
        });
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    async fn bind(&self, pod: &PodKey, node: &str) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        if s.fail_binds > 0 {
            s.fail_binds -= 1;
            return Err(ApiError::Conflict(format!("{pod}: injected conflict")));
        }
        let key = (pod.namespace.clone(), pod.name.clone());
        let current = s
            .pods
            .get(&key)
            .ok_or_else(|| ApiError::NotFound(pod.to_string()))?;
        if current.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
            return Err(ApiError::Conflict(format!(
                "{pod}: uid precondition failed"
            )));
        }
        if current
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
        {
            return Err(ApiError::Conflict(format!(
                "{pod} is already assigned to a node"
            )));
        }
        s.write_pod(&key, |p| {
            p.spec.get_or_insert_with(Default::default).node_name = Some(node.to_string());
        });
        s.bindings.push((pod.clone(), node.to_string()));
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    async fn event(&self, event: EventRecord) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        s.bump();
        s.events.push(event);
        Ok(())
    }

    async fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: PodGroupStatus,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let rv = s.bump();
        let g = s
            .groups
            .get_mut(&(namespace.to_string(), name.to_string()))
            .map(Arc::make_mut)
            .ok_or_else(|| ApiError::NotFound(format!("podgroup {namespace}/{name}")))?;
        g.status = Some(status);
        g.metadata.resource_version = Some(rv);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"schedulerName": "gpuplace", "containers": []}
        }))
        .unwrap()
    }

    fn names(view: &ClusterView) -> Vec<String> {
        view.pods.iter().map(|p| p.key.name.clone()).collect()
    }

    #[tokio::test]
    async fn the_cache_follows_the_watch_and_relists_after_compaction() {
        let api = MemoryApi::new();
        api.put_pod(pod("a"));
        api.put_pod(pod("b"));
        assert_eq!(names(&api.view().await.unwrap()), ["a", "b"]);
        assert_eq!(api.relists(), 1, "the first view lists");

        // Changes arrive as watch events: no relist.
        api.delete_pod("ns", "a");
        api.put_pod(pod("c"));
        let key = PodKey {
            namespace: "ns".into(),
            name: "b".into(),
            uid: api.pod("ns", "b").unwrap().metadata.uid.unwrap(),
        };
        let rv = api
            .pod("ns", "b")
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        api.patch_assignment(&key, &rv, Some("{}")).await.unwrap();
        let view = api.view().await.unwrap();
        assert_eq!(names(&view), ["b", "c"]);
        assert_eq!(view.pods[0].assignment.as_deref(), Some("{}"));
        assert_eq!(api.relists(), 1);

        // A gap longer than the history: 410 Gone, so the cache lists again, and a pod
        // deleted during the gap is gone from it.
        api.delete_pod("ns", "c");
        api.compact_history();
        assert_eq!(names(&api.view().await.unwrap()), ["b"]);
        assert_eq!(api.relists(), 2);
    }
}
