//! `gpuplace scheduler` and `gpuplace crd`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_scheduler::SchedulerConfig;
use gpuplace_scheduler::app;
use gpuplace_scheduler::metrics::{Health, Metrics};
use gpuplace_scheduler::scheduler::run::Heartbeat;
use serde::Deserialize;

/// Which DRA claims are gpuplace's: the driver and its classes, checked as the API checks
/// their names.
fn dra_settings(
    driver: Option<String>,
    classes: Option<Vec<String>>,
) -> anyhow::Result<gpuplace_scheduler::k8s::dra::DraSettings> {
    let mut settings = gpuplace_scheduler::k8s::dra::DraSettings::default();
    if let Some(driver) = driver {
        settings.driver = driver.trim().to_string();
    }
    if let Some(classes) = classes {
        settings.classes = classes
            .iter()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
    }
    if !gpuplace_model::keys::is_dns_subdomain(&settings.driver) {
        anyhow::bail!(
            "--dra-driver {:?}: a driver name is a lowercase DNS subdomain (gpu.gpuplace.io)",
            settings.driver
        );
    }
    if settings.classes.is_empty() {
        anyhow::bail!("--dra-classes: name at least one DeviceClass");
    }
    if let Some(bad) = settings
        .classes
        .iter()
        .find(|c| !gpuplace_model::keys::is_dns_subdomain(c))
    {
        anyhow::bail!(
            "--dra-classes: {bad:?} is not a DeviceClass name (a lowercase DNS subdomain)"
        );
    }
    Ok(settings)
}

/// Settings from the optional YAML file (keys as the flags); flags win.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct FileSettings {
    scheduler_name: Option<String>,
    policy: Option<String>,
    /// Policy name -> weight.
    weights: Option<std::collections::BTreeMap<String, i64>>,
    resource: Option<String>,
    seed: Option<u64>,
    metrics_addr: Option<SocketAddr>,
    leader_elect: Option<bool>,
    lease_namespace: Option<String>,
    interval_ms: Option<u64>,
    max_in_flight: Option<usize>,
    kube_api_qps: Option<f64>,
    kube_api_burst: Option<u32>,
    ui: Option<bool>,
    defrag: Option<String>,
    defrag_min_age: Option<String>,
    defrag_budget: Option<f64>,
    defrag_max_moves: Option<usize>,
    usage_half_life: Option<String>,
    pod_initial_backoff: Option<f64>,
    pod_max_backoff: Option<f64>,
    unschedulable_flush: Option<f64>,
    dra_driver: Option<String>,
    dra_classes: Option<Vec<String>>,
}

