//! The `DevicePlugin` gRPC service the kubelet calls.

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_kubelet_api::v1beta1::device_plugin_server::DevicePlugin;
use gpuplace_kubelet_api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use gpuplace_model::NodeInventory;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::config::{Config, DeviceIdStrategy, DeviceListStrategy};
use crate::devices::{Advertised, DeviceIdError, DeviceTable, PreferenceError};
use crate::metrics::{DeviceLabel, Metrics};
use crate::plan::handshake::Handshake;

/// Environment variable the NVIDIA container runtime reads.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// Environment variable with the kubelet device IDs, for debugging inside the container.
pub const DEVICE_IDS_ENV: &str = "GPUPLACE_DEVICE_IDS";
/// Annotation with the kubelet device IDs of a container's allocation.
pub use gpuplace_model::keys::DEVICE_IDS_ANNOTATION;
/// Milli-GPU of the container's share (shares only).
pub const SHARE_MILLI_ENV: &str = "GPUPLACE_GPU_MILLI";
/// The share's part of the GPU's memory, in MiB (shares only; a limiter may enforce it).
pub const SHARE_MEMORY_ENV: &str = "GPUPLACE_GPU_MEMORY_LIMIT_MIB";
/// MPS: the share as a percentage of the GPU's threads.
pub const MPS_THREADS_ENV: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// MPS: the share's device memory limit (`0=<MiB>M`, the one visible GPU).
pub const MPS_MEMORY_ENV: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Control device nodes every GPU container needs.
pub const CONTROL_DEVICES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// Keeps a [`DeviceTable`] in step with the backend's inventory, and the health gauges too.
pub fn device_tables(
    mut inventory: watch::Receiver<Arc<NodeInventory>>,
    replicas: u32,
    shares: bool,
    metrics: Metrics,
) -> watch::Receiver<Arc<DeviceTable>> {
    let build = move |inv: Arc<NodeInventory>, metrics: &Metrics| {
        let table = DeviceTable::with_shares(inv, replicas, shares);
        for gpu in &table.inventory().gpus {
            metrics
                .device_healthy
                .get_or_create(&DeviceLabel {
                    device: gpu.id.clone(),
                })
                .set(i64::from(gpu.healthy));
        }
        metrics.devices.set(table.list().len() as i64);
        Arc::new(table)
    };
    let first = build(inventory.borrow_and_update().clone(), &metrics);
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        while inventory.changed().await.is_ok() {
            let inv = inventory.borrow_and_update().clone();
            let unhealthy: Vec<&str> = inv
                .gpus
                .iter()
                .filter(|g| !g.healthy)
                .map(|g| g.id.as_str())
                .collect();
            info!(?unhealthy, "device list changed");
            if tx.send(build(inv.clone(), &metrics)).is_err() {
                break;
            }
        }
    });
    rx
}

/// One serving instance of the plugin. `stop` ends open ListAndWatch streams when the
/// instance is replaced (kubelet restart) or the plugin shuts down.
#[derive(Clone)]
pub struct DevicePluginService {
    tables: watch::Receiver<Arc<DeviceTable>>,
    config: Arc<Config>,
    metrics: Metrics,
    stop: watch::Receiver<bool>,
    handshake: Option<Arc<Handshake>>,
    /// Serves the share resource's slices instead of whole devices.
    share: bool,
}

impl DevicePluginService {
    pub fn new(
        tables: watch::Receiver<Arc<DeviceTable>>,
        config: Arc<Config>,
        metrics: Metrics,
        stop: watch::Receiver<bool>,
        handshake: Option<Arc<Handshake>>,
    ) -> Self {
        DevicePluginService {
            tables,
            config,
            metrics,
            stop,
            handshake,
            share: false,
        }
    }

    /// The same service for the share resource (`gpuplace.io/gpu-milli` slices).
    pub fn for_shares(mut self) -> Self {
        self.share = true;
        self
    }

    fn table(&self) -> Arc<DeviceTable> {
        self.tables.borrow().clone()
    }

    fn refuse(&self, reason: &str, message: String) -> Status {
        self.metrics.error(reason);
        warn!(reason, %message, "request refused");
        Status::invalid_argument(message)
    }
}

fn id_reason(e: &DeviceIdError) -> &'static str {
    match e {
        DeviceIdError::Unknown(_) => "unknown_device",
        DeviceIdError::Duplicate(_) => "duplicate_device",
        DeviceIdError::Unhealthy(_) => "unhealthy_device",
        DeviceIdError::Empty => "empty_request",
        DeviceIdError::WrongResource(_) => "wrong_resource",
    }
}

