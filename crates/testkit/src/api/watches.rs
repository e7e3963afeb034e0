//! What watches of pods see: every change, or those of one node's pods.

use super::{MemoryApi, PodChange, lock};

impl MemoryApi {
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

    /// [`pod_changes_since`](Self::pod_changes_since) for the pods bound to `node` (and
    /// those deleted or moved from it), as a watch with `spec.nodeName=<node>` sees them.
    pub fn node_pod_changes_since(&self, node: &str, since: u64) -> (Vec<PodChange>, u64) {
        let s = lock(&self.store);
        let Some(changes) = s.node_changes.get(node) else {
            return (Vec::new(), since);
        };
        let start = changes.partition_point(|(rv, _)| *rv <= since);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (_, key) in &changes[start..] {
            if seen.insert(key.clone()) {
                out.push((key.clone(), s.pods.get(key).cloned()));
            }
        }
        let reached = changes
            .last()
            .map(|(rv, _)| *rv)
            .unwrap_or(since)
            .max(since);
        (out, reached)
    }

    /// Waits until a pod of `node` changes after resourceVersion `since` (see
    /// [`node_pod_changes_since`](Self::node_pod_changes_since)).
    pub async fn wait_node_pod_change(&self, node: &str, since: u64) {
        let mut rx = {
            let mut s = lock(&self.store);
            let last = s
                .node_changes
                .get(node)
                .and_then(|c| c.last())
                .map_or(0, |(rv, _)| *rv);
            s.node_watchers
                .entry(node.to_string())
                .or_insert_with(|| tokio::sync::watch::channel(last).0)
                .subscribe()
        };
        let _ = rx.wait_for(|v| *v > since).await;
    }

    /// Waits until a pod changes after resourceVersion `since`.
    pub async fn wait_pod_change(&self, since: u64) {
        let mut rx = self.pod_version.subscribe();
        let _ = rx.wait_for(|v| *v > since).await;
    }
}
