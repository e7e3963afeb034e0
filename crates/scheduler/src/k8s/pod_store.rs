//! The scheduler's pod cache: what a watch delivers, kept as [`PodInfo`] in the one
//! watch-fed store ([`gpuplace_model::RelistStore`], shared with the device plugin).
//!
//! Each pod is converted once, when its version arrives, and the decoded object dropped;
//! the same version again (a relist, a resync) keeps the converted one.

use std::sync::Arc;

use gpuplace_model::{Cursor, ObjectKey, RelistStore};
use k8s_openapi::api::core::v1::Pod;

use crate::api::PodFeed;
use crate::k8s::pod_info::PodInfo;

/// Pod changes the store remembers for readers of its feed: a reader further behind reads
/// every pod again. Readers take the feed on every call (the extender) or round (the
/// loop), far more often than this many changes arrive between two.
pub const FEED_CHANGES: usize = 16_384;

fn key_of(pod: &Pod) -> ObjectKey {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Pods by namespace and name, plus a relist in progress.
#[derive(Debug)]
pub struct PodStore {
    gpu_resource: String,
    pods: RelistStore<PodInfo>,
}

impl PodStore {
    pub fn new(gpu_resource: &str) -> Self {
        PodStore {
            gpu_resource: gpu_resource.to_string(),
            pods: RelistStore::journaled(FEED_CHANGES),
        }
    }

    fn convert(&self, pod: &Pod, key: &ObjectKey) -> Arc<PodInfo> {
        match self.pods.get(key) {
            // The same version again (a relist, a resync): keep the converted one.
            Some(info)
                if pod.metadata.resource_version.as_deref()
                    == Some(info.resource_version.as_str())
                    && pod.metadata.uid.as_deref() == Some(info.key.uid.as_str()) =>
            {
                Arc::clone(info)
            }
            _ => Arc::new(PodInfo::from_pod(pod, &self.gpu_resource)),
        }
    }

    /// A pod was added or changed.
    pub fn apply(&mut self, pod: &Pod) {
        let key = key_of(pod);
        let info = self.convert(pod, &key);
        self.pods.apply(key, info);
    }

    /// A pod was deleted.
    pub fn delete(&mut self, pod: &Pod) {
        self.pods.remove(&key_of(pod));
    }

    /// The pod `namespace/name` was deleted (a watch event that carries only the key).
    pub fn delete_key(&mut self, namespace: &str, name: &str) {
        self.pods.remove(&(namespace.to_string(), name.to_string()));
    }

    /// The watch restarted: a full list follows.
    pub fn begin_relist(&mut self) {
        self.pods.begin_relist();
    }

    /// One pod of the list in progress.
    pub fn relisted(&mut self, pod: &Pod) {
        let key = key_of(pod);
        let info = self.convert(pod, &key);
        self.pods.relisted(key, info);
    }

    /// The list is complete: it replaces the cache (pods deleted meanwhile disappear).
    pub fn relist_done(&mut self) {
        self.pods.relist_done();
    }

    /// Whether a first full list has arrived.
    pub fn is_listed(&self) -> bool {
        self.pods.is_listed()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pods changed since `since` (see [`PodFeed`]).
    pub fn feed(&self, since: Option<Cursor>) -> PodFeed {
        PodFeed {
            cursor: self.pods.cursor(),
            changes: since.and_then(|c| self.pods.changes_since(c)),
        }
    }

    /// Every pod, sorted by namespace and name.
    pub fn view(&self) -> Vec<Arc<PodInfo>> {
        self.pods.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, rv: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "resourceVersion": rv},
            "spec": {"containers": []}
        }))
        .unwrap()
    }

    #[test]
    fn relist_is_swapped_in_whole_and_unchanged_pods_are_not_converted_again() {
        let mut cache = PodStore::new("nvidia.com/gpu");
        cache.begin_relist();
        cache.relisted(&pod("a", "1"));
        cache.relisted(&pod("b", "2"));
        assert!(
            cache.is_empty() && !cache.is_listed(),
            "nothing before the list completes"
        );
        cache.relist_done();
        assert_eq!(cache.len(), 2);
        let a1 = cache.view()[0].clone();
        cache.apply(&pod("a", "3"));
        cache.delete(&pod("b", "2"));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.view()[0].resource_version, "3");
        // A relist after a watch gap: b is gone, a unchanged keeps its conversion.
        cache.begin_relist();
        cache.relisted(&pod("a", "3"));
        let before = cache.view()[0].clone();
        cache.relist_done();
        assert!(Arc::ptr_eq(&before, &cache.view()[0]));
        assert!(!Arc::ptr_eq(&a1, &cache.view()[0]));
    }
}
