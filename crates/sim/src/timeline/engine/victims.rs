//! Victims in the timeline replay: running pods grouped by unit (a gang is evicted whole),
//! as the victim search's candidates, and a plan carried out (its victims back to the
//! queue, to start over; the pod started where the plan puts it). Shared by preemption and
//! reclaim.

use std::collections::BTreeMap;

use gpuplace_core::preempt::{Candidates, Holder};

use super::{Engine, Job, Placed};
use crate::timeline::options::Ms;
use crate::trace::TracePod;

/// Evictions planned for a unit: the victim groups searched, the groups evicted (indices)
/// and each member's place (in the unit's member order).
pub(super) struct Eviction {
    pub groups: Vec<Vec<u32>>,
    pub units: Vec<usize>,
    pub places: Vec<(usize, Vec<(usize, u32)>)>,
}

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

    /// How long after the decision a unit that evicted or moved pods is bound: the
    /// scheduler nominates it and binds it in a later cycle, once its victims are gone
    /// (their grace period) and no sooner than the queue's initial backoff after its
    /// attempt (the victims' deletion makes it due then).
    pub(super) fn room_in(&self) -> std::time::Duration {
        self.costs
            .eviction_grace
            .max(self.queue.config().initial_backoff)
    }

    /// The victim search's candidates: one unit per group.
    pub(super) fn candidates(&self, groups: &[Vec<u32>]) -> Candidates<'_> {
        candidates_of(&self.jobs, self.pods, groups)
    }

    /// Evicts the plan's groups (their controller makes them again a moment later, to
    /// start over unless checkpointed) and starts each of `jobs` where the plan puts it
    /// once its room is free ([`Self::room_in`]).
    pub(super) fn evict_and_start(&mut self, jobs: &[u32], plan: &Eviction, now: Ms) -> bool {
        for &u in &plan.units {
            let group = &plan.groups[u];
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
        let mut placed: Vec<(u32, Placed)> = Vec::with_capacity(jobs.len());
        for (&job, (node, gpus)) in jobs.iter().zip(&plan.places) {
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            if self.state.apply(*node, request, gpus).is_err() {
                // Planned on this state: cannot happen; give back what was taken.
                debug_assert!(false, "a victim search's place was refused");
                for (job, p) in placed.into_iter().rev() {
                    let request = &self.pods[self.jobs[job as usize].pod as usize].request;
                    let _ = self.state.release(p.node, request, &p.gpus);
                }
                return false;
            }
            placed.push((
                job,
                Placed {
                    node: *node,
                    gpus: gpus.clone(),
                },
            ));
        }
        for (job, p) in placed {
            self.start(job, p, now, self.room_in());
        }
        true
    }
}

/// The victim search's candidates for running `groups` of `jobs`: one unit per group, of
/// its highest priority.
pub(super) fn candidates_of<'s>(
    jobs: &'s [Job],
    pods: &'s [TracePod],
    groups: &[Vec<u32>],
) -> Candidates<'s> {
    let mut candidates = Candidates::default();
    for group in groups {
        let top = group
            .iter()
            .map(|&r| pods[jobs[r as usize].pod as usize].priority)
            .max()
            .unwrap_or(0);
        // Made when it arrived (a controller's new pod: at the re-create).
        let made = group.iter().map(|&r| jobs[r as usize].arrival.0).min();
        candidates.push_unit(
            top,
            made.map_or(0, |m| m as i64),
            group.iter().map(|&r| {
                let j = &jobs[r as usize];
                Holder {
                    node: j.node as usize,
                    request: &pods[j.pod as usize].request,
                    gpus: &j.gpus,
                    budgets: Vec::new(),
                }
            }),
        );
    }
    candidates
}
