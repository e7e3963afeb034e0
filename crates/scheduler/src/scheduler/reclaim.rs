//! Reclaim (after priority preemption, before defragmentation): a pod of a queue below its
//! guarantee that fits nowhere takes devices back from queues above theirs. Core's
//! [`Entitlement`] says which queues' pods may go and how much each may lose; the victims
//! are chosen by the same victim search as preemption ([`gpuplace_core::preempt`]: exact
//! devices, topology requirements met, budgets counted, whole gangs, lowest priority and
//! fewest GPUs first). A plan that would take some queue below its guarantee is searched
//! again without that queue's pods on that node.

use std::sync::Arc;

use gpuplace_core::fairshare::{Entitlement, Loss, Picker, Res};
use gpuplace_core::preempt;

use super::post_filter::Outcome;
use super::preempt::candidates;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::framework::filter::Verdicts;
use crate::framework::{FilterInput, Profile};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// Plans tried before giving up on one pod (each drops one queue's pods on one node).
const MAX_PLANS: usize = 32;

/// The round's queue order and allocations, and the pod's queue.
pub(super) struct Fair<'p, 't, U> {
    pub picker: &'p mut Picker<'t, U>,
    pub queue: usize,
}

impl<A: ClusterApi> Scheduler<A> {
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
        let filtered = profile
            .filter(
                verdicts,
                &FilterInput {
                    snapshot,
                    scalars: &snapshot.scalars,
                    pod,
                    demand: &demand,
                    planned: &[],
                },
            )
            .ok()?;
        let started = std::time::Instant::now();
        let reservations = &self.cluster.reservations;
        let promised = self.cluster.nominations.victims();
        let queues = &self.queues;
        let takeable = |p: &PodInfo| queues.of(p).is_ok_and(|v| entitled.may_take_from(v));
        let (cands, keys) = candidates(
            snapshot,
            view,
            i32::MAX,
            Some(&takeable),
            &|uid| !reservations.is_empty() && reservations.contains(uid),
            &promised,
            filtered.mask(),
        );
        if cands.units.is_empty() {
            return None;
        }
        // Each unit's queue (a gang's from its first member).
        let unit_queue: Vec<usize> = cands
            .units
            .iter()
            .map(|u| queues.of(&keys[u.members.start]).unwrap_or(0))
            .collect();
        let mut taken = vec![false; cands.units.len()];
        let mut found = None;
        for _ in 0..MAX_PLANS {
            let Some(plan) = preempt::find(
                &snapshot.state,
                &demand.request,
                &cands,
                filtered.mask(),
                &taken,
            ) else {
                break;
            };
            let losses = losses_of(snapshot, &cands, &unit_queue, &plan.units);
            match entitled.check(&losses) {
                Ok(()) => {
                    found = Some((plan, losses));
                    break;
                }
                Err(v) => {
                    // Not that queue's pods on that node.
                    for (u, unit) in cands.units.iter().enumerate() {
                        let on_node = cands.holders[unit.members.clone()]
                            .iter()
                            .any(|h| h.node == plan.node);
                        if unit_queue[u] == v && on_node {
                            taken[u] = true;
                        }
                    }
                }
            }
        }
        self.preemption_times.push(started.elapsed());
        let (plan, losses) = found?;
        let victims: Vec<crate::api::PodKey> = plan
            .units
            .iter()
            .flat_map(|&u| {
                keys[cands.units[u].members.clone()]
                    .iter()
                    .map(|p| p.key.clone())
            })
            .collect();
        for &u in &plan.units {
            *report
                .reclaimed
                .entry(tree.name(unit_queue[u]).to_string())
                .or_default() += cands.units[u].members.len();
        }
        drop(cands);
        let name = tree.name(fair.queue).to_string();
        for loss in &losses {
            fair.picker.removed(loss.queue, &loss.res);
        }
        fair.picker.placed(fair.queue, &asked);
        let why = format!("to give queue {name} its guarantee");
        let outcome = self
            .nominate_one(snapshot, pod, &demand, &plan, victims, Some(&why), report)
            .await;
        Some(match outcome {
            Outcome::Nominated { node, victims } => Outcome::Reclaimed {
                node,
                victims,
                queue: name,
            },
            other => other,
        })
    }
}

/// What the plan's units take from each queue.
fn losses_of(
    snapshot: &Snapshot,
    cands: &preempt::Candidates<'_>,
    unit_queue: &[usize],
    units: &[usize],
) -> Vec<Loss> {
    let mut losses: Vec<Loss> = Vec::new();
    for &u in units {
        let mut res = Res::default();
        for h in cands.members(u) {
            let model = snapshot.state.inventory(h.node).gpu_model();
            res.add(&Res::of(h.request, Some(model)));
        }
        match losses.iter_mut().find(|l| l.queue == unit_queue[u]) {
            Some(l) => l.res.add(&res),
            None => losses.push(Loss {
                queue: unit_queue[u],
                res,
            }),
        }
    }
    losses
}
