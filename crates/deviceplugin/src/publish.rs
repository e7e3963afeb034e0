//! Publishes this node's GPUs and links for the scheduler: the `gpuplace.io/inventory`
//! annotation (JSON, schema in `gpuplace_model::NodeInventory`) and GPU Feature Discovery's
//! labels (`nvidia.com/gpu.product`, `.memory`, `.count`, `.replicas`), written on start and
//! again whenever the inventory changes (health, reload), with a JSON merge patch on the
//! Node (core/v1 only; RBAC: `patch` on `nodes`).

use std::sync::Arc;
use std::time::Duration;

use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

/// A label value as Kubernetes accepts it: at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending with an alphanumeric (GFD writes `NVIDIA-A100-SXM4-80GB`).
pub fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The merge patch that publishes `inventory` (GPUs advertised `replicas` times each).
pub fn node_patch(inventory: &NodeInventory, replicas: u32) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert(
        "nvidia.com/gpu.count".into(),
        json!(inventory.gpus.len().to_string()),
    );
    labels.insert(
        "nvidia.com/gpu.replicas".into(),
        json!(replicas.to_string()),
    );
    if let Some(gpu) = inventory.gpus.first() {
        let product = label_value(&gpu.model);
        if !product.is_empty() {
            labels.insert("nvidia.com/gpu.product".into(), json!(product));
        }
        if gpu.memory_mib > 0 {
            labels.insert(
                "nvidia.com/gpu.memory".into(),
                json!(gpu.memory_mib.to_string()),
            );
        }
    }
    json!({"metadata": {
        "annotations": {INVENTORY_ANNOTATION: inventory.to_json()},
        "labels": labels,
    }})
}

/// Why a publication failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot patch node {node}: {source}")]
    Patch { node: String, source: kube::Error },
}

async fn publish(api: &Api<Node>, node: &str, patch: &Value) -> Result<(), PublishError> {
    api.patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|source| PublishError::Patch {
            node: node.to_string(),
            source,
        })
}

/// Keeps the node's annotation and labels equal to the latest inventory until the
/// inventory channel closes. Failures are logged and retried with backoff (up to 30 s);
/// an unchanged inventory is not written again.
pub async fn run(
    client: Client,
    node: String,
    mut inventory: watch::Receiver<Arc<NodeInventory>>,
    replicas: u32,
) {
    let api: Api<Node> = Api::all(client);
    let mut published: Option<Value> = None;
    let mut backoff = Duration::from_millis(500);
    loop {
        let patch = node_patch(&inventory.borrow_and_update(), replicas);
        if published.as_ref() != Some(&patch) {
            match publish(&api, &node, &patch).await {
                Ok(()) => {
                    info!(%node, "published the GPU inventory on the node");
                    published = Some(patch);
                    backoff = Duration::from_millis(500);
                }
                Err(e) => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "inventory not published");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        changed = inventory.changed() => if changed.is_err() { return },
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
        }
        if inventory.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(
            label_value("NVIDIA A100-SXM4-80GB"),
            "NVIDIA-A100-SXM4-80GB"
        );
        assert_eq!(label_value(" (Tesla) "), "Tesla");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn patch_carries_the_inventory_and_gfd_labels() {
        let mut inv = NodeInventory::uniform("n1", 0, 0, 4, "NVIDIA A100");
        for g in &mut inv.gpus {
            g.memory_mib = 81920;
        }
        let patch = node_patch(&inv, 2);
        let meta = &patch["metadata"];
        let text = meta["annotations"][INVENTORY_ANNOTATION].as_str().unwrap();
        assert_eq!(NodeInventory::from_json(text).unwrap(), inv);
        assert_eq!(meta["labels"]["nvidia.com/gpu.product"], "NVIDIA-A100");
        assert_eq!(meta["labels"]["nvidia.com/gpu.memory"], "81920");
        assert_eq!(meta["labels"]["nvidia.com/gpu.count"], "4");
        assert_eq!(meta["labels"]["nvidia.com/gpu.replicas"], "2");
    }
}
