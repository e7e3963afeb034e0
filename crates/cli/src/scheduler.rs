//! `gpuplace scheduler` and `gpuplace crd`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_scheduler::k8s::kube_api::KubeApi;
use gpuplace_scheduler::k8s::leader::{ElectionConfig, Elector, Ended, Gate, KubeLeases};
use gpuplace_scheduler::metrics::{Health, Metrics};
use gpuplace_scheduler::scheduler::run::{Heartbeat, LoopConfig};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use serde::Deserialize;
use tracing::info;

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
    /// YAML config file (scheduler-name, policy, weights, resource, seed, metrics-addr,
    /// leader-elect, lease-namespace, interval-ms, max-in-flight, kube-api-qps,
    /// kube-api-burst).
    #[arg(long, env = "GPUPLACE_CONFIG")]
    config: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long, env = "GPUPLACE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
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
    /// Bindings in flight at once [default: 16].
    #[arg(long, env = "GPUPLACE_MAX_IN_FLIGHT")]
    max_in_flight: Option<usize>,
    /// The scheduler's requests per second to the API server (Bindings, Events, reads,
    /// statuses), after a burst [default: 0, no limit].
    #[arg(long, env = "GPUPLACE_KUBE_API_QPS")]
    kube_api_qps: Option<f64>,
    /// Requests allowed at once before the QPS limit applies [default: 100].
    #[arg(long, env = "GPUPLACE_KUBE_API_BURST")]
    kube_api_burst: Option<u32>,
    /// Seed of the node order that breaks ties [default: 42].
    #[arg(long, env = "GPUPLACE_SEED")]
    seed: Option<u64>,
    /// FGD's target workload from a pod list (the simulator's CSV: name, cpu_milli,
    /// memory_mib, num_gpu, gpu_milli[, gpu_spec]), e.g. the cluster's history
    /// [default: the pods the cluster runs and is asked to run].
    #[arg(long, env = "GPUPLACE_FGD_WORKLOAD")]
    fgd_workload: Option<PathBuf>,
    /// JSON log lines.
    #[arg(long)]
    log_json: bool,
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
    let config = SchedulerConfig {
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
        workload: args.fgd_workload.as_deref().map(fgd_workload).transpose()?,
        max_in_flight: args
            .max_in_flight
            .or(file.max_in_flight)
            .unwrap_or(16)
            .max(1),
        ..Default::default()
    };
    let metrics_addr = args.metrics_addr.or(file.metrics_addr);
    let leader_elect = args.leader_elect.or(file.leader_elect).unwrap_or(false);
    let lease_namespace = args
        .lease_namespace
        .or(file.lease_namespace)
        .unwrap_or_else(|| "kube-system".into());
    let interval = Duration::from_millis(
        args.interval_ms
            .or(file.interval_ms)
            .unwrap_or(1000)
            .max(10),
    );
    let rate = (
        args.kube_api_qps.or(file.kube_api_qps).unwrap_or(0.0),
        args.kube_api_burst.or(file.kube_api_burst).unwrap_or(100),
    );
    if !(rate.0 >= 0.0 && rate.0.is_finite()) {
        anyhow::bail!(
            "kube-api-qps {} is not a number of requests per second",
            rate.0
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(
        args.kubeconfig,
        config,
        metrics_addr,
        leader_elect,
        lease_namespace,
        interval,
        rate,
    ))
}

pub(crate) async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn serve(
    kubeconfig: Option<PathBuf>,
    config: SchedulerConfig,
    metrics_addr: Option<SocketAddr>,
    leader_elect: bool,
    lease_namespace: String,
    interval: Duration,
    (qps, burst): (f64, u32),
) -> anyhow::Result<()> {
    let client = client(kubeconfig).await?;
    let identity = format!(
        "{}-{}",
        config.scheduler_name,
        std::env::var("HOSTNAME").unwrap_or_else(|_| std::process::id().to_string())
    );
    let metrics = Metrics::default();
    let heartbeat = Heartbeat::default();
    let health = Health::new(heartbeat.clone(), Duration::from_secs(60));
    if let Some(addr) = metrics_addr {
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
        tokio::spawn(crate::ops::serve(listener, Arc::new(registry), probes));
    }
    info!(scheduler = %config.scheduler_name, policy = %config.policy, "starting watches");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::signals::shutdown().await;
        let _ = stop.send(true);
    });
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let api = tokio::select! {
        api = KubeApi::start(client.clone(), identity.clone(), &config.gpu_resource) => {
            api?.with_rate_limit(qps, burst)
        }
        _ = until_stopped(stopped.clone()) => return Ok(()),
    };
    // Standbys are ready too: their caches are synced, so a rolling update proceeds.
    health.set_ready();
    let gate = if leader_elect {
        Gate::closed()
    } else {
        Gate::always_open()
    };
    let election = leader_elect.then(|| {
        let leases = KubeLeases::new(
            kube::Api::namespaced(client.clone(), &lease_namespace),
            &config.scheduler_name,
        );
        let elector = Elector::new(
            leases,
            ElectionConfig::new(&config.scheduler_name, &identity),
            gate.clone(),
        );
        tokio::spawn(elector.run(until_stopped(stopped.clone())))
    });
    let scheduler = Scheduler::with_gate(api, config, gate.clone());
    let leader_metric = metrics.leader.clone();
    let observe = |report: &gpuplace_scheduler::RoundReport, took: Duration| {
        leader_metric.set(i64::from(gate.is_open()));
        metrics.observe(report, took.as_secs_f64());
    };
    let loop_config = LoopConfig {
        tick: interval,
        ..LoopConfig::default()
    };
    let Some(mut election) = election else {
        scheduler
            .run(loop_config, heartbeat, until_stopped(stopped), observe)
            .await;
        return Ok(());
    };
    // The loop stops with the election: on shutdown (lease released), or at once when
    // the lease is lost (the gate is already closed: nothing more is decided or written).
    let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
    let loop_stop = {
        let stopped = stopped.clone();
        async move {
            let mut lost = lost_rx;
            tokio::select! {
                _ = until_stopped(stopped) => {}
                _ = lost.wait_for(|l| *l) => {}
            }
        }
    };
    let run = scheduler.run(loop_config, heartbeat, loop_stop, observe);
    tokio::pin!(run);
    let ended = tokio::select! {
        ended = &mut election => ended,
        _ = &mut run => {
            // Shut down: the loop has drained its Bindings; the election releases the lease
            // (it saw the same signal) before the process ends.
            match tokio::time::timeout(Duration::from_secs(5), &mut election).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election task failed"),
                Err(_) => tracing::warn!("the lease was not released within 5 s"),
            }
            return Ok(());
        }
    };
    let _ = lost_tx.send(true);
    run.await;
    match ended {
        Ok(Ended::Stopped) => Ok(()),
        Ok(Ended::Lost) => {
            anyhow::bail!("lost the scheduler lease; exiting so the pod restarts as a standby")
        }
        Err(e) => anyhow::bail!("leader election task failed: {e}"),
    }
}

/// `gpuplace crd`: the PodGroup CustomResourceDefinition as YAML.
pub fn print_crd() -> anyhow::Result<()> {
    let crd = gpuplace_scheduler::k8s::gang::crd_json();
    print!(
        "{}",
        serde_saphyr::to_string(&crd).map_err(|e| anyhow::anyhow!("{e}"))?
    );
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
