//! What one (policy, seed) timeline replay measured.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuplace_core::Policy;
use serde::Serialize;

use super::arrivals::Schedule;
use super::engine::Outcome;
use super::metrics::{Class, Means, Series, Waits};
use super::options::Ms;
use crate::trace::TracePod;

/// What one (policy, seed) timeline replay measured (over the window after the warm-up).
#[derive(Clone, Debug, Serialize)]
pub struct TimelineRun {
    #[serde(serialize_with = "policy_name")]
    pub policy: Policy,
    pub seed: u64,
    pub means: Means,
    /// Waits per class, seconds.
    pub waits: BTreeMap<Class, Waits>,
    /// Per class, the wait (s) at each percent 0..=100 of its pods, for CDF plots.
    pub cdf: BTreeMap<Class, Vec<f64>>,
    /// Pods that arrived in the window and had not started by its end.
    pub never_started: usize,
    /// Pods that arrived in the window.
    pub arrived: usize,
    /// GPU-hours of the pods that finished in the window (whole runs).
    pub completed_gpu_hours: f64,
    /// GPU-hours of work done in the window (allocation integrated over time).
    pub busy_gpu_hours: f64,
    /// The same over the whole run, warm-up included.
    pub run_busy_gpu_hours: f64,
    /// Little's law's three terms over the window: pods waiting (time mean), arrivals per
    /// second, mean wait (s).
    pub little: Little,
    pub series: Series,
    pub preempted_pods: usize,
    pub preempted_gpus: f64,
    /// Work evicted before it finished, % of the GPU time of the whole run.
    pub work_lost_pct: f64,
    /// Defragmentation: pods moved, GPUs moved per simulated hour, and the work the moves
    /// threw away, % of the GPU time of the whole run (0 when checkpointed).
    pub moved_pods: u64,
    pub moved_gpus_per_hour: f64,
    pub move_lost_pct: f64,
    /// Simulated time: the window, and the whole run (s).
    pub window_s: f64,
    pub simulated_s: f64,
    pub arrivals_per_s: f64,
    pub rounds: u64,
    pub attempts: u64,
    /// Tenants' fairness and guarantees (`--tenants`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<super::engine::TenantRun>,
    #[serde(skip)]
    pub elapsed: Duration,
}

fn policy_name<S: serde::Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// L = lambda * W, over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Little {
    pub waiting: f64,
    pub arrivals_per_s: f64,
    pub mean_wait_s: f64,
}

/// What [`measure`] needs besides the replay's outcome.
pub(super) struct Context<'a> {
    pub policy: Policy,
    pub seed: u64,
    pub pods: &'a [TracePod],
    /// The arrival index where the measurement window starts.
    pub warmup: usize,
    pub capacity_milli: u64,
}

/// What one replay measured, from its pods' lives and the recorder.
pub(super) fn measure(
    context: &Context<'_>,
    schedule: &Schedule,
    outcome: &Outcome,
    elapsed: Duration,
) -> TimelineRun {
    let recorder = &outcome.recorder;
    let end = schedule.arrivals.last().map_or(Ms(0), |a| a.at);
    let from = schedule
        .arrivals
        .get(
            context
                .warmup
                .min(schedule.arrivals.len().saturating_sub(1)),
        )
        .map_or(Ms(0), |a| a.at);
    let pods = context.pods;
    let mut waits: BTreeMap<Class, (Vec<f64>, usize)> = BTreeMap::new();
    let (mut all, mut arrived, mut never, mut completed) = (0.0, 0usize, 0usize, 0.0);
    for job in &outcome.jobs {
        let request = &pods[job.pod as usize].request;
        if job.measured {
            let wait = job.start.unwrap_or(end).0.saturating_sub(job.arrival.0) as f64 / 1e3;
            arrived += 1;
            all += wait;
            never += usize::from(job.start.is_none());
            for class in Class::of(request) {
                let entry = waits.entry(class).or_default();
                entry.0.push(wait);
                entry.1 += usize::from(job.start.is_none());
            }
        }
        if let (Some(start), Some(stop)) = (job.start, job.end)
            && !job.evicted
            && stop >= from
        {
            completed += request.total_gpu_milli() as f64 * (stop.0 - start.0) as f64;
        }
    }
    let cdf = waits
        .iter()
        .map(|(class, (w, _))| (*class, percentiles(w)))
        .collect();
    let window_s = recorder.window_ms() / 1e3;
    let means = recorder.means();
    let capacity = context.capacity_milli as f64;
    let run_ms = end.0.max(1) as f64;
    TimelineRun {
        policy: context.policy,
        seed: context.seed,
        means,
        waits: waits
            .into_iter()
            .map(|(c, (w, n))| (c, Waits::of(w, n)))
            .collect(),
        cdf,
        never_started: never,
        arrived,
        completed_gpu_hours: completed / 1e3 / 3.6e6,
        busy_gpu_hours: recorder.window.allocated / 1e3 / 3.6e6,
        run_busy_gpu_hours: recorder.allocated_all / 1e3 / 3.6e6,
        little: Little {
            waiting: means.waiting,
            arrivals_per_s: arrived as f64 / window_s.max(1e-9),
            mean_wait_s: if arrived > 0 {
                all / arrived as f64
            } else {
                0.0
            },
        },
        series: recorder.series.clone(),
        preempted_pods: outcome.preempted_pods,
        preempted_gpus: outcome.preempted_milli as f64 / 1e3,
        work_lost_pct: 100.0 * outcome.lost_milli_ms as f64 / (capacity * run_ms),
        moved_pods: outcome.defrag.moved_pods,
        moved_gpus_per_hour: outcome.defrag.moved_milli as f64 / 1e3 / (run_ms / 3.6e6),
        move_lost_pct: 100.0 * outcome.defrag.lost_milli_ms as f64 / (capacity * run_ms),
        window_s,
        simulated_s: end.0 as f64 / 1e3,
        arrivals_per_s: schedule.rate_per_s,
        rounds: outcome.rounds,
        attempts: outcome.attempts,
        tenants: outcome.tenants.clone(),
        elapsed,
    }
}

/// The value at each percent 0..=100 of `values` (nearest rank).
fn percentiles(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return Vec::new();
    }
    (0..=100)
        .map(|p| {
            let rank = ((p as f64 / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        })
        .collect()
}
