//! PostFilter in the timeline replay: core's one chain ([`gpuplace_core::cycle::post_filter`]:
//! preemption, reclaim, make-room, in that order, as the scheduler runs it) over the replay's
//! planning for a unit (a pod, or a gang whole), then the plan carried out on simulated
//! time: victims evicted (re-created by their controller later), moved pods' replacements
//! steered to their planned places, the unit bound once its room is free.
//!
//! The plans are core's: [`preempt::find`] for a pod, [`preempt::find_for_all`] for a gang
//! (largest members first, as the scheduler's gang search), reclaim's
//! [`cycle::reclaim::plan_within_guarantees`] over either, and [`defrag::make_room_for_all`].

use std::rc::Rc;
use std::sync::Arc;

use gpuplace_core::cycle::place::{Quorum, Trial};
use gpuplace_core::cycle::{self, Cycled, Found, Planner, Step, Unit};
use gpuplace_core::defrag::RoomPlan;
use gpuplace_core::fairshare::{Loss, Picker};
use gpuplace_core::preempt::{self, Preemption};

use super::Engine;
use super::evictable::{Room, SearchAsk};
use super::freeing::holders_of;
use super::groups::Groups;
use super::movable::MovableUnits;
use super::units::{Job, Placed, Tried};
use super::victims::{Eviction, Unsure, candidates_of};
use crate::timeline::options::Ms;
use crate::trace::TracePod;

/// What the chain found for a unit.
pub(super) enum SimPlan {
    Preempt(Eviction),
    Reclaim {
        eviction: Eviction,
        losses: Vec<Loss>,
        /// Pods taken per victim queue.
        counts: Vec<(usize, u64)>,
    },
    Room {
        groups: std::sync::Arc<MovableUnits>,
        plan: RoomPlan,
        /// Member positions in the order of the plan's placements.
        order: Vec<usize>,
    },
}

/// [`Engine::plan_nodes`]'s answer: the victim groups on the nodes asked about, the plans
/// of those where evictions let the pod fit (the others have none), and the nodes whose
/// answer reads more than their own changes.
struct NodesPlanned {
    groups: Groups,
    /// The leaving pods' places the plans could count on (slots).
    freeing: Vec<u32>,
    plans: Vec<Preemption>,
    unsure: Vec<u32>,
}

/// Why a step planned nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Nothing,
    /// Make-room's memo holds the unit's shape until this time.
    Later(Ms),
}

/// The unit's queue and the round's queue standing, when the queues serve.
#[derive(Clone, Copy)]
pub(super) struct FairView<'f, 't> {
    pub queue: usize,
    pub picker: &'f Picker<'t, u32>,
}

/// The replay's planning for one unit that fits nowhere.
struct SimSteps<'e, 'a, 'f, 't> {
    engine: &'e mut Engine<'a>,
    unit: u32,
    fair: Option<FairView<'f, 't>>,
    /// The nodes the unit's queue's per-model limits leave (`None`: any).
    narrow: Option<&'f [bool]>,
    /// A nominee's nodes (its members' jobs and nodes), tried first.
    nominated: &'f [(u32, usize)],
    now: Ms,
}

impl Planner for SimSteps<'_, '_, '_, '_> {
    type Plan = SimPlan;
    type Why = Wait;

    fn applies(&self, step: Step) -> bool {
        // A nominee whose victims are still leaving waits for them (the scheduler's
        // preemption says so and evicts nothing more).
        if !self.engine.units[self.unit as usize].held.is_empty() {
            return false;
        }
        match step {
            Step::Preempt => self.engine.preempt,
            Step::Reclaim => self.fair.is_some(),
            Step::MakeRoom => self.engine.defrag.config.settings.mode.makes_room(),
        }
    }

    fn plan(&mut self, step: Step) -> Found<SimPlan, Wait> {
        let planned = match step {
            Step::Preempt => (self.engine)
                .plan_preempt(self.unit, self.now)
                .map(SimPlan::Preempt),
            Step::Reclaim => self
                .fair
                .and_then(|fair| self.engine.plan_reclaim(self.unit, fair, self.now)),
            Step::MakeRoom => {
                if let Some(until) = self.engine.room_memo_until(self.unit, self.now) {
                    return Found::Nothing(Wait::Later(until));
                }
                self.engine.plan_make_room(self.unit, self.now)
            }
        };
        planned.map_or(Found::Nothing(Wait::Nothing), Found::Plan)
    }
}

impl Unit for SimSteps<'_, '_, '_, '_> {
    type Placed = Placed;
    type Unfit = ();

    fn place(&mut self) -> Trial<Placed, ()> {
        self.engine.trial(self.unit, self.narrow, self.nominated)
    }

