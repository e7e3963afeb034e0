//! What the cluster pays, on simulated time: an evicted pod's work (its whole elapsed run
//! unless checkpointed), its place until it is gone ([`super::leaving`]), its controller's
//! new pod made a moment later, and users who delete pods that waited too long
//! (`--patience`).

use std::cmp::Reverse;

use super::Engine;
use super::units::{Evicted, Recreation, Work};
use crate::timeline::metrics::Class;
use crate::timeline::options::{Ms, Patience};
use crate::timeline::patience;

impl Engine<'_> {
    /// Evicts running `job` at `now`: it leaves (its GPUs go back to the state). Thrown
    /// away is everything it had done, before this job too (a warm-start pod's age, earlier
    /// checkpointed progress), unless checkpointed, when the replacement resumes instead.
    pub(super) fn evict(&mut self, job: u32, now: Ms) -> Evicted {
        let j = &self.jobs[job as usize];
        let milli = j.milli();
        let ran = j
            .work_from
            .map_or(0, |from| now.0.saturating_sub(from.0))
            .min(j.run_ms);
        let done = j.full_ms.saturating_sub(j.run_ms) + ran;
        let (done_ms, lost_milli_ms) = if self.checkpointed {
            (done.min(j.full_ms.saturating_sub(1)), 0)
        } else {
            (0, u128::from(milli) * u128::from(done))
        };
        let work = Work {
            pod: j.pod,
            full_ms: j.full_ms,
            done_ms,
            replaces: Some(job),
        };
        self.depart(job, now, true);
        Evicted {
            work,
            milli,
            lost_milli_ms,
        }
    }

    /// The plan just carried out evicted pods: what it did not take of their places stays
    /// theirs until their grace period is over (at the earliest, the next round), promised
    /// to the nominee `promised` while it waits (offered to any search without one).
    pub(super) fn hold_remains(&mut self, now: Ms, promised: Option<u32>) {
        let at = now + self.costs.eviction_grace;
        for job in self.leaving.take_evicted() {
            self.hold_leaving(job, at, promised);
        }
    }

    /// Evicted pods whose grace period is over are gone: their remains come back, and
    /// the parked units wake (as the Pod's deletion wakes them in the scheduler).
    pub(super) fn gone_due(&mut self, now: Ms) {
        for unit in self.leaving.promises_due(now) {
            self.nomination_ended(unit);
        }
        let nodes = self.leaving_gone(now);
        self.left.extend(&nodes);
        self.released.extend(nodes);
    }

    /// `pods` join the queue as one unit once their controller has made them again.
    pub(super) fn recreate(&mut self, pods: Vec<Work>, priority: i32, now: Ms) {
        let at = now + self.costs.recreate;
        let index = self.recreations.len() as u32;
        self.recreations.push(Recreation { pods, priority });
        self.later.push(Reverse((at, index)));
    }

    /// The replacements whose time has come join the queue.
    pub(super) fn recreate_due(&mut self, now: Ms) {
        while let Some(&Reverse((at, index))) = self.later.peek()
            && at <= now
        {
            self.later.pop();
            let r = &mut self.recreations[index as usize];
            let pods = std::mem::take(&mut r.pods);
            let priority = r.priority;
            self.enqueue(&pods, priority, now, true, true);
        }
    }

    /// Whether (and when) the user of arriving `unit` (arrival index `arrival`) gives up.
    pub(super) fn draw_patience(&mut self, unit: u32, arrival: u64, now: Ms) {
        if self.patience == Patience::Off {
            return;
        }
        let Some(&first) = self.units[unit as usize].jobs.first() else {
            return;
        };
        let classes = Class::of(&self.pods[self.jobs[first as usize].pod as usize].request);
        if let Some(ms) = patience::draw_ms(&classes, self.seed, arrival) {
            self.give_ups.push(Reverse((Ms(now.0 + ms), unit)));
        }
    }

    /// Units still waiting when their user's patience ends are deleted.
    pub(super) fn give_up_due(&mut self, now: Ms) {
        while let Some(&Reverse((at, unit))) = self.give_ups.peek()
            && at <= now
        {
            self.give_ups.pop();
            if !self.units[unit as usize].waiting {
                continue;
            }
            self.quiet_ends(unit);
            self.units[unit as usize].waiting = false;
            self.estimate_gave_up(unit);
            self.queue.forget(&unit);
            self.outcome_counts.abandoned_units += 1;
            // A nominee given up gives its held places back (what its victims hold stays
            // theirs until they are gone).
            let lifted = self.lift_hold(unit, now);
            self.settle_hold(unit, lifted, Some(&[]), now);
            for job in self.units[unit as usize].jobs.clone() {
                let j = &mut self.jobs[job as usize];
                j.abandoned = true;
                j.end = Some(now);
                self.pending_milli -= self.pods[j.pod as usize].request.total_gpu_milli();
                self.waiting_pods -= 1;
                self.fair_abandoned(job);
            }
        }
    }
}
