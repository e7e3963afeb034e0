//! Start-up wiring of the standalone scheduler (watches, leader election, the loop) and of
//! the extender (watches, then its HTTP verbs), each task with its owner and a shutdown
//! path. The binary parses flags, serves the metrics and probes, and calls [`serve`] or
//! [`serve_extender`].

use std::future::Future;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tracing::info;

use crate::api::ApiError;
use crate::extender::http::{ExtenderMetrics, router};
use crate::extender::{Extender, ExtenderConfig};
use crate::k8s::kube_api::KubeApi;
use crate::k8s::leader::{ElectionConfig, Elector, Ended, Gate, KubeLeases};
use crate::metrics::{Health, Metrics};
use crate::scheduler::run::{Heartbeat, LoopConfig};
use crate::{RoundReport, Scheduler, SchedulerConfig};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("lost the scheduler lease; exiting so the pod restarts as a standby")]
    LeaseLost,
    #[error("leader election task failed: {0}")]
    Election(#[from] tokio::task::JoinError),
    #[error("extender server failed: {0}")]
    Serve(#[from] std::io::Error),
}

/// How the process runs, beside what the scheduler decides ([`SchedulerConfig`]).
#[derive(Clone, Debug)]
pub struct Options {
    /// Only the holder of the Lease schedules.
    pub leader_elect: bool,
    pub lease_namespace: String,
    /// The loop's longest sleep without an event.
    pub interval: Duration,
    /// The client's own rate limit (0: none) and burst, as client-go's flags.
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
}

/// What the process exports: the metrics, and the health the probes answer from.
#[derive(Clone)]
pub struct Observed {
    pub metrics: Metrics,
    pub health: Health,
    pub heartbeat: Heartbeat,
    /// The live GPU map, when served: attached to the view once the caches are synced,
    /// fed every round.
    pub ui: Option<std::sync::Arc<crate::ui::Ui<KubeApi>>>,
}

/// Runs the scheduler until `shutdown` (or, with leader election, until the lease is lost:
/// then `Err(LeaseLost)` so the pod restarts as a standby).
pub async fn serve(
    client: Client,
    config: SchedulerConfig,
    options: Options,
    observed: Observed,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let identity = identity(&config.scheduler_name);
    info!(scheduler = %config.scheduler_name, policy = %config.policy, "starting watches");
    let stopped = stop_on(shutdown);
    let api = tokio::select! {
        api = KubeApi::start_with(client.clone(), identity.clone(), &config.gpu_resource, config.dra.clone()) => {
            api?.with_rate_limit(options.kube_api_qps, options.kube_api_burst)
        }
        _ = until_stopped(stopped.clone()) => return Ok(()),
    };
    // Standbys are ready too: their caches are synced, so a rolling update proceeds.
    observed.health.set_ready();
    let gate = if options.leader_elect {
        Gate::closed()
    } else {
        Gate::always_open()
    };
    let election = options.leader_elect.then(|| {
        let leases = KubeLeases::new(
            kube::Api::namespaced(client.clone(), &options.lease_namespace),
            &config.scheduler_name,
        );
        let elector = Elector::new(
            leases,
            ElectionConfig::new(&config.scheduler_name, &identity),
            gate.clone(),
        );
        tokio::spawn(elector.run(until_stopped(stopped.clone())))
    });
    let Observed {
        metrics,
        heartbeat,
        ui,
        ..
    } = observed;
    let scheduler = Scheduler::with_gate(api.clone(), config, gate.clone());
    if let Some(ui) = &ui {
        ui.attach(api, scheduler.reasons());
    }
    let leader_metric = metrics.leader.clone();
    let observe = |report: &RoundReport, took: Duration| {
        leader_metric.set(i64::from(gate.is_open()));
        metrics.observe(report, took.as_secs_f64());
        if let Some(ui) = &ui {
            ui.history().record_round(report, took);
        }
        trace_round(report, took);
    };
    let loop_config = LoopConfig {
        tick: options.interval,
        ..LoopConfig::default()
    };
    let Some(election) = election else {
        scheduler
            .run(loop_config, heartbeat, until_stopped(stopped), observe)
            .await;
        return Ok(());
    };
    let led = Led {
        scheduler,
        loop_config,
        heartbeat,
        stopped,
        election,
    };
    led.run(observe).await
}

/// This replica's name for Events and the Lease: `prefix-` and the pod's hostname (else
/// the process id).
fn identity(prefix: &str) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| std::process::id().to_string());
    format!("{prefix}-{host}")
}

