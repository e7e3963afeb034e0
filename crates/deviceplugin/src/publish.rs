//! Publishes this node's GPUs and links for the scheduler: the `gpuplace.io/inventory`
//! annotation (JSON, schema in `gpuplace_model::NodeInventory`) and GPU Feature Discovery's
//! labels (`nvidia.com/gpu.product`, `.memory`, `.count`, `.replicas`; left to GFD when GFD
//! labels the node), written on start, whenever the inventory changes (health, reload), and
//! whenever the plugin's watch of its own Node finds them missing or stale (a Node deleted
//! and re-created), with a JSON merge patch of only these keys (core/v1 only; RBAC: `get`,
//! `list`, `watch`, `patch` on `nodes`).

//!
//! [`patch`] computes what to write (pure); [`keep_published`] decides when; [`kube`] writes
//! and watches with kube-rs.

pub mod kube;
pub mod patch;

use std::sync::Arc;
use std::time::Duration;

use gpuplace_model::NodeInventory;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

pub use patch::{desired, gfd_present, in_place, label_value, node_patch};

/// Why a publication failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot patch node {node}: {source}")]
    Patch { node: String, source: ::kube::Error },
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
    publish: impl Into<patch::Publish>,
    mut node_events: mpsc::Receiver<NodeSeen>,
) {
    let publish = publish.into();
    // The Node as last seen, once the watch has said anything.
    let mut seen: Option<NodeSeen> = None;
    let mut published: Option<Value> = None;
    let mut backoff = Duration::from_millis(500);
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut watching = true;
    loop {
        let want = desired(
            &inventory.borrow_and_update(),
            publish.clone(),
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