#[derive(Args, Debug)]
pub struct SchedulerArgs {
    /// Kubeconfig file [default: in-cluster config, or $KUBECONFIG, or ~/.kube/config].
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Schedule pods whose spec.schedulerName is this [default: gpuplace].
    #[arg(long, env = "GPUPLACE_SCHEDULER_NAME")]
    scheduler_name: Option<String>,
    /// Placement policy (`gpuplace policies`) [default: gpuplace, the best measured].
    #[arg(long, env = "GPUPLACE_POLICY")]
    policy: Option<String>,
    /// Score by a weighted sum of policies, e.g. `fgd=2,best-fit=1` (weights 1-100); the
    /// policy above still picks the GPU of a fractional request.
    #[arg(long, env = "GPUPLACE_WEIGHTS")]
    weights: Option<String>,
    /// YAML config file (scheduler-name, policy, weights, resource, seed, metrics-addr, ui,
    /// leader-elect, lease-namespace, interval-ms, max-in-flight, kube-api-qps,
    /// kube-api-burst, defrag, defrag-min-age, defrag-budget, defrag-max-moves,
    /// usage-half-life, pod-initial-backoff, pod-max-backoff, unschedulable-flush).
    #[arg(long, env = "GPUPLACE_CONFIG")]
    config: Option<PathBuf>,
    /// Serve /metrics, /healthz, /readyz and the live GPU map (/ui) here.
    #[arg(long, env = "GPUPLACE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Serve the read-only GPU map at /ui on the metrics address [default: true].
    #[arg(long, env = "GPUPLACE_UI")]
    ui: Option<bool>,
    /// GPU extended resource [default: nvidia.com/gpu].
    #[arg(long, env = "GPUPLACE_RESOURCE")]
    resource: Option<String>,
    /// Only schedule while holding the Lease `<scheduler-name>` (one active scheduler).
    #[arg(long, env = "GPUPLACE_LEADER_ELECT")]
    leader_elect: Option<bool>,
    /// Namespace of the Lease [default: kube-system].
    #[arg(long, env = "GPUPLACE_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// The longest wait between two looks at the cluster, in ms; rounds otherwise run
    /// as soon as a watch event, a write's outcome or a backoff's end calls for one
    /// [default: 1000].
    #[arg(long, env = "GPUPLACE_INTERVAL_MS")]
    interval_ms: Option<u64>,
    /// Seconds a pod that failed waits before its next try, doubling per failure
    /// (kube-scheduler's podInitialBackoffSeconds) [default: 1].
    #[arg(long, env = "GPUPLACE_POD_INITIAL_BACKOFF")]
    pod_initial_backoff: Option<f64>,
    /// The longest backoff, seconds (podMaxBackoffSeconds) [default: 10].
    #[arg(long, env = "GPUPLACE_POD_MAX_BACKOFF")]
    pod_max_backoff: Option<f64>,
    /// Seconds after which a pod parked as unschedulable is tried again even if nothing
    /// happened (podMaxInUnschedulablePodsDuration) [default: 300]. A trace replayed at
    /// `gpuplace replay --speed K` keeps the simulator's timing with all three divided by K.
    #[arg(long, env = "GPUPLACE_UNSCHEDULABLE_FLUSH")]
    unschedulable_flush: Option<f64>,
    /// Bindings in flight at once [default: 64; on a real API server at 5,000 nodes and
    /// 40,000 pods, 16 bound 570 pods/s where the Go null binder (64) bound 683 and 64 724].
    #[arg(long, env = "GPUPLACE_MAX_IN_FLIGHT")]
    max_in_flight: Option<usize>,
    /// The scheduler's requests per second to the API server (Bindings, Events, reads,
    /// statuses), after a burst [default: 0, no limit].
    #[arg(long, env = "GPUPLACE_KUBE_API_QPS")]
    kube_api_qps: Option<f64>,
    /// Requests allowed at once before the QPS limit applies [default: 100].
    #[arg(long, env = "GPUPLACE_KUBE_API_BURST")]
    kube_api_burst: Option<u32>,
    /// The DRA driver whose claims gpuplace allocates (Kubernetes 1.34+; its node agent's
    /// `--dra-driver`) [default: gpu.gpuplace.io].
    #[arg(long, env = "GPUPLACE_DRA_DRIVER")]
    dra_driver: Option<String>,
    /// The DeviceClasses that select that driver's GPUs, comma-separated
    /// [default: gpu.gpuplace.io,gpu-share.gpuplace.io].
    #[arg(long, env = "GPUPLACE_DRA_CLASSES", value_delimiter = ',')]
    dra_classes: Option<Vec<String>>,
    /// Seed of the node order that breaks ties [default: 42].
    #[arg(long, env = "GPUPLACE_SEED")]
    seed: Option<u64>,
    /// FGD's target workload from a pod list (the simulator's CSV: name, cpu_milli,
    /// memory_mib, num_gpu, gpu_milli[, gpu_spec]), e.g. the cluster's history
    /// [default: the pods the cluster runs and is asked to run].
    #[arg(long, env = "GPUPLACE_FGD_WORKLOAD")]
    fgd_workload: Option<PathBuf>,
    /// Move pods that opted in (`gpuplace.io/movable: "true"`, owned by a ReplicaSet,
    /// StatefulSet or Job): `make-room` for a pod that fits nowhere, `rebalance` to lower
    /// fragmentation in the background, `all` for both, or `off` [default: off].
    #[arg(long, env = "GPUPLACE_DEFRAG")]
    defrag: Option<String>,
    /// How long a pod must have run before it may move, e.g. 5m, 90s, 0s; at most 720h
    /// [default: 5m].
    #[arg(long, env = "GPUPLACE_DEFRAG_MIN_AGE")]
    defrag_min_age: Option<String>,
    /// GPUs rebalancing may move per hour, 0 to 1000000 [default: 16].
    #[arg(long, env = "GPUPLACE_DEFRAG_BUDGET")]
    defrag_budget: Option<f64>,
    /// Pods one plan may move (and rebalancing moves in flight), 1 to 1000 [default: 4].
    #[arg(long, env = "GPUPLACE_DEFRAG_MAX_MOVES")]
    defrag_max_moves: Option<usize>,
    /// The half-life of queues' usage over time where no Queue on the path sets
    /// `usageHalfLife` (e.g. 1h, 30m; at most a year; 0: fair order by what queues hold
    /// now) [default: 0].
    #[arg(long, env = "GPUPLACE_USAGE_HALF_LIFE")]
    usage_half_life: Option<String>,
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// JSON log lines.
    #[arg(long)]
    log_json: bool,
}

