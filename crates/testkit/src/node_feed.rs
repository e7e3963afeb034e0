//! The node side's view of the in-memory API: a watch on the pods bound to one node, with
//! a random delivery delay (as a real watch lags), feeding the device plugin's pod store;
//! a watch on one Node feeding the inventory publisher; and the node agent's writes
//! ([`NodeApi`], [`NodePatcher`]) on the in-memory API.

use std::time::Duration;

use gpuplace_deviceplugin::plan::handshake::{NodeApi, NodeApiError};
use gpuplace_deviceplugin::plan::store::{NodePod, NodePods};
use gpuplace_deviceplugin::publish::{NodePatcher, NodeSeen, PublishError};
use gpuplace_model::ALLOCATED_ANNOTATION;
use gpuplace_scheduler::{EventRecord, PodKey};
use k8s_openapi::api::core::v1::Node;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;
use tokio::sync::watch;

use crate::api::MemoryApi;

/// Keeps `store` equal to the pods bound to `node`, each batch of changes delivered after
/// a random delay of `delay_ms` (lo..=hi), until `stop` turns true.
pub async fn feed_node_pods(
    api: MemoryApi,
    node: String,
    store: NodePods,
    delay_ms: (u64, u64),
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut since = 0u64;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = api.wait_node_pod_change(&node, since) => {}
        }
        if delay_ms.1 > 0 {
            tokio::time::sleep(Duration::from_millis(
                rng.random_range(delay_ms.0..=delay_ms.1),
            ))
            .await;
        }
        let (changes, reached) = api.node_pod_changes_since(&node, since);
        since = reached;
        for ((namespace, name), pod) in changes {
            match pod {
                Some(p)
                    if p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(node.as_str()) =>
                {
                    store.apply(&p)
                }
                _ => {
                    if store.get(&namespace, &name).is_some() {
                        store.delete(&namespace, &name);
                    }
                }
            }
        }
    }
}

impl NodeApi for MemoryApi {
    async fn set_allocated(&self, pod: &NodePod, allocated: &str) -> Result<(), NodeApiError> {
        self.set_annotation(
            &pod.namespace,
            &pod.name,
            &pod.uid,
            ALLOCATED_ANNOTATION,
            allocated,
        )
        .map_err(|e| NodeApiError(e.to_string()))
    }

    async fn warn(&self, pod: &NodePod, reason: &str, note: String) -> Result<(), NodeApiError> {
        self.record_event(EventRecord {
            pod: PodKey {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            },
            kind: "Warning".into(),
            reason: reason.to_string(),
            message: note,
            at: crate::clock::server_time(),
        });
        Ok(())
    }
}

/// Sends `node`'s Node (or `None` once deleted) to `tx` on every change, until the
/// receiver is gone: what the plugin's watch of its own Node delivers.
pub async fn feed_node(api: MemoryApi, node: String, tx: mpsc::Sender<NodeSeen>) {
    let mut since = 0;
    loop {
        if tx.send(api.node(&node)).await.is_err() {
            return;
        }
        since = api.wait_node_change(since).await;
    }
}

impl NodePatcher for MemoryApi {
    async fn patch(&self, node: &str, patch: &serde_json::Value) -> Result<Node, PublishError> {
        // A merge patch: strings set, nulls remove (as the API server applies it).
        let map = |field: &str| -> std::collections::BTreeMap<String, String> {
            patch["metadata"][field]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let removed: Vec<String> = patch["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.is_null())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let refused = |e: gpuplace_scheduler::ApiError| PublishError::Refused {
            node: node.to_string(),
            message: e.to_string(),
        };
        let merged = self
            .merge_node_metadata(node, &map("annotations"), &map("labels"))
            .map_err(refused)?;
        if removed.is_empty() {
            return Ok(merged);
        }
        self.remove_node_labels(node, &removed).map_err(refused)
    }
}