    fn quorum(&self) -> Quorum {
        // A gang binds whole: its minimum is its size.
        let n = self.engine.units[self.unit as usize].jobs.len() as u32;
        Quorum {
            bound: 0,
            waiting: n,
            min_member: n,
        }
    }

    fn unreserve(&mut self, trial: &Trial<Placed, ()>) {
        let e = &mut *self.engine;
        let jobs = &e.units[self.unit as usize].jobs;
        for (i, placed) in trial.placed.iter().rev() {
            let request = &e.pods[e.jobs[jobs[*i] as usize].pod as usize].request;
            // Taken a moment ago: giving it back cannot fail (the state is then as before,
            // so no remembered failure is disturbed).
            let _ = e.state.release(placed.node, request, &placed.gpus);
        }
    }
}

impl Engine<'_> {
    /// One cycle for `unit` (core's [`cycle::schedule`]): placed, else PostFilter's plan
    /// carried out; how the attempt ended. With queues serving, `fair` is the unit's queue
    /// and the round's standing (reclaim's losses taken off it).
    pub(super) fn cycle(
        &mut self,
        unit: u32,
        fair: Option<(usize, &mut Picker<'_, u32>)>,
        narrow: Option<&[bool]>,
        now: Ms,
    ) -> Tried {
        let started = |placed: bool| {
            if placed {
                Tried::Started
            } else {
                Tried::Parked
            }
        };
        // Its quiet attempts first written, as a flush's made them.
        self.speak_up(unit);
        // A nominee is decided with its hold lifted (its victims' part still theirs), its
        // nominated nodes tried first.
        let nominated: Vec<(u32, usize)> = (self.units[unit as usize].held.iter())
            .map(|(job, p)| (*job, p.node))
            .collect();
        let lifted = self.lift_hold(unit, now);
        let cycled = {
            let view = fair.as_ref().map(|(queue, picker)| FairView {
                queue: *queue,
                picker,
            });
            cycle::schedule(&mut SimSteps {
                engine: self,
                unit,
                fair: view,
                narrow,
                nominated: &nominated,
                now,
            })
        };
        let started_on: Option<Vec<(usize, usize)>> = match &cycled {
            Cycled::Allowed(trial) => {
                Some(trial.placed.iter().map(|(i, p)| (*i, p.node)).collect())
            }
            _ => None,
        };
        let promised = self.settle_hold(unit, lifted, started_on.as_deref(), now);
        let chained = match cycled {
            Cycled::Allowed(trial) => {
                for (i, placed) in trial.placed {
                    let job = self.units[unit as usize].jobs[i];
                    self.start(job, placed, now, std::time::Duration::ZERO);
                }
                if promised {
                    self.promise_until_bound(unit);
                }
                return Tried::Started;
            }
            Cycled::MembersMissing(_) => return Tried::Parked,
            Cycled::PostFiltered { chained, .. } => chained,
        };
        let tried = match chained.plan.map(|(_, p)| p) {
            None => chained
                .why
                .iter()
                .find_map(|(_, w)| match w {
                    Wait::Later(until) => Some(Tried::Later(*until)),
                    Wait::Nothing => None,
                })
                .unwrap_or(Tried::Parked),
            Some(SimPlan::Preempt(eviction)) => {
                started(self.evict_and_nominate(unit, &eviction, now))
            }
            Some(SimPlan::Reclaim {
                eviction,
                losses,
                counts,
            }) => {
                if let Some((_, picker)) = fair {
                    for loss in &losses {
                        picker.removed(loss.queue, &loss.res);
                    }
                }
                if let Some(t) = &mut self.tenants {
                    for (q, pods) in counts {
                        t.reclaimed(q, pods);
                    }
                }
                started(self.evict_and_nominate(unit, &eviction, now))
            }
            Some(SimPlan::Room {
                groups,
                plan,
                order,
            }) => started(self.carry_out(&groups, &plan, &order, unit, now)),
        };
        // What the plan did not take of its victims' places stays theirs until they are
        // gone, promised to the unit while it is nominated.
        let promised = (!self.units[unit as usize].held.is_empty()).then_some(unit);
        self.hold_remains(now, promised);
        tried
    }

    /// Core's victim search for `unit` over `groups`, not evicting those in `excluded`
    /// (the candidates built once); the units evicted and the places in member order.
    /// The leaving pods' places of `slots` count as freeing themselves.
    fn search(
        &mut self,
        unit: u32,
        groups: Groups,
        slots: &[u32],
        excluded: &[bool],
    ) -> Option<Eviction> {
        let found = {
            let (pods, jobs) = (self.pods, &self.jobs);
            let asks = asks_of(pods, jobs, &self.units[unit as usize].jobs);
            let mut candidates = candidates_of(jobs, pods, &groups);
            candidates.freeing = holders_of(&self.leaving, slots);
            search_on(&mut self.placer, &self.state, &asks, &candidates, excluded)
        };
        found.map(|(units, places)| {
            let nodes: Vec<usize> = places.iter().map(|p| p.0).collect();
            Eviction {
                groups: Rc::new(groups),
                units,
                places,
                freeing: self.slots_on(slots, &nodes),
            }
        })
    }

    /// Preemption's search for `unit` as `me` over the candidates on the nodes of `room`:
    /// the running units it may evict and the leaving pods it may count on.
    fn preempt_search(
        &mut self,
        unit: u32,
        me: &preempt::Contender<usize>,
        room: &Room,
        now: Ms,
    ) -> Option<Eviction> {
        let take = |pod| self.may_take(me, pod);
        let groups = self.victim_groups(&take, now, room, Unsure::Unasked);
        let slots = self.offered_slots(&take, room);
        self.search(unit, groups, &slots, &[])
    }

    /// Priority preemption for `unit`: lower-priority units (within its queue when the
    /// queues serve) evicted so that every member fits.
    fn plan_preempt(&mut self, unit: u32, now: Ms) -> Option<Eviction> {
        let u = &self.units[unit as usize];
        // A gang evicts only what every member outranks.
        let priority = match u.single {
            Some(one) => one.priority,
            None => preempt::gang_priority(
                u.jobs
                    .iter()
                    .map(|&j| self.pods[self.jobs[j as usize].pod as usize].priority),
            )?,
        };
        if self.by_priority.none_below(priority) {
            return None;
        }
        let single = u.single;
        let first = single.map_or_else(|| self.jobs[u.jobs[0] as usize].pod, |one| one.pod);
        let me = self.contender(first, priority);
        // A pod alone: no victim search where no node could take it after evictions, and
        // only the candidates on the nodes that could; each node's plan kept while the
        // node is unchanged.
        let Some(one) = single else {
            return self.preempt_search(unit, &me, &Room::Anywhere, now);
        };
        let request = self.request_of(one.rid);
        let room = (self.by_priority).room(&self.state, priority, request);
        match room {
            Room::Nowhere => None,
            Room::On(nodes) if self.memo => {
                let ask = SearchAsk {
                    request: one.rid,
                    priority,
                    queue: me.queue,
                };
                self.plan_preempt_kept(unit, ask, &me, &nodes, now)
            }
            room => self.preempt_search(unit, &me, &room, now),
        }
    }

    /// Pod-alone `unit`'s plan on each node marked in `nodes`: the victim groups on them,
    /// each node's plan (core's [`preempt::plans_on`]) and the nodes whose answer reads
    /// more than their own changes ([`Groups::unsure`]).
    fn plan_nodes(
        &self,
        unit: u32,
        me: &preempt::Contender<usize>,
        nodes: &[bool],
        now: Ms,
    ) -> NodesPlanned {
        let nodes: Arc<[bool]> = Arc::from(nodes);
        let room = Room::On(Arc::clone(&nodes));
        let take = |pod| self.may_take(me, pod);
        let mut groups = self.victim_groups(&take, now, &room, Unsure::Listed);
        let freeing = self.offered_slots(&take, &room);
        let unsure = std::mem::take(&mut groups.unsure);
        let (pods, jobs) = (self.pods, &self.jobs);
        let job = self.units[unit as usize].jobs[0];
        let request = &pods[jobs[job as usize].pod as usize].request;
        let mut candidates = candidates_of(jobs, pods, &groups);
        candidates.freeing = holders_of(&self.leaving, &freeing);
        let plans = preempt::plans_on(&self.state, request, &candidates, &nodes);
        drop(candidates);
        NodesPlanned {
            groups,
            freeing,
            plans,
            unsure,
        }
    }

    /// A pod's contender in a victim search: its priority and, when the queues serve, its
    /// queue.
    fn contender(&self, pod: u32, priority: i32) -> preempt::Contender<usize> {
        let tenants = self.tenants.as_ref().filter(|_| self.queues_serve);
        preempt::Contender {
            priority,
            queue: tenants.map(|t| t.queue_of_pod(pod)),
        }
    }

    /// Whether `me` may evict `pod`.
    fn may_take(&self, me: &preempt::Contender<usize>, pod: u32) -> bool {
        let priority = self.pods[pod as usize].priority;
        preempt::may_preempt(me, &self.contender(pod, priority))
    }

    /// [`Self::plan_preempt`] for a pod alone of `ask` on the nodes marked in `room`: the
    /// nodes changed since they were last planned are planned again, and the cheapest
    /// plan of all (kept or new) is carried out as the full search would choose it.
    fn plan_preempt_kept(
        &mut self,
        unit: u32,
        ask: SearchAsk,
        me: &preempt::Contender<usize>,
        room: &[bool],
        now: Ms,
    ) -> Option<Eviction> {
        let looked = (self.node_plans).look(ask, room, &self.state, &self.by_priority);
        let mut fresh: Option<(Groups, Vec<u32>, Preemption)> = None;
        if looked.any_unknown {
            let NodesPlanned {
                groups,
                freeing,
                plans,
                unsure,
            } = self.plan_nodes(unit, me, &looked.unknown, now);
            self.node_plans.learn(ask, &looked.unknown, &plans, &unsure);
            fresh = preempt::cheapest(&self.state, plans).map(|best| (groups, freeing, best));
        }
        let kept_wins = looked.best_kept.filter(|&kept| {
            (fresh.as_ref()).is_none_or(|(_, _, f)| preempt::cheaper(&self.state, kept, f.ranked()))
        });
        if let Some(kept) = kept_wins {
            fresh = match self.plan_kept_again(unit, me, kept, room.len(), now) {
                Some(again) => Some(again),
                None => {
                    // Cannot happen; the full search decides.
                    self.node_plans.forget(ask);
                    return self.preempt_search(unit, me, &Room::On(Arc::from(room)), now);
                }
            };
        }
        fresh.map(|(groups, slots, plan)| Eviction {
            freeing: self.slots_on(&slots, &[plan.node]),
            groups: Rc::new(groups),
            units: plan.units,
            places: vec![(plan.node, plan.gpus)],
        })
    }

    /// A kept plan that wins, planned again on its node alone (its victims grouped as the
    /// full search groups them); `None` if it no longer holds (cannot happen).
    fn plan_kept_again(
        &self,
        unit: u32,
        me: &preempt::Contender<usize>,
        kept: preempt::Ranked,
        nodes: usize,
        now: Ms,
    ) -> Option<(Groups, Vec<u32>, Preemption)> {
        #[cfg(test)]
        super::node_plans::KEPT_WON.with(|k| k.set(k.get() + 1));
        let mut only = vec![false; nodes];
        *only.get_mut(kept.node)? = true;
        let NodesPlanned {
            groups,
            freeing,
            plans,
            ..
        } = self.plan_nodes(unit, me, &only, now);
        let plan = plans.into_iter().find(|p| p.ranked() == kept);
        debug_assert!(plan.is_some(), "a kept plan ({kept:?}) did not hold");
        plan.map(|plan| (groups, freeing, plan))
    }
}
/// The requests of `members` (jobs), largest first (the order the scheduler plans a gang's
/// members), with their member positions.
pub(super) fn asks_of<'p>(
    pods: &'p [TracePod],
    jobs: &[Job],
    members: &[u32],
) -> Vec<(usize, &'p gpuplace_model::Request)> {
    let request = |j: u32| &pods[jobs[j as usize].pod as usize].request;
    let order = preempt::largest_first(members.iter().map(|&j| request(j).total_gpu_milli()));
    order
        .into_iter()
        .map(|i| (i, request(members[i])))
        .collect()
}

/// A unit's places: per member (in member order), node and GPUs.
pub(super) type Places = Vec<(usize, Vec<(usize, u32)>)>;

/// Core's victim search for `asks` (a pod's plan, or every member of a gang at once) over
/// `candidates`, not evicting those in `excluded`: the units evicted and the places in
/// member order.
pub(super) fn search_on(
    placer: &mut gpuplace_core::Placer,
    state: &gpuplace_core::ClusterState,
    asks: &[(usize, &gpuplace_model::Request)],
    candidates: &preempt::Candidates<'_>,
    excluded: &[bool],
) -> Option<(Vec<usize>, Places)> {
    if let [(_, request)] = asks[..] {
        let plan = preempt::find(state, request, candidates, None, excluded)?;
        return Some((plan.units, vec![(plan.node, plan.gpus)]));
    }
    let members: Vec<(&gpuplace_model::Request, Option<&[bool]>)> =
        asks.iter().map(|&(_, r)| (r, None)).collect();
    let plan = preempt::find_for_all(placer, state, &members, candidates, excluded)?;
    let mut places = vec![(0, Vec::new()); asks.len()];
    for ((i, _), place) in asks.iter().zip(plan.placements) {
        places[*i] = place;
    }
    Some((plan.units, places))
}
