//! The timeline replay (`gpuplace simulate --timeline`): the cluster over time. Pods arrive
//! at an offered load, wait in the scheduler's queue when nothing fits, run for their trace
//! duration and leave; what operators feel is measured: how busy the GPUs are, how
//! fragmented, how much demand waits and how long each shape of pod waits.
//!
//! - [`durations`]: how long each pod runs;
//! - [`arrivals`]: the arrival units, the rate that gives the load, the warm start;
//! - [`engine`]: the event loop with the scheduler's queue and core's placements;
//! - [`metrics`]: integrals, series and waits; [`summary`]: means over seeds and reports.

pub mod arrivals;
pub mod durations;
pub mod engine;
pub mod metrics;
mod plot;
pub mod summary;

use std::collections::BTreeMap;
use std::ops::Add;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::queue::QueueConfig;
use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use rayon::prelude::*;
use serde::Serialize;

pub use arrivals::{Mix, Schedule};
pub use durations::{DurationError, DurationModel};
pub use engine::Job;
pub use metrics::{Class, Means, Series, Waits};

use crate::replay::{SimError, Workload};

/// Simulated time in milliseconds since the replay started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Ms(pub u64);

impl Add<Duration> for Ms {
    type Output = Ms;

    fn add(self, d: Duration) -> Ms {
        Ms(self
            .0
            .saturating_add(d.as_millis().min(u128::from(u64::MAX)) as u64))
    }
}

/// How a timeline replay runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineOptions {
    /// Offered load: GPU-seconds asked per second over GPU capacity (`--load`).
    pub load: f64,
    /// Units arriving after the start (`--arrivals`).
    pub arrivals: usize,
    /// Share of the arrivals whose pods and time are left out of the metrics (`--warmup`).
    pub warmup: f64,
    pub durations: DurationModel,
    /// A pod that fits nowhere evicts lower-priority pods (`--preempt`).
    pub preempt: bool,
    /// Start from the mix's stationary population instead of an empty cluster.
    pub warm_start: bool,
    /// The scheduler's backoff and parking.
    pub queue: QueueConfig,
    /// Points of the series over time.
    pub series_points: usize,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            load: 0.95,
            arrivals: 50_000,
            warmup: 0.2,
            durations: DurationModel::default(),
            preempt: false,
            warm_start: true,
            queue: QueueConfig::default(),
            series_points: 240,
        }
    }
}

