//! A nominee's held places, as the scheduler keeps them. A plan that evicts (preemption,
//! reclaim, make-room's moves) nominates its unit to the places it planned: taken in the
//! state for it, so no other pod lands there. Part of each place was free before the plan
//! and part was its victims', which stays theirs until their grace period is over. When
//! the nominee is decided again before then, the scheduler lifts its hold (what the victims
//! have freed) and tries it on every node, the victims' part still taken; it may start
//! elsewhere at once. Here the same: the hold is lifted for its attempt, the part still
//! owed to leaving pods taken in its stead, and put back if the attempt fails.

use gpuplace_model::Request;

use super::Engine;
use super::leaving::{Owed, Remains};
use super::units::Placed;
use crate::timeline::options::Ms;

/// What nodes had free before a plan's pods left: (node, CPU, memory, milli per GPU).
pub(super) struct FreeBefore(Vec<(usize, u64, u64, Vec<u32>)>);

/// How a nominee's hold stands for one attempt ([`Engine::lift_hold`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lifted {
    /// Not nominated.
    Nothing,
    /// Its victims are gone: the hold is given back for good.
    Released,
    /// Its victims are still leaving: the hold is lifted for the attempt, their part taken.
    WhileLeaving,
}

impl Engine<'_> {
    /// What `nodes` have free now, before a plan's pods leave.
    pub(super) fn free_before_plan(&self, nodes: impl Iterator<Item = usize>) -> FreeBefore {
        let mut out: Vec<(usize, u64, u64, Vec<u32>)> = Vec::new();
        for n in nodes {
            if out.iter().all(|f| f.0 != n) {
                let s = self.state.node(n);
                out.push((n, s.cpu_free, s.memory_free, s.gpu_free.clone()));
            }
        }
        FreeBefore(out)
    }

    /// Nominates `unit` at `now` to `placed` (taken in the state), each place owing to the
    /// pods leaving what `before` did not have free: held for it until it is decided again
    /// (see the module's text). Not started: the attempt failed, as the scheduler's did.
    /// Its queue counts the members' requests as held from here, not as waiting, as the
    /// scheduler's standing counts a nominee. A part owed by the plan's victims (the pods
    /// it is evicting) is theirs for their grace period; a part owed only by the leaving
    /// pods of `freeing` it counted on (slots), until the last of them is gone.
    pub(super) fn nominate(
        &mut self,
        unit: u32,
        placed: Vec<(u32, Placed)>,
        mut before: FreeBefore,
        freeing: &[u32],
        now: Ms,
    ) -> bool {
        let grace_end = now + self.costs.eviction_grace;
        let mut owed = Vec::new();
        for (job, p) in &placed {
            let request = &self.pods[self.jobs[*job as usize].pod as usize].request;
            if let Some(part) = owed_part(&mut before, p, request) {
                let (until, owner) = self.owed_to(p.node, freeing, grace_end);
                owed.push(Owed { part, until, owner });
            }
        }
        let held_until = owed.iter().map(|o| o.until).max().unwrap_or(grace_end);
        let u = &mut self.units[unit as usize];
        let was_held = !u.held.is_empty();
        u.held = placed;
        u.owed = owed;
        u.held_until = held_until;
        if !was_held {
            self.fair_nominated(unit, true);
        }
        false
    }

    /// Until when a place on `node` is owed, and as whose (the job a search counts it of
    /// once the nominee no longer waits): the plan's victims there (the most important),
    /// else the leaving pods of `freeing` there (the last to go).
    fn owed_to(&self, node: usize, freeing: &[u32], grace_end: Ms) -> (Ms, Option<u32>) {
        let priority = |job: u32| self.pods[self.jobs[job as usize].pod as usize].priority;
        let victim = (self.leaving.evicting().iter().copied())
            .filter(|&j| self.jobs[j as usize].node as usize == node)
            .max_by_key(|&j| (priority(j), std::cmp::Reverse(j)));
        if victim.is_some() {
            return (grace_end, victim);
        }
        let last = (freeing.iter())
            .filter_map(|&s| self.leaving.slot(s))
            .filter(|(r, _, _)| r.node == node)
            .max_by_key(|(_, at, _)| *at);
        match last {
            Some((_, at, owner)) => (at, owner.map(|o| o.job)),
            None => (grace_end, None),
        }
    }

    /// Lifts `unit`'s hold for its attempt at `now`: its places given back, and while its
    /// victims are still leaving, their part taken again (until [`Self::settle_hold`]).
    pub(super) fn lift_hold(&mut self, unit: u32, now: Ms) -> Lifted {
        let u = &self.units[unit as usize];
        if u.held.is_empty() {
            return Lifted::Nothing;
        }
        let leaving = now < u.held_until;
        for (job, p) in &u.held {
            let request = &self.pods[self.jobs[*job as usize].pod as usize].request;
            let given = self.state.release(p.node, request, &p.gpus);
            debug_assert!(given.is_ok(), "a held place: {given:?}");
            // The failure memo must see the node's resources come back.
            self.released.push(p.node as u32);
        }
        if !leaving {
            let u = &mut self.units[unit as usize];
            u.held.clear();
            u.owed.clear();
            self.fair_nominated(unit, false);
            self.nomination_ended(unit);
            return Lifted::Released;
        }
        for o in self.units[unit as usize]
            .owed
            .iter()
            .filter(|o| o.until > now)
        {
            let part = &o.part;
            let taken = self.state.apply(part.node, &part.request, &part.gpus);
            debug_assert!(taken.is_ok(), "a leaving pod's part: {taken:?}");
        }
        Lifted::WhileLeaving
    }

    /// After the attempt at `now` of a unit whose hold was lifted while its victims leave:
    /// started (on the nodes of `started_on`: member and node), its nomination ends and
    /// their part stays theirs until they are gone; else the hold is put back as it was.
    /// Started where it was nominated, the victims stay promised to it until its Binding
    /// is seen (the scheduler keeps such a nomination until then, [`Self::promise_until_bound`]
    /// when this returns true); elsewhere (or deleted: no nodes), they are offered to any
    /// search from now on.
    pub(super) fn settle_hold(
        &mut self,
        unit: u32,
        lifted: Lifted,
        started_on: Option<&[(usize, usize)]>,
        now: Ms,
    ) -> bool {
        if lifted != Lifted::WhileLeaving {
            return false;
        }
        let u = &mut self.units[unit as usize];
        if let Some(started_on) = started_on {
            let members = &u.jobs;
            let where_held = |(i, node): &(usize, usize)| {
                let job = members.get(*i).copied();
                u.held
                    .iter()
                    .any(|(j, p)| Some(*j) == job && p.node == *node)
            };
            let same = !started_on.is_empty() && started_on.iter().all(where_held);
            let owed = std::mem::take(&mut u.owed);
            u.held.clear();
            let promised = same.then_some(unit);
            for o in owed.into_iter().filter(|o| o.until > now) {
                self.hold_owed(o.part, o.until, o.owner, promised);
            }
            self.fair_nominated(unit, false);
            if !same {
                self.nomination_ended(unit);
            }
            return same;
        }
        for o in u.owed.iter().filter(|o| o.until > now) {
            let part = &o.part;
            let given = self.state.release(part.node, &part.request, &part.gpus);
            debug_assert!(given.is_ok(), "a leaving pod's part: {given:?}");
        }
        for (job, p) in &u.held {
            let request = &self.pods[self.jobs[*job as usize].pod as usize].request;
            let taken = self.state.apply(p.node, request, &p.gpus);
            debug_assert!(taken.is_ok(), "a held place put back: {taken:?}");
        }
        false
    }

    /// `unit`, started where it was nominated, keeps its victims promised until a round
    /// after its last member's Binding landed.
    pub(super) fn promise_until_bound(&mut self, unit: u32) {
        let bound = (self.units[unit as usize].jobs.iter())
            .filter_map(|&j| self.jobs[j as usize].start)
            .max();
        if let Some(bound) = bound {
            self.leaving.end_promise_at(unit, Ms(bound.0 + 1));
        }
    }
}

/// What of place `p` (of `request`) was not free in `before` (which it uses up): the
/// leaving pods' part; `None` when it was all free.
fn owed_part(before: &mut FreeBefore, p: &Placed, request: &Request) -> Option<Remains> {
    let (_, cpu, memory, gpu) = before.0.iter_mut().find(|f| f.0 == p.node)?;
    let take = |free: &mut u64, want: u64| {
        let had = (*free).min(want);
        *free -= had;
        want - had
    };
    let cpu_owed = take(cpu, request.cpu_milli);
    let memory_owed = take(memory, request.memory_mib);
    let gpus: Vec<(usize, u32)> = p
        .gpus
        .iter()
        .filter_map(|&(g, milli)| {
            let free = gpu.get_mut(g)?;
            let had = (*free).min(milli);
            *free -= had;
            (milli > had).then_some((g, milli - had))
        })
        .collect();
    (cpu_owed > 0 || memory_owed > 0 || !gpus.is_empty()).then(|| {
        Remains::new(
            p.node,
            Request {
                cpu_milli: cpu_owed,
                memory_mib: memory_owed,
                ..Request::default()
            },
            gpus,
        )
    })
}
