//! `gpuplace extender`: gpuplace's placement inside the stock kube-scheduler, as its HTTP
//! extender (filter, prioritize, bind), with /metrics, /healthz and /readyz on the same
//! listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use axum::serve::ListenerExt;
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_scheduler::app;
use gpuplace_scheduler::extender::http::{DEFAULT_MAX_BODY_BYTES, ExtenderMetrics};
use gpuplace_scheduler::extender::{ExtenderConfig, FilterMode};
use tracing::info;

#[derive(Args, Debug)]
pub struct ExtenderArgs {
    /// Kubeconfig file [default: in-cluster config, or $KUBECONFIG, or ~/.kube/config].
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Serve the extender verbs (POST /filter, /prioritize, /bind) here; also /metrics,
    /// /healthz and /readyz unless --metrics-addr is given. A loopback address only:
    /// kube-scheduler calls its extender in the same pod, and whoever reaches this address
    /// could make the extender post Bindings with its ServiceAccount (kube-scheduler's
    /// extender client sends no credential that could be reviewed).
    #[arg(long, env = "GPUPLACE_LISTEN", default_value = "127.0.0.1:8888", value_parser = loopback_addr)]
    listen: SocketAddr,
    /// Serve /metrics, /healthz and /readyz on their own address (not loopback: over TLS,
    /// callers need a bearer token allowed `get` on /metrics).
    #[arg(long, env = "GPUPLACE_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    #[command(flatten)]
    tls: crate::ops::TlsArgs,
    /// `best`: filter passes only the node gpuplace would choose (kube-scheduler's own
    /// scores cannot undo the placement); `all`: every fitting node passes and prioritize
    /// ranks them.
    #[arg(long, env = "GPUPLACE_FILTER_MODE", default_value = "best")]
    filter_mode: FilterMode,
    /// Placement policy (`gpuplace policies`).
    #[arg(long, env = "GPUPLACE_POLICY", default_value = "gpuplace")]
    policy: Policy,
    /// Score by a weighted sum of policies, e.g. `fgd=2,best-fit=1` (weights 1-100).
    #[arg(long, env = "GPUPLACE_WEIGHTS")]
    weights: Option<String>,
    /// GPU extended resource.
    #[arg(long, env = "GPUPLACE_RESOURCE", default_value = "nvidia.com/gpu")]
    resource: String,
    /// Seed of the node order that breaks ties.
    #[arg(long, env = "GPUPLACE_SEED", default_value_t = 42)]
    seed: u64,
    /// FGD's target workload from a pod list (the simulator's CSV), e.g. the cluster's
    /// history [default: the pods' shapes, every 10 s].
    #[arg(long, env = "GPUPLACE_FGD_WORKLOAD")]
    fgd_workload: Option<std::path::PathBuf>,
    /// Largest request body accepted (larger ones get 400).
    #[arg(long, env = "GPUPLACE_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// The extender's own requests per second to the API server (Bindings, reads), after
    /// a burst (0: no limit).
    #[arg(long, env = "GPUPLACE_KUBE_API_QPS", default_value_t = 0.0)]
    kube_api_qps: f64,
    #[arg(long, env = "GPUPLACE_KUBE_API_BURST", default_value_t = 100)]
    kube_api_burst: u32,
    /// JSON log lines.
    #[arg(long)]
    log_json: bool,
}

pub fn run(args: ExtenderArgs) -> anyhow::Result<()> {
    crate::logging::init(args.log_json);
    let weights = match &args.weights {
        Some(text) => crate::scheduler::parse_weights(text)?,
        None => Vec::new(),
    };
    gpuplace_core::Placer::new(args.policy, 0).with_weights(&weights)?;
    if !(args.kube_api_qps >= 0.0 && args.kube_api_qps.is_finite()) {
        anyhow::bail!(
            "kube-api-qps {} is not a number of requests per second",
            args.kube_api_qps
        );
    }
    let config = ExtenderConfig {
        policy: args.policy,
        weights,
        seed: args.seed,
        gpu_resource: args.resource.clone(),
        filter_mode: args.filter_mode,
        workload: args
            .fgd_workload
            .as_deref()
            .map(crate::scheduler::fgd_workload)
            .transpose()?,
        ..Default::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args, config))
}

async fn serve(args: ExtenderArgs, config: ExtenderConfig) -> anyhow::Result<()> {
    let client = crate::kube_client::client(args.kubeconfig.clone()).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    // kube-scheduler waits for each filter answer: never let Nagle hold one back.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let ready = Arc::new(AtomicBool::new(false));
    let metrics = ExtenderMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let is_ready = Arc::clone(&ready);
    let probes = crate::ops::Probes {
        healthz: Arc::new(|| Ok("ok")),
        readyz: Arc::new(move || {
            if is_ready.load(Ordering::Relaxed) {
                Ok("ready")
            } else {
                Err("caches not synced")
            }
        }),
    };
    let registry = Arc::new(registry);
    // Health and metrics on their own address answer from the start (not ready until the
    // caches are synced); otherwise they join the extender's routes.
    let ops = match args.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            let exposure =
                crate::ops::exposure(addr, &args.tls, Some(client.clone()), false).await?;
            tokio::spawn(crate::ops::serve(
                listener, registry, probes, None, exposure,
            ));
            None
        }
        // On the extender's own address (plain HTTP on loopback, for kube-scheduler).
        None => Some(crate::ops::router(registry, probes)),
    };
    let served = app::ServedExtender {
        metrics,
        ready,
        extra: ops,
    };
    let options = app::ExtenderOptions {
        kube_api_qps: args.kube_api_qps,
        kube_api_burst: args.kube_api_burst,
        max_body_bytes: args.max_body_bytes,
    };
    info!(listen = %args.listen, "extender starting");
    let shutdown = crate::signals::shutdown();
    Ok(app::serve_extender(client, config, options, listener, served, shutdown).await?)
}

/// `--listen`: a socket address on loopback, or the reason it is refused.
fn loopback_addr(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|e| format!("{value:?} is not an address and port: {e}"))?;
    if gpuplace_scheduler::access::may_serve_open(&addr) {
        Ok(addr)
    } else {
        Err(format!(
            "{addr} is not a loopback address: the extender serves /bind without authentication \
             (kube-scheduler sends it no credential), so anyone reaching it could make it post \
             Bindings; run it beside kube-scheduler on 127.0.0.1 (deploy/base/extender)"
        ))
    }
}
