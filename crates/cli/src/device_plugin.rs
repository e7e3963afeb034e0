//! `gpuplace device-plugin`: the kubelet device plugin (runs as a DaemonSet).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use gpuplace_deviceplugin::config::{
    BackendKind, DeviceIdStrategy, DeviceListStrategy, KubeletApi, LogFormat, Settings,
};
use gpuplace_deviceplugin::metrics::{self, Metrics};

/// Every setting can come from a flag, from its environment variable, or from the config
/// file, in that order of precedence.
#[derive(Args, Debug)]
pub struct DevicePluginArgs {
    /// YAML config file with the same keys as the flags (e.g. `device-list-strategy: both`).
    #[arg(long, env = "GPUPLACE_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of the kubelet's device plugin sockets.
    #[arg(long, env = "GPUPLACE_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// Extended resource to advertise [default: nvidia.com/gpu].
    #[arg(long, env = "GPUPLACE_RESOURCE")]
    resource: Option<String>,
    /// Where GPUs come from: nvml, or file (an inventory file, --inventory; `fake` is its
    /// old name) [default: nvml].
    #[arg(long, env = "GPUPLACE_BACKEND")]
    backend: Option<BackendKind>,
    /// Inventory file for the file backend (see deploy/inventories).
    #[arg(long, env = "GPUPLACE_INVENTORY")]
    inventory: Option<PathBuf>,
    /// This node's name, from the downward API (`spec.nodeName`) [default: $NODE_NAME];
    /// required to publish the inventory or run the handshake.
    #[arg(long, env = "GPUPLACE_NODE_NAME")]
    node_name: Option<String>,
    /// Time-slicing: advertise each GPU this many times as <uuid>::<n> [default: 1].
    #[arg(long, env = "GPUPLACE_REPLICAS")]
    replicas: Option<u32>,
    /// Also advertise GPU shares as gpuplace.io/gpu-milli, 1000 slices per GPU
    /// [default: true, false with --replicas above 1].
    #[arg(long, env = "GPUPLACE_SHARES")]
    shares: Option<bool>,
    /// Name devices to the runtime by uuid or index [default: uuid].
    #[arg(long, env = "GPUPLACE_DEVICE_ID_STRATEGY")]
    device_id_strategy: Option<DeviceIdStrategy>,
    /// Pass devices as envvar, cdi or both [default: envvar].
    #[arg(long, env = "GPUPLACE_DEVICE_LIST_STRATEGY")]
    device_list_strategy: Option<DeviceListStrategy>,
    /// CDI kind of the device names [default: nvidia.com/gpu].
    #[arg(long, env = "GPUPLACE_CDI_KIND")]
    cdi_kind: Option<String>,
    /// Host directory holding the device nodes [default: /dev].
    #[arg(long, env = "GPUPLACE_DEV_ROOT")]
    dev_root: Option<PathBuf>,
    /// Return device specs (/dev/nvidia*) in Allocate [default: true].
    #[arg(long, env = "GPUPLACE_PASS_DEVICE_SPECS")]
    pass_device_specs: Option<bool>,
    /// Ask the kubelet to call PreStartContainer [default: false].
    #[arg(long, env = "GPUPLACE_PRE_START_REQUIRED")]
    pre_start_required: Option<bool>,
    /// Publish the inventory annotation and GFD labels on this node's Node (in-cluster
    /// service account or kubeconfig; skipped with a warning when there is none) [default: true].
    #[arg(long, env = "GPUPLACE_PUBLISH_INVENTORY")]
    publish_inventory: Option<bool>,
    /// Make the kubelet honour the scheduler's exact devices: watch this node's pods and
    /// answer GetPreferredAllocation with their `gpuplace.io/assignment` [default: true].
    #[arg(long, env = "GPUPLACE_HANDSHAKE")]
    handshake: Option<bool>,
    /// The kubelet's PodResources socket [default: /var/lib/kubelet/pod-resources/kubelet.sock].
    #[arg(long, env = "GPUPLACE_POD_RESOURCES_SOCKET")]
    pod_resources_socket: Option<PathBuf>,
    /// Serve Prometheus metrics and /healthz here (e.g. 0.0.0.0:9400; not loopback: over
    /// TLS, callers need a bearer token allowed `get` on /metrics).
    #[arg(long, env = "GPUPLACE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// Log format: text or json [default: text].
    #[arg(long, env = "GPUPLACE_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    /// XIDs that do not mark a GPU unhealthy [default: 13,31,43,45,68,109].
    #[arg(long, env = "GPUPLACE_XID_IGNORE", value_delimiter = ',')]
    xid_ignore: Option<Vec<u64>>,
    /// Seconds without critical errors before a GPU is healthy again; 0 never [default: 300].
    #[arg(long, env = "GPUPLACE_HEALTH_RECOVERY_SECONDS")]
    health_recovery_seconds: Option<u64>,
    /// Backstop poll of the plugin directory, in ms [default: 500].
    #[arg(long, env = "GPUPLACE_POLL_INTERVAL_MS")]
    poll_interval_ms: Option<u64>,
    /// Which kubelet API to serve: device-plugin (extended resources, any cluster from
    /// 1.26) or dra (a DRA driver: ResourceSlices and the DRA kubelet plugin, 1.34+)
    /// [default: device-plugin].
    #[arg(long, env = "GPUPLACE_KUBELET_API")]
    kubelet_api: Option<KubeletApi>,
    /// The DRA driver's name [default: gpu.gpuplace.io].
    #[arg(long, env = "GPUPLACE_DRA_DRIVER")]
    dra_driver: Option<String>,
    /// CDI spec directory the container runtime reads (DRA) [default: /var/run/cdi].
    #[arg(long, env = "GPUPLACE_CDI_ROOT")]
    cdi_root: Option<PathBuf>,
    /// The kubelet's plugin watcher directory (DRA) [default: /var/lib/kubelet/plugins_registry].
    #[arg(long, env = "GPUPLACE_PLUGINS_REGISTRY")]
    plugins_registry: Option<PathBuf>,
    /// Directory of DRA plugin sockets and state [default: /var/lib/kubelet/plugins].
    #[arg(long, env = "GPUPLACE_DRA_PLUGIN_DIR")]
    dra_plugin_dir: Option<PathBuf>,
    /// Read the GPUs once (inventory, links, health; with NVML also the driver, MIG mode and
    /// XID support), print them as JSON and exit: no kubelet, no API.
    #[arg(long)]
    discover: bool,
}

