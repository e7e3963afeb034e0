//! Publishes this node's GPUs and links for the scheduler: the `gpuplace.io/inventory`
//! annotation (JSON, schema in `gpuplace_model::NodeInventory`) and GPU Feature Discovery's
//! labels (`nvidia.com/gpu.product`, `.memory`, `.count`, `.replicas`; left to GFD when GFD
//! labels the node), written on start, whenever the inventory changes (health, reload), and
//! whenever the plugin's watch of its own Node finds them missing or stale (a Node deleted
//! and re-created), with a JSON merge patch of only these keys (core/v1 only; RBAC: `get`,
//! `list`, `watch`, `patch` on `nodes`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory, keys};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
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
        keys::GPU_COUNT_LABEL.into(),
        json!(inventory.gpus.len().to_string()),
    );
    labels.insert(keys::GPU_REPLICAS_LABEL.into(), json!(replicas.to_string()));
    if let Some(gpu) = inventory.gpus.first() {
        let product = label_value(&gpu.model);
        if !product.is_empty() {
            labels.insert(keys::GPU_PRODUCT_LABEL.into(), json!(product));
        }
        if gpu.memory_mib > 0 {
            labels.insert(
                keys::GPU_MEMORY_LABEL.into(),
                json!(gpu.memory_mib.to_string()),
            );
        }
    }
    json!({"metadata": {
        "annotations": {INVENTORY_ANNOTATION: inventory.to_json()},
        "labels": labels,
    }})
}

/// GPU Feature Discovery's own label: when the Node has it, GFD owns the `nvidia.com/gpu.*`
/// labels and gpuplace writes only its annotation.
pub use gpuplace_model::keys::GFD_TIMESTAMP_LABEL;

/// Whether GPU Feature Discovery labels this node.
pub fn gfd_present(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(GFD_TIMESTAMP_LABEL))
}

/// The patch for `inventory` on `node` as last seen: without GFD's labels where GFD runs.
pub fn desired(inventory: &NodeInventory, replicas: u32, node: Option<&Node>) -> Value {
    let mut patch = node_patch(inventory, replicas);
    if node.is_some_and(gfd_present)
        && let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.remove("labels");
    }
    patch
}

/// Whether every annotation and label of `patch` already holds on `node`.
pub fn in_place(node: &Node, patch: &Value) -> bool {
    let holds = |field: &str, have: Option<&std::collections::BTreeMap<String, String>>| {
        patch["metadata"][field].as_object().is_none_or(|want| {
            want.iter()
                .all(|(k, v)| have.and_then(|h| h.get(k)).map(String::as_str) == v.as_str())
        })
    };
    holds("annotations", node.metadata.annotations.as_ref())
        && holds("labels", node.metadata.labels.as_ref())
}

/// Why a publication failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot patch node {node}: {source}")]
    Patch { node: String, source: kube::Error },
    #[error("cannot patch node {node}: {message}")]
    Refused { node: String, message: String },
}

/// Writes the patch; the answer is the Node as it is now.
pub trait NodePatcher: Send + Sync {
    fn patch(
        &self,
        node: &str,
        patch: &Value,
    ) -> impl std::future::Future<Output = Result<Node, PublishError>> + Send;
}

/// [`NodePatcher`] with a JSON merge patch (only gpuplace's keys are in it, so other
/// writers' annotations and labels are left alone).
pub struct KubePatcher {
    api: Api<Node>,
}

impl KubePatcher {
    pub fn new(client: Client) -> KubePatcher {
        KubePatcher {
            api: Api::all(client),
        }
    }
}

impl NodePatcher for KubePatcher {
    async fn patch(&self, node: &str, patch: &Value) -> Result<Node, PublishError> {
        self.api
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| PublishError::Patch {
                node: node.to_string(),
                source,
            })
    }
}

/// What the plugin's watch of its own Node saw: the Node, or `None` once it is deleted.
pub type NodeSeen = Option<Node>;