/// `--defrag*` from the flags, else the file, else the defaults.
fn defrag_config(
    args: &SchedulerArgs,
    file: &FileSettings,
) -> anyhow::Result<gpuplace_scheduler::scheduler::defrag::DefragConfig> {
    use gpuplace_scheduler::scheduler::defrag::{DefragConfig, parse_duration};
    let mut config = DefragConfig::default();
    let d = &mut config.settings;
    if let Some(mode) = args.defrag.as_ref().or(file.defrag.as_ref()) {
        d.mode = mode.parse()?;
    }
    if let Some(age) = args
        .defrag_min_age
        .as_ref()
        .or(file.defrag_min_age.as_ref())
    {
        d.min_age = parse_duration(age)?;
        anyhow::ensure!(
            d.min_age <= gpuplace_scheduler::scheduler::defrag::MAX_MIN_AGE,
            "--defrag-min-age must be at most 720h (30 days), got {age}"
        );
    }
    if let Some(budget) = args.defrag_budget.or(file.defrag_budget) {
        anyhow::ensure!(
            budget.is_finite() && (0.0..=1_000_000.0).contains(&budget),
            "--defrag-budget must be GPUs per hour, between 0 and 1000000, got {budget}"
        );
        d.budget_gpus_per_hour = budget;
    }
    if let Some(moves) = args.defrag_max_moves.or(file.defrag_max_moves) {
        anyhow::ensure!(
            (1..=1000).contains(&moves),
            "--defrag-max-moves must be between 1 and 1000, got {moves}"
        );
        d.max_moves = moves;
    }
    Ok(config)
}

