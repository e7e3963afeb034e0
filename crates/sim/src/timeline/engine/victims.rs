//! Victims in the timeline replay: running pods grouped by unit (a gang is evicted whole),
//! as the victim search's candidates, and a plan carried out (its victims back to the
//! queue, to start over; the pod started where the plan puts it). Shared by preemption and
//! reclaim.

use std::rc::Rc;

use gpuplace_core::preempt::{self, Candidates, Holder};

use super::Engine;
use super::evictable::Room;
use super::groups::Groups;
use super::running::Made;
use super::units::{Job, Placed};
use crate::timeline::options::Ms;
use crate::trace::TracePod;

/// Evictions planned for a unit: the victim groups searched, the groups evicted (indices),
/// each member's place (in the unit's member order) and the leaving pods' places (slots)
/// it counted on as freeing themselves.
pub(super) struct Eviction {
    pub groups: Rc<Groups>,
    pub units: Vec<usize>,
    pub places: Vec<(usize, Vec<(usize, u32)>)>,
    pub freeing: Vec<u32>,
}

/// A group found by [`Engine::victim_groups`]: its place in the cluster's order and its
/// members' span in the search's buffer.
struct Kept {
    order: Made,
    from: usize,
    to: usize,
}

/// Whether [`Engine::victim_groups`] lists the nodes whose answer reads more than their
/// own changes: a search kept node by node needs them, others do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unsure {
    Listed,
    Unasked,
}