/// The runtime-facing answer for one container's devices.
pub fn container_response(
    table: &DeviceTable,
    devices: &[&Advertised],
    config: &Config,
) -> ContainerAllocateResponse {
    let gpus: Vec<&gpuplace_model::Gpu> = table
        .physical(devices)
        .into_iter()
        .map(|g| table.gpu(g))
        .collect();
    let names: Vec<String> = gpus
        .iter()
        .map(|g| match config.device_id_strategy {
            DeviceIdStrategy::Uuid => g.uuid.clone(),
            DeviceIdStrategy::Index => g.index.to_string(),
        })
        .collect();
    let slices = devices.iter().filter(|d| d.slice).count() as u64;
    let ids = device_ids(table, devices, &gpus, slices > 0);
    let mut envs = share_envs(&gpus, slices);
    match config.device_list_strategy {
        DeviceListStrategy::Envvar | DeviceListStrategy::Both => {
            envs.insert(VISIBLE_DEVICES_ENV.to_string(), names.join(","));
        }
        // The legacy runtime hook must inject nothing when CDI carries the devices.
        DeviceListStrategy::Cdi => {
            envs.insert(VISIBLE_DEVICES_ENV.to_string(), "void".to_string());
        }
    }
    envs.insert(DEVICE_IDS_ENV.to_string(), ids.join(","));
    let cdi_devices = match config.device_list_strategy {
        DeviceListStrategy::Cdi | DeviceListStrategy::Both => names
            .iter()
            .map(|n| CdiDevice {
                name: format!("{}={n}", config.cdi_kind),
            })
            .collect(),
        DeviceListStrategy::Envvar => Vec::new(),
    };
    let mut annotations = HashMap::new();
    annotations.insert(DEVICE_IDS_ANNOTATION.to_string(), ids.join(","));
    ContainerAllocateResponse {
        envs,
        mounts: Vec::new(),
        devices: device_specs(&gpus, config),
        annotations,
        cdi_devices,
    }
}

/// The device IDs handed out: one by one for whole GPUs; a share's slice IDs are many,
/// so named as `<gpu>:<slices>` instead.
fn device_ids(
    table: &DeviceTable,
    devices: &[&Advertised],
    gpus: &[&gpuplace_model::Gpu],
    sliced: bool,
) -> Vec<String> {
    if !sliced {
        return devices.iter().map(|d| d.id.clone()).collect();
    }
    gpus.iter()
        .map(|g| {
            let n = devices
                .iter()
                .filter(|d| d.slice && table.gpu(d.gpu).id == g.id)
                .count();
            format!("{}:{n}", g.id)
        })
        .collect()
}

/// A share's limits for the container (milli-GPU, memory, MPS thread and memory limits);
/// none for whole GPUs.
fn share_envs(gpus: &[&gpuplace_model::Gpu], slices: u64) -> HashMap<String, String> {
    if slices == 0 {
        return HashMap::new();
    }
    let memory_mib = gpus.first().map_or(0, |g| g.memory_mib) * slices / 1000;
    share_limit_envs(&[ShareLimit {
        device: 0,
        milli: slices,
        memory_mib,
    }])
    .into_iter()
    .collect()
}

/// What one GPU share holds: its milli-GPU and its memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareLimit {
    /// The GPU's position among the container's visible GPUs (its CUDA ordinal).
    pub device: usize,
    pub milli: u64,
    pub memory_mib: u64,
}

/// The environment of shares, in device order (the device plugin's one share, a DRA
/// claim's several): milli and memory per share, MPS threads by the largest share, MPS
/// memory limits by device position. Both node agents write it through here.
pub fn share_limit_envs(shares: &[ShareLimit]) -> Vec<(String, String)> {
    if shares.is_empty() {
        return Vec::new();
    }
    let join =
        |f: &dyn Fn(&ShareLimit) -> String| shares.iter().map(f).collect::<Vec<_>>().join(",");
    let threads = shares.iter().map(|s| s.milli).max().unwrap_or(0);
    let mut envs = vec![
        (SHARE_MILLI_ENV.to_string(), join(&|s| s.milli.to_string())),
        (
            SHARE_MEMORY_ENV.to_string(),
            join(&|s| s.memory_mib.to_string()),
        ),
        (
            MPS_THREADS_ENV.to_string(),
            threads.div_ceil(10).max(1).to_string(),
        ),
    ];
    if shares.iter().any(|s| s.memory_mib > 0) {
        envs.push((
            MPS_MEMORY_ENV.to_string(),
            join(&|s| format!("{}={}M", s.device, s.memory_mib)),
        ));
    }
    envs
}