/// Why a timeline replay cannot run.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error(transparent)]
    Workload(#[from] SimError),
    #[error(transparent)]
    Durations(#[from] DurationError),
    #[error("--load must be between 0.01 and 10, got {0}")]
    Load(f64),
    #[error("--arrivals must be between 10 and {MAX_TIMELINE_ARRIVALS}, got {0}")]
    Arrivals(usize),
    #[error("--warmup must be at least 0 and below 1, got {0}")]
    Warmup(f64),
}

/// The most arrivals one timeline replay may take (bounds its time and memory).
pub const MAX_TIMELINE_ARRIVALS: usize = 2_000_000;

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
    /// Simulated time: the window, and the whole run (s).
    pub window_s: f64,
    pub simulated_s: f64,
    pub arrivals_per_s: f64,
    pub rounds: u64,
    pub attempts: u64,
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

/// A workload made ready for timeline replays.
pub struct Timeline {
    base: ClusterState,
    workload: Workload,
    mix: Mix,
    request_ids: Vec<u32>,
    options: TimelineOptions,
}

impl Timeline {
    /// Validates the workload and options, binds FGD's target workload (the pod list's
    /// shapes) and works out each pod's run time.
    pub fn new(workload: Workload, options: TimelineOptions) -> Result<Self, TimelineError> {
        if !(options.load.is_finite() && (0.01..=10.0).contains(&options.load)) {
            return Err(TimelineError::Load(options.load));
        }
        if !(10..=MAX_TIMELINE_ARRIVALS).contains(&options.arrivals) {
            return Err(TimelineError::Arrivals(options.arrivals));
        }
        if !(options.warmup.is_finite() && (0.0..1.0).contains(&options.warmup)) {
            return Err(TimelineError::Warmup(options.warmup));
        }
        options.durations.validate()?;
        let mut base = ClusterState::new(workload.nodes.clone()).map_err(SimError::from)?;
        if base.gpu_capacity_milli() == 0 {
            return Err(SimError::NoGpus.into());
        }
        if workload.pods.is_empty() {
            return Err(SimError::NoPods.into());
        }
        if workload
            .pods
            .iter()
            .all(|p| p.request.total_gpu_milli() == 0)
        {
            return Err(SimError::NoGpuPods.into());
        }
        let mix = Mix::new(&workload.pods, &options.durations);
        let target = TargetWorkload::from_requests(workload.pods.iter().map(|p| &p.request), 0.95);
        base.set_workload(Arc::new(target));
        let mut ids: std::collections::HashMap<&gpuplace_model::Request, u32> = Default::default();
        let request_ids = workload
            .pods
            .iter()
            .map(|p| {
                let next = ids.len() as u32;
                *ids.entry(&p.request).or_insert(next)
            })
            .collect();
        Ok(Timeline {
            base,
            workload,
            mix,
            request_ids,
            options,
        })
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    pub fn options(&self) -> &TimelineOptions {
        &self.options
    }

    pub fn mix(&self) -> &Mix {
        &self.mix
    }

    pub fn gpu_count(&self) -> usize {
        self.workload.nodes.iter().map(|n| n.gpus.len()).sum()
    }

    /// What arrives in seed `seed`'s replay.
    pub fn schedule(&self, seed: u64) -> Schedule {
        arrivals::schedule(
            &self.mix,
            self.base.gpu_capacity_milli(),
            self.options.load,
            self.options.arrivals,
            seed,
            self.options.warm_start,
        )
    }

    /// The arrival index where the measurement window starts.
    pub fn warmup_index(&self) -> usize {
        (self.options.arrivals as f64 * self.options.warmup).floor() as usize
    }

    /// The placer's tie-break seed for arrival seed `seed` (as the static replay's).
    pub fn placer_seed(seed: u64) -> u64 {
        seed ^ 0x9e37_79b9_7f4a_7c15
    }

    /// Replays one policy with one seed.
    pub fn run(&self, policy: Policy, seed: u64) -> TimelineRun {
        self.run_with_jobs(policy, seed).0
    }

    /// [`run`](Self::run), with every pod's life (for checks).
    pub fn run_with_jobs(&self, policy: Policy, seed: u64) -> (TimelineRun, Vec<Job>) {
        let started = Instant::now();
        let schedule = self.schedule(seed);
        let engine = engine::Engine::new(
            &self.workload.pods,
            &self.mix,
            &self.request_ids,
            self.base.clone(),
            Placer::new(policy, Self::placer_seed(seed)),
            &self.options,
        );
        let outcome = engine.run(&schedule, self.warmup_index(), self.options.series_points);
        let run = self.measure(policy, seed, &schedule, &outcome, started.elapsed());
        (run, outcome.jobs)
    }

    fn measure(
        &self,
        policy: Policy,
        seed: u64,
        schedule: &Schedule,
        outcome: &engine::Outcome,
        elapsed: Duration,
    ) -> TimelineRun {
        let recorder = &outcome.recorder;
        let end = schedule.arrivals.last().map_or(Ms(0), |a| a.at);
        let from = schedule
            .arrivals
            .get(
                self.warmup_index()
                    .min(schedule.arrivals.len().saturating_sub(1)),
            )
            .map_or(Ms(0), |a| a.at);
        let pods = &self.workload.pods;
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
        let capacity = self.base.gpu_capacity_milli() as f64;
        let run_ms = end.0.max(1) as f64;
        TimelineRun {
            policy,
            seed,
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
            window_s,
            simulated_s: end.0 as f64 / 1e3,
            arrivals_per_s: schedule.rate_per_s,
            rounds: outcome.rounds,
            attempts: outcome.attempts,
            elapsed,
        }
    }
}

#[cfg(test)]
mod tests;

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

/// Runs every (policy, seed) pair in parallel; `done` is called as each finishes.
pub fn run_all(
    timeline: &Timeline,
    policies: &[Policy],
    seeds: &[u64],
    done: &(dyn Fn(&TimelineRun) + Sync),
) -> Result<Vec<TimelineRun>, TimelineError> {
    if policies.is_empty() {
        return Err(SimError::NoPolicies.into());
    }
    if seeds.is_empty() {
        return Err(SimError::NoSeeds.into());
    }
    let jobs: Vec<(Policy, u64)> = policies
        .iter()
        .flat_map(|&p| seeds.iter().map(move |&s| (p, s)))
        .collect();
    let mut runs: Vec<TimelineRun> = jobs
        .par_iter()
        .map(|&(policy, seed)| {
            let run = timeline.run(policy, seed);
            done(&run);
            run
        })
        .collect();
    runs.sort_by_key(|r| {
        (
            policies.iter().position(|p| *p == r.policy).unwrap_or(0),
            r.seed,
        )
    });
    Ok(runs)
}