/// Keeps the Node's annotation and labels equal to the latest inventory until the
/// inventory channel closes: after every inventory change, and whenever the Node seen on
/// `node_events` lacks them or holds stale values (a Node deleted and re-created, another
/// writer's edit). Failures are retried with backoff (up to 30 s).
pub async fn keep_published<P: NodePatcher>(
    patcher: P,
    node: String,
    mut inventory: watch::Receiver<Arc<NodeInventory>>,
    replicas: u32,
    mut node_events: mpsc::Receiver<NodeSeen>,
) {
    // The Node as last seen, once the watch has said anything.
    let mut seen: Option<NodeSeen> = None;
    let mut published: Option<Value> = None;
    let mut backoff = Duration::from_millis(500);
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut watching = true;
    loop {
        let want = desired(
            &inventory.borrow_and_update(),
            replicas,
            seen.as_ref().and_then(Option::as_ref),
        );
        let needed = match &seen {
            Some(Some(n)) => !in_place(n, &want),
            // Deleted: nothing to patch until the kubelet registers it again.
            Some(None) => false,
            None => published.as_ref() != Some(&want),
        };
        let due = retry_at.is_none_or(|t| t <= tokio::time::Instant::now());
        if needed && due {
            match patcher.patch(&node, &want).await {
                Ok(now) => {
                    info!(%node, "published the GPU inventory on the node");
                    if seen.is_some() {
                        seen = Some(Some(now));
                    }
                    published = Some(want);
                    backoff = Duration::from_millis(500);
                    retry_at = None;
                }
                Err(e) => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "inventory not published");
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            continue;
        }
        let retry = async {
            match retry_at {
                Some(t) if needed => tokio::time::sleep_until(t).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = inventory.changed() => if changed.is_err() { return },
            event = node_events.recv(), if watching => match event {
                Some(n) => {
                    if n.is_none() {
                        info!(%node, "the Node was deleted: publishing again when it is back");
                    }
                    seen = Some(n);
                }
                None => watching = false,
            },
            _ = retry => {}
        }
    }
}

/// Feeds `tx` with this node's Node from a watch (field selector on its name), until the
/// receiver is gone. Errors are logged and retried with backoff.
pub async fn watch_node(client: Client, node: String, tx: mpsc::Sender<NodeSeen>) {
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listed: Option<Node> = None;
    while let Some(event) = stream.next().await {
        let seen = match event {
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(n)) => {
                listed = Some(n);
                continue;
            }
            Ok(watcher::Event::InitDone) => listed.take(),
            Ok(watcher::Event::Apply(n)) => Some(n),
            Ok(watcher::Event::Delete(_)) => None,
            Err(e) => {
                warn!(error = %e, %node, "watching this node's Node failed; retrying");
                continue;
            }
        };
        if tx.send(seen).await.is_err() {
            return;
        }
    }
}

/// [`keep_published`] with kube-rs: a merge patch, and a watch of the Node.
pub async fn run(
    client: Client,
    node: String,
    inventory: watch::Receiver<Arc<NodeInventory>>,
    replicas: u32,
) {
    let (tx, rx) = mpsc::channel(16);
    let watch = tokio::spawn(watch_node(client.clone(), node.clone(), tx));
    keep_published(KubePatcher::new(client), node, inventory, replicas, rx).await;
    watch.abort();
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
    fn gfd_keeps_its_labels_and_stale_values_are_found() {
        let inv = NodeInventory::uniform("n1", 0, 0, 4, "A100");
        let mut node: Node = serde_json::from_value(json!({"metadata": {"name": "n1",
            "labels": {"nvidia.com/gfd.timestamp": "1", "nvidia.com/gpu.product": "GFD-NAME"}}}))
        .unwrap();
        let want = desired(&inv, 1, Some(&node));
        assert!(
            want["metadata"].get("labels").is_none(),
            "GFD's labels stay GFD's"
        );
        assert!(!in_place(&node, &want), "the annotation is missing");
        node.metadata.annotations = Some(
            [(INVENTORY_ANNOTATION.to_string(), inv.to_json())]
                .into_iter()
                .collect(),
        );
        assert!(in_place(&node, &want));
        // Without GFD our labels are part of it, and a stale one is found.
        node.metadata.labels = Some(
            [("nvidia.com/gpu.count".to_string(), "2".to_string())]
                .into_iter()
                .collect(),
        );
        let want = desired(&inv, 1, Some(&node));
        assert_eq!(want["metadata"]["labels"]["nvidia.com/gpu.count"], "4");
        assert!(!in_place(&node, &want));
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
