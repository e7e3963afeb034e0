//! A timeline measured on a live cluster (`gpuplace replay`): the pods' lives as the API
//! server showed them (created, bound, deleted) turned into the same [`TimelineRun`] the
//! simulator reports, by the same measurement ([`super::run::measure`]), so the two can be
//! set side by side.

use std::time::Duration;

use gpuplace_core::Policy;

use super::engine::{DefragCounts, Job, Outcome};
use super::metrics::{Recorder, Values};
use super::options::Ms;
use super::{Schedule, Timeline, TimelineRun, run};

/// One pod's life on the live cluster, on the replay's simulated clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Life {
    /// Index into the pod list.
    pub pod: u32,
    /// Its arrival unit (a gang's pods share one).
    pub unit: u32,
    /// When its pod was created.
    pub arrival: Ms,
    /// How long it runs once bound, and its pod's whole run.
    pub run_ms: u64,
    pub full_ms: u64,
    /// Arrived in the measurement window (not a warm-start pod nor a controller's).
    pub measured: bool,
    /// When the watch showed its Binding.
    pub bound: Option<Ms>,
    /// When it was gone (its run ended, or it was evicted).
    pub end: Option<Ms>,
    /// Deleted by someone else than the replay before its run ended.
    pub evicted: bool,
    /// Made as its controller would for an evicted pod.
    pub by_controller: bool,
    /// Its node (index into the node list) and GPUs (position, milli), where known: a
    /// scheduler that records no devices leaves them to be assumed as the kubelet would
    /// pick them (the first that fit).
    pub node: Option<usize>,
    pub gpus: Option<Vec<(usize, u32)>>,
    /// The life (index) of the evicted pod this one was made for (`by_controller`).
    pub replaces: Option<u32>,
}

/// What the live run cost beside the lives.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveCounts {
    pub preempted_pods: usize,
    pub preempted_milli: u64,
    pub moved_pods: u64,
}

impl Timeline {
    /// The run `policy`'s scheduler made live for seed `seed`, measured as a simulated one.
    pub fn measure_lives(
        &self,
        policy: Policy,
        seed: u64,
        lives: &[Life],
        counts: LiveCounts,
        elapsed: Duration,
    ) -> TimelineRun {
        let schedule = self.schedule(seed);
        let outcome = self.outcome_of(&schedule, lives, counts);
        // One run, and what a live report is for: every pod is kept.
        let context = run::Context {
            record_pods: true,
            ..self.context(policy, seed)
        };
        run::measure(&context, &schedule, &outcome, elapsed)
    }

    /// The recorder and jobs the engine would have left, from the lives.
    fn outcome_of(&self, schedule: &Schedule, lives: &[Life], counts: LiveCounts) -> Outcome {
        let end = schedule.arrivals.last().map_or(Ms(0), |a| a.at);
        let from = schedule
            .arrivals
            .get(
                self.warmup_index()
                    .min(schedule.arrivals.len().saturating_sub(1)),
            )
            .map_or(Ms(0), |a| a.at);
        let mut recorder = Recorder::new(
            from,
            end,
            self.base.gpu_capacity_milli(),
            self.options.series_points,
        );
        let pods = &self.workload.pods;
        let milli = |l: &Life| pods[l.pod as usize].request.total_gpu_milli();
        // Every change in time order: arrivals add waiting pods, Bindings turn them into
        // held GPUs, ends take either away.
        let mut changes: Vec<(Ms, usize, Change)> = Vec::new();
        for (i, l) in lives.iter().enumerate() {
            changes.push((l.arrival, i, Change::Arrive));
            if let Some(b) = l.bound {
                changes.push((b, i, Change::Bind));
            }
            if let Some(e) = l.end {
                changes.push((e, i, Change::End));
            }
        }
        changes.sort_by_key(|(at, i, c)| (*at, c.rank(lives[*i].bound.is_some()), *i));
        let mut state = self.base.clone();
        let mut placed: Vec<Option<Held>> = vec![None; lives.len()];
        let mut values = Values::default();
        let mut lost: u128 = 0;
        for (at, i, change) in changes {
            recorder.advance(
                at,
                Values {
                    frag_milli: state.total_frag(),
                    ..values
                },
            );
            let life = &lives[i];
            let request = &pods[life.pod as usize].request;
            match change {
                Change::Arrive => {
                    values.waiting += 1;
                    values.pending_milli += milli(life);
                }
                Change::Bind => {
                    values.waiting = values.waiting.saturating_sub(1);
                    values.pending_milli = values.pending_milli.saturating_sub(milli(life));
                    values.allocated_milli += milli(life);
                    placed[i] = life
                        .node
                        .and_then(|n| place_on(&mut state, n, request, life.gpus.as_deref()));
                }
                Change::End => {
                    if life.bound.is_some_and(|b| b <= at) {
                        values.allocated_milli = values.allocated_milli.saturating_sub(milli(life));
                        if let Some(held) = placed[i].take() {
                            let _ = state.release(held.node, request, &held.gpus);
                        }
                        if life.evicted {
                            let ran = at.0.saturating_sub(life.bound.map_or(at.0, |b| b.0));
                            lost += u128::from(milli(life)) * u128::from(ran);
                        }
                    } else {
                        values.waiting = values.waiting.saturating_sub(1);
                        values.pending_milli = values.pending_milli.saturating_sub(milli(life));
                    }
                }
            }
        }
        recorder.advance(
            end,
            Values {
                frag_milli: state.total_frag(),
                ..values
            },
        );
        Outcome {
            jobs: lives.iter().map(job_of).collect(),
            recorder,
            preempted_pods: counts.preempted_pods,
            preempted_milli: counts.preempted_milli,
            lost_milli_ms: lost,
            abandoned_units: 0,
            rounds: 0,
            attempts: 0,
            failed_attempts: None,
            defrag: DefragCounts {
                moved_pods: counts.moved_pods,
                ..DefragCounts::default()
            },
            tenants: None,
            estimates: Default::default(),
            projections: 0,
        }
    }
}

