//! The engine's side of expected starts ([`super::estimate`]): told at a unit's first
//! wait, checked at its start.

use gpuplace_core::waiting::{Ending, Start, expected_start};

use super::Engine;
use crate::timeline::metrics::Class;
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// `unit` failed its first attempt at `now`: each of its measured jobs is told when it
    /// is expected to start.
    pub(super) fn estimate_first_wait(&mut self, unit: u32, now: Ms) {
        if self.estimates.share <= 0.0 {
            return;
        }
        let jobs = self.units[unit as usize].jobs.clone();
        let endings: Vec<Ending<'_>> = self
            .jobs
            .iter()
            .filter(|j| j.start.is_some() && j.end.is_none())
            .filter(|j| self.estimates.declares(&self.pods[j.pod as usize].name))
            .map(|j| Ending {
                node: j.node as usize,
                request: &self.pods[j.pod as usize].request,
                gpus: &j.gpus,
                end_ms: (j.work_from.unwrap_or(now).0 + j.run_ms) as i64,
            })
            .collect();
        let mut made = Vec::new();
        for job in jobs {
            let j = &self.jobs[job as usize];
            if !j.measured {
                continue;
            }
            let request = &self.pods[j.pod as usize].request;
            let start = expected_start(&self.state, request, None, &endings, now.0 as i64);
            made.push((
                job,
                match start {
                    Start::At(ms) => Some(ms.max(0) as u64),
                    Start::Unknown => None,
                },
            ));
        }
        for (job, estimate) in made {
            self.estimates.made.entry(job).or_insert(estimate);
        }
    }

    /// `job` started (its Binding) at `bound`: its estimate's error is kept.
    pub(super) fn estimate_started(&mut self, job: u32, bound: Ms) {
        let Some(estimate) = self.estimates.made.remove(&job) else {
            return;
        };
        let classes = Class::of(&self.pods[self.jobs[job as usize].pod as usize].request);
        for class in classes {
            match estimate {
                Some(ms) => self
                    .estimates
                    .errors
                    .entry(class)
                    .or_default()
                    .push((bound.0 as f64 - ms as f64).abs() / 1e3),
                None => *self.estimates.unknown.entry(class).or_default() += 1,
            }
        }
    }
}
