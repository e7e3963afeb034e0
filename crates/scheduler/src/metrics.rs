//! Scheduler metrics (`/metrics`), with `/healthz` and `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::scheduler::RoundReport;
use crate::scheduler::run::Heartbeat;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// Why defragmentation moved a pod: `make-room` or `rebalance`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// A queue's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Everything the scheduler exports.
#[derive(Clone)]
pub struct Metrics {
    pub attempts: Family<ResultLabel, Counter>,
    pub round_seconds: Histogram,
    pub pending: Gauge,
    pub gpus_total: Gauge,
    pub gpus_allocated: Gauge,
    /// Fractional: a cluster's fragmentation is often under one GPU.
    pub fragmentation_gpus: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub leader: Gauge,
    pub in_flight: Gauge,
    pub reservations: Gauge,
    pub events_dropped: Gauge,
    pub events_queued: Gauge,
    /// Pods evicted by preemption.
    pub preempted: Counter,
    /// Pods moved by defragmentation, by reason.
    pub defrag_moves: Family<ReasonLabel, Counter>,
    /// Preemptors waiting for their victims.
    pub nominated: Gauge,
    /// Duration of one preemption search (candidates, victim search, plan).
    pub preemption_search_seconds: Histogram,
    /// Per queue: GPUs held, guaranteed, its fair share, pods waiting, pods reclaimed.
    pub queue_allocated_gpus: Family<QueueLabel, FloatGauge>,
    pub queue_guaranteed_gpus: Family<QueueLabel, FloatGauge>,
    pub queue_fair_share_gpus: Family<QueueLabel, FloatGauge>,
    pub queue_pending_pods: Family<QueueLabel, Gauge>,
    pub queue_reclaimed_pods: Family<QueueLabel, Counter>,
}

/// What `/readyz` and `/healthz` answer: ready once the caches are synced (standbys too,
/// so a rolling update of the replicas completes); healthy while the scheduling loop beats.
#[derive(Clone, Debug)]
pub struct Health {
    ready: Arc<AtomicBool>,
    heartbeat: Heartbeat,
    stuck_after: Duration,
}

impl Health {
    pub fn new(heartbeat: Heartbeat, stuck_after: Duration) -> Health {
        Health {
            ready: Arc::default(),
            heartbeat,
            stuck_after,
        }
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Healthy until ready (starting), then while the loop's last beat is recent.
    pub fn is_healthy(&self) -> bool {
        !self.is_ready() || self.heartbeat.age() < self.stuck_after
    }
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
            in_flight: Gauge::default(),
            reservations: Gauge::default(),
            events_dropped: Gauge::default(),
            events_queued: Gauge::default(),
            preempted: Counter::default(),
            defrag_moves: Family::default(),
            nominated: Gauge::default(),
            preemption_search_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            queue_allocated_gpus: Family::default(),
            queue_guaranteed_gpus: Family::default(),
            queue_fair_share_gpus: Family::default(),
            queue_pending_pods: Family::default(),
            queue_reclaimed_pods: Family::default(),
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
        r.register(
            "bindings_in_flight",
            "Bindings sent whose outcome the scheduler has not yet taken",
            self.in_flight.clone(),
        );
        r.register(
            "reservations",
            "Pods assumed and not yet seen bound by the watch",
            self.reservations.clone(),
        );
        r.register(
            "events_dropped",
            "Events dropped because too many were queued",
            self.events_dropped.clone(),
        );
        r.register(
            "events_queued",
            "Events waiting to be sent (they yield to Bindings while those are busy)",
            self.events_queued.clone(),
        );
        r.register(
            "preemption_victims",
            "Pods evicted by preemption",
            self.preempted.clone(),
        );
        r.register(
            "defrag_moves",
            "Pods moved by defragmentation (evicted through the Eviction API, their replacements steered), by reason",
            self.defrag_moves.clone(),
        );
        r.register(
            "nominated_pods",
            "Preemptors waiting for their victims to terminate",
            self.nominated.clone(),
        );
        r.register(
            "preemption_search_seconds",
            "Duration of one preemption search (candidates, victim search, plan)",
            self.preemption_search_seconds.clone(),
        );
        let q = registry.sub_registry_with_prefix("gpuplace_queue");
        q.register(
            "allocated_gpus",
            "GPUs held by a queue's pods and its children's (shares as fractions)",
            self.queue_allocated_gpus.clone(),
        );
        q.register(
            "guaranteed_gpus",
            "GPUs guaranteed to a queue",
            self.queue_guaranteed_gpus.clone(),
        );
        q.register(
            "fair_share_gpus",
            "A queue's fair share of the GPUs now (guarantee, then its weight's part of the rest, as far as asked)",
            self.queue_fair_share_gpus.clone(),
        );
        q.register(
            "pending_pods",
            "Pods waiting in a queue and its children",
            self.queue_pending_pods.clone(),
        );
        q.register(
            "reclaimed_pods",
            "Pods of a queue preempted to give other queues their guarantee",
            self.queue_reclaimed_pods.clone(),
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
        self.preempted.inc_by(report.preempted as u64);
        for (reason, n) in [("make-room", report.made_room), ("rebalance", report.moved)] {
            if n > 0 {
                self.defrag_moves
                    .get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    })
                    .inc_by(n as u64);
            }
        }
        for (queue, n) in &report.reclaimed {
            self.queue_reclaimed_pods
                .get_or_create(&QueueLabel {
                    queue: queue.clone(),
                })
                .inc_by(*n as u64);
        }
        for f in &report.queues {
            let label = QueueLabel {
                queue: f.name.clone(),
            };
            let gpus = |milli: u64| milli as f64 / 1000.0;
            self.queue_allocated_gpus
                .get_or_create(&label)
                .set(gpus(f.allocated[0]));
            self.queue_guaranteed_gpus
                .get_or_create(&label)
                .set(gpus(f.guaranteed[0]));
            self.queue_fair_share_gpus
                .get_or_create(&label)
                .set(gpus(f.fair_share[0]));
            self.queue_pending_pods
                .get_or_create(&label)
                .set(i64::from(f.pending_pods));
        }
        for search in &report.preemption_searches {
            self.preemption_search_seconds.observe(search.as_secs_f64());
        }
        if report.idle || seconds == 0.0 {
            // An idle look or settled writes: no round to time, no new picture.
            return;
        }
        self.round_seconds.observe(seconds);
        self.pending.set(report.pending as i64);
        self.in_flight.set(report.in_flight as i64);
        self.reservations.set(report.reservations as i64);
        self.events_dropped.set(report.events_dropped as i64);
        self.events_queued.set(report.events_queued as i64);
        self.nominated.set(report.nominated as i64);
        self.gpus_total
            .set((report.gpu_capacity_milli / 1000) as i64);
        self.gpus_allocated
            .set((report.gpu_allocated_milli / 1000) as i64);
        self.fragmentation_gpus
            .set(report.fragmentation_milli as f64 / 1000.0);
    }
}
