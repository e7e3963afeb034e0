//! The scheduler's loop and its gang stage in core's one cycle
//! ([`gpuplace_core::cycle::schedule`]: Filter, Score, Reserve, Permit, then PostFilter's
//! chain of preemption, reclaim, make-room): this scheduler's units, a pod ([`PodSteps`])
//! and a gang whole ([`GangSteps`]), placed on the round's snapshot
//! ([`crate::shared::members::OnSnapshot`]) and planned for, then what the cycle came to carried
//! out through the API (Bindings, evictions, moves, nominations).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::cycle::place::{self, Quorum, Trial};
use gpuplace_core::cycle::{Chained, Found, Planner, Step, Unit};

use super::gang_status::Gang;
use super::make_room::{Made, RoomPlanned};
use super::make_room_gang::GangRoom;
use super::post_filter::{GangPreempted, Outcome, Preempted};
use super::reclaim::{Fair, GangReclaimed, Reclaimed};
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::framework::Filtering;
use crate::framework::filter::Verdicts;
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::{Nominated, OnSnapshot, ReserveOn, Steered, Trialled};
use crate::snapshot::Snapshot;

/// Why a step planned nothing for a pod.
pub(super) enum Why {
    /// Preemption's reason (no victims, never preempts, waiting for victims...).
    Outcome(Outcome),
    /// Make-room's (a budget in the way, or nothing).
    Made(Made),
    /// Nothing to say (reclaim, or a gang's make-room).
    Quiet,
}

/// A pod's plan, as the chain found it.
pub(super) enum PodPlan {
    Preempt(Preempted),
    Reclaim(Reclaimed),
    Room(RoomPlanned),
}

/// A gang's plan, as the chain found it.
pub(super) enum GangPlanned {
    Preempt(GangPreempted),
    Reclaim(GangReclaimed),
    Room(GangRoom),
}

/// Time a cycle spent in Filter and in core.
#[derive(Clone, Copy, Default)]
pub(super) struct Spent {
    pub filter: Duration,
    pub core: Duration,
}

/// One pod in the cycle: placed, else planned for.
pub(super) struct PodSteps<'s, 'a, 'f, 'p, 't, A: ClusterApi, U> {
    pub scheduler: &'s mut Scheduler<A>,
    pub snapshot: &'s Snapshot,
    pub view: &'s ClusterView,
    pub verdicts: &'s Verdicts,
    pub pod: &'a Arc<PodInfo>,
    /// The pod's planned place when it replaces a moved pod.
    pub steered: &'s Steered<'s>,
    /// The pod's nominated node when a plan evicted or moved pods for it.
    pub nominated: &'s Nominated,
    pub fair: Option<&'f Fair<'p, 't, U>>,
    pub round: &'s mut RoundState,
    /// The nodes the pod's queue's per-model limits leave (`None`: any).
    pub narrow: Option<&'s [bool]>,
    pub spent: Spent,
    /// What the pod was found short of when it fit nowhere.
    pub unfit: Option<crate::shared::members::UnfitFound>,
}

impl<'a, A: ClusterApi, U> Unit for PodSteps<'_, 'a, '_, '_, '_, A, U> {
    type Placed = Trialled<'a>;
    type Unfit = String;

    fn place(&mut self) -> Trial<Trialled<'a>, String> {
        let started = Instant::now();
        let s = &mut *self.scheduler;
        let mut members = OnSnapshot::new(
            self.snapshot,
            Filtering {
                profile: &s.profile,
                volumes: &self.round.volumes,
            },
            vec![(self.pod, self.verdicts)],
            self.steered,
            ReserveOn::Assume,
        );
        members.nominated = Some(self.nominated);
        let trial = place::trial(&mut members, &mut s.placer, self.narrow);
        self.unfit = members.unfit.take();
        self.spent.filter += members.filter_time;
        self.spent.core += started.elapsed().saturating_sub(members.filter_time);
        trial
    }

    fn quorum(&self) -> Quorum {
        Quorum::ONE
    }

    /// A pod's place is reserved by `assume` only once Permit allowed it.
    fn unreserve(&mut self, _: &Trial<Trialled<'a>, String>) {}
}

