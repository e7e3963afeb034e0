//! The driver's Kubernetes adapters: ResourceSlices (list, write, watch) and ResourceClaims
//! (get), with kube-rs.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::warn;

use super::prepare::{ClaimSource, SourceError};
use super::publish::{ApiError, SliceApi};

/// The slice API of one client.
pub struct KubeSlices {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
}

impl KubeSlices {
    pub fn new(client: Client) -> Self {
        KubeSlices {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
        }
    }
}

fn api_error(e: kube::Error) -> ApiError {
    ApiError(e.to_string())
}

/// The field selector of one node's slices of one driver.
fn selector(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

impl SliceApi for KubeSlices {
    async fn node_uid(&self, node: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .nodes
            .get_opt(node)
            .await
            .map_err(api_error)?
            .and_then(|n| n.metadata.uid))
    }

    async fn list(&self, node: &str, driver: &str) -> Result<Vec<ResourceSlice>, ApiError> {
        let params = ListParams::default().fields(&selector(node, driver));
        Ok(self.slices.list(&params).await.map_err(api_error)?.items)
    }

    async fn create(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        self.slices
            .create(&PostParams::default(), slice)
            .await
            .map_err(api_error)
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices
            .replace(&name, &PostParams::default(), slice)
            .await
            .map_err(api_error)
    }

    async fn delete(&self, name: &str) -> Result<(), ApiError> {
        match self.slices.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }
}

/// Sends a nudge on every event of this node's slices of `driver` (changes by others, the
/// kubelet's wipe), coalesced, until the receiver is gone.
pub async fn watch_slices(client: Client, node: String, driver: String, tx: mpsc::Sender<()>) {
    let api: Api<ResourceSlice> = Api::all(client);
    let config = watcher::Config::default().fields(&selector(&node, &driver));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, %node, "watching this node's ResourceSlices failed; retrying");
                continue;
            }
        }
        match tx.try_send(()) {
            Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
            Err(mpsc::error::TrySendError::Closed(())) => return,
        }
    }
}

/// ResourceClaims read with one client.
pub struct KubeClaims {
    client: Client,
}

impl KubeClaims {
    pub fn new(client: Client) -> Self {
        KubeClaims { client }
    }
}

impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| SourceError {
            namespace: namespace.to_string(),
            name: name.to_string(),
            message: e.to_string(),
        })
    }
}
