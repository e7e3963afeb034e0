//! Queues in the timeline replay's rounds: due units served in core's [`Picker`] order (as
//! the scheduler serves them), limits checked first, reclaim for a queue below its
//! guarantee (core's [`Entitlement`] over the same victim search as preemption) between
//! placement and make-room, and the tenants' standing kept as pods come and go.

use std::sync::Arc;

use gpuplace_core::fairshare::{Entitlement, Loss, Picker, Res};
use gpuplace_core::preempt;

use super::Engine;
use crate::timeline::options::Ms;

/// Plans tried per reclaim before giving up (each drops one queue's pods on one node).
const MAX_PLANS: usize = 32;

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

    pub(super) fn fair_abandoned(&mut self, job: u32) {
        let (q, asked) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.pending[q].sub(&asked);
        }
    }

    pub(super) fn fair_departed(&mut self, job: u32, node: usize) {
        let (q, placed) = self.fair_res(job, Some(node));
        if let Some(t) = &mut self.tenants {
            t.held[q].sub(&placed);
        }
    }

    /// The due units in the queues' order (without tenants, as given), each tried as the
    /// scheduler tries a pod: `first` places it (or preempts for it), then reclaim, then
    /// `last` (make room); says whether each started.
    pub(super) fn fair_round(
        &mut self,
        due: Vec<u32>,
        now: Ms,
        first: &mut dyn FnMut(&mut Self, u32, Ms) -> bool,
        last: &mut dyn FnMut(&mut Self, u32, Ms) -> bool,
    ) -> Vec<(u32, bool)> {
        let Some(t) = self.tenants.as_ref().filter(|_| self.queues_serve) else {
            return due
                .into_iter()
                .map(|u| (u, first(self, u, now) || last(self, u, now)))
                .collect();
        };
        let tree = Arc::clone(&t.tree);
        let mut picker: Picker<'_, u32> = Picker::new(&tree, &t.held, t.shares());
        for u in due {
            let first = self.units[u as usize].jobs[0];
            let q = t.queue(self.jobs[first as usize].pod);
            picker.push(q, u);
        }
        let mut out = Vec::new();
        while let Some((q, unit)) = picker.pop() {
            let jobs = self.units[unit as usize].jobs.clone();
            let mut asked = Res::default();
            for &j in &jobs {
                asked.add(&self.fair_res(j, None).1);
            }
            if picker.limit_hit(q, &asked).is_some() {
                out.push((unit, false));
                continue;
            }
            let mut started = first(self, unit, now);
            if !started && jobs.len() == 1 {
                started = self.try_reclaim(jobs[0], q, &mut picker, now);
            }
            if !started {
                started = last(self, unit, now);
            }
            if started {
                for &j in &jobs {
                    let node = self.jobs[j as usize].node as usize;
                    picker.placed(q, &self.fair_res(j, Some(node)).1);
                }
            }
            out.push((unit, started));
        }
        out
    }

    /// Evicts pods of queues above their guarantee so that `job` of queue `q` starts.
    fn try_reclaim(&mut self, job: u32, q: usize, picker: &mut Picker<'_, u32>, now: Ms) -> bool {
        let Some(t) = &self.tenants else {
            return false;
        };
        let (tree, queue_of) = (Arc::clone(&t.tree), Arc::clone(&t.queue_of));
        let asked = self.fair_res(job, None).1;
        let Some(entitled) = Entitlement::new(&tree, picker.allocations(), q, &asked) else {
            return false;
        };
        let of = |pod: u32| queue_of.get(pod as usize).copied().unwrap_or(0);
        let groups = self.victim_groups(&|pod| entitled.may_take_from(of(pod)));
        if groups.is_empty() {
            return false;
        }
        let group_queue: Vec<usize> = groups
            .iter()
            .map(|g| of(self.jobs[g[0] as usize].pod))
            .collect();
        let found = {
            let candidates = self.candidates(&groups);
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            let mut taken = vec![false; groups.len()];
            let mut found = None;
            for _ in 0..MAX_PLANS {
                let Some(plan) = preempt::find(&self.state, request, &candidates, None, &taken)
                else {
                    break;
                };
                let mut losses: Vec<Loss> = Vec::new();
                for &u in &plan.units {
                    for &r in &groups[u] {
                        let node = self.jobs[r as usize].node as usize;
                        let res = self.fair_res(r, Some(node)).1;
                        match losses.iter_mut().find(|l| l.queue == group_queue[u]) {
                            Some(l) => l.res.add(&res),
                            None => losses.push(Loss {
                                queue: group_queue[u],
                                res,
                            }),
                        }
                    }
                }
                match entitled.check(&losses) {
                    Ok(()) => {
                        found = Some((plan, losses));
                        break;
                    }
                    Err(v) => {
                        for (u, g) in groups.iter().enumerate() {
                            let here = g
                                .iter()
                                .any(|&r| self.jobs[r as usize].node as usize == plan.node);
                            if group_queue[u] == v && here {
                                taken[u] = true;
                            }
                        }
                    }
                }
            }
            found
        };
        let Some((plan, losses)) = found else {
            return false;
        };
        for &u in &plan.units {
            if let Some(t) = &mut self.tenants {
                t.reclaimed(group_queue[u], groups[u].len() as u64);
            }
        }
        for loss in &losses {
            picker.removed(loss.queue, &loss.res);
        }
        self.evict_and_start(job, &groups, plan, now)
    }
}
