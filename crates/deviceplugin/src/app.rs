//! Start-up wiring of the device plugin: the GPU source, publishing, the handshake and the
//! kubelet endpoints, each task with its owner and a shutdown path. The binary parses flags,
//! serves `metrics` and calls [`serve`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::{
    Backend, BackendError, DiscoveryReport, FileBackend, NvmlBackend, file_report, nvml_report,
};
use crate::config::{BackendKind, Config, KubeletApi};
use crate::devices::DeviceTable;
use crate::kubelet::podresources::PodResources;
use crate::kubelet::registration::{self, PluginError};
use crate::kubelet::service;
use crate::metrics::Metrics;
use crate::plan::handshake::{Handshake, HandshakeConfig};
use crate::plan::kube::{KubeNodeApi, watch_pods};
use crate::plan::store::NodePods;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the file backend needs --inventory")]
    NoInventory,
    #[error(
        "publishing the inventory and the handshake need this node's name: set --node-name or NODE_NAME (downward API: spec.nodeName), or turn both off with --publish-inventory false --handshake false"
    )]
    NoNodeName,
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Dra(#[from] crate::dra::DraError),
}

/// The name the inventory carries: the node's, else the host's (logs only).
fn inventory_name(config: &Config) -> String {
    if !config.node_name.is_empty() {
        return config.node_name.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unnamed-node".to_string())
}

/// Reads the node's GPUs once from the configured source (`--discover`), touching no
/// kubelet and no API.
pub fn discover(config: &Config) -> Result<DiscoveryReport, AppError> {
    let name = inventory_name(config);
    Ok(match config.backend {
        BackendKind::Nvml => nvml_report(&name, &config.dev_root)?,
        BackendKind::File => {
            let path = config.inventory.as_ref().ok_or(AppError::NoInventory)?;
            file_report(path, &name)?
        }
    })
}

fn start_backend(config: &Config) -> Result<Box<dyn Backend>, AppError> {
    let name = inventory_name(config);
    Ok(match config.backend {
        BackendKind::Nvml => Box::new(NvmlBackend::start(
            &name,
            config.xid_ignore.clone(),
            config.health_recovery,
            config.dev_root.clone(),
        )?),
        BackendKind::File => {
            let path = config.inventory.as_ref().ok_or(AppError::NoInventory)?;
            Box::new(FileBackend::start(path, &name, config.poll_interval)?)
        }
    })
}

/// A client when publishing or the handshake want the API; none (with a warning) when
/// there is no API access, so the plugin still serves the kubelet.
async fn api_client(config: &Config) -> Result<Option<kube::Client>, AppError> {
    let dra = config.kubelet_api == KubeletApi::Dra;
    if !(config.publish_inventory || config.handshake || dra) {
        return Ok(None);
    }
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) if dra => {
            warn!(error = %e, "no Kubernetes API access");
            return Err(crate::dra::DraError::NoApi.into());
        }
        Err(e) => {
            warn!(
                error = %e,
                "no Kubernetes API access: the inventory is not published and the scheduler's device choices are not honoured"
            );
            return Ok(None);
        }
    };
    if config.node_name.is_empty() {
        return Err(AppError::NoNodeName);
    }
    Ok(Some(client))
}

/// The handshake and its reconciler, stopped through `stop`.
struct RunningHandshake {
    handshake: Arc<Handshake>,
    stop: watch::Sender<bool>,
    reconciler: JoinHandle<()>,
}

fn start_handshake(
    config: &Config,
    client: &kube::Client,
    tables: &watch::Receiver<Arc<DeviceTable>>,
    metrics: &Metrics,
    tasks: &mut Vec<JoinHandle<()>>,
) -> RunningHandshake {
    let pods = NodePods::new(&config.resource, &config.node_name);
    tasks.push(tokio::spawn(watch_pods(
        client.clone(),
        config.node_name.clone(),
        pods.clone(),
    )));
    let handshake = Handshake::new(
        HandshakeConfig {
            node: config.node_name.clone(),
            wait_for_watch: Duration::from_secs(2),
            resync: Duration::from_secs(10),
        },
        pods,
        PodResources::new(&config.pod_resources_socket, &config.resource),
        tables.clone(),
        metrics.clone(),
    );
    let (stop, stop_rx) = watch::channel(false);
    let reconciler = tokio::spawn(handshake.clone().reconcile_loop(
        KubeNodeApi::new(client.clone(), &config.node_name),
        async move {
            let mut stop_rx = stop_rx;
            let _ = stop_rx.wait_for(|s| *s).await;
        },
    ));
    info!(node = %config.node_name, "handshake on: answering the kubelet with the scheduler's devices");
    RunningHandshake {
        handshake,
        stop,
        reconciler,
    }
}

/// Runs the device plugin until `shutdown`: GPUs from the configured backend, the
/// inventory published on the Node, the handshake, and the kubelet endpoints (registered
/// again after every kubelet restart). `metrics` is what the caller serves.
pub async fn serve(
    config: Arc<Config>,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AppError> {
    let backend = start_backend(&config)?;
    let inventory = backend.watch();
    info!(
        node = %config.node_name,
        resource = %config.resource,
        gpus = inventory.borrow().gpus.len(),
        "device plugin starting"
    );
    let client = api_client(&config).await?;
    let mut tasks = Vec::new();
    if config.publish_inventory
        && let Some(client) = &client
    {
        tasks.push(tokio::spawn(crate::publish::kube::run(
            client.clone(),
            config.node_name.clone(),
            inventory.clone(),
            crate::publish::patch::Publish {
                replicas: config.replicas,
                dra_driver: (config.kubelet_api == KubeletApi::Dra)
                    .then(|| config.dra.driver.clone()),
            },
        )));
    }
    if config.kubelet_api == KubeletApi::Dra {
        let client = client.ok_or(crate::dra::DraError::NoApi)?;
        let served = crate::dra::serve(config, inventory, client, metrics, shutdown).await;
        for task in tasks {
            task.abort();
        }
        drop(backend);
        return Ok(served?);
    }
    let tables = service::device_tables(inventory, config.replicas, config.shares, metrics.clone());
    let handshake = match (&client, config.handshake) {
        (Some(client), true) => Some(start_handshake(
            &config, client, &tables, &metrics, &mut tasks,
        )),
        _ => None,
    };
    let served = registration::run_with_handshake(
        config,
        tables,
        metrics,
        handshake.as_ref().map(|h| h.handshake.clone()),
        shutdown,
    )
    .await;
    if let Some(running) = handshake {
        let _ = running.stop.send(true);
        let _ = running.reconciler.await;
    }
    for task in tasks {
        task.abort();
    }
    drop(backend);
    Ok(served?)
}
