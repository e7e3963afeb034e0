//! The engine's side of expected starts ([`super::estimate`]): the line kept, projected
//! once a period as the scheduler projects it, each waiting unit told at the first
//! projection after its first wait, checked at its start, learnt from at each end.

use gpuplace_core::waiting::history::{WAIT_CLASSES, wait_class};
use gpuplace_core::waiting::{Ahead, Ending, Span, Start, project, project_line, told};
use gpuplace_model::Request;

use super::Engine;
use super::estimate::Told;
use crate::timeline::metrics::Class;
use crate::timeline::options::Ms;

/// The baselines of one shape at one projection.
#[derive(Clone, Copy, Default)]
struct Baselines {
    alone: Option<i64>,
    longest: Option<i64>,
}

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

    /// `unit` failed an attempt at `now` (its first: it joins the line, its jobs wait to be
    /// told). As the scheduler does, the line is projected at most once every
    /// [`told::PROJECT_EVERY_MS`], in a round where a pod is told why it waits, and each
    /// job not told yet is told from it (the measured ones' errors are reported; every
    /// one's start teaches the calibration how projections turn out).
    pub(super) fn estimate_failed(&mut self, unit: u32, now: Ms, first: bool) {
        if self.estimates.share <= 0.0 {
            return;
        }
        if first {
            let key = self.units[unit as usize].key;
            self.estimates.line.insert((key, unit));
            let jobs = self.units[unit as usize].jobs.clone();
            self.estimates.untold.extend(jobs);
        }
        let now_ms = now.0 as i64;
        if !self.units[unit as usize].held.is_empty() {
            self.tell_nominee(unit, now_ms);
        }
        if self.estimates.untold.is_empty() || told::fresh(self.estimates.projected_at, now_ms) {
            return;
        }
        // Looked at once a period: projected only when a job to tell is within reach.
        self.estimates.projected_at = Some(now_ms);
        let covered = self.line_jobs().any(|j| self.estimates.untold.contains(&j));
        if !covered {
            return;
        }
        self.estimates.projections += 1;
        for (job, t) in self.project_untold(now_ms) {
            self.estimates.untold.remove(&job);
            self.estimates.made.insert(job, t);
        }
    }

    /// Nominee `unit`'s jobs not told yet are told at `now_ms` when its victims are gone,
    /// as the scheduler tells a nominee (core's [`told::nominee`]).
    fn tell_nominee(&mut self, unit: u32, now_ms: i64) {
        let gone_by = self.units[unit as usize].held_until.0 as i64;
        let Some(span) = told::nominee(gone_by, now_ms) else {
            return;
        };
        let jobs: Vec<u32> = (self.units[unit as usize].jobs.iter())
            .copied()
            .filter(|j| self.estimates.untold.contains(j))
            .collect();
        if jobs.is_empty() {
            return;
        }
        // The baselines "now" and the longest running pod on the best node; the
        // projection with nothing ahead is not played for a nominee (its places are held:
        // it is not a pod waiting for room), and is reported over the line's pods only.
        let told: Vec<(u32, Told)> = jobs
            .into_iter()
            .map(|job| {
                let pod = &self.pods[self.jobs[job as usize].pod as usize];
                let longest = (self.jobs[job as usize].measured)
                    .then(|| self.longest_on_best_node(&pod.request, now_ms))
                    .flatten();
                let t = Told {
                    estimate: Some(span),
                    first: None,
                    alone: None,
                    longest,
                    at: now_ms,
                };
                (job, t)
            })
            .collect();
        for (job, t) in told {
            self.estimates.untold.remove(&job);
            self.estimates.made.insert(job, t);
        }
    }

    /// The running pods whose expected ends are `ends`, as the projection reads them.
    fn endings<'s>(&'s self, ends: &[(u32, Span)]) -> Vec<Ending<'s>> {
        ends.iter()
            .map(|&(job, end)| {
                let j = &self.jobs[job as usize];
                let pod = &self.pods[j.pod as usize];
                Ending {
                    node: j.node as usize,
                    request: &pod.request,
                    gpus: &j.gpus,
                    priority: pod.priority,
                    end,
                }
            })
            .collect()
    }

    /// The line's first [`told::PROJECTED`] jobs, in its order; a nominee's are left out
    /// (its places are held in the state already, its start is its victims' leaving).
    fn line_jobs(&self) -> impl Iterator<Item = u32> + '_ {
        self.estimates
            .line
            .iter()
            .filter(|&&(_, u)| self.units[u as usize].held.is_empty())
            .flat_map(|&(_, u)| self.units[u as usize].jobs.iter().copied())
            .take(told::PROJECTED)
    }

    /// The line's first [`told::PROJECTED`] jobs projected at `now_ms`: what each job not
    /// told yet is told, and what the baselines say (a job the projection gives no start
    /// to come is told nothing, and stays to be told).
    fn project_untold(&self, now_ms: i64) -> Vec<(u32, Told)> {
        let line: Vec<u32> = self.line_jobs().collect();
        let ahead: Vec<Ahead<'_>> = line
            .iter()
            .map(|&a| {
                let pod = &self.pods[self.jobs[a as usize].pod as usize];
                let declared = self.declared_of(a);
                let class = declared.map_or_else(|| class_of(&pod.request), |_| String::new());
                Ahead {
                    request: &pod.request,
                    allowed: None,
                    priority: pod.priority,
                    runs: self.estimates.history.remaining(&class, 0, declared),
                }
            })
            .collect();
        let ends = self.running_ends(now_ms);
        let endings = self.endings(&ends);
        let starts = project_line(&self.state, &ahead, &endings, now_ms);
        // The baselines depend on the request and priority only: reckoned once a shape.
        let mut baselines: Vec<(&Request, i32, Baselines)> = Vec::new();
        let mut told = Vec::new();
        // Pods of each wait class ahead in the line.
        let mut ahead_of = [0usize; WAIT_CLASSES];
        for (&job, start) in line.iter().zip(&starts) {
            let pod = &self.pods[self.jobs[job as usize].pod as usize];
            let request = &pod.request;
            let class = wait_class(request.gpu_count, request.gpu_milli);
            let ahead = ahead_of[class];
            ahead_of[class] += 1;
            if !self.estimates.untold.contains(&job) {
                continue;
            }
            let history = &self.estimates.history;
            let Some(telling) = told::tell(history, class, start, ahead, now_ms) else {
                continue;
            };
            let b = match (baselines.iter()).find(|(r, p, _)| *r == request && *p == pod.priority) {
                // Only the measured jobs' baselines are reported.
                _ if !self.jobs[job as usize].measured => Baselines::default(),
                Some((_, _, b)) => *b,
                None => {
                    let b = self.baselines(request, pod.priority, &endings, now_ms);
                    baselines.push((request, pod.priority, b));
                    b
                }
            };
            let t = Told {
                estimate: telling.span,
                first: Some(telling.first),
                alone: b.alone,
                longest: b.longest,
                at: now_ms,
            };
            told.push((job, t));
        }
        told
    }

    /// What a pod asking `request` could be told at `now_ms` without the line: when it
    /// would start with nothing ahead, and when the longest running pod on the best node
    /// ends.
    fn baselines(
        &self,
        request: &Request,
        priority: i32,
        endings: &[Ending<'_>],
        now_ms: i64,
    ) -> Baselines {
        let pod = Ahead {
            request,
            allowed: None,
            priority,
            runs: None,
        };
        let alone = match project(&self.state, pod, &[], endings, now_ms) {
            Start::At(span) => Some(span.at_ms),
            Start::Unknown => None,
        };
        Baselines {
            alone,
            longest: self.longest_on_best_node(request, now_ms),
        }
    }

    /// The running jobs' expected ends at `now_ms`: declared (scaled as declarations
    /// turned out), else learnt from their class's run times.
    fn running_ends(&self, now_ms: i64) -> Vec<(u32, Span)> {
        self.running
            .all()
            .iter()
            .filter_map(|&job| {
                let j = &self.jobs[job as usize];
                let from = j.work_from?.0 as i64;
                // Its whole pod's age: what ran before this job too.
                let age = (now_ms - from).max(0) as u64 + j.full_ms.saturating_sub(j.run_ms);
                let request = &self.pods[j.pod as usize].request;
                let declared = self.declared_of(job);
                // Its class is read only when it declares nothing.
                let class = declared.map_or_else(|| class_of(request), |_| String::new());
                let left = self.estimates.history.remaining(&class, age, declared)?;
                Some((job, left.shifted(now_ms)))
            })
            .collect()
    }

    /// The baseline: the earliest, over the nodes with GPUs enough for `request`, of the
    /// latest declared end of the pods running there (a node with a pod that declares
    /// nothing is left out); `None` when no node's end is known.
    fn longest_on_best_node(&self, request: &Request, now_ms: i64) -> Option<i64> {
        let mut latest: Vec<Option<i64>> = vec![Some(now_ms); self.state.len()];
        for &job in self.running.all() {
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

    /// `unit`'s user gave up: it left the line, and nothing it was told is checked.
    pub(super) fn estimate_gave_up(&mut self, unit: u32) {
        self.estimate_left_line(unit);
        for job in &self.units[unit as usize].jobs {
            self.estimates.untold.remove(job);
            self.estimates.made.remove(job);
        }
    }

    /// `job` started (its Binding) at `bound`: each reckoning's error is kept (a measured
    /// job never told a start is counted unknown).
    pub(super) fn estimate_started(&mut self, job: u32, bound: Ms) {
        // However it started (its round, a nomination, a gang), its unit left the line.
        self.estimate_left_line(self.jobs[job as usize].unit);
        let untold = self.estimates.untold.remove(&job);
        let told = self.estimates.made.remove(&job);
        let bound = bound.0 as i64;
        if let Some(first) = told.as_ref().and_then(|t| t.first) {
            first.learn(&mut self.estimates.history, bound);
        }
        let j = &self.jobs[job as usize];
        if j.measured && (untold || told.is_some()) {
            let classes = Class::of(&self.pods[j.pod as usize].request);
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
