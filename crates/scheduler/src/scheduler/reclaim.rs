//! Reclaim (after priority preemption, before defragmentation): a pod or a whole gang of a
//! queue below its guarantee that fits nowhere takes devices back from queues above
//! theirs. Core's [`Entitlement`] says which queues' pods may go and how much each may
//! lose; the victims are chosen by the same victim search as preemption
//! ([`gpuplace_core::preempt`]: exact devices, topology requirements met, budgets counted,
//! whole gangs, lowest priority and fewest GPUs first), checked against every guarantee by
//! core's [`cycle::reclaim`] (a plan that would take some queue below its guarantee is
//! searched again without that queue's pods on the nodes it took them from).

use std::sync::Arc;

use gpuplace_core::cycle;
use gpuplace_core::fairshare::{Entitlement, Loss, Picker, Res};
use gpuplace_core::preempt;

use super::post_filter::{GangPreempted, GangSearch, Outcome, Preempted, victims_of};
use super::preempt::candidates;
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView, PodKey};
use crate::framework::filter::Verdicts;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// The round's queue order and allocations, and the pod's (or gang's) queue.
pub(super) struct Fair<'p, 't, U> {
    pub picker: &'p mut Picker<'t, U>,
    pub queue: usize,
}

/// The pods a reclaim may evict: the victim search's candidates, their pods, and each
/// unit's queue (a gang's from its first member).
struct Pool<'s> {
    cands: preempt::Candidates<'s>,
    keys: Vec<Arc<PodInfo>>,
    unit_queue: Vec<usize>,
}

impl Pool<'_> {
    /// What evicting each unit takes, as core's reclaim plan reads it.
    fn takes<'c>(&'c self, snapshot: &'c Snapshot) -> cycle::reclaim::Takes<'c, 'c> {
        cycle::reclaim::Takes::new(&snapshot.state, &self.cands, &self.unit_queue)
    }

    /// What each victim of the plan's `units` takes from its queue, in the order of
    /// [`victims_of`] (core's [`cycle::reclaim::victim_losses`]).
    fn taking(&self, snapshot: &Snapshot, units: &[usize]) -> Taking {
        Taking {
            each: cycle::reclaim::victim_losses(
                &snapshot.state,
                &self.cands,
                &self.unit_queue,
                units,
            ),
        }
    }
}

/// What a reclaim plan takes from each victim's queue, victim by victim (what the server
/// refuses to evict stays counted).
pub(super) struct Taking {
    each: Vec<Loss>,
}

/// A pod's reclaim as planned.
pub(super) struct Reclaimed {
    pub preempted: Preempted,
    taking: Taking,
}

/// A gang's reclaim as planned.
pub(super) struct GangReclaimed {
    pub preempted: GangPreempted,
    taking: Taking,
}