impl<A: ClusterApi, U> Planner for PodSteps<'_, '_, '_, '_, '_, A, U> {
    type Plan = PodPlan;
    type Why = Why;

    /// A moved pod's replacement waits for its planned place (held for it, coming free as
    /// the pods there leave): it evicts nothing and moves nothing meanwhile.
    fn applies(&self, step: Step) -> bool {
        !self.steered.contains_key(&self.pod.key.uid)
            && applies(self.scheduler, self.fair.is_some(), step)
    }

    fn plan(&mut self, step: Step) -> Found<PodPlan, Why> {
        let (s, snapshot, view) = (&mut *self.scheduler, self.snapshot, self.view);
        let round = &mut *self.round;
        match step {
            Step::Preempt => s
                .plan_preempt_one(round, snapshot, view, self.verdicts, self.pod)
                .map(PodPlan::Preempt, Why::Outcome),
            Step::Reclaim => {
                let planned = self.fair.and_then(|fair| {
                    s.plan_reclaim_one(round, snapshot, view, self.verdicts, self.pod, fair)
                });
                planned.map_or(Found::Nothing(Why::Quiet), |r| {
                    Found::Plan(PodPlan::Reclaim(r))
                })
            }
            Step::MakeRoom => s
                .plan_make_room(round, snapshot, view, self.verdicts, self.pod)
                .map(PodPlan::Room, Why::Made),
        }
    }
}

/// A gang whole in the cycle: its waiting members placed together in one of its domains,
/// else planned for.
pub(super) struct GangSteps<'s, 'm, 'f, 'p, 't, A: ClusterApi, U> {
    pub scheduler: &'s mut Scheduler<A>,
    pub snapshot: &'s Snapshot,
    pub view: &'s ClusterView,
    pub gang: &'s Gang,
    pub members: &'s [(&'m Arc<PodInfo>, Verdicts)],
    pub domains: &'s [Option<Vec<bool>>],
    /// Moved members' planned places.
    pub steered: &'s Steered<'s>,
    /// Nominated members' nodes.
    pub nominated: &'s Nominated,
    pub fair: Option<&'f Fair<'p, 't, U>>,
    pub round: &'s mut RoundState,
    /// The nodes the gang's queue's per-model limits leave (`None`: any).
    pub narrow: Option<&'s [bool]>,
    /// Why members did not fit, over the domains where too few did.
    pub failure: Option<String>,
    /// What the first member that fit nowhere was short of (the first domain's).
    pub unfit: Option<crate::shared::members::UnfitFound>,
}

impl<'m, A: ClusterApi, U> Unit for GangSteps<'_, 'm, '_, '_, '_, A, U> {
    type Placed = Trialled<'m>;
    type Unfit = String;

    /// A trial on a copy of the state in each domain (one value of the gang's topology key,
    /// or the whole cluster); core keeps the best.
    fn place(&mut self) -> Trial<Trialled<'m>, String> {
        let quorum = self.quorum();
        let s = &mut *self.scheduler;
        let mut trials = Vec::with_capacity(self.domains.len());
        for domain in self.domains {
            let members = self.members.iter().map(|(p, v)| (*p, v)).collect();
            let mut on = OnSnapshot::new(
                self.snapshot,
                Filtering {
                    profile: &s.profile,
                    volumes: &self.round.volumes,
                },
                members,
                self.steered,
                ReserveOn::Copy,
            );
            on.domain = domain.as_deref();
            on.nominated = Some(self.nominated);
            let trial = place::trial(&mut on, &mut s.placer, self.narrow);
            if self.unfit.is_none() {
                self.unfit = on.unfit.take();
            }
            trials.push((trial, on.frag()));
        }
        let (best, failure) = place::keep_best(trials, quorum);
        self.failure = failure.or_else(|| {
            (self.domains.is_empty()).then(|| "no node has the gang's topology key".to_string())
        });
        best.unwrap_or_else(|| Trial::failed(None))
    }

    fn quorum(&self) -> Quorum {
        Quorum {
            bound: self.gang.bound,
            waiting: self.members.len() as u32,
            min_member: self.gang.spec.min_member,
        }
    }

    /// The trials were on copies of the state.
    fn unreserve(&mut self, _: &Trial<Trialled<'m>, String>) {}
}