/// Device nodes for the GPUs and the control devices, when specs are passed: only those
/// that exist on the host (a spec for an absent file fails the container, `lstat
/// /dev/nvidia0` or `not a device node`, e.g. while a driver is being reinstalled).
fn device_specs(gpus: &[&gpuplace_model::Gpu], config: &Config) -> Vec<DeviceSpec> {
    if !config.pass_device_specs {
        return Vec::new();
    }
    let spec = |name: String| {
        let host = config.dev_root.join(&name);
        if !crate::backend::is_device_node(&host) {
            debug!(path = %host.display(), "no device file on the host: no device spec");
            return None;
        }
        Some(DeviceSpec {
            container_path: format!("/dev/{name}"),
            host_path: host.display().to_string(),
            permissions: "rw".to_string(),
        })
    };
    gpus.iter()
        .map(|g| format!("nvidia{}", g.device_node()))
        .chain(CONTROL_DEVICES.iter().map(|c| c.to_string()))
        .filter_map(spec)
        .collect()
}

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: self.config.pre_start_required,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let share = self.share;
        let mut tables = self.tables.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let list = move |t: &DeviceTable| if share { t.list_slices() } else { t.list() };
            let first = list(&tables.borrow_and_update());
            if tx
                .send(Ok(ListAndWatchResponse { devices: first }))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    changed = tables.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let devices = list(&tables.borrow_and_update());
                        if tx.send(Ok(ListAndWatchResponse { devices })).await.is_err() {
                            break;
                        }
                    }
                    _ = stop.changed() => break,
                    _ = tx.closed() => break,
                }
            }
            debug!("ListAndWatch stream ended");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let table = self.table();
        let mut container_responses = Vec::new();
        for (i, container) in request
            .into_inner()
            .container_requests
            .into_iter()
            .enumerate()
        {
            // One unknown ID (a device gone since the kubelet's last list) must not fail
            // the whole answer: it is left out and logged.
            let (available, unknown) = table.known(&container.available_device_i_ds);
            if available.is_empty()
                && let Some(first) = unknown.first()
            {
                let e = DeviceIdError::Unknown(first.clone());
                return Err(self.refuse(id_reason(&e), format!("container request {i}: {e}")));
            }
            if !unknown.is_empty() {
                self.metrics.error("unknown_available_device");
                warn!(
                    ?unknown,
                    "GetPreferredAllocation offers devices this plugin does not know; ignoring them"
                );
            }
            let must = &container.must_include_device_i_ds;
            let size = i64::from(container.allocation_size);
            let answer = match &self.handshake {
                Some(h) => {
                    h.preferred(&table, self.share, &available, must, size)
                        .await
                }
                None if self.share => table
                    .slices_for(&available, must, size, &[], None)
                    .map(|(ids, _)| ids),
                None => table.preferred(&available, must, size).map(|(ids, _)| ids),
            };
            let ids = answer.map_err(|e| {
                let reason = match &e {
                    PreferenceError::Device(d) => id_reason(d),
                    _ => "bad_preferred_request",
                };
                self.refuse(reason, format!("container request {i}: {e}"))
            })?;
            debug!(?ids, "preferred allocation");
            self.metrics.preferred_allocations.inc();
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let table = self.table();
        let mut container_responses = Vec::new();
        for (i, container) in request
            .into_inner()
            .container_requests
            .into_iter()
            .enumerate()
        {
            let devices = table
                .resolve_kind(&container.devices_ids, true, self.share)
                .map_err(|e| self.refuse(id_reason(&e), format!("container request {i}: {e}")))?;
            if let Some(h) = &self.handshake {
                h.allocated(&table, &container.devices_ids).await;
            }
            container_responses.push(container_response(&table, &devices, &self.config));
            self.metrics.allocations.inc();
            if self.share {
                info!(gpus = ?table.physical(&devices), slices = devices.len(), "allocated a share");
            } else {
                info!(devices = ?container.devices_ids, "allocated");
            }
        }
        if container_responses.is_empty() {
            return Err(self.refuse("empty_request", "no container requests".to_string()));
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        self.table()
            .resolve_kind(&ids, false, self.share)
            .map_err(|e| self.refuse(id_reason(&e), e.to_string()))?;
        debug!(?ids, "pre-start");
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn a_share_gets_its_gpu_and_hints_of_its_size() {
        let mut inv = NodeInventory::uniform("n", 1, 1, 2, "A100");
        for g in &mut inv.gpus {
            g.id = format!("GPU-{}", g.index);
            g.uuid = g.id.clone();
            g.memory_mib = 40_960;
        }
        let table = DeviceTable::with_shares(Arc::new(inv), 1, true);
        let config = Settings::default().resolve().unwrap();
        let ids: Vec<String> = (0..250).map(|k| format!("GPU-1::m{k}")).collect();
        let devices = table.resolve_kind(&ids, true, true).unwrap();
        let r = container_response(&table, &devices, &config);
        assert_eq!(r.envs[VISIBLE_DEVICES_ENV], "GPU-1");
        assert_eq!(r.envs[SHARE_MILLI_ENV], "250");
        assert_eq!(r.envs[SHARE_MEMORY_ENV], "10240");
        assert_eq!(r.envs[MPS_THREADS_ENV], "25");
        assert_eq!(r.envs[MPS_MEMORY_ENV], "0=10240M");
        assert_eq!(r.envs[DEVICE_IDS_ENV], "GPU-1:250");
        // Whole devices get no share hints.
        let whole = table
            .resolve_kind(&["GPU-0".to_string()], true, false)
            .unwrap();
        let r = container_response(&table, &whole, &config);
        assert_eq!(r.envs[VISIBLE_DEVICES_ENV], "GPU-0");
        assert!(!r.envs.contains_key(SHARE_MILLI_ENV));
    }
}