impl DevicePluginArgs {
    fn settings(&self) -> Settings {
        Settings {
            plugin_dir: self.plugin_dir.clone(),
            resource: self.resource.clone(),
            backend: self.backend,
            inventory: self.inventory.clone(),
            node_name: self.node_name.clone(),
            replicas: self.replicas,
            shares: self.shares,
            device_id_strategy: self.device_id_strategy,
            device_list_strategy: self.device_list_strategy,
            cdi_kind: self.cdi_kind.clone(),
            dev_root: self.dev_root.clone(),
            pass_device_specs: self.pass_device_specs,
            pre_start_required: self.pre_start_required,
            publish_inventory: self.publish_inventory,
            handshake: self.handshake,
            pod_resources_socket: self.pod_resources_socket.clone(),
            metrics_addr: self.metrics_addr,
            log_format: self.log_format,
            xid_ignore: self.xid_ignore.clone(),
            health_recovery_seconds: self.health_recovery_seconds,
            poll_interval_ms: self.poll_interval_ms,
            kubelet_api: self.kubelet_api,
            dra_driver: self.dra_driver.clone(),
            cdi_root: self.cdi_root.clone(),
            plugins_registry: self.plugins_registry.clone(),
            dra_plugin_dir: self.dra_plugin_dir.clone(),
        }
    }
}

/// Resolves flag > env > file > defaults.
pub fn resolve(args: &DevicePluginArgs) -> anyhow::Result<gpuplace_deviceplugin::Config> {
    let file = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    Ok(args.settings().over(file).resolve()?)
}

pub fn run(args: DevicePluginArgs) -> anyhow::Result<()> {
    let config = Arc::new(resolve(&args)?);
    crate::logging::init(config.log_format == LogFormat::Json);
    if args.discover {
        let report = gpuplace_deviceplugin::app::discover(&config)?;
        // As `status` writes: a closed pipe (`| head`) is an error, not a panic.
        let out = serde_json::to_string_pretty(&report)? + "\n";
        std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())?;
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(config, args.tls))
}

async fn serve(
    config: Arc<gpuplace_deviceplugin::Config>,
    tls: crate::ops::TlsArgs,
) -> anyhow::Result<()> {
    let shutdown = crate::signals::shutdown();
    let metrics = Metrics::default();
    if let Some(addr) = config.metrics_addr {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let registry = Arc::new(registry);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        let registered = metrics.clone();
        let probe: crate::ops::Probe = Arc::new(move || metrics::health(&registered));
        let probes = crate::ops::Probes {
            healthz: probe.clone(),
            readyz: probe,
        };
        let exposure = crate::ops::exposure(addr, &tls, None, false).await?;
        tokio::spawn(crate::ops::serve(
            listener, registry, probes, None, exposure,
        ));
    }
    Ok(gpuplace_deviceplugin::app::serve(config, metrics, shutdown).await?)
}
