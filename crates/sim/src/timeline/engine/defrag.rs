//! Defragmentation in the timeline replay: core's make-room and rebalance plans, carried
//! out on simulated time. A moved pod is evicted at the decision and its planned place is
//! held for its replacement (the scheduler steers the controller's new pod there), which
//! is bound once its controller made it (the re-create) where that place was free before
//! the plan, as the scheduler binds it there at once, or else once the place is free
//! ([`super::steering`]: another pod there ended, or the pods that held it are gone); a
//! moved gang's replacements all together; then the bind and start costs. The unit the
//! room was made for is bound as a preemptor is. Unless the
//! replay is checkpointed the replacement runs its whole duration again and everything the
//! pod had done counts as lost.
//!
//! A pod may move when the hash of its trace index puts it in the movable share and it
//! has run at least the minimum age; a gang moves only whole and only when every member
//! may. Make-room runs for a unit that fits nowhere (after priority preemption, if on); a
//! request whose make-room failed is not planned again for a simulated minute. Rebalancing
//! follows the scheduler's rules with core's settings (see [`Engine::maybe_rebalance`]).

use std::collections::HashSet;
use std::time::Duration;

use gpuplace_core::defrag::{self, Fleet, Limits, Movables, MoveCandidate, ROOM_RETRY, RoomPlan};
use gpuplace_core::preempt::Holder;

use super::Engine;
use super::chain::{SimPlan, asks_of};
use super::defrag_state::movable_pod;
use super::kept::MovableKept;
use super::leaving::Owed;
use super::movable::MovableUnits;
use super::nominee::{FreeBefore, Leavers, owed_part};
use super::running::Started;
use super::units::{Job, Placed, Work};
use super::victims::created_ms;
use crate::timeline::options::Ms;
use crate::trace::TracePod;

/// The movable `groups` (running jobs) as core's movables.
fn movables<'s>(jobs: &'s [Job], pods: &'s [TracePod], groups: &MovableUnits) -> Movables<'s> {
    let mut m = Movables::default();
    for group in groups.iter() {
        // Made when it arrived (a controller's new pod: at the re-create).
        let made = group
            .iter()
            .map(|&r| created_ms(jobs[r as usize].arrival))
            .min();
        m.push_unit(
            made.unwrap_or(0),
            group.iter().map(|&r| {
                let j = &jobs[r as usize];
                let holder = Holder {
                    node: j.node as usize,
                    request: &pods[j.pod as usize].request,
                    gpus: &j.gpus,
                    budgets: Vec::new(),
                };
                (holder, None)
            }),
        );
    }
    m
}

