//! The node side's view of the in-memory API: a watch on the pods bound to one node, with
//! a random delivery delay (as a real watch lags), feeding the device plugin's pod store;
//! and the node agent's writes ([`NodeApi`]) on the in-memory API.

use std::time::Duration;

use gpuplace_deviceplugin::node_agent::{NodeApi, NodeApiError};
use gpuplace_deviceplugin::node_pods::{NodePod, NodePods};
use gpuplace_model::ALLOCATED_ANNOTATION;
use gpuplace_scheduler::{EventRecord, PodKey};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;

use crate::MemoryApi;

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
            _ = api.wait_pod_change(since) => {}
        }
        if delay_ms.1 > 0 {
            tokio::time::sleep(Duration::from_millis(
                rng.random_range(delay_ms.0..=delay_ms.1),
            ))
            .await;
        }
        let (changes, reached) = api.pod_changes_since(since);
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
        });
        Ok(())
    }
}