pub fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    crate::logging::init(args.log_json);
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            serde_saphyr::from_str::<FileSettings>(&text)
                .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?
        }
        None => FileSettings::default(),
    };
    let defrag = defrag_config(&args, &file)?;
    let policy: Policy = args
        .policy
        .or(file.policy)
        .unwrap_or_else(|| Policy::DEFAULT.name().into())
        .parse()?;
    let weights = match (args.weights, file.weights) {
        (Some(text), _) => parse_weights(&text)?,
        (None, Some(map)) => map
            .into_iter()
            .map(|(name, weight)| Ok((name.parse::<Policy>()?, weight)))
            .collect::<anyhow::Result<_>>()?,
        (None, None) => Vec::new(),
    };
    // Refuse bad weights here, with the reason, rather than inside the loop.
    gpuplace_core::Placer::new(policy, 0).with_weights(&weights)?;
    let usage_half_life_ms = match args.usage_half_life.or(file.usage_half_life) {
        Some(text) => gpuplace_core::fairshare::parse_half_life(&text)
            .map_err(|e| anyhow::anyhow!("--usage-half-life: {e}"))?,
        None => 0,
    };
    let queue = crate::queue_flags::queue_config(
        args.pod_initial_backoff
            .or(file.pod_initial_backoff)
            .unwrap_or(1.0),
        args.pod_max_backoff
            .or(file.pod_max_backoff)
            .unwrap_or(10.0),
        args.unschedulable_flush
            .or(file.unschedulable_flush)
            .unwrap_or(300.0),
    )?;
    let config = SchedulerConfig {
        usage_half_life_ms,
        queue,
        defrag,
        weights,
        scheduler_name: args
            .scheduler_name
            .or(file.scheduler_name)
            .unwrap_or_else(|| "gpuplace".into()),
        policy,
        gpu_resource: args
            .resource
            .or(file.resource)
            .unwrap_or_else(|| gpuplace_model::keys::GPU_RESOURCE.into()),
        seed: args.seed.or(file.seed).unwrap_or(42),
        dra: dra_settings(
            args.dra_driver.or(file.dra_driver),
            args.dra_classes.or(file.dra_classes),
        )?,
        workload: args.fgd_workload.as_deref().map(fgd_workload).transpose()?,
        max_in_flight: ranged(
            "max-in-flight",
            args.max_in_flight.or(file.max_in_flight).unwrap_or(64),
            1,
            MAX_IN_FLIGHT,
        )?,
        ..Default::default()
    };
    let metrics_addr = args.metrics_addr.or(file.metrics_addr);
    let ui = args.ui.or(file.ui).unwrap_or(true);
    let leader_elect = args.leader_elect.or(file.leader_elect).unwrap_or(false);
    let lease_namespace = args
        .lease_namespace
        .or(file.lease_namespace)
        .unwrap_or_else(|| "kube-system".into());
    let interval = Duration::from_millis(ranged(
        "interval-ms",
        args.interval_ms.or(file.interval_ms).unwrap_or(1000),
        10,
        3_600_000,
    )?);
    let options = app::Options {
        leader_elect,
        lease_namespace,
        interval,
        kube_api_qps: args.kube_api_qps.or(file.kube_api_qps).unwrap_or(0.0),
        kube_api_burst: ranged(
            "kube-api-burst",
            args.kube_api_burst.or(file.kube_api_burst).unwrap_or(100),
            1,
            100_000,
        )?,
    };
    if !(0.0..=1e6).contains(&options.kube_api_qps) {
        anyhow::bail!(
            "--kube-api-qps {:?} is not a number of requests per second from 0 (no limit) to 1000000",
            options.kube_api_qps
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let served = Served {
        metrics_addr,
        ui,
        tls: args.tls,
    };
    runtime.block_on(serve(args.kubeconfig, config, served, options))
}

/// What the metrics address serves.
struct Served {
    metrics_addr: Option<SocketAddr>,
    /// The live GPU map beside the metrics.
    ui: bool,
    /// The certificate when the address is not loopback.
    tls: crate::ops::TlsArgs,
}

async fn serve(
    kubeconfig: Option<PathBuf>,
    config: SchedulerConfig,
    served: Served,
    options: app::Options,
) -> anyhow::Result<()> {
    let client = crate::kube_client::client(kubeconfig).await?;
    let metrics = Metrics::default();
    let heartbeat = Heartbeat::default();
    let health = Health::new(heartbeat.clone(), Duration::from_secs(60));
    let ui = (served.ui && served.metrics_addr.is_some())
        .then(|| Arc::new(gpuplace_scheduler::ui::Ui::new(&config.gpu_resource)));
    if let Some(addr) = served.metrics_addr {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        let (live, ready) = (health.clone(), health.clone());
        let probes = crate::ops::Probes {
            healthz: Arc::new(move || {
                if live.is_healthy() {
                    Ok("ok")
                } else {
                    Err("scheduling loop stuck")
                }
            }),
            readyz: Arc::new(move || {
                if ready.is_ready() {
                    Ok("ready")
                } else {
                    Err("caches not synced")
                }
            }),
        };
        let extra = ui.clone().map(gpuplace_scheduler::ui::router);
        let exposure =
            crate::ops::exposure(addr, &served.tls, Some(client.clone()), ui.is_some()).await?;
        tokio::spawn(crate::ops::serve(
            listener,
            Arc::new(registry),
            probes,
            extra,
            exposure,
        ));
    }
    let observed = app::Observed {
        metrics,
        health,
        heartbeat,
        ui,
    };
    let shutdown = crate::signals::shutdown();
    Ok(app::serve(client, config, options, observed, shutdown).await?)
}

/// `gpuplace crd`: the PodGroup and Queue CustomResourceDefinitions as YAML, one document
/// each (`kubectl apply -f -` takes both).
pub fn print_crd() -> anyhow::Result<()> {
    let crds = [
        gpuplace_scheduler::k8s::gang::crd_json(),
        gpuplace_scheduler::k8s::queue::crd_json(),
    ];
    let mut docs = Vec::new();
    for crd in &crds {
        docs.push(serde_saphyr::to_string(crd).map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    print!("{}", docs.join("---\n"));
    Ok(())
}

/// `fgd=2,best-fit=1` -> [(Fgd, 2), (BestFit, 1)].
pub(crate) fn parse_weights(text: &str) -> anyhow::Result<Vec<(Policy, i64)>> {
    text.split(',')
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| {
            let (name, weight) = entry
                .split_once('=')
                .with_context(|| format!("weight {entry:?} is not POLICY=WEIGHT"))?;
            let weight: i64 = weight
                .trim()
                .parse()
                .with_context(|| format!("weight {entry:?}: {weight:?} is not a whole number"))?;
            Ok((name.trim().parse::<Policy>()?, weight))
        })
        .collect()
}

/// FGD's target workload from a pod list in the simulator's CSV format (`--fgd-workload`),
/// bound as `gpuplace simulate` binds a trace's shapes.
pub(crate) fn fgd_workload(
    path: &std::path::Path,
) -> anyhow::Result<std::sync::Arc<gpuplace_core::TargetWorkload>> {
    let pods = gpuplace_sim::load_pods(path)
        .with_context(|| format!("--fgd-workload {}", path.display()))?;
    Ok(std::sync::Arc::new(
        gpuplace_core::TargetWorkload::from_requests(pods.iter().map(|p| &p.request), 0.95),
    ))
}

/// The most Bindings in flight a scheduler takes (each holds a connection's slot).
const MAX_IN_FLIGHT: usize = 4096;

/// `value` of setting `name` (a flag or its key in the config file) when it lies in
/// `min..=max`; otherwise an error naming the setting and its range. Nothing is clamped.
fn ranged<T: PartialOrd + std::fmt::Display>(
    name: &str,
    value: T,
    min: T,
    max: T,
) -> anyhow::Result<T> {
    if value < min || value > max {
        anyhow::bail!("--{name} {value} is out of range: from {min} to {max}");
    }
    Ok(value)
}
