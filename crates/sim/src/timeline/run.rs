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
    /// Pods that arrived in the window and had not started by its end (nor been given up).
    pub never_started: usize,
    /// Pods that arrived in the window and whose user deleted them while they waited.
    pub abandoned: usize,
    /// Pods that arrived in the window.
    pub arrived: usize,
    /// GPU-hours of the pods that finished in the window (whole runs).
    pub completed_gpu_hours: f64,
    /// GPU-hours of work done in the window (allocation integrated over time).
    pub busy_gpu_hours: f64,
    /// Work that was done in the window and not thrown away (evicted pods' work is, unless
    /// checkpointed), % of the window's GPU capacity; allocation also counts GPUs held by
    /// pods starting, terminating or running work that is later thrown away.
    pub goodput_pct: f64,
    /// Work thrown away by evictions and moves over the whole run, GPU-hours (a pod's whole
    /// elapsed run, its age before t=0 included).
    pub gpu_hours_lost: f64,
    /// Pods moved per simulated hour.
    pub moves_per_hour: f64,
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
    /// Attempts that left the pod waiting (`None`: a live report).
    pub failed_attempts: Option<u64>,
    /// Tenants' fairness and guarantees (`--tenants`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<super::engine::TenantRun>,
    /// Per class, the expected start's error (with `--declared-share`).
    pub estimates: BTreeMap<Class, super::engine::EstimateRun>,
    #[serde(skip)]
    pub elapsed: Duration,
    /// Every pod's life (`pods.csv`), when the options ask for it (`record_pods`).
    #[serde(skip)]
    pub pods: Vec<super::pods::PodRecord>,
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
    /// Evicted pods resume (their work is kept).
    pub checkpointed: bool,
    /// Keep every pod's record ([`TimelineRun::pods`]).
    pub record_pods: bool,
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
    let mut waits: BTreeMap<Class, ClassTally> = BTreeMap::new();
    let (mut all, mut arrived, mut never, mut completed) = (0.0, 0usize, 0usize, 0.0);
    let (mut abandoned, mut useful) = (0usize, 0.0);
    let redone = redone_to(&outcome.jobs, from);
    for (job, &redo_to) in outcome.jobs.iter().zip(&redone) {
        let request = &pods[job.pod as usize].request;
        if job.measured {
            let started = job.start.filter(|s| *s <= end);
            let until = job.waited_until(end);
            let wait = until.0.saturating_sub(job.arrival.0) as f64 / 1e3;
            let unstarted = started.is_none() && !job.abandoned;
            arrived += 1;
            all += wait;
            never += usize::from(unstarted);
            abandoned += usize::from(job.abandoned);
            for class in Class::of(request) {
                let entry = waits.entry(class).or_default();
                entry.waits.push(wait);
                entry.never += usize::from(unstarted);
                entry.abandoned += usize::from(job.abandoned);
            }
        }
        useful += kept_work(job, Window { from, end }, context.checkpointed, redo_to);
        if let (Some(start), Some(stop)) = (job.work_from, job.end)
            && !job.evicted
            && stop >= from
        {
            completed += request.total_gpu_milli() as f64 * (stop.0 - start.0) as f64;
        }
    }
    let cdf = waits
        .iter()
        .map(|(class, t)| (*class, percentiles(&t.waits)))
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
            .map(|(c, t)| (c, Waits::of(t.waits, t.never, t.abandoned)))
            .collect(),
        cdf,
        never_started: never,
        abandoned,
        arrived,
        completed_gpu_hours: completed / 1e3 / 3.6e6,
        busy_gpu_hours: recorder.window.allocated / 1e3 / 3.6e6,
        run_busy_gpu_hours: recorder.allocated_all / 1e3 / 3.6e6,
        goodput_pct: 100.0 * useful / (capacity * recorder.window_ms().max(1.0)),
        gpu_hours_lost: (outcome.lost_milli_ms + outcome.defrag.lost_milli_ms) as f64 / 1e3 / 3.6e6,
        moves_per_hour: outcome.defrag.moved_pods as f64 / (run_ms / 3.6e6),
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
        failed_attempts: outcome.failed_attempts,
        tenants: outcome.tenants.clone(),
        estimates: outcome.estimates.clone(),
        elapsed,
        pods: if context.record_pods {
            let attempts_known = outcome.failed_attempts.is_some();
            outcome
                .jobs
                .iter()
                .map(|job| super::pods::PodRecord::of(job, pods, attempts_known))
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// One class's waits, and how many of its pods never started or were given up.
#[derive(Default)]
struct ClassTally {
    waits: Vec<f64>,
    never: usize,
    abandoned: usize,
}

/// Milli-GPU-milliseconds of `job`'s work inside the window `[from, end]` that was kept:
/// none of an evicted job's unless checkpointed.
/// The measurement window.
#[derive(Clone, Copy)]
struct Window {
    from: Ms,
    end: Ms,
}

/// By job, the progress (ms of its pod's run) up to which it runs again what an earlier
/// copy of its pod had done by the window's start: that work was done once, before the
/// window, and running it again in the window is not goodput. A job made to replace an
/// evicted or moved one carries that one's figure on.
fn redone_to(jobs: &[super::engine::Job], from: Ms) -> Vec<u64> {
    let mut out = vec![0u64; jobs.len()];
    for (i, job) in jobs.iter().enumerate() {
        let Some(p) = job.replaces.map(|p| p as usize).filter(|&p| p < i) else {
            continue;
        };
        let prev = &jobs[p];
        let before = prev.full_ms.saturating_sub(prev.run_ms);
        let at = prev.end.map_or(from, |e| e.min(from));
        let ran = prev
            .work_from
            .map_or(0, |w| at.0.saturating_sub(w.0).min(prev.run_ms));
        out[i] = out[p].max(before + ran);
    }
    out
}

/// The work `job` did in `window` and kept (milli-GPU ms): none when it was evicted and
/// not checkpointed (thrown away), and none of what it ran again up to `redo_to` (see
/// [`redone_to`]): each piece of a pod's work counts once.
fn kept_work(job: &super::engine::Job, window: Window, checkpointed: bool, redo_to: u64) -> f64 {
    let Window { from, end } = window;
    let Some(work_from) = job.work_from else {
        return 0.0;
    };
    if job.evicted && !checkpointed {
        return 0.0;
    }
    let done_before = job.full_ms.saturating_sub(job.run_ms);
    let new_from = Ms(work_from.0 + redo_to.saturating_sub(done_before));
    let lo = work_from.max(from).max(new_from);
    let hi = job.end.unwrap_or(end).min(end);
    if hi <= lo {
        return 0.0;
    }
    job.milli() as f64 * (hi.0 - lo.0) as f64
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::engine::Job;

    fn job(work_from: u64, end: Option<u64>, evicted: bool) -> Job {
        Job {
            pod: 0,
            unit: 0,
            arrival: Ms(0),
            run_ms: 1_000,
            full_ms: 1_000,
            measured: true,
            placed_at: Some(Ms(0)),
            placed_round: 0,
            start: Some(Ms(0)),
            work_from: Some(Ms(work_from)),
            end: end.map(Ms),
            evicted,
            by_controller: false,
            abandoned: false,
            node: 0,
            gpus: vec![(0, 1_000), (1, 500)],
            failed_attempts: 0,
            replaces: None,
        }
    }

    #[test]
    fn goodput_keeps_work_in_the_window_and_drops_evicted_work_unless_checkpointed() {
        let w = Window {
            from: Ms(100),
            end: Ms(1_000),
        };
        // 1,500 milli from 50 to 600: 500 ms in the window.
        assert_eq!(
            kept_work(&job(50, Some(600), false), w, false, 0),
            750_000.0
        );
        // Still running at the end: counted to the end.
        assert_eq!(kept_work(&job(900, None, false), w, false, 0), 150_000.0);
        // Evicted: thrown away, unless checkpointed.
        assert_eq!(kept_work(&job(200, Some(400), true), w, false, 0), 0.0);
        assert_eq!(kept_work(&job(200, Some(400), true), w, true, 0), 300_000.0);
        // Evicted before its container ran: nothing either way.
        assert_eq!(kept_work(&job(500, Some(400), true), w, true, 0), 0.0);
    }

    #[test]
    fn goodput_counts_work_run_again_in_the_window_once() {
        let w = Window {
            from: Ms(100),
            end: Ms(1_000),
        };
        // A warm pod 9,000 ms into a 10,000-ms run, working from 0, evicted at 300; its
        // replacement runs the whole 10,000 again from 400. What it runs again by the end
        // (600 ms of the 9,100 done before the window) is not counted; the old pod's work is
        // thrown away.
        let mut warm = job(0, Some(300), true);
        warm.full_ms = 10_000;
        let mut again = job(400, None, false);
        again.full_ms = 10_000;
        again.run_ms = 10_000;
        again.replaces = Some(0);
        let jobs = vec![warm, again];
        let redone = redone_to(&jobs, w.from);
        assert_eq!(redone, vec![0, 9_100]);
        assert_eq!(kept_work(&jobs[1], w, false, redone[1]), 0.0);
        // Without it the run again counted whole: 600 ms.
        assert_eq!(kept_work(&jobs[1], w, false, 0), 900_000.0);
        // A pod that arrived in the window, evicted at 500 and made again: its first run
        // is thrown away and its replacement's counts whole, once.
        let first = job(200, Some(500), true);
        let mut second = job(600, None, false);
        second.replaces = Some(0);
        let jobs = vec![first, second];
        let redone = redone_to(&jobs, w.from);
        assert_eq!(redone[1], 0);
        assert_eq!(kept_work(&jobs[0], w, false, redone[0]), 0.0);
        assert_eq!(kept_work(&jobs[1], w, false, redone[1]), 600_000.0);
        // The same chain one copy on: a replacement of the replacement carries the figure.
        let mut third = job(700, None, false);
        third.full_ms = 10_000;
        third.run_ms = 10_000;
        third.replaces = Some(1);
        let mut warm = job(0, Some(300), true);
        warm.full_ms = 10_000;
        let mut again = job(400, Some(600), true);
        again.full_ms = 10_000;
        again.run_ms = 10_000;
        again.replaces = Some(0);
        assert_eq!(
            redone_to(&[warm, again, third], w.from),
            vec![0, 9_100, 9_100]
        );
    }
}