impl<A: ClusterApi, U> Planner for GangSteps<'_, '_, '_, '_, '_, A, U> {
    type Plan = GangPlanned;
    type Why = Why;

    /// A moved gang's replacements wait for their planned places, as a pod's does.
    fn applies(&self, step: Step) -> bool {
        let steered = |(p, _): &(&Arc<PodInfo>, Verdicts)| self.steered.contains_key(&p.key.uid);
        !self.members.iter().all(steered) && applies(self.scheduler, self.fair.is_some(), step)
    }

    fn plan(&mut self, step: Step) -> Found<GangPlanned, Why> {
        let (s, snapshot, view) = (&mut *self.scheduler, self.snapshot, self.view);
        let (members, domains) = (self.members, self.domains);
        let round = &mut *self.round;
        match step {
            Step::Preempt => s
                .plan_preempt_gang(round, snapshot, view, members, domains)
                .map(GangPlanned::Preempt, Why::Outcome),
            Step::Reclaim => self
                .fair
                .and_then(|fair| s.plan_reclaim_gang(round, snapshot, view, members, domains, fair))
                .map_or(Found::Nothing(Why::Quiet), |r| {
                    Found::Plan(GangPlanned::Reclaim(r))
                }),
            Step::MakeRoom => s
                .plan_make_room_gang(round, snapshot, view, members, domains)
                .map_or(Found::Nothing(Why::Quiet), |r| {
                    Found::Plan(GangPlanned::Room(r))
                }),
        }
    }
}

/// Whether `step` applies to a unit: preemption always (its plan says why not), reclaim
/// when the queues serve, make-room when defragmentation makes room.
fn applies<A: ClusterApi>(scheduler: &Scheduler<A>, queues_serve: bool, step: Step) -> bool {
    match step {
        Step::Preempt => true,
        Step::Reclaim => queues_serve,
        Step::MakeRoom => scheduler.config.defrag.settings.mode.makes_room(),
    }
}

/// Preemption's reason and make-room's, from the steps that planned nothing.
fn reasons(why: Vec<(Step, Why)>) -> (Outcome, Option<Made>) {
    let mut outcome = Outcome::NotTried;
    let mut made = None;
    for (_, w) in why {
        match w {
            Why::Outcome(o) => outcome = o,
            Why::Made(m) => made = Some(m),
            Why::Quiet => {}
        }
    }
    (outcome, made)
}

impl<A: ClusterApi> Scheduler<A> {
    /// PostFilter's plan for `pod`, which fits nowhere, carried out: what preemption (or
    /// reclaim) came to, and what make-room did if it was tried.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn carry_out_pod<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        pod: &Arc<PodInfo>,
        round: &mut RoundState,
        chained: Chained<PodPlan, Why>,
        fair: Option<Fair<'_, '_, U>>,
        report: &mut RoundReport,
    ) -> (Outcome, Option<Made>) {
        let Chained { plan, why } = chained;
        let (mut outcome, mut made) = reasons(why);
        match plan.map(|(_, p)| p) {
            None => {}
            Some(PodPlan::Preempt(p)) => {
                outcome = self
                    .nominate_one(snapshot, pod, &p.demand, &p.plan, p.victims, None, report)
                    .await
                    .outcome;
            }
            Some(PodPlan::Reclaim(r)) => {
                if let Some(fair) = fair {
                    outcome = self.reclaim_one(snapshot, pod, r, fair, report).await;
                }
            }
            Some(PodPlan::Room(r)) => {
                made = Some(self.make_room(round, snapshot, view, pod, r, report).await);
            }
        }
        (outcome, made)
    }

    /// PostFilter's plan for a gang whose waiting `members` do not fit at once carried out
    /// (every member nominated, or nothing evicted); what it came to.
    pub(super) async fn carry_out_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[(&Arc<PodInfo>, Verdicts)],
        chained: Chained<GangPlanned, Why>,
        fair: Option<Fair<'_, '_, U>>,
        report: &mut RoundReport,
    ) -> Outcome {
        let Chained { plan, why } = chained;
        let (outcome, _) = reasons(why);
        match plan.map(|(_, p)| p) {
            None => outcome,
            Some(GangPlanned::Preempt(p)) => {
                self.nominate_gang(snapshot, members, &p.plan, p.victims, None, report)
                    .await
                    .outcome
            }
            Some(GangPlanned::Reclaim(r)) => match fair {
                Some(fair) => self.reclaim_gang(snapshot, members, r, fair, report).await,
                None => outcome,
            },
            Some(GangPlanned::Room(r)) => self
                .make_room_gang(snapshot, members, r, report)
                .await
                .unwrap_or(outcome),
        }
    }
}
