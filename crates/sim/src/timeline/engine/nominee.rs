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

/// A pod leaving a node a plan counted on: when it is gone, the job it was, and what it
/// holds there still (its CPU, memory and each GPU's milli).
pub(super) struct Leaver {
    at: Ms,
    job: Option<u32>,
    share: Remains,
}

/// The pods leaving that a plan counted on, the first to go first, each with what of its
/// share no owed part has claimed yet.
#[derive(Default)]
pub(super) struct Leavers(Vec<Leaver>);

impl Leavers {
    /// Splits `part` (owed of a place) among the pods leaving its node, the first to go
    /// first, each up to its share: one owed part each, until it is gone, as its job's.
    /// What none of them holds (none: the plan counted on no leaving pod there) is owed
    /// until `grace_end`, as nobody's.
    pub(super) fn owe(&mut self, mut part: Remains, grace_end: Ms, out: &mut Vec<Owed>) {
        let node = part.node;
        for l in self.0.iter_mut().filter(|l| l.share.node == node) {
            let piece = take_share(&mut l.share, &mut part);
            if !piece.is_empty() {
                out.push(Owed {
                    part: piece,
                    until: l.at,
                    owner: l.job,
                });
            }
        }
        if !part.is_empty() {
            out.push(Owed {
                part,
                until: grace_end,
                owner: None,
            });
        }
    }
}

/// What `share` holds of `part`, taken off both (CPU, memory, each GPU's milli).
fn take_share(share: &mut Remains, part: &mut Remains) -> Remains {
    let both = |a: &mut u64, b: &mut u64| {
        let t = (*a).min(*b);
        *a -= t;
        *b -= t;
        t
    };
    let cpu = both(&mut share.request.cpu_milli, &mut part.request.cpu_milli);
    let memory = both(&mut share.request.memory_mib, &mut part.request.memory_mib);
    let mut gpus = Vec::new();
    for (g, want) in part.gpus.iter_mut() {
        if let Some((_, has)) = share.gpus.iter_mut().find(|(sg, _)| sg == g) {
            let t = (*want).min(*has);
            *want -= t;
            *has -= t;
            if t > 0 {
                gpus.push((*g, t));
            }
        }
    }
    part.gpus.retain(|&(_, m)| m > 0);
    let request = Request {
        cpu_milli: cpu,
        memory_mib: memory,
        ..Request::default()
    };
    Remains::new(part.node, request, gpus)
}

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
    /// scheduler's standing counts a nominee. The part owed is the `leavers`' (the plan's
    /// victims and the leaving places it counted on), each owing its share until it is
    /// gone, the first to go first: the scheduler's nominee holds what was free of its plan
    /// and grows by what each victim gives back as it goes.
    pub(super) fn nominate(
        &mut self,
        unit: u32,
        placed: Vec<(u32, Placed)>,
        mut before: FreeBefore,
        mut leavers: Leavers,
        now: Ms,
    ) -> bool {
        let grace_end = now + self.costs.eviction_grace;
        let mut owed = Vec::new();
        for (job, p) in &placed {
            let request = &self.pods[self.jobs[*job as usize].pod as usize].request;
            if let Some(part) = owed_part(&mut before, p, request) {
                leavers.owe(part, grace_end, &mut owed);
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

    /// The pods leaving that a plan counts on, as they stand before it takes its places:
    /// the pods it evicted (gone at `grace_end`) and the leaving places of `freeing`.
    pub(super) fn leavers(&self, freeing: &[u32], grace_end: Ms) -> Leavers {
        let mut out: Vec<Leaver> = (freeing.iter())
            .filter_map(|&s| self.leaving.slot(s))
            .map(|(r, at, owner)| Leaver {
                at,
                job: owner.map(|o| o.job),
                share: r.clone(),
            })
            .collect();
        for &job in self.leaving.evicting() {
            let j = &self.jobs[job as usize];
            let request = &self.pods[j.pod as usize].request;
            let share = Request {
                cpu_milli: request.cpu_milli,
                memory_mib: request.memory_mib,
                ..Request::default()
            };
            out.push(Leaver {
                at: grace_end,
                job: Some(job),
                share: Remains::new(j.node as usize, share, j.gpus.clone()),
            });
        }
        out.sort_by_key(|l| l.at);
        Leavers(out)
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
pub(super) fn owed_part(before: &mut FreeBefore, p: &Placed, request: &Request) -> Option<Remains> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn place(cpu: u64, gpus: Vec<(usize, u32)>) -> Remains {
        let request = Request {
            cpu_milli: cpu,
            ..Request::default()
        };
        Remains::new(0, request, gpus)
    }

    /// An owed part: until when, whose, its CPU and its GPUs.
    type Shown = (Ms, Option<u32>, u64, Vec<(usize, u32)>);

    fn shown(owed: &[Owed]) -> Vec<Shown> {
        let part = |o: &Owed| {
            (
                o.until,
                o.owner,
                o.part.request.cpu_milli,
                o.part.gpus.clone(),
            )
        };
        owed.iter().map(part).collect()
    }

    /// Seed 324 of the differential test: a plan owes 9,408 CPU milli and a whole GPU to
    /// two pods leaving, the first (gone at 10) holding 8,000 and the GPU, the second (gone
    /// at 20) 8,000. The scheduler's hold grows by the first's share when it goes, then by
    /// what it still misses of the second's: the first owes all it has, the second the rest.
    #[test]
    fn an_owed_part_is_owed_by_the_first_to_go_first() {
        let mut leavers = Leavers(vec![
            Leaver {
                at: Ms(10),
                job: Some(7),
                share: place(8_000, vec![(2, 1000)]),
            },
            Leaver {
                at: Ms(20),
                job: Some(8),
                share: place(8_000, vec![(1, 470)]),
            },
        ]);
        let mut owed = Vec::new();
        leavers.owe(place(9_408, vec![(2, 1000)]), Ms(30), &mut owed);
        assert_eq!(
            shown(&owed),
            vec![
                (Ms(10), Some(7), 8_000, vec![(2, 1000)]),
                (Ms(20), Some(8), 1_408, vec![]),
            ]
        );
        // A second place on the node owes what is left of their shares, then nobody's.
        owed.clear();
        leavers.owe(place(8_000, vec![(1, 500)]), Ms(30), &mut owed);
        assert_eq!(
            shown(&owed),
            vec![
                (Ms(20), Some(8), 6_592, vec![(1, 470)]),
                (Ms(30), None, 1_408, vec![(1, 30)]),
            ]
        );
    }
}