/// A flag every task can wait on, set when `shutdown` completes.
fn stop_on(shutdown: impl Future<Output = ()> + Send + 'static) -> watch::Receiver<bool> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    stopped
}

async fn until_stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The loop under leader election: it stops with the election, on shutdown (lease
/// released) or at once when the lease is lost (the gate is already closed: nothing more
/// is decided or written).
struct Led {
    scheduler: Scheduler<KubeApi>,
    loop_config: LoopConfig,
    heartbeat: Heartbeat,
    stopped: watch::Receiver<bool>,
    election: tokio::task::JoinHandle<Ended>,
}

impl Led {
    async fn run(self, observe: impl FnMut(&RoundReport, Duration)) -> Result<(), AppError> {
        let Led {
            scheduler,
            loop_config,
            heartbeat,
            stopped,
            mut election,
        } = self;
        let (lost_tx, lost_rx) = watch::channel(false);
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
                // Shut down: the loop has drained its Bindings; the election releases the
                // lease (it saw the same signal) before the process ends.
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
        match ended? {
            Ended::Stopped => Ok(()),
            Ended::Lost => Err(AppError::LeaseLost),
        }
    }
}

/// How the extender runs, beside what it decides ([`ExtenderConfig`]).
#[derive(Clone, Debug)]
pub struct ExtenderOptions {
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    /// Larger request bodies are refused with HTTP 400.
    pub max_body_bytes: usize,
}

/// Serves the extender's verbs on `listener` until `shutdown`: watches first (`ready` is
/// set once the caches are synced), then filter, prioritize and bind, with `extra` routes
/// (metrics and probes, when they share the listener) merged in.
pub async fn serve_extender<L>(
    client: Client,
    config: ExtenderConfig,
    options: ExtenderOptions,
    listener: L,
    served: ServedExtender,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let identity = identity("gpuplace-extender");
    info!(mode = ?config.filter_mode, policy = %config.policy, "starting watches");
    let stopped = stop_on(shutdown);
    let api = tokio::select! {
        api = KubeApi::start(client, identity, &config.gpu_resource) => {
            api?.with_rate_limit(options.kube_api_qps, options.kube_api_burst)
        }
        _ = until_stopped(stopped.clone()) => return Ok(()),
    };
    served
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let extender = std::sync::Arc::new(Extender::new(api, config));
    let app = router(extender, served.metrics, options.max_body_bytes);
    let app = match served.extra {
        Some(extra) => app.merge(extra),
        None => app,
    };
    info!("serving the extender");
    axum::serve(listener, app)
        .with_graceful_shutdown(until_stopped(stopped))
        .await?;
    Ok(())
}

/// What the extender's caller observes and adds: its metrics, the readiness flag the
/// probes read, and routes to serve beside the verbs.
pub struct ServedExtender {
    pub metrics: ExtenderMetrics,
    pub ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub extra: Option<axum::Router>,
}

/// One line per round that built a view (`RUST_LOG=gpuplace_scheduler::rounds=debug`): its
/// length and phases, what it decided, and the writes it left queued, for a trace of a run.
fn trace_round(report: &RoundReport, took: Duration) {
    if report.idle || took.is_zero() {
        return;
    }
    let t = &report.timings;
    tracing::debug!(
        target: "gpuplace_scheduler::rounds",
        took_ms = took.as_millis() as u64,
        view_ms = t.view.as_millis() as u64,
        snapshot_ms = t.snapshot.as_millis() as u64,
        decide_ms = (t.filter + t.core).as_millis() as u64,
        api_ms = t.api.as_millis() as u64,
        queues_ms = t.queues.as_millis() as u64,
        assumed = report.assumed,
        bound = report.bound,
        unschedulable = report.unschedulable,
        pending = report.pending,
        more = report.more,
        in_flight = report.in_flight,
        reservations = report.reservations,
        events_queued = report.events_queued,
        "round"
    );
}
