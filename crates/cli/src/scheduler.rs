//! `gpuplace scheduler` and `gpuplace crd`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_scheduler::kube_api::KubeApi;
use gpuplace_scheduler::lease::LeaderElection;
use gpuplace_scheduler::metrics::{self, Metrics};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use serde::Deserialize;
use tracing::{error, info};

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
}

#[derive(Args, Debug)]
pub struct SchedulerArgs {
    /// Kubeconfig file [default: in-cluster config, or $KUBECONFIG, or ~/.kube/config].
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Schedule pods whose spec.schedulerName is this [default: gpuplace].
    #[arg(long, env = "GPUPLACE_SCHEDULER_NAME")]
    scheduler_name: Option<String>,
    /// Placement policy (`gpuplace policies`) [default: fgd, the best measured].
    #[arg(long, env = "GPUPLACE_POLICY")]
    policy: Option<String>,
    /// Score by a weighted sum of policies, e.g. `fgd=2,best-fit=1` (weights 1-100); the
    /// policy above still picks the GPU of a fractional request.
    #[arg(long, env = "GPUPLACE_WEIGHTS")]
    weights: Option<String>,
    /// YAML config file (scheduler-name, policy, weights, resource, seed, metrics-addr,
    /// leader-elect, lease-namespace, interval-ms).
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
    /// Pause between scheduling rounds, in ms [default: 200].
    #[arg(long, env = "GPUPLACE_INTERVAL_MS")]
    interval_ms: Option<u64>,
    /// Seed of the node order that breaks ties [default: 42].
    #[arg(long, env = "GPUPLACE_SEED")]
    seed: Option<u64>,
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
        .unwrap_or_else(|| "fgd".into())
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
            .unwrap_or_else(|| "nvidia.com/gpu".into()),
        seed: args.seed.or(file.seed).unwrap_or(42),
        ..Default::default()
    };
    let metrics_addr = args.metrics_addr.or(file.metrics_addr);
    let leader_elect = args.leader_elect.or(file.leader_elect).unwrap_or(false);
    let lease_namespace = args
        .lease_namespace
        .or(file.lease_namespace)
        .unwrap_or_else(|| "kube-system".into());
    let interval =
        Duration::from_millis(args.interval_ms.or(file.interval_ms).unwrap_or(200).max(10));
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
    ))
}

async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
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
) -> anyhow::Result<()> {
    let client = client(kubeconfig).await?;
    let identity = format!(
        "{}-{}",
        config.scheduler_name,
        std::env::var("HOSTNAME").unwrap_or_else(|_| std::process::id().to_string())
    );
    let metrics = Metrics::default();
    if let Some(addr) = metrics_addr {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        tokio::spawn(metrics::serve(
            listener,
            Arc::new(registry),
            metrics.ready.clone(),
        ));
    }
    let election = leader_elect.then(|| {
        LeaderElection::new(
            kube::Api::namespaced(client.clone(), &lease_namespace),
            &config.scheduler_name,
            &identity,
            Duration::from_secs(15),
        )
    });
    info!(scheduler = %config.scheduler_name, policy = %config.policy, "starting watches");
    let shutdown = crate::signals::shutdown();
    tokio::pin!(shutdown);
    let api = tokio::select! {
        api = KubeApi::start(client, identity.clone(), &config.gpu_resource) => api?,
        _ = &mut shutdown => return Ok(()),
    };
    let mut scheduler = Scheduler::new(api, config);
    let mut leader = election.is_none();
    let mut last_renew = Instant::now() - Duration::from_secs(3600);
    loop {
        if let Some(election) = &election
            && last_renew.elapsed() >= election.renew_every()
        {
            let now_leader = election.try_hold().await;
            if now_leader != leader {
                info!(leader = now_leader, "leadership changed");
            }
            leader = now_leader;
            last_renew = Instant::now();
            metrics.leader.set(i64::from(leader));
        }
        if leader {
            let started = Instant::now();
            match scheduler.round(started).await {
                Ok(report) => metrics.observe(&report, started.elapsed().as_secs_f64()),
                Err(e) => error!(error = %e, "scheduling round failed"),
            }
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// `gpuplace crd`: the PodGroup CustomResourceDefinition as YAML.
pub fn print_crd() -> anyhow::Result<()> {
    let crd = gpuplace_scheduler::gang::crd_json();
    print!(
        "{}",
        serde_saphyr::to_string(&crd).map_err(|e| anyhow::anyhow!("{e}"))?
    );
    Ok(())
}

/// `fgd=2,best-fit=1` -> [(Fgd, 2), (BestFit, 1)].
fn parse_weights(text: &str) -> anyhow::Result<Vec<(Policy, i64)>> {
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
