//! The publisher's Kubernetes adapter: a merge patch of the Node with kube-rs, and a watch
//! of this node's Node (field selector on its name).

use std::sync::Arc;

use futures::StreamExt;
use gpuplace_model::NodeInventory;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::warn;

use super::{NodePatcher, NodeSeen, PublishError, keep_published};

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
    publish: super::patch::Publish,
) {
    let (tx, rx) = mpsc::channel(16);
    let watch = tokio::spawn(watch_node(client.clone(), node.clone(), tx));
    keep_published(KubePatcher::new(client), node, inventory, publish, rx).await;
    watch.abort();
}
