//! The engine's side of expected starts ([`super::estimate`]): the line kept, told at a
//! unit's first wait, checked at its start, learnt from at each end.

use gpuplace_core::waiting::history::wait_class;
use gpuplace_core::waiting::{Ahead, Ending, Span, Start, project};
use gpuplace_model::Request;

use super::Engine;
use super::estimate::Told;
use crate::timeline::metrics::Class;
use crate::timeline::options::Ms;

/// What the run history knows a pod by: its shape.
fn class_of(request: &Request) -> String {
    format!("{}x{}", request.gpu_count, request.gpu_milli)
}

impl Engine<'_> {
    /// What job `job`'s pod declares.
    fn declared_of(&self, job: u32) -> Option<u64> {
        let j = &self.jobs[job as usize];
        let pod = &self.pods[j.pod as usize];
        self.estimates.declared(&pod.name, j.full_ms)
    }

    /// `unit` failed its first attempt at `now`: it joins the line, and each of its jobs is
    /// told when it is expected to start (the measured ones' errors are reported; every
    /// one's start teaches the calibration how projections turn out).
    pub(super) fn estimate_first_wait(&mut self, unit: u32, now: Ms) {
        if self.estimates.share <= 0.0 {
            return;
        }
        let key = self.units[unit as usize].key;
        self.estimates.line.insert((key, unit));
        let now_ms = now.0 as i64;
        let told: Vec<(u32, Told)> = self.units[unit as usize]
            .jobs
            .clone()
            .into_iter()
            .map(|job| (job, self.tell(unit, job, now_ms)))
            .collect();
        for (job, t) in told {
            self.estimates.made.entry(job).or_insert(t);
        }
    }

    /// What `job` of `unit` is told at `now_ms`, and what the baselines say.
    fn tell(&self, unit: u32, job: u32, now_ms: i64) -> Told {
        let key = self.units[unit as usize].key;
        let request = &self.pods[self.jobs[job as usize].pod as usize].request;
        let ahead_jobs: Vec<u32> = self
            .estimates
            .line
            .range(..(key, unit))
            .take(gpuplace_core::waiting::start::MAX_STEPS / 2)
            .flat_map(|&(_, u)| self.units[u as usize].jobs.iter().copied())
            .collect();
        let ahead: Vec<Ahead<'_>> = ahead_jobs
            .iter()
            .map(|&a| {
                let r = &self.pods[self.jobs[a as usize].pod as usize].request;
                Ahead {
                    request: r,
                    allowed: None,
                    runs: self
                        .estimates
                        .history
                        .remaining(&class_of(r), 0, self.declared_of(a)),
                }
            })
            .collect();
        let ends = self.running_ends(now_ms);
        let endings: Vec<Ending<'_>> = ends
            .iter()
            .map(|&(job, end)| {
                let j = &self.jobs[job as usize];
                Ending {
                    node: j.node as usize,
                    request: &self.pods[j.pod as usize].request,
                    gpus: &j.gpus,
                    end,
                }
            })
            .collect();
        let projected = match project(&self.state, request, None, &ahead, &endings, now_ms) {
            Start::At(span) => Some(span),
            Start::Unknown => None,
        };
        let class = wait_class(request.gpu_count, request.gpu_milli);
        let estimate = projected.map(|p| {
            let history = &self.estimates.history;
            history
                .calibrated(class, p.shifted(-now_ms))
                .shifted(now_ms)
        });
        let alone = match project(&self.state, request, None, &[], &endings, now_ms) {
            Start::At(span) => Some(span.at_ms),
            Start::Unknown => None,
        };
        Told {
            estimate,
            projected: projected.map(|p| p.at_ms),
            alone,
            longest: self.longest_on_best_node(request, now_ms),
            at: now_ms,
        }
    }

    /// The running jobs' expected ends at `now_ms`: declared (scaled as declarations
    /// turned out), else learnt from their class's run times.
    fn running_ends(&self, now_ms: i64) -> Vec<(u32, Span)> {
        self.running
            .iter()
            .filter_map(|&job| {
                let j = &self.jobs[job as usize];
                let from = j.work_from?.0 as i64;
                // Its whole pod's age: what ran before this job too.
                let age = (now_ms - from).max(0) as u64 + j.full_ms.saturating_sub(j.run_ms);
                let request = &self.pods[j.pod as usize].request;
                let left = self.estimates.history.remaining(
                    &class_of(request),
                    age,
                    self.declared_of(job),
                )?;
                Some((job, left.shifted(now_ms)))
            })
            .collect()
    }

    /// The baseline: the earliest, over the nodes with GPUs enough for `request`, of the
    /// latest declared end of the pods running there (a node with a pod that declares
    /// nothing is left out); `None` when no node's end is known.
    fn longest_on_best_node(&self, request: &Request, now_ms: i64) -> Option<i64> {
        let mut latest: Vec<Option<i64>> = vec![Some(now_ms); self.state.len()];
        for &job in &self.running {
            let j = &self.jobs[job as usize];
            let n = j.node as usize;
            let end = match (j.work_from, self.declared_of(job)) {
                (Some(from), Some(d)) => {
                    let done = j.full_ms.saturating_sub(j.run_ms);
                    Some(from.0 as i64 + d.saturating_sub(done) as i64)
                }
                _ => None,
            };
            latest[n] = match (latest[n], end) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        (0..self.state.len())
            .filter(|&n| self.state.inventory(n).gpus.len() as u32 >= request.gpu_count.max(1))
            .filter_map(|n| latest[n])
            .min()
    }

    /// `unit` left the line (it started, or its user gave up).
    pub(super) fn estimate_left_line(&mut self, unit: u32) {
        if self.estimates.share > 0.0 {
            let key = self.units[unit as usize].key;
            self.estimates.line.remove(&(key, unit));
        }
    }

    /// `job` started (its Binding) at `bound`: each reckoning's error is kept.
    pub(super) fn estimate_started(&mut self, job: u32, bound: Ms) {
        // However it started (its round, a nomination, a gang), its unit left the line.
        self.estimate_left_line(self.jobs[job as usize].unit);
        let Some(told) = self.estimates.made.remove(&job) else {
            return;
        };
        let j = &self.jobs[job as usize];
        let request = &self.pods[j.pod as usize].request;
        let bound = bound.0 as i64;
        if let Some(projected) = told.projected {
            let class = wait_class(request.gpu_count, request.gpu_milli);
            let waited = |at: i64| (at - told.at).max(0) as u64;
            let history = &mut self.estimates.history;
            history.waited(class, waited(projected), waited(bound));
        }
        if j.measured {
            let classes = Class::of(request);
            self.estimates.started(&classes, told, bound);
        }
    }

    /// `job` ended its run: its class learns how long it ran, and against what it declared.
    pub(super) fn estimate_ended(&mut self, job: u32) {
        if self.estimates.share <= 0.0 {
            return;
        }
        let j = &self.jobs[job as usize];
        let full = j.full_ms;
        let class = class_of(&self.pods[j.pod as usize].request);
        let declared = self.declared_of(job);
        self.estimates.history.ran(&class, full, declared);
    }
}
