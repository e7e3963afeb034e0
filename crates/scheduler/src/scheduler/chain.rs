//! PostFilter for the scheduler's loop and its gang stage: core's one chain
//! ([`gpuplace_core::cycle::post_filter`]: preemption, reclaim, make-room) over this
//! scheduler's planning for a pod ([`PodSteps`]) and for a gang whole ([`GangSteps`]),
//! then the plan that came back carried out through the API (evictions, moves,
//! nominations).

use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::cycle::{self, Chained, Found, Planner, Step};

use super::make_room::{GangRoom, Made, RoomPlanned};
use super::post_filter::{GangPreempted, Outcome, Preempted};
use super::reclaim::{Fair, GangReclaimed, Reclaimed};
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::framework::filter::Verdicts;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// A pod that fits nowhere, as Filter left it, at the round's time.
pub(super) struct Unfit<'a> {
    pub pod: &'a Arc<PodInfo>,
    pub verdicts: &'a Verdicts,
    pub now: Instant,
}

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

/// The scheduler's planning for one pod that fits nowhere.
struct PodSteps<'s, 'f, 'p, 't, A: ClusterApi, U> {
    scheduler: &'s mut Scheduler<A>,
    snapshot: &'s Snapshot,
    view: &'s ClusterView,
    verdicts: &'s Verdicts,
    pod: &'s Arc<PodInfo>,
    fair: Option<&'f Fair<'p, 't, U>>,
    now: Instant,
}

impl<A: ClusterApi, U> Planner for PodSteps<'_, '_, '_, '_, A, U> {
    type Plan = PodPlan;
    type Why = Why;

    fn applies(&self, step: Step) -> bool {
        applies(self.scheduler, self.fair.is_some(), step)
    }

    fn plan(&mut self, step: Step) -> Found<PodPlan, Why> {
        let (s, snapshot, view) = (&mut *self.scheduler, self.snapshot, self.view);
        match step {
            Step::Preempt => s
                .plan_preempt_one(snapshot, view, self.verdicts, self.pod)
                .map(PodPlan::Preempt, Why::Outcome),
            Step::Reclaim => {
                let planned = self.fair.and_then(|fair| {
                    s.plan_reclaim_one(snapshot, view, self.verdicts, self.pod, fair)
                });
                planned.map_or(Found::Nothing(Why::Quiet), |r| {
                    Found::Plan(PodPlan::Reclaim(r))
                })
            }
            Step::MakeRoom => s
                .plan_make_room(snapshot, view, self.verdicts, self.pod, self.now)
                .map(PodPlan::Room, Why::Made),
        }
    }
}

/// The scheduler's planning for a gang whose waiting members do not fit at once.
struct GangSteps<'s, 'm, 'f, 'p, 't, A: ClusterApi, U> {
    scheduler: &'s mut Scheduler<A>,
    snapshot: &'s Snapshot,
    view: &'s ClusterView,
    members: &'s [(&'m Arc<PodInfo>, Verdicts)],
    domains: &'s [Option<Vec<bool>>],
    fair: Option<&'f Fair<'p, 't, U>>,
}

impl<A: ClusterApi, U> Planner for GangSteps<'_, '_, '_, '_, '_, A, U> {
    type Plan = GangPlanned;
    type Why = Why;

    fn applies(&self, step: Step) -> bool {
        applies(self.scheduler, self.fair.is_some(), step)
    }

    fn plan(&mut self, step: Step) -> Found<GangPlanned, Why> {
        let (s, snapshot, view) = (&mut *self.scheduler, self.snapshot, self.view);
        let (members, domains) = (self.members, self.domains);
        match step {
            Step::Preempt => s
                .plan_preempt_gang(snapshot, view, members, domains)
                .map(GangPlanned::Preempt, Why::Outcome),
            Step::Reclaim => self
                .fair
                .and_then(|fair| s.plan_reclaim_gang(snapshot, view, members, domains, fair))
                .map_or(Found::Nothing(Why::Quiet), |r| {
                    Found::Plan(GangPlanned::Reclaim(r))
                }),
            Step::MakeRoom => s
                .plan_make_room_gang(snapshot, view, members, domains)
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
    /// PostFilter for `pod`, which fits nowhere: the chain planned, its plan carried out;
    /// what preemption (or reclaim) came to, and what make-room did if it was tried.
    pub(super) async fn post_filter_pod<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        unfit: Unfit<'_>,
        fair: Option<Fair<'_, '_, U>>,
        report: &mut RoundReport,
    ) -> (Outcome, Option<Made>) {
        let Unfit { pod, verdicts, now } = unfit;
        let Chained { plan, why } = cycle::post_filter(&mut PodSteps {
            scheduler: self,
            snapshot,
            view,
            verdicts,
            pod,
            fair: fair.as_ref(),
            now,
        });
        let (mut outcome, mut made) = reasons(why);
        match plan.map(|(_, p)| p) {
            None => {}
            Some(PodPlan::Preempt(p)) => {
                outcome = self
                    .nominate_one(snapshot, pod, &p.demand, &p.plan, p.victims, None, report)
                    .await;
            }
            Some(PodPlan::Reclaim(r)) => {
                if let Some(fair) = fair {
                    outcome = self.reclaim_one(snapshot, pod, r, fair, report).await;
                }
            }
            Some(PodPlan::Room(r)) => {
                made = Some(self.make_room(snapshot, view, pod, r, now, report).await);
            }
        }
        (outcome, made)
    }

    /// PostFilter for a gang whose waiting `members` do not fit at once, within one of
    /// `domains`: the chain planned, its plan carried out (every member nominated, or
    /// nothing evicted); what it came to.
    pub(super) async fn post_filter_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
        fair: Option<Fair<'_, '_, U>>,
        report: &mut RoundReport,
    ) -> Outcome {
        let Chained { plan, why } = cycle::post_filter(&mut GangSteps {
            scheduler: self,
            snapshot,
            view,
            members,
            domains,
            fair: fair.as_ref(),
        });
        let (outcome, _) = reasons(why);
        match plan.map(|(_, p)| p) {
            None => outcome,
            Some(GangPlanned::Preempt(p)) => {
                self.nominate_gang(snapshot, members, &p.plan, p.victims, None, report)
                    .await
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