impl Engine<'_> {
    /// Running units that may move at `now` (each as its running jobs), in the cluster's
    /// order.
    fn movable_units(&self, now: Ms) -> MovableUnits {
        let s = &self.defrag.config;
        let min_age = s.settings.min_age;
        let eligible = |started: &Started| {
            let pod = MoveCandidate {
                opted_in: movable_pod(started.pod, s.movable),
                // Every trace pod is re-created by its job's controller.
                controlled: true,
                // A pod decided at this instant has its Binding in flight.
                bound: started.decided < now,
                leaving: false,
                age: Some(Duration::from_millis(
                    now.0.saturating_sub(started.work_from.0),
                )),
            };
            defrag::may_move(&pod, min_age)
        };
        // The running jobs in the cluster's order: a pod alone where it stands, a gang
        // where its first member stands (as its earliest member orders it), whole.
        let mut units = MovableUnits::default();
        let mut gangs_seen: HashSet<u32> = HashSet::new();
        let mut members: Vec<u32> = Vec::new();
        for (r, started) in self.running.in_cluster_order() {
            if started.alone {
                if eligible(started) {
                    units.push(&[r]);
                }
                continue;
            }
            if !gangs_seen.insert(started.unit) {
                continue;
            }
            // Its members running now (a moved gang's replacements carry its unit), at
            // least as many as it has members (the stack's PodGroup minMember).
            members.clear();
            self.running.of_unit_into(started.unit, &mut members);
            let min_member = self.units[started.unit as usize].jobs.len();
            let whole = members
                .iter()
                .map(|&j| self.running.started(&self.made(j)).is_some_and(&eligible));
            if defrag::unit_may_move(whole, min_member) {
                members.sort_unstable();
                units.push(&members);
            }
        }
        units
    }

    /// [`Self::movable_units`], kept while the running pods and the time are the same: a
    /// round's failed attempts asked for it again and again (most of a make-room run's
    /// time on multigpu20).
    fn movable_units_now(&self, now: Ms) -> std::sync::Arc<MovableUnits> {
        let generation = self.by_priority.generation();
        let mut kept = self.movable_kept.borrow_mut();
        if let Some(k) = kept.as_ref().filter(|k| k.is(generation, now)) {
            return std::sync::Arc::clone(&k.groups);
        }
        let groups = std::sync::Arc::new(self.movable_units(now));
        *kept = Some(MovableKept {
            generation,
            at: now,
            groups: std::sync::Arc::clone(&groups),
        });
        groups
    }

    /// The request id of `unit`'s one pod (a gang has none: its make-room is not
    /// remembered, as the scheduler's is not).
    fn single_rid(&self, unit: u32) -> Option<usize> {
        self.units[unit as usize].single.map(|one| one.rid as usize)
    }

    /// Until when make-room does not search for `unit`'s shape again (it searched lately
    /// and found nothing).
    pub(super) fn room_memo_until(&self, unit: u32, now: Ms) -> Option<Ms> {
        self.single_rid(unit)
            .and_then(|rid| self.defrag.failed.waiting_until(&rid, now))
    }

    /// Plans room for `unit`, which fits nowhere (the chain's last step).
    pub(super) fn plan_make_room(&mut self, unit: u32, now: Ms) -> Option<SimPlan> {
        let jobs = &self.units[unit as usize].jobs;
        let single_rid = self.single_rid(unit);
        // Checked before the failure memo: a cluster too full is not a failed plan.
        let requests = jobs
            .iter()
            .map(|&j| &self.pods[self.jobs[j as usize].pod as usize].request);
        if !defrag::room_possible(&self.state, requests) {
            return None;
        }
        let groups = self.movable_units_now(now);
        if groups.is_empty() {
            return None;
        }
        let limits = Limits {
            max_pods: self.defrag.config.settings.max_moves,
            max_milli: u64::MAX,
        };
        // Members largest first, as the scheduler plans a gang's.
        let (order, plan) = {
            let m = movables(&self.jobs, self.pods, &groups);
            let asks = asks_of(self.pods, &self.jobs, &self.units[unit as usize].jobs);
            let members: Vec<(&gpuplace_model::Request, Option<&[bool]>)> =
                asks.iter().map(|&(_, r)| (r, None)).collect();
            let plan =
                defrag::make_room_for_all(&mut self.placer, &mut self.state, &members, &m, limits);
            (
                asks.into_iter().map(|(i, _)| i).collect::<Vec<usize>>(),
                plan,
            )
        };
        let Some(plan) = plan else {
            if let Some(rid) = single_rid {
                self.defrag.failed.found_nothing(rid, now + ROOM_RETRY);
            }
            return None;
        };
        Some(SimPlan::Room {
            groups,
            plan,
            order,
        })
    }

    /// Moves the plan's pods (their replacements steered to their planned places) and
    /// nominates `unit` to the places made for its members.
    pub(super) fn carry_out(
        &mut self,
        groups: &MovableUnits,
        plan: &RoomPlan,
        order: &[usize],
        unit: u32,
        now: Ms,
    ) -> bool {
        let members = &self.units[unit as usize].jobs;
        let jobs: Vec<u32> = order.iter().map(|&i| members[i]).collect();
        let holders = groups.all_jobs();
        let moved: Vec<u32> = plan
            .units
            .iter()
            .flat_map(|&u| groups.get(u).iter().copied())
            .collect();
        let at_once = self.free_before(holders, &plan.moves);
        // The moves' replacements hold their places first, then the nominee what is left
        // (the scheduler's steers are held as each pod moves, the nomination after).
        let nodes = plan.moves.iter().map(|m| m.to);
        let mut before = self.free_before_plan(nodes.chain(plan.placements.iter().map(|p| p.node)));
        let mut replacements = Vec::with_capacity(moved.len());
        for &job in &moved {
            replacements.push((job, self.leave_for_move(job, now)));
        }
        let mut leavers = self.leavers(&[], now + self.costs.eviction_grace);
        let mut held = Vec::with_capacity(jobs.len());
        for (&job, p) in jobs.iter().zip(&plan.placements) {
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            if self.state.apply(p.node, request, &p.gpus).is_err() {
                debug_assert!(false, "make-room placement refused");
                return false;
            }
            let placed = Placed {
                node: p.node,
                gpus: p.gpus.clone(),
            };
            held.push((job, placed));
        }
        for (mv, &free) in plan.moves.iter().zip(&at_once) {
            let job = holders[mv.holder];
            let owed = self.owed_by_move(&mut before, &mut leavers, job, mv, now);
            if let Some((_, work)) = replacements.iter().find(|(j, _)| *j == job) {
                let alone = alone_in(holders, &plan.moves, mv, &self.jobs);
                let _ = self.restart(job, *work, mv, Fits { free, alone, owed }, now);
            }
        }
        self.defrag.counts.plans += 1;
        self.nominate(unit, held, before, leavers, now)
    }

    /// Which of `moves` (of `holders`' jobs) go to places free before any pod leaves,
    /// each taking its place in order, as core's state sees them; a gang's members only
    /// all together (the scheduler binds a moved gang's replacements as a gang, when
    /// every planned place is free: differential seed 2269).
    fn free_before(&mut self, holders: &[u32], moves: &[defrag::Move]) -> Vec<bool> {
        let free = self.each_free_before(holders, moves);
        let unit_of = |mv: &defrag::Move| unit_of(holders, &self.jobs, mv);
        moves
            .iter()
            .map(|mv| {
                let unit = unit_of(mv);
                (moves.iter().zip(&free)).all(|(other, &f)| f || unit_of(other) != unit)
            })
            .collect()
    }

    /// Which of `moves` go to places free before any pod leaves, each on its own.
    fn each_free_before(&mut self, holders: &[u32], moves: &[defrag::Move]) -> Vec<bool> {
        let mut taken = Vec::new();
        let mut free = Vec::with_capacity(moves.len());
        for mv in moves {
            let job = holders[mv.holder];
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            let ok = self.state.apply(mv.to, request, &mv.gpus).is_ok();
            if ok {
                taken.push(mv);
            }
            free.push(ok);
        }
        for mv in taken.into_iter().rev() {
            let job = holders[mv.holder];
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            let given = self.state.release(mv.to, request, &mv.gpus);
            debug_assert!(given.is_ok(), "a place just taken: {given:?}");
        }
        free
    }

    /// `job` leaves its place to move: counted, and its work lost unless checkpointed;
    /// what its replacement runs.
    fn leave_for_move(&mut self, job: u32, now: Ms) -> Work {
        let evicted = self.evict(job, now);
        let c = &mut self.defrag.counts;
        c.moved_pods += 1;
        c.moved_milli += evicted.milli;
        c.lost_milli_ms += evicted.lost_milli_ms;
        evicted.work
    }

    /// The replacement of moved `job`, running `work`, is made by its controller and bound
    /// to the move's node and GPUs: once the controller's re-create has passed where its
    /// place was `free` before the plan, else once the grace period of the pods that held
    /// it has passed too, or earlier where its place frees first (a pod `alone`, `owed`
    /// the part its leaving pods hold: [`super::steering`]); never past the replay's last
    /// round. Not measured (its pod's wait was measured when it first arrived). Returns
    /// when the replacement is bound (past the replay's end: would be).
    fn restart(
        &mut self,
        job: u32,
        work: Work,
        mv: &defrag::Move,
        fits: Fits,
        now: Ms,
    ) -> Option<Ms> {
        let Fits { free, alone, owed } = fits;
        let (to, gpus) = (mv.to, &mv.gpus[..]);
        let unit = self.jobs[job as usize].unit;
        let request = &self.pods[work.pod as usize].request;
        if self.state.apply(to, request, gpus).is_err() {
            debug_assert!(false, "planned move refused");
            return None;
        }
        self.pending_milli += request.total_gpu_milli();
        self.waiting_pods += 1;
        let new = self.jobs.len() as u32;
        self.running.add_job();
        // Made by its controller the re-create after the move: that is its place in the
        // cluster's order of pods (a victim search's, a listing's), as the scheduler sees it.
        let made = now + self.costs.recreate;
        self.jobs.push(Job::waiting(unit, made, work, false, true));
        // Waiting as any pod does until its start below takes it out: its queue's demand
        // is not the less for a request it never counted (the scheduler counts the
        // planned place as held from the move, and its queue's demand as it was).
        self.fair_enqueued(new);
        let placed = Placed {
            node: to,
            gpus: gpus.to_vec(),
        };
        let room_in = if free {
            self.costs.recreate
        } else {
            self.costs.eviction_grace.max(self.costs.recreate)
        };
        // The replay stops after its round at its last arrival: a replacement made after
        // that round, or whose place is not free by then, is never bound (the scheduler
        // never sees it, or never decides it); its place stays held, as a steer holds it,
        // and its move in flight (rebalancing's pace counts it so until the end).
        if now >= self.run_end || now + room_in > self.run_end {
            // Its queue counts the place as held, as the scheduler counts a steer.
            self.jobs[new as usize].placed_at = Some(now);
            self.jobs[new as usize].placed_round = self.outcome_counts.rounds;
            self.fair_steered(new);
            return Some(now + room_in + self.costs.bind_latency);
        }
        self.start(new, placed, now, room_in);
        // A pod alone whose place its leaving pods still hold is bound once it is free,
        // at the latest as planned ([`super::steering`]); a gang's only as planned.
        if !free && alone && !owed.is_empty() {
            self.wait_for_place(new, now + self.costs.recreate, now + room_in, owed);
        }
        self.jobs[new as usize].start
    }

    /// What of move `mv`'s place (of `job`) was not free in `before` (which it uses up),
    /// owed to the pods leaving there, the first to go first ([`Leavers`]).
    fn owed_by_move(
        &self,
        before: &mut FreeBefore,
        leavers: &mut Leavers,
        job: u32,
        mv: &defrag::Move,
        now: Ms,
    ) -> Vec<Owed> {
        let request = &self.pods[self.jobs[job as usize].pod as usize].request;
        let placed = Placed {
            node: mv.to,
            gpus: mv.gpus.clone(),
        };
        let mut owed = Vec::new();
        if let Some(part) = owed_part(before, &placed, request) {
            leavers.owe(part, now + self.costs.eviction_grace, &mut owed);
        }
        owed
    }

    /// Rebalances as the scheduler does, after a round's decisions: core's pace (when it
    /// looks, the hour's GPU budget, the moves in flight, the controllers' cooldown) and
    /// core's plan with a fresh FGD placer, as `scheduler/rebalance.rs`.
    pub(super) fn maybe_rebalance(&mut self, now: Ms) {
        self.defrag.in_flight.retain(|bound| *bound > now);
        let fleet = Fleet {
            pending: self.waiting_pods,
            frag_milli: self.state.total_frag(),
            capacity_milli: self.state.gpu_capacity_milli(),
            in_flight: self.defrag.in_flight.len(),
        };
        let settings = &self.defrag.config.settings;
        let Some(limits) = self.defrag.pace.limits(settings, now, &fleet) else {
            return;
        };
        let groups = self.movable_units_now(now).keeping(|g| {
            let unit = self.jobs[g[0] as usize].unit;
            !self.defrag.pace.moved_lately(&unit)
        });
        let moves = {
            let m = movables(&self.jobs, self.pods, &groups);
            defrag::rebalance_in_place(
                &mut self.defrag.fgd,
                &mut self.state,
                &m,
                limits,
                defrag::REBALANCE_MIN_GAIN_MILLI,
            )
            .moves
        };
        if moves.is_empty() {
            return;
        }
        let holders = groups.all_jobs();
        let at_once = self.free_before(holders, &moves);
        let mut before = self.free_before_plan(moves.iter().map(|m| m.to));
        let mut works = Vec::with_capacity(moves.len());
        for mv in &moves {
            let job = holders[mv.holder];
            let milli = self.jobs[job as usize].milli();
            let unit = self.jobs[job as usize].unit;
            self.defrag.pace.moved(now, Some(unit), milli);
            works.push(self.leave_for_move(job, now));
        }
        let mut leavers = self.leavers(&[], now + self.costs.eviction_grace);
        for ((mv, &free), work) in moves.iter().zip(&at_once).zip(works) {
            let job = holders[mv.holder];
            let owed = self.owed_by_move(&mut before, &mut leavers, job, mv, now);
            let alone = alone_in(holders, &moves, mv, &self.jobs);
            if let Some(bound) = self.restart(job, work, mv, Fits { free, alone, owed }, now) {
                self.defrag.in_flight.push(bound);
            }
        }
        // Rebalancing nominates no one: the moved pods are offered as they leave.
        self.hold_remains(now, None);
        self.defrag.counts.plans += 1;
    }
}

