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
pub mod observed;
pub mod options;
pub mod patience;
mod plot;
pub mod pods;
pub mod pods_csv;
pub mod report;
pub mod run;
pub mod summary;
pub mod tenant_summary;
pub mod tenants;

use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use rayon::prelude::*;

pub use arrivals::{Mix, Schedule};
pub use durations::{DurationError, DurationModel};
pub use engine::Job;
pub use metrics::{Class, Means, Series, Waits};
pub use options::{Ms, TimelineOptions};
pub use run::{Little, TimelineRun};

use crate::replay::SimError;
use crate::workload::Workload;

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
    #[error("--tenants: {0}")]
    Tenants(#[from] tenants::TenantsError),
    #[error(
        "the replay would simulate about {hours:.0} h ({arrivals} arrivals at {per_hour:.3} per hour), past the most of {MAX_SIMULATED_H} h: lower --arrivals, --min-duration or --duration-scale, or raise --load"
    )]
    TooLong {
        hours: f64,
        arrivals: usize,
        per_hour: f64,
    },
    #[error(
        "the warm start would hold about {units:.0} units at t=0, past the most of {MAX_WARM_UNITS}: lower --min-duration or --duration-scale, or add --cold-start"
    )]
    WarmTooLarge { units: f64 },
}

/// The most simulated time one replay may cover, hours (the engine's work grows with it).
pub const MAX_SIMULATED_H: f64 = 20_000.0;
/// The most units a warm start may hold at t=0.
pub const MAX_WARM_UNITS: f64 = 2_000_000.0;

/// The most arrivals one timeline replay may take (bounds its time and memory).
pub const MAX_TIMELINE_ARRIVALS: usize = 2_000_000;

/// A workload made ready for timeline replays.
pub struct Timeline {
    base: ClusterState,
    workload: Workload,
    mix: Mix,
    request_ids: Vec<u32>,
    options: TimelineOptions,
    tenants: Option<tenants::Tenants>,
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
        let mut workload = workload;
        if options.no_priorities {
            workload.pods.iter_mut().for_each(|p| p.priority = 0);
        }
        let mix = Mix::new(&workload.pods, &options.durations);
        check_bounds(&mix, base.gpu_capacity_milli(), &options)?;
        if options.whole_gpus {
            whole_gpus(&mut workload.pods);
        }
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
        let tenants = match &options.tenants {
            Some(file) => {
                let capacity = [
                    base.gpu_capacity_milli(),
                    workload.nodes.iter().map(|n| n.cpu_milli).sum(),
                    workload.nodes.iter().map(|n| n.memory_mib).sum(),
                ];
                Some(tenants::Tenants::new(file, capacity, &workload.pods)?)
            }
            None => None,
        };
        Ok(Timeline {
            base,
            workload,
            mix,
            request_ids,
            options,
            tenants,
        })
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    pub fn options(&self) -> &TimelineOptions {
        &self.options
    }

    /// The queues and each pod's queue (`--tenants`).
    pub fn tenants(&self) -> Option<&tenants::Tenants> {
        self.tenants.as_ref()
    }

    /// GPU milli of the whole cluster.
    pub fn capacity_milli(&self) -> u64 {
        self.base.gpu_capacity_milli()
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

    /// What [`run::measure`] needs of this timeline for `policy`'s run of `seed` (the
    /// simulated and the live runs are measured alike).
    fn context(&self, policy: Policy, seed: u64) -> run::Context<'_> {
        run::Context {
            policy,
            seed,
            pods: &self.workload.pods,
            warmup: self.warmup_index(),
            capacity_milli: self.base.gpu_capacity_milli(),
            checkpointed: self.options.checkpointed,
            record_pods: self.options.record_pods,
        }
    }

    /// Replays one policy with one seed.
    pub fn run(&self, policy: Policy, seed: u64) -> TimelineRun {
        self.run_with_jobs(policy, seed).0
    }

    /// [`run`](Self::run), with every pod's life (for checks).
    pub fn run_with_jobs(&self, policy: Policy, seed: u64) -> (TimelineRun, Vec<Job>) {
        let started = Instant::now();
        let schedule = self.schedule(seed);
        let engine = self.engine(policy, seed);
        let outcome = engine.run(&schedule, self.warmup_index(), self.options.series_points);
        let run = run::measure(
            &self.context(policy, seed),
            &schedule,
            &outcome,
            started.elapsed(),
        );
        (run, outcome.jobs)
    }

    /// The replay's engine for `policy` on `seed`'s arrivals: the cluster at its start, the
    /// placer's tie-break as the options say.
    pub(crate) fn engine(&self, policy: Policy, seed: u64) -> engine::Engine<'_> {
        engine::Engine::new(
            engine::Inputs {
                pods: &self.workload.pods,
                mix: &self.mix,
                request_ids: &self.request_ids,
            },
            self.base.clone(),
            Placer::new(
                policy,
                self.options.scheduler_seed.unwrap_or_else(|| {
                    Self::placer_seed(self.options.tie_break_seed.unwrap_or(seed))
                }),
            )
            .with_percentage_of_nodes_to_score(self.options.percentage_of_nodes_to_score),
            &self.options,
            self.tenants.as_ref(),
            seed,
        )
    }
}

#[cfg(test)]
mod tests;

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

/// Gives every share a whole GPU (`--whole-gpus`).
pub fn whole_gpus(pods: &mut [crate::trace::TracePod]) {
    for pod in pods {
        if pod.request.gpu_count > 0 && pod.request.gpu_milli < 1000 {
            pod.request.gpu_count = 1;
            pod.request.gpu_milli = 1000;
        }
    }
}

/// Refuses ahead a replay whose simulated time or warm start would have no useful end,
/// with the estimate (the arrival rate is fixed by the load, so long runs mean few arrivals
/// per hour and a long clock).
fn check_bounds(
    mix: &Mix,
    capacity_milli: u64,
    options: &TimelineOptions,
) -> Result<(), TimelineError> {
    let per_ms = mix.rate_per_ms(capacity_milli, options.load);
    if per_ms <= 0.0 {
        return Ok(());
    }
    let hours = options.arrivals as f64 / per_ms / 3_600_000.0;
    if !(hours.is_finite() && hours <= MAX_SIMULATED_H) {
        return Err(TimelineError::TooLong {
            hours,
            arrivals: options.arrivals,
            per_hour: per_ms * 3_600_000.0,
        });
    }
    if options.warm_start {
        let units = mix.warm_mean(per_ms);
        if !(units.is_finite() && units <= MAX_WARM_UNITS) {
            return Err(TimelineError::WarmTooLarge { units });
        }
    }
    Ok(())
}
