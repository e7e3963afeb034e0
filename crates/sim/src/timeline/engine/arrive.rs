//! Units joining the queue: arrivals (whose users may give up on them), the warm start's
//! running population, and controllers' new pods after an eviction.

use std::cmp::Reverse;

use super::Engine;
use super::units::{Job, Single, Unit, Work};
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// A unit of `template` joins the queue at `now`; `left` (warm start) is the share of
    /// its run time still to go; `arrival`: its index among the arrivals (none for the warm
    /// start), whose user may give up on it.
    pub(super) fn admit(
        &mut self,
        template: u32,
        now: Ms,
        left: Option<f64>,
        arrival: Option<u64>,
    ) {
        let Some(t) = self.mix.templates.get(template as usize) else {
            return;
        };
        let pods: Vec<Work> = t
            .pods
            .iter()
            .map(|&p| {
                let full = self.mix.durations_ms[p];
                let run = left.map_or(full, |f| ((full as f64 * f).round() as u64).max(1));
                Work {
                    pod: p as u32,
                    full_ms: full.max(run),
                    done_ms: full.saturating_sub(run),
                    replaces: None,
                }
            })
            .collect();
        let unit = self.enqueue(&pods, t.priority, now, left.is_none(), false);
        if let Some(arrival) = arrival {
            self.draw_patience(unit, arrival, now);
        }
    }

    /// Puts a unit of `pods` in the queue.
    pub(super) fn enqueue(
        &mut self,
        pods: &[Work],
        priority: i32,
        now: Ms,
        measurable: bool,
        by_controller: bool,
    ) -> u32 {
        let unit = self.units.len() as u32;
        let measured = measurable && now >= self.measure_from;
        let mut jobs = Vec::with_capacity(pods.len());
        for w in pods {
            jobs.push(self.jobs.len() as u32);
            self.pending_milli += self.pods[w.pod as usize].request.total_gpu_milli();
            self.waiting_pods += 1;
            self.running.add_job();
            self.jobs
                .push(Job::waiting(unit, now, *w, measured, by_controller));
        }
        for &job in &jobs {
            self.fair_enqueued(job);
        }
        let key = (Reverse(priority), self.sequence);
        self.sequence += 1;
        let single = match (&jobs[..], pods) {
            ([_], [w]) => Some(Single {
                pod: w.pod,
                rid: self.request_ids[w.pod as usize],
                priority: self.pods[w.pod as usize].priority,
            }),
            _ => None,
        };
        self.units.push(Unit {
            jobs,
            single,
            key,
            waiting: true,
            fails: 0,
            ready: false,
            failed_at: Ms(0),
            parked: None,
            held: Vec::new(),
            owed: Vec::new(),
            held_until: Ms(0),
        });
        self.fresh.push(unit);
        unit
    }
}