/// How a move's place stood when its pod moved: free, its pod alone among the plan's
/// moves of its unit, and the part its leaving pods still hold.
struct Fits {
    free: bool,
    alone: bool,
    owed: Vec<Owed>,
}

/// The unit of move `mv`'s pod (one of `holders`' jobs).
fn unit_of(holders: &[u32], jobs: &[Job], mv: &defrag::Move) -> u32 {
    jobs[holders[mv.holder] as usize].unit
}

/// Whether `mv`'s pod is the only one of its unit among `moves`.
fn alone_in(holders: &[u32], moves: &[defrag::Move], mv: &defrag::Move, jobs: &[Job]) -> bool {
    let unit = unit_of(holders, jobs, mv);
    moves
        .iter()
        .filter(|m| unit_of(holders, jobs, m) == unit)
        .count()
        == 1
}

#[cfg(test)]
mod tests {
    use super::movable_pod;

    #[test]
    fn the_movable_share_is_about_what_was_asked() {
        let n = (0..10_000).filter(|&p| movable_pod(p, 0.3)).count();
        assert!((2_700..3_300).contains(&n), "{n}");
        assert_eq!((0..100).filter(|&p| movable_pod(p, 0.0)).count(), 0);
        assert_eq!((0..100).filter(|&p| movable_pod(p, 1.0)).count(), 100);
    }
}