/// A step of a pod's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Arrive,
    Bind,
    End,
}

impl Change {
    /// The order at one instant: ends that free GPUs first, then arrivals, then Bindings
    /// (a pod bound the instant it arrives), then ends of pods that never ran.
    fn rank(self, was_bound: bool) -> u8 {
        match (self, was_bound) {
            (Change::End, true) => 0,
            (Change::Arrive, _) => 1,
            (Change::Bind, _) => 2,
            (Change::End, false) => 3,
        }
    }
}

/// What a bound pod holds in the replayed state.
#[derive(Clone, Debug)]
struct Held {
    node: usize,
    gpus: Vec<(usize, u32)>,
}

/// Holds `request` on node `n` (its recorded GPUs, or the first that fit); `None` when the
/// state cannot hold it (then only the allocation counts it).
fn place_on(
    state: &mut gpuplace_core::ClusterState,
    n: usize,
    request: &gpuplace_model::Request,
    gpus: Option<&[(usize, u32)]>,
) -> Option<Held> {
    if n >= state.len() {
        return None;
    }
    let gpus = match gpus {
        Some(g) => g.to_vec(),
        None => first_fitting(state.node(n), request),
    };
    state
        .apply(n, request, &gpus)
        .ok()
        .map(|()| Held { node: n, gpus })
}

/// The GPUs a kubelet without a preference might give: the first that fit.
fn first_fitting(
    node: &gpuplace_core::NodeState,
    request: &gpuplace_model::Request,
) -> Vec<(usize, u32)> {
    let want = request.gpu_count as usize;
    if want == 0 {
        return Vec::new();
    }
    node.gpu_free
        .iter()
        .enumerate()
        .filter(|(_, free)| **free >= request.gpu_milli)
        .take(want)
        .map(|(g, _)| (g, request.gpu_milli))
        .collect()
}

fn job_of(l: &Life) -> Job {
    Job {
        pod: l.pod,
        unit: l.unit,
        arrival: l.arrival,
        run_ms: l.run_ms,
        full_ms: l.full_ms,
        measured: l.measured,
        placed_at: l.bound,
        placed_round: 0,
        start: l.bound,
        work_from: l.bound,
        end: l.end,
        evicted: l.evicted,
        by_controller: l.by_controller,
        abandoned: false,
        node: l.node.map_or(u32::MAX, |n| n as u32),
        gpus: l.gpus.clone().unwrap_or_default(),
        // Not seen from outside the scheduler: the live report leaves it out.
        failed_attempts: 0,
        replaces: l.replaces,
    }
}
