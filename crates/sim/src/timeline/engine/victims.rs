//! Victims in the timeline replay: running pods grouped by unit (a gang is evicted whole),
//! as the victim search's candidates, and a plan carried out (its victims back to the
//! queue, to start over; the pod started where the plan puts it). Shared by preemption and
//! reclaim.

use std::collections::BTreeMap;

use gpuplace_core::preempt::{self, Candidates, Holder};

use super::{Engine, Placed};
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// Running pods that `take` accepts (by pod index), grouped by unit (a gang is
    /// evicted whole).
    pub(super) fn victim_groups(&self, take: &dyn Fn(u32) -> bool) -> Vec<Vec<u32>> {
        let mut by_unit: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &r in &self.running {
            let j = &self.jobs[r as usize];
            if take(j.pod) {
                by_unit.entry(j.unit).or_default().push(r);
            }
        }
        by_unit.into_values().collect()
    }

    /// The victim search's candidates: one unit per group.
    pub(super) fn candidates(&self, groups: &[Vec<u32>]) -> Candidates<'_> {
        let mut candidates = Candidates::default();
        for group in groups {
            let top = group
                .iter()
                .map(|&r| self.pods[self.jobs[r as usize].pod as usize].priority)
                .max()
                .unwrap_or(0);
            candidates.push_unit(
                top,
                group.iter().map(|&r| {
                    let j = &self.jobs[r as usize];
                    Holder {
                        node: j.node as usize,
                        request: &self.pods[j.pod as usize].request,
                        gpus: &j.gpus,
                        budgets: Vec::new(),
                    }
                }),
            );
        }
        candidates
    }

    /// Evicts the plan's groups (their controller makes them again a moment later, to
    /// start over unless checkpointed) and starts `job` where the plan puts it once the
    /// victims' grace period has passed.
    pub(super) fn evict_and_start(
        &mut self,
        job: u32,
        groups: &[Vec<u32>],
        plan: preempt::Preemption,
        now: Ms,
    ) -> bool {
        for &u in &plan.units {
            let group = &groups[u];
            let mut again = Vec::with_capacity(group.len());
            let mut top = i32::MIN;
            for &victim in group {
                top = top.max(self.pods[self.jobs[victim as usize].pod as usize].priority);
                let evicted = self.evict(victim, now);
                self.outcome_counts.preempted_pods += 1;
                self.outcome_counts.preempted_milli += evicted.milli;
                self.outcome_counts.lost_milli_ms += evicted.lost_milli_ms;
                again.push(evicted.work);
            }
            self.recreate(again, top, now);
        }
        let request = &self.pods[self.jobs[job as usize].pod as usize].request;
        if self.state.apply(plan.node, request, &plan.gpus).is_err() {
            return false;
        }
        let placed = Placed {
            node: plan.node,
            gpus: plan.gpus,
        };
        self.start(job, placed, now, self.costs.eviction_grace);
        true
    }

    /// Evicts lower-priority units so that the single pod of `unit` fits (the scheduler's
    /// victim search); the victims go back to the queue.
    pub(super) fn try_preempt(&mut self, unit: u32, now: Ms) -> bool {
        let [job] = self.units[unit as usize].jobs[..] else {
            return false;
        };
        let priority = self.pods[self.jobs[job as usize].pod as usize].priority;
        if self.by_priority.range(..priority).all(|(_, n)| *n == 0) {
            return false;
        }
        // With tenants serving, the pod's queue takes part in the rule (core's).
        let tenants = self.tenants.as_ref().filter(|_| self.queues_serve);
        let contender = |pod: u32| preempt::Contender {
            priority: self.pods[pod as usize].priority,
            queue: tenants.map(|t| t.queue_of_pod(pod)),
        };
        let me = contender(self.jobs[job as usize].pod);
        let groups = self.victim_groups(&|pod| preempt::may_preempt(&me, &contender(pod)));
        let plan = {
            let candidates = self.candidates(&groups);
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            preempt::find(&self.state, request, &candidates, None, &[])
        };
        match plan {
            Some(plan) => self.evict_and_start(job, &groups, plan, now),
            None => false,
        }
    }
}
