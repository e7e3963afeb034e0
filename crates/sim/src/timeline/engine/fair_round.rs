//! Queues in the timeline replay's rounds: due units served in core's [`Picker`] order (as
//! the scheduler serves them), limits checked first, reclaim for a queue below its
//! guarantee (core's [`Entitlement`] over the same victim search as preemption) between
//! placement and make-room, and the tenants' standing kept as pods come and go.

use std::sync::Arc;

use gpuplace_core::fairshare::{Picker, Res};

use super::Engine;
use super::clock::{Attempt, AttemptClock, Attempts};
use super::units::Tried;
use crate::timeline::options::Ms;

impl Engine<'_> {
    fn fair_res(&self, job: u32, node: Option<usize>) -> (usize, Res) {
        let pod = self.jobs[job as usize].pod;
        let model = node.map(|n| self.state.inventory(n).gpu_model());
        let q = self.tenants.as_ref().map_or(0, |t| t.queue(pod));
        (q, Res::of(&self.pods[pod as usize].request, model))
    }

    pub(super) fn fair_enqueued(&mut self, job: u32) {
        let (q, res) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.largest[q] = t.largest[q].max(res.dims[0]);
            t.pending[q].add(&res);
        }
    }

    pub(super) fn fair_started(&mut self, job: u32, node: usize) {
        let (q, placed) = self.fair_res(job, Some(node));
        let (_, asked) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.pending[q].sub(&asked);
            t.held[q].add(&placed);
        }
    }

    /// `job`, a replacement left on its planned place past the replay's end, is counted
    /// as held in its queue rather than waiting (the scheduler counts a steer so).
    pub(super) fn fair_steered(&mut self, job: u32) {
        let (q, asked) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.pending[q].sub(&asked);
            t.held[q].add(&asked);
        }
    }

    pub(super) fn fair_abandoned(&mut self, job: u32) {
        let (q, asked) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.pending[q].sub(&asked);
        }
    }

    /// `unit` was nominated (`true`) or its held places given back to decide it again:
    /// its members' requests move from its queue's waiting demand to what it holds, or
    /// back (the scheduler counts a nominee as held, once).
    pub(super) fn fair_nominated(&mut self, unit: u32, nominated: bool) {
        let Some(t) = &mut self.tenants else {
            return;
        };
        for &job in &self.units[unit as usize].jobs {
            let pod = self.jobs[job as usize].pod;
            let q = t.queue(pod);
            let asked = Res::of(&self.pods[pod as usize].request, None);
            if nominated {
                t.pending[q].sub(&asked);
                t.held[q].add(&asked);
            } else {
                t.held[q].sub(&asked);
                t.pending[q].add(&asked);
            }
        }
    }

    /// Checks (test builds) that each queue's waiting demand is what its waiting pods ask,
    /// those of nominees aside (counted as held): every change to it came with a pod
    /// starting to wait, starting, being nominated or given up.
    #[cfg(debug_assertions)]
    pub(super) fn check_queue_demand(&self) {
        let Some(t) = &self.tenants else {
            return;
        };
        let mut want = vec![Res::default(); t.pending.len()];
        for job in &self.jobs {
            // A replacement left on its place past the end ([`Self::fair_steered`]) too.
            let steered = job.placed_at.is_some();
            let waits = job.start.is_none() && job.end.is_none() && !job.abandoned && !steered;
            if waits && self.units[job.unit as usize].held.is_empty() {
                let asked = Res::of(&self.pods[job.pod as usize].request, None);
                want[t.queue(job.pod)].add(&asked);
            }
        }
        for (q, (w, p)) in want.iter().zip(&t.pending).enumerate() {
            debug_assert_eq!(w.dims, p.dims, "queue {q}'s waiting demand");
        }
    }

    pub(super) fn fair_departed(&mut self, job: u32, node: usize) {
        let (q, placed) = self.fair_res(job, Some(node));
        if let Some(t) = &mut self.tenants {
            t.held[q].sub(&placed);
        }
    }

    /// The due units in the queues' order (without tenants, as given), each tried as the
    /// scheduler tries a pod: placed, else PostFilter's chain (preemption, reclaim,
    /// make-room), at the times `clock` gives; says how each attempt ended, and which due
    /// units the clock left no time for.
    pub(super) fn fair_round(&mut self, due: Vec<u32>, clock: &mut AttemptClock) -> Attempts {
        let mut out = Attempts::default();
        let Some(t) = self.tenants.as_ref().filter(|_| self.queues_serve) else {
            self.round_with_quiet(due, clock, &mut out);
            return out;
        };
        let tree = Arc::clone(&t.tree);
        let mut picker: Picker<'_, u32> = Picker::new(&tree, &t.held, t.shares());
        if t.ledger.decays() {
            picker = picker.with_usage(&t.ledger.means());
        }
        for u in due {
            let first = self.units[u as usize].jobs[0];
            let q = t.queue(self.jobs[first as usize].pod);
            picker.push(q, u);
        }
        while let Some((q, unit)) = picker.pop() {
            let Some(decided) = clock.begin() else {
                out.left.push(unit);
                continue;
            };
            let jobs = self.units[unit as usize].jobs.clone();
            let mut asked = Res::default();
            for &j in &jobs {
                asked.add(&self.fair_res(j, None).1);
            }
            // A nominee is out of its queue's allocation while it is decided again, and
            // back in if it stays nominated, as the scheduler's `unaccount`/`account`.
            if !self.units[unit as usize].held.is_empty() {
                picker.removed(q, &asked);
            }
            if picker.limit_hit(q, &asked).is_some() {
                if !self.units[unit as usize].held.is_empty() {
                    picker.placed(q, &asked);
                }
                let tried = Tried::Parked;
                let at = clock.end(false);
                out.done.push(Attempt { unit, tried, at });
                continue;
            }
            // A queue's per-model limits narrow the nodes, as the scheduler's do.
            let narrow = picker.model_mask(q, asked.dims[0], &self.state);
            let tried = self.cycle(unit, Some((q, &mut picker)), narrow.as_deref(), decided);
            let at = clock.end(tried == Tried::Started);
            if tried == Tried::Started {
                for &j in &jobs {
                    let node = self.jobs[j as usize].node as usize;
                    picker.placed(q, &self.fair_res(j, Some(node)).1);
                }
            } else if !self.units[unit as usize].held.is_empty() {
                picker.placed(q, &asked);
            }
            out.done.push(Attempt { unit, tried, at });
        }
        out
    }
}

impl Engine<'_> {
    /// By queue, the waits (s) of the pods measured, to their Binding (or the end, or
    /// their user giving up).
    pub(super) fn queue_waits(&self, end: Ms) -> Vec<Vec<f64>> {
        let Some(t) = &self.tenants else {
            return Vec::new();
        };
        let mut waits = vec![Vec::new(); t.tree.len()];
        for j in self.jobs.iter().filter(|j| j.measured) {
            let until = j.waited_until(end);
            waits[t.queue(j.pod)].push(until.0.saturating_sub(j.arrival.0) as f64 / 1e3);
        }
        waits
    }
}
