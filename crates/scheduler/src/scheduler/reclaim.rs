//! Reclaim (after priority preemption, before defragmentation): a pod or a whole gang of a
//! queue below its guarantee that fits nowhere takes devices back from queues above
//! theirs. Core's [`Entitlement`] says which queues' pods may go and how much each may
//! lose; the victims are chosen by the same victim search as preemption
//! ([`gpuplace_core::preempt`]: exact devices, topology requirements met, budgets counted,
//! whole gangs, lowest priority and fewest GPUs first). A plan that would take some queue
//! below its guarantee is searched again without that queue's pods on the nodes it took
//! them from.

use std::sync::Arc;

use gpuplace_core::fairshare::{Entitlement, Loss, Picker, Res};
use gpuplace_core::preempt;

use super::post_filter::{GangSearch, Outcome, victims_of};
use super::preempt::candidates;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView, PodKey};
use crate::framework::filter::Verdicts;
use crate::framework::{FilterInput, Profile};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// Plans tried before giving up (each drops one queue's pods on the nodes it lost them).
const MAX_PLANS: usize = 32;

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
    /// What the plan's `units` take from each queue.
    fn losses(&self, snapshot: &Snapshot, units: &[usize]) -> Vec<Loss> {
        let mut losses: Vec<Loss> = Vec::new();
        for &u in units {
            let mut res = Res::default();
            for h in self.cands.members(u) {
                let model = snapshot.state.inventory(h.node).gpu_model();
                res.add(&Res::of(h.request, Some(model)));
            }
            match losses.iter_mut().find(|l| l.queue == self.unit_queue[u]) {
                Some(l) => l.res.add(&res),
                None => losses.push(Loss {
                    queue: self.unit_queue[u],
                    res,
                }),
            }
        }
        losses
    }

    /// Marks queue `v`'s units on the nodes the plan's `units` took its pods from.
    fn exclude(&self, units: &[usize], v: usize, taken: &mut [bool]) {
        let nodes: Vec<usize> = units
            .iter()
            .filter(|&&u| self.unit_queue[u] == v)
            .flat_map(|&u| self.cands.members(u).iter().map(|h| h.node))
            .collect();
        for (u, unit) in self.cands.units.iter().enumerate() {
            let on_node = self.cands.holders[unit.members.clone()]
                .iter()
                .any(|h| nodes.contains(&h.node));
            if self.unit_queue[u] == v && on_node {
                taken[u] = true;
            }
        }
    }

    /// The first plan `search` finds (given the units excluded so far) whose losses keep
    /// every queue at its guarantee, with those losses.
    fn plan<P>(
        &self,
        snapshot: &Snapshot,
        entitled: &Entitlement<'_>,
        mut search: impl FnMut(&[bool]) -> Option<P>,
        units_of: impl Fn(&P) -> &[usize],
    ) -> Option<(P, Vec<Loss>)> {
        let mut taken = vec![false; self.cands.units.len()];
        for _ in 0..MAX_PLANS {
            let plan = search(&taken)?;
            let losses = self.losses(snapshot, units_of(&plan));
            match entitled.check(&losses) {
                Ok(()) => return Some((plan, losses)),
                Err(v) => self.exclude(units_of(&plan), v, &mut taken),
            }
        }
        None
    }

    /// Counts the plan's victims per queue in the round's report.
    fn report(
        &self,
        tree_name: impl Fn(usize) -> String,
        units: &[usize],
        report: &mut RoundReport,
    ) {
        for &u in units {
            *report
                .reclaimed
                .entry(tree_name(self.unit_queue[u]))
                .or_default() += self.cands.units[u].members.len();
        }
    }
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
        let reservations = &self.cluster.reservations;
        let promised = self.cluster.nominations.victims(deciding);
        let queues = &self.queues;
        let takeable = |p: &PodInfo| queues.of(p).is_ok_and(|v| entitled.may_take_from(v));
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

    /// Reclaim for `pod` of queue `fair.queue`; `None` when its queue is not entitled or no
    /// plan keeps every queue at its guarantee.
    pub(super) async fn reclaim_one<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        fair: Fair<'_, '_, U>,
        report: &mut RoundReport,
    ) -> Option<Outcome> {
        let demand = pod.demand.clone().ok()?;
        if pod.never_preempts {
            return None;
        }
        let asked = Res::of(&demand.request, None);
        let tree = fair.picker.tree();
        let entitled = Entitlement::new(tree, fair.picker.allocations(), fair.queue, &asked)?;
        let profile = Profile {
            volumes: &self.volumes,
        };
        let input = FilterInput {
            snapshot,
            scalars: &snapshot.scalars,
            pod,
            demand: &demand,
            planned: &[],
        };
        let filtered = profile.filter(verdicts, &input).ok()?;
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
        let found = pool.plan(snapshot, &entitled, search, |p| &p.units);
        self.preemption_times.push(started.elapsed());
        let (plan, losses) = found?;
        pool.report(|q| tree.name(q).to_string(), &plan.units, report);
        let victims = victims_of(&pool.cands, &pool.keys, &plan.units);
        drop(pool);
        let queue = taken_back(fair, &losses);
        let why = format!("to give queue {queue} its guarantee");
        let outcome = self
            .nominate_one(snapshot, pod, &demand, &plan, victims, Some(&why), report)
            .await;
        Some(reclaimed(outcome, queue))
    }

    /// Reclaim for a gang of queue `fair.queue` whose `members` do not fit at once: every
    /// member planned within one of `domains`, all nominated or nothing evicted.
    pub(super) async fn reclaim_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
        fair: Fair<'_, '_, U>,
        report: &mut RoundReport,
    ) -> Option<Outcome> {
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
        let masks = self.member_masks(snapshot, members);
        let gang = GangSearch {
            members,
            masks: &masks,
            domains,
        };
        let placer = &mut self.placer;
        let search = |taken: &[bool]| gang.best(placer, snapshot, &pool.cands, taken).ok()?;
        let found = pool.plan(snapshot, &entitled, search, |p| &p.plan.units);
        self.preemption_times.push(started.elapsed());
        let (plan, losses) = found?;
        pool.report(|q| tree.name(q).to_string(), &plan.plan.units, report);
        let victims = victims_of(&pool.cands, &pool.keys, &plan.plan.units);
        drop(pool);
        let queue = taken_back(fair, &losses);
        let why = format!("to give queue {queue} its guarantee");
        let outcome = self
            .nominate_gang(snapshot, members, &plan, victims, Some(&why), report)
            .await;
        Some(reclaimed(outcome, queue))
    }
}

/// Takes what the plan takes from the victims' queues off the round's allocations (the
/// taker's nominations are counted once the unit is decided); the taker's queue name.
fn taken_back<U>(fair: Fair<'_, '_, U>, losses: &[Loss]) -> String {
    for loss in losses {
        fair.picker.removed(loss.queue, &loss.res);
    }
    fair.picker.tree().name(fair.queue).to_string()
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