impl<A: ClusterApi> Scheduler<A> {
    /// The pods that `deciding` (of a queue entitled as `entitled`) may evict, on the
    /// nodes of `mask`; `None` when there are none.
    fn reclaim_pool<'s>(
        &self,
        snapshot: &'s Snapshot,
        view: &ClusterView,
        deciding: &[&PodKey],
        entitled: &Entitlement<'_>,
        mask: Option<&[bool]>,
    ) -> Option<Pool<'s>> {
        let reservations = self.cluster.reservations();
        let promised = self.cluster.promised_victims(deciding);
        let queues = &self.queues;
        let by_queue = entitled.takeable();
        let takeable = |p: &PodInfo| {
            queues
                .of(p)
                .is_ok_and(|v| by_queue.get(v).copied().unwrap_or(false))
        };
        let (cands, keys) = candidates(
            snapshot,
            view,
            i32::MAX,
            Some(&takeable),
            &|uid| !reservations.is_empty() && reservations.contains(uid),
            &promised,
            mask,
        );
        if cands.units.is_empty() {
            return None;
        }
        let unit_queue = cands
            .units
            .iter()
            .map(|u| queues.of(&keys[u.members.start]).unwrap_or(0))
            .collect();
        Some(Pool {
            cands,
            keys,
            unit_queue,
        })
    }

    /// Plans reclaim for `pod` of queue `fair.queue`; nothing when its queue is not
    /// entitled or no plan keeps every queue at its guarantee.
    pub(super) fn plan_reclaim_one<U>(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        fair: &Fair<'_, '_, U>,
    ) -> Option<Reclaimed> {
        let demand = pod.demand.clone().ok()?;
        if pod.never_preempts {
            return None;
        }
        let asked = Res::of(&demand.request, None);
        let tree = fair.picker.tree();
        let entitled = Entitlement::new(tree, fair.picker.allocations(), fair.queue, &asked)?;
        let filtered = self
            .profile
            .filter_alone(snapshot, &round.volumes, verdicts, pod)
            .ok()?;
        let started = std::time::Instant::now();
        let pool = self.reclaim_pool(snapshot, view, &[&pod.key], &entitled, filtered.mask())?;
        let search = |taken: &[bool]| {
            preempt::find(
                &snapshot.state,
                &demand.request,
                &pool.cands,
                filtered.mask(),
                taken,
            )
        };
        let takes = pool.takes(snapshot);
        let prefer = cycle::reclaim::prefer_most_used(&takes, fair.picker);
        let found =
            cycle::reclaim::plan_within_guarantees(&takes, &entitled, prefer, search, |p| &p.units);
        round.preemption_times.push(started.elapsed());
        let found = found?;
        let victims = victims_of(
            &pool.cands,
            &pool.keys,
            &found.plan.units,
            &[found.plan.node],
        );
        Some(Reclaimed {
            taking: pool.taking(snapshot, &found.plan.units),
            preempted: Preempted {
                demand,
                plan: found.plan,
                victims,
            },
        })
    }

    /// Plans reclaim for a gang of queue `fair.queue` whose `members` do not fit at once:
    /// every member planned within one of `domains`.
    pub(super) fn plan_reclaim_gang<U>(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
        fair: &Fair<'_, '_, U>,
    ) -> Option<GangReclaimed> {
        let mut asked = Res::default();
        for (p, _) in members {
            if p.never_preempts {
                return None;
            }
            asked.add(&Res::of(&p.demand.as_ref().ok()?.request, None));
        }
        let tree = fair.picker.tree();
        let entitled = Entitlement::new(tree, fair.picker.allocations(), fair.queue, &asked)?;
        let started = std::time::Instant::now();
        let deciding: Vec<&PodKey> = members.iter().map(|(p, _)| &p.key).collect();
        let pool = self.reclaim_pool(snapshot, view, &deciding, &entitled, None)?;
        let masks = self.member_masks(snapshot, &round.volumes, members);
        let gang = GangSearch {
            members,
            masks: &masks,
            domains,
        };
        let placer = &mut self.placer;
        let search = |taken: &[bool]| gang.best(placer, snapshot, &pool.cands, taken).ok()?;
        let takes = pool.takes(snapshot);
        let prefer = cycle::reclaim::prefer_most_used(&takes, fair.picker);
        let found =
            cycle::reclaim::plan_within_guarantees(&takes, &entitled, prefer, search, |p| {
                &p.plan.units
            });
        round.preemption_times.push(started.elapsed());
        let found = found?;
        let nodes: Vec<usize> = found.plan.plan.placements.iter().map(|p| p.0).collect();
        let victims = victims_of(&pool.cands, &pool.keys, &found.plan.plan.units, &nodes);
        Some(GangReclaimed {
            taking: pool.taking(snapshot, &found.plan.plan.units),
            preempted: GangPreempted {
                plan: found.plan,
                victims,
            },
        })
    }

    /// Carries a pod's reclaim out: counted, taken off the round's allocations, the
    /// victims evicted and the pod nominated.
    pub(super) async fn reclaim_one<U>(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &Arc<PodInfo>,
        planned: Reclaimed,
        fair: Fair<'_, '_, U>,
        report: &mut RoundReport,
    ) -> Outcome {
        let queue = fair.picker.tree().name(fair.queue).to_string();
        let why = format!("to give queue {queue} its guarantee");
        let Preempted {
            demand,
            plan,
            victims,
        } = planned.preempted;
        let carried = self
            .nominate_one(snapshot, pod, &demand, &plan, victims, Some(&why), report)
            .await;
        taken_back(fair, &planned.taking, &carried.gone, report);
        reclaimed(carried.outcome, queue)
    }

    /// Carries a gang's reclaim out, as gang preemption is: every eviction dry-run first
    /// (a refusal there evicts nothing), then one by one, each while this replica leads;
    /// every member nominated, or, stopped midway, none nominated and the gang tried again.
    pub(super) async fn reclaim_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[(&Arc<PodInfo>, Verdicts)],
        planned: GangReclaimed,
        fair: Fair<'_, '_, U>,
        report: &mut RoundReport,
    ) -> Outcome {
        let queue = fair.picker.tree().name(fair.queue).to_string();
        let why = format!("to give queue {queue} its guarantee");
        let GangPreempted { plan, victims } = planned.preempted;
        let carried = self
            .nominate_gang(snapshot, members, &plan, victims, Some(&why), report)
            .await;
        taken_back(fair, &planned.taking, &carried.gone, report);
        reclaimed(carried.outcome, queue)
    }
}

/// Takes what the victims that are `gone` (evicted, in the plan's order) held off their
/// queues' allocations for the rest of the round (the taker's nominations are counted once
/// the unit is decided) and counts them per queue in the round's report. A victim the
/// server would not evict still runs: its queue keeps counting it, against its limit too.
fn taken_back<U>(fair: Fair<'_, '_, U>, taking: &Taking, gone: &[bool], report: &mut RoundReport) {
    for (loss, _) in taking.each.iter().zip(gone).filter(|(_, gone)| **gone) {
        let name = fair.picker.tree().name(loss.queue).to_string();
        *report.reclaimed.entry(name).or_default() += 1;
        fair.picker.removed(loss.queue, &loss.res);
    }
}

/// A nomination made by reclaim, told as one.
fn reclaimed(outcome: Outcome, queue: String) -> Outcome {
    match outcome {
        Outcome::Nominated { node, victims } => Outcome::Reclaimed {
            node,
            victims,
            queue,
        },
        other => other,
    }
}
