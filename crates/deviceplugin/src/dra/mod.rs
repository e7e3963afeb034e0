//! gpuplace's node agent as a DRA driver (`resource.k8s.io/v1`, Kubernetes 1.34+), beside
//! the device plugin (a node runs one or the other: `--kubelet-api dra`):
//!
//! - [`slices`] turns the inventory into ResourceSlices (one device per GPU, its attributes,
//!   consumable `milli` and `memory`, a taint on an unhealthy GPU), and [`publish`] keeps
//!   them in the API, written on change only;
//! - [`claim`] reads a claim's allocation into the node's GPUs and the containers' env;
//!   [`prepare`] prepares and unprepares claims for the kubelet, with a checkpoint and a
//!   CDI spec per claim ([`state`]);
//! - [`server`] serves the kubelet's plugin watcher registration, `v1.DRAPlugin` and the
//!   device health stream ([`health`]);
//! - [`kube`] is the API adapter.

pub mod authority;
pub mod claim;
pub mod health;
pub mod kube;
pub mod prepare;
pub mod publish;
pub mod server;
pub mod slices;
pub mod state;

use std::future::Future;
use std::sync::Arc;

use gpuplace_model::NodeInventory;
use tokio::sync::{mpsc, watch};
use tracing::info;

pub use slices::DEFAULT_DRIVER;

use crate::config::Config;
use crate::metrics::Metrics;

/// Why the driver stopped.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error(
        "a DRA driver reads ResourceClaims and publishes ResourceSlices: it needs API access (in-cluster service account or kubeconfig) and this node's name (--node-name or NODE_NAME)"
    )]
    NoApi,
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("cannot serve the DRA plugin sockets: {0}")]
    Serve(#[from] std::io::Error),
}

/// Runs the DRA driver until `shutdown`: the slices published and kept, the kubelet plugin
/// served. Every task it starts ends before it returns.
pub async fn serve(
    config: Arc<Config>,
    inventory: watch::Receiver<Arc<NodeInventory>>,
    client: ::kube::Client,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DraError> {
    if config.node_name.is_empty() {
        return Err(DraError::NoApi);
    }
    let dra = &config.dra;
    let node = config.node_name.clone();
    let publisher = publish::Publisher::new(
        kube::KubeSlices::new(client.clone()),
        publish::PublishSettings {
            driver: dra.driver.clone(),
            node: node.clone(),
            shares: config.shares,
        },
    );
    let (nudge, nudged) = mpsc::channel(1);
    let watch = tokio::spawn(kube::watch_slices(
        client.clone(),
        node.clone(),
        dra.driver.clone(),
        nudge,
    ));
    let publishing = tokio::spawn(publish::keep_published(
        publisher,
        inventory.clone(),
        nudged,
    ));
    let preparer = Arc::new(prepare::Preparer::new(
        kube::KubeClaims::new(client),
        prepare::PrepareSettings {
            driver: dra.driver.clone(),
            pool: node.clone(),
            checkpoint: dra.plugin_dir.join(&dra.driver).join("checkpoint.json"),
            cdi: state::CdiSettings {
                root: dra.cdi_root.clone(),
                vendor: dra.driver.clone(),
                device_nodes: config.pass_device_specs,
                dev_root: config.dev_root.clone(),
            },
        },
        inventory,
    )?);
    info!(driver = %dra.driver, %node, "DRA driver starting");
    let (stop, stopped) = watch::channel(false);
    let sockets = server::Sockets::new(&dra.plugins_registry, &dra.plugin_dir, &dra.driver);
    let serving = tokio::spawn(server::serve(
        sockets,
        dra.driver.clone(),
        preparer,
        metrics,
        stopped,
    ));
    shutdown.await;
    let _ = stop.send(true);
    let served = serving.await;
    watch.abort();
    publishing.abort();
    match served {
        Ok(result) => Ok(result?),
        Err(e) => Err(DraError::Serve(std::io::Error::other(e.to_string()))),
    }
}
