//! Scheduler metrics (`/metrics`), with `/healthz` and `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::scheduler::RoundReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// Everything the scheduler exports.
#[derive(Clone)]
pub struct Metrics {
    pub attempts: Family<ResultLabel, Counter>,
    pub round_seconds: Histogram,
    pub pending: Gauge,
    pub gpus_total: Gauge,
    pub gpus_allocated: Gauge,
    pub fragmentation_gpus: Gauge,
    pub leader: Gauge,
    pub ready: Arc<AtomicBool>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            attempts: Family::default(),
            round_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            pending: Gauge::default(),
            gpus_total: Gauge::default(),
            gpus_allocated: Gauge::default(),
            fragmentation_gpus: Gauge::default(),
            leader: Gauge::default(),
            ready: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gpuplace_scheduler");
        r.register(
            "attempts",
            "Scheduling attempts by result",
            self.attempts.clone(),
        );
        r.register(
            "round_seconds",
            "Duration of a scheduling round",
            self.round_seconds.clone(),
        );
        r.register(
            "pending_pods",
            "Pods of this scheduler waiting for a node",
            self.pending.clone(),
        );
        r.register("gpus", "GPUs in the cluster", self.gpus_total.clone());
        r.register(
            "gpus_allocated",
            "GPUs allocated (fractions summed)",
            self.gpus_allocated.clone(),
        );
        r.register(
            "fragmentation_gpus",
            "GPUs fragmented under FGD's measure",
            self.fragmentation_gpus.clone(),
        );
        r.register(
            "leader",
            "1 while this instance holds the lease",
            self.leader.clone(),
        );
    }

    /// Records one round.
    pub fn observe(&self, report: &RoundReport, seconds: f64) {
        for (result, n) in [
            ("bound", report.bound),
            ("unschedulable", report.unschedulable),
            ("conflict", report.conflicts),
        ] {
            self.attempts
                .get_or_create(&ResultLabel {
                    result: result.into(),
                })
                .inc_by(n as u64);
        }
        self.round_seconds.observe(seconds);
        self.pending.set(report.pending as i64);
        self.gpus_total
            .set((report.gpu_capacity_milli / 1000) as i64);
        self.gpus_allocated
            .set((report.gpu_allocated_milli / 1000) as i64);
        self.fragmentation_gpus
            .set((report.fragmentation_milli / 1000) as i64);
        self.ready.store(true, Ordering::Relaxed);
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` (ready after the first round).
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut out = String::new();
                    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        out,
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { (StatusCode::OK, "ok") }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready.load(Ordering::Relaxed) {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        );
    let _ = axum::serve(listener, app).await;
}