impl Engine<'_> {
    /// Whether running `j`'s Binding has landed by `now` as the scheduler sees it: written
    /// by then, and decided before this instant or in an earlier round (a pod decided in
    /// this round is a reservation until a later view shows it bound, even with no bind
    /// latency; a second round at the same instant is such a view). Both: where attempts
    /// take time, one round's attempts are decided at several instants, each seeing those
    /// before it as the old rule did.
    fn landed(&self, j: &Job, now: Ms) -> bool {
        j.start.is_some_and(|bound| bound <= now)
            && j.placed_at
                .is_some_and(|at| at < now || j.placed_round < self.outcome_counts.rounds)
    }

    /// Running pods grouped by unit, the units whose every running member `take`
    /// accepts (by pod index) and whose Binding landed by `now`: a gang is evicted whole or
    /// not at all, so one member the preemptor may not evict (its priority, its queue, its
    /// Binding still in flight) keeps the whole gang, as the scheduler's candidates do (a
    /// pod decided and not yet bound is reserved there, not a candidate). Only units with
    /// a member on a node of `room` (the search finds nothing on the others, whose
    /// candidates taken together cannot make room). With [`Unsure::Listed`], also the
    /// nodes whose answer reads more than their own changes ([`Groups::unsure`]), which
    /// reads every unit there, victims or not; without, a unit is dropped at its first
    /// member that may not be taken (a reclaim's pool, grouped again for every search,
    /// leaves out the units of every queue it may not take from).
    pub(super) fn victim_groups(
        &self,
        take: &dyn Fn(u32) -> bool,
        now: Ms,
        room: &Room,
        unsure: Unsure,
    ) -> Groups {
        // The units with a running member on a node of `room`, from those nodes' pods.
        let mut marks = self.unit_marks.borrow_mut();
        let stamp = marks.stamp();
        let mut units: Vec<u32> = match room {
            Room::Anywhere => Vec::with_capacity(self.running.all().len()),
            _ => Vec::new(),
        };
        let mut visit = |job: u32, unit: u32| {
            if marks.marked(unit, stamp) {
                return;
            }
            marks.mark(unit, stamp);
            let j = &self.jobs[job as usize];
            if unsure == Unsure::Listed || (self.landed(j, now) && take(j.pod)) {
                units.push(unit);
            }
        };
        match room {
            Room::Nowhere => {}
            Room::Anywhere => {
                for &r in self.running.all() {
                    visit(r, self.jobs[r as usize].unit);
                }
            }
            Room::On(nodes) => {
                for (n, _) in nodes.iter().enumerate().filter(|(_, on)| **on) {
                    for o in self.running.on(n) {
                        visit(o.job, o.unit);
                    }
                }
            }
        }
        // Each with its running members in the order of the running list (a moved pod's
        // replacement is of its unit without being among the unit's jobs), in one buffer.
        let mut members: Vec<u32> = Vec::with_capacity(units.len());
        let mut kept: Vec<Kept> = Vec::with_capacity(units.len());
        let mut unsure_nodes: Vec<u32> = Vec::new();
        for unit in units {
            let from = members.len();
            self.running.of_unit_into(unit, &mut members);
            let group = &members[from..];
            if unsure == Unsure::Listed {
                self.note_unsure(group, now, &mut unsure_nodes);
            }
            if preempt::unit_may_be_evicted(group.iter().map(|&r| {
                let j = &self.jobs[r as usize];
                self.landed(j, now) && take(j.pod)
            })) {
                kept.push(Kept {
                    order: self.cluster_order(group),
                    from,
                    to: members.len(),
                });
            } else {
                members.truncate(from);
            }
        }
        // Each group's place in the cluster's order is its own (its first pod's index).
        kept.sort_unstable_by_key(|k| k.order);
        let mut groups = Groups::with_capacity(members.len(), kept.len());
        for k in kept {
            groups.push(&members[k.from..k.to]);
        }
        groups.unsure = unsure_nodes;
        groups
    }

    /// Adds to `unsure` the nodes of running `group` when whether it may be a victim there
    /// depends on more than those nodes' own changes: it has members on several nodes, or
    /// one whose Binding has not landed by `now`.
    fn note_unsure(&self, group: &[u32], now: Ms, unsure: &mut Vec<u32>) {
        let node = |r: &u32| self.jobs[*r as usize].node;
        let first = group.first().map(node);
        let spans = group.iter().any(|r| Some(node(r)) != first);
        let unbound = group
            .iter()
            .any(|&r| !self.landed(&self.jobs[r as usize], now));
        if spans || unbound {
            unsure.extend(group.iter().map(node));
        }
    }

    /// Where a running `group` stands in the cluster's order of pods (creation to the
    /// second, then name), which the victim search uses to tell equals apart: its first
    /// pod's place ([`Self::made`]; make-room walks the running jobs in that order).
    pub(super) fn cluster_order(&self, group: &[u32]) -> Made {
        group
            .iter()
            .map(|&r| self.made(r))
            .min()
            .unwrap_or_default()
    }

    /// Where `job` stands in the cluster's order of pods. Its name, as the test stack
    /// gives names: by when it was made (to the millisecond, so to the second as well), a
    /// controller's pod before an arrival of the same instant, then in job order.
    pub(super) fn made(&self, job: u32) -> Made {
        let j = &self.jobs[job as usize];
        Made {
            at_ms: j.arrival.0,
            arrived: !j.by_controller,
            job,
        }
    }

    /// Evicts the plan's groups (their controller makes them again a moment later, to
    /// start over unless checkpointed) and nominates `unit`, each of its members' places
    /// held ([`Self::nominate`]), also where leaving pods it counted on free them.
    pub(super) fn evict_and_nominate(&mut self, unit: u32, plan: &Eviction, now: Ms) -> bool {
        let before = self.free_before_plan(plan.places.iter().map(|(node, _)| *node));
        for &u in &plan.units {
            let group = plan.groups.get(u);
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
        let leavers = self.leavers(&plan.freeing, now + self.costs.eviction_grace);
        // The leaving pods counted on give their places for the plan's, keeping the rest.
        self.lend_freeing(&plan.freeing);
        let jobs = self.units[unit as usize].jobs.clone();
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
                self.keep_freeing(&plan.freeing, None);
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
        self.keep_what_the_plan_left(unit, &plan.freeing, now);
        let started = self.nominate(unit, placed, before, leavers, now);
        // The victims' places are held already (nominate read whom it evicted).
        self.leaving.take_evicted();
        started
    }

    /// What the plan just carried out for `unit` left of the places it counted on stays
    /// theirs, promised to `unit`: the pods that leave last keep theirs first. The
    /// scheduler's nominee holds what was free of its plan and grows by what each victim
    /// gives back as it goes, so the first to go fill the plan and only the last ones'
    /// places come free beyond it. Its victims (gone when their grace period is over)
    /// first, then the leaving places it counted on, the latest first.
    fn keep_what_the_plan_left(&mut self, unit: u32, freeing: &[u32], now: Ms) {
        let at = now + self.costs.eviction_grace;
        for job in self.leaving.evicting().to_vec() {
            self.hold_leaving(job, at, Some(unit));
        }
        let mut latest_first = freeing.to_vec();
        latest_first.sort_by_key(|&s| std::cmp::Reverse(self.leaving.slot(s).map(|(_, at, _)| at)));
        self.keep_freeing(&latest_first, Some(unit));
    }
}

/// The victim search's candidates for running `groups` of `jobs`: one unit per group, of
/// its highest priority.
pub(super) fn candidates_of<'s>(
    jobs: &'s [Job],
    pods: &'s [TracePod],
    groups: &Groups,
) -> Candidates<'s> {
    let mut candidates = Candidates::with_capacity(groups.pods(), groups.len());
    for group in groups.iter() {
        let top = group
            .iter()
            .map(|&r| pods[jobs[r as usize].pod as usize].priority)
            .max()
            .unwrap_or(0);
        // Made when it arrived (a controller's new pod: at the re-create).
        let made = group
            .iter()
            .map(|&r| created_ms(jobs[r as usize].arrival))
            .min();
        candidates.push_unit(
            top,
            made.unwrap_or(0),
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

/// A pod's creation time as the API server keeps it (`creationTimestamp`, to the second),
/// for a pod that arrived at `arrival`.
pub(super) fn created_ms(arrival: Ms) -> i64 {
    (arrival.0 / 1000 * 1000) as i64
}
