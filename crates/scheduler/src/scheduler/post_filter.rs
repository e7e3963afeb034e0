//! The PostFilter stage: priority preemption for GPUs, for one pod and for a gang on the
//! round's state (kube-scheduler's DefaultPreemption,
//! with core's victim search choosing the exact devices that come free).
//!
//! A pod (or a gang) that fits nowhere may evict pods of lower priority: the candidates
//! are bound pods of lower priority, a gang only whole; the search ([`gpuplace_core::
//! preempt`]) picks the node and victims at least cost (disruption budgets, victim
//! priority, count, GPU freed beyond the need, fragmentation after). The victims are
//! evicted with their own grace period, the preemptor's `status.nominatedNodeName` is set,
//! and while the victims terminate the GPUs they free are held for it: each round applies
//! the part of the planned devices already free to the state, so no other pod takes them.
//! The nomination ends when the pod is bound (cleared on the server if bound elsewhere) or
//! deleted. A pod with `preemptionPolicy: Never` never evicts; a pod whose victims are
//! still terminating waits for them instead of evicting more.
//!
//! Nominations, holds, candidates and messages live in [`super::preempt`].

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::cycle::Found;
use gpuplace_core::preempt;

use super::preempt::{
    candidates, no_victims, on_node_only, victims_named_for, waiting_for_victims, waiting_on_node,
};
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView, PodKey};
use crate::framework::filter::Verdicts;
use crate::framework::volumes::VolumeIndex;
use crate::k8s::pod_info::PodInfo;
use crate::shared::nominations::{HoldLimit, Nomination};
use crate::snapshot::Snapshot;

/// A plan carried out: what it came to, and whether each of its victims (in the plan's
/// order) was evicted (a refused eviction leaves its victim running, counted where it is).
pub(super) struct CarriedOut {
    pub outcome: Outcome,
    pub gone: Vec<bool>,
}

/// What preemption did for a pod that fits nowhere.
pub(super) enum Outcome {
    /// Not tried (the pod's requests or volumes are what is wrong).
    NotTried,
    /// `preemptionPolicy: Never`.
    Never,
    /// Its earlier victims are still terminating.
    Waiting,
    /// No eviction can help; so many nodes were rejected for reasons eviction cannot
    /// change.
    NoVictims(usize),
    /// Victims evicted; nominated to the node.
    Nominated { node: String, victims: Vec<PodKey> },
    /// Pods that opted in are moving out of the way (a gang's make-room); nominated.
    Moving { node: String, moved: Vec<PodKey> },
    /// A gang's plan (`by` preemption or defragmentation) could not be carried out
    /// whole: why (nothing nominated).
    Unfinished { by: &'static str, why: String },
    /// Pods of queues above their guarantee evicted for the pod's queue; nominated.
    Reclaimed {
        node: String,
        victims: Vec<PodKey>,
        queue: String,
    },
}

impl Outcome {
    /// Whether the pod was nominated (its victims or moved pods leaving): it starts when
    /// they have left, not when room frees, so it is told no projected start.
    pub(super) fn under_way(&self) -> bool {
        matches!(
            self,
            Outcome::Waiting
                | Outcome::Nominated { .. }
                | Outcome::Moving { .. }
                | Outcome::Reclaimed { .. }
        )
    }

    /// Whether PostFilter found nothing to do (or did not look).
    pub(super) fn found_nothing(&self) -> bool {
        matches!(self, Outcome::NotTried | Outcome::NoVictims(_))
    }

    /// What would unblock the pod, as PostFilter found it: a plan under way, or why none.
    pub(super) fn unblock(&self) -> Option<String> {
        Some(match self {
            Outcome::NotTried => return None,
            Outcome::Never => "nothing: its preemptionPolicy is Never".into(),
            Outcome::Waiting => "its preemption or make-room, under way: the pods it preempted or moved are terminating".into(),
            Outcome::NoVictims(_) => "nothing found: no pod of lower priority, of a queue above its guarantee, or opted in to moving would make room".into(),
            // Planned again over pods already terminating there (after a restart).
            Outcome::Nominated { node, victims } if victims.is_empty() => {
                format!("preemption under way: the pods terminating on node {node} leaving")
            }
            Outcome::Nominated { node, victims } => format!(
                "preemption under way: {} pod(s) of lower priority leaving node {node}",
                victims.len()
            ),
            Outcome::Reclaimed { node, victims, .. } => format!(
                "reclaim under way: {} pod(s) of queues above their guarantee leaving node {node}",
                victims.len()
            ),
            Outcome::Moving { node, moved } => format!(
                "make-room under way: {} pod(s) moving off node(s) {node}",
                moved.len()
            ),
            Outcome::Unfinished { by, why } => match *by {
                "preemption" => format!("a preemption plan, not carried out whole: {why}"),
                _ => format!("a make-room plan, not carried out: {why}"),
            },
        })
    }

    /// The failure message with preemption's part, in kube-scheduler's form, for a pod of
    /// `namespace`: the pods evicted or moved are counted, never named.
    pub(super) fn message(&self, failure: &str, nodes: usize, namespace: &str) -> String {
        match self {
            Outcome::NotTried => failure.to_string(),
            Outcome::Never => {
                format!("{failure} preemption: not eligible due to preemptionPolicy=Never.")
            }
            Outcome::Waiting => format!(
                "{failure} preemption: waiting for the pods preempted or moved earlier to terminate."
            ),
            Outcome::NoVictims(not_helpful) => {
                format!("{failure} {}", no_victims(nodes, *not_helpful))
            }
            Outcome::Nominated { node, victims } if victims.is_empty() => format!(
                "{failure} preemption: nominated node {node}; waiting for the pods terminating there."
            ),
            Outcome::Nominated { node, victims } => format!(
                "{failure} preemption: nominated node {node}; preempting {} pod(s) of lower priority: {}.",
                victims.len(),
                victims_named_for(victims, namespace)
            ),
            Outcome::Reclaimed {
                node,
                victims,
                queue,
            } => format!(
                "{failure} reclaim: nominated node {node}; preempting {} pod(s) of queues above their guarantee to give queue {queue} its guarantee: {}.",
                victims.len(),
                victims_named_for(victims, namespace)
            ),
            Outcome::Unfinished { by, why } => format!("{failure} {by}: {why}."),
            Outcome::Moving { node, moved } => format!(
                "{failure} defragmentation: moving {} pod(s) to make room on node(s) {node}: {}.",
                moved.len(),
                victims_named_for(moved, namespace)
            ),
        }
    }
}

/// The pods of `units` (whole gangs included).
pub(super) fn victims_of(
    cands: &preempt::Candidates<'_>,
    keys: &[Arc<PodInfo>],
    units: &[usize],
    nodes: &[usize],
) -> Victims {
    let evicted = units
        .iter()
        .flat_map(|&u| {
            keys[cands.units[u].members.clone()]
                .iter()
                .map(|p| p.key.clone())
        })
        .collect();
    let first = cands.holders.len();
    let counted = (cands.freeing.iter().enumerate())
        .filter(|(_, h)| nodes.contains(&h.node))
        .filter_map(|(i, _)| keys.get(first + i).map(|p| p.key.clone()))
        .collect();
    Victims { evicted, counted }
}

/// Whom a plan evicts, and the terminating pods on its nodes it counts on as freeing
/// room: both are promised to its nominee (no other preemptor counts on them while it
/// waits), only the first are evicted.
#[derive(Clone, Debug, Default)]
pub(super) struct Victims {
    pub evicted: Vec<PodKey>,
    pub counted: Vec<PodKey>,
}

impl Victims {
    /// Every pod the nominee waits for.
    fn promised(&self) -> Vec<PodKey> {
        self.evicted.iter().chain(&self.counted).cloned().collect()
    }
}

/// What `pod` will take on node `n` once `victims` are gone.
fn nomination(
    snapshot: &Snapshot,
    pod: &PodInfo,
    demand: &crate::k8s::demand::PodDemand,
    n: usize,
    gpus: &[(usize, u32)],
    victims: &[PodKey],
) -> Nomination {
    let inventory = snapshot.state.inventory(n);
    Nomination {
        key: pod.key.clone(),
        priority: pod.priority,
        node: inventory.name.clone(),
        request: demand.request.clone(),
        gpus: gpus
            .iter()
            .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
            .collect(),
        extended: demand.extended.clone(),
        victims: victims.to_vec(),
        adopted: false,
        hold: HoldLimit::First,
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// The node of each pod among `units`' members, for the victims' Events.
    fn nodes_of(snapshot: &Snapshot, keys: &[&PodKey]) -> HashMap<String, String> {
        keys.iter()
            .filter_map(|k| {
                let held = snapshot.held.get(&k.uid)?;
                Some((
                    k.uid.clone(),
                    snapshot.state.inventory(held.node).name.clone(),
                ))
            })
            .collect()
    }

    /// Plans priority preemption for `pod`, which fits nowhere (the chain's first step).
    pub(super) fn plan_preempt_one(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
    ) -> Found<Preempted, Outcome> {
        let Ok(demand) = pod.demand.clone() else {
            return Found::Stop(Outcome::NotTried);
        };
        if pod.never_preempts {
            return Found::Stop(Outcome::Never);
        }
        if waiting_for_victims(pod, self.cluster.nomination(&pod.key.uid), view, snapshot) {
            return Found::Stop(Outcome::Waiting);
        }
        // An adopted nomination is planned again on its node only, once.
        let adopted = self.cluster.take_adopted(&pod.key.uid);
        let Ok(filtered) = self
            .profile
            .filter_alone(snapshot, &round.volumes, verdicts, pod)
        else {
            return Found::Stop(Outcome::NotTried);
        };
        let only = adopted
            .as_deref()
            .and_then(|node| on_node_only(snapshot, node, filtered.mask()));
        let mask = only.as_deref().or(filtered.mask());
        // Nothing more to evict on an adopted nomination's node: it waits there.
        let nothing = |not_helpful| match &adopted {
            Some(_) if waiting_on_node(pod, snapshot) => Found::Stop(Outcome::Waiting),
            _ => Found::Nothing(Outcome::NoVictims(not_helpful)),
        };
        let not_helpful = filtered
            .mask()
            .map_or(0, |m| m.iter().filter(|a| !**a).count());
        let started = std::time::Instant::now();
        let reservations = self.cluster.reservations();
        let promised = self.cluster.promised_victims(&[&pod.key]);
        // With queues, priority preempts only within the pod's queue (reclaim is across).
        let queues = &self.queues;
        let own = round.queues_in_use.then(|| queues.of(pod).ok());
        let me = preempt::Contender {
            priority: pod.priority,
            queue: own.flatten(),
        };
        let same_queue = |p: &PodInfo| {
            let them = preempt::Contender {
                priority: p.priority,
                queue: queues.of(p).ok(),
            };
            preempt::may_preempt(&me, &them)
        };
        let (cands, keys) = candidates(
            snapshot,
            view,
            pod.priority,
            own.map(|_| &same_queue as &dyn Fn(&PodInfo) -> bool),
            &|uid| !reservations.is_empty() && reservations.contains(uid),
            &promised,
            mask,
        );
        if cands.units.is_empty() && cands.freeing.is_empty() {
            return nothing(not_helpful);
        }
        let plan = preempt::find(&snapshot.state, &demand.request, &cands, mask, &[]);
        round.preemption_times.push(started.elapsed());
        let Some(plan) = plan else {
            return nothing(not_helpful);
        };
        let victims = victims_of(&cands, &keys, &plan.units, &[plan.node]);
        Found::Plan(Preempted {
            demand,
            plan,
            victims,
        })
    }

    /// Evicts `victims` (the plan's) and nominates `pod` to the plan's node, the devices
    /// it will take held for it from now on. `why` ends the victims' Events.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn nominate_one(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &Arc<PodInfo>,
        demand: &crate::k8s::demand::PodDemand,
        plan: &preempt::Preemption,
        victims: Victims,
        why: Option<&str>,
        report: &mut RoundReport,
    ) -> CarriedOut {
        let node = snapshot.state.inventory(plan.node).name.clone();
        let promised = victims.promised();
        let nomination = nomination(snapshot, pod, demand, plan.node, &plan.gpus, &promised);
        let victims = victims.evicted;
        let where_ = Self::nodes_of(snapshot, &victims.iter().collect::<Vec<_>>());
        let carried = self
            .carry_out(
                &pod.key,
                &where_,
                &victims,
                &[(pod.key.clone(), node.clone())],
                why,
                false,
            )
            .await;
        // A pod keeps what its evicted victims freed even when some eviction was refused
        // (it is tried again after a backoff, the hold kept from others).
        report.preempted += carried.evicted();
        // A nomination made anew replaces the pod's earlier one and its hold.
        self.cluster.nominate(nomination, snapshot);
        tracing::info!(pod = %pod.key, %node, victims = victims.len(), "preempting");
        CarriedOut {
            outcome: Outcome::Nominated { node, victims },
            gone: carried.gone,
        }
    }

    /// Plans priority preemption for a gang whose waiting `members` do not fit at once:
    /// every member is planned (members that fit placed as they are, the others each
    /// evicting), within one of `domains`.
    pub(super) fn plan_preempt_gang(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
    ) -> Found<GangPreempted, Outcome> {
        if let Some(outcome) = self.gang_not_eligible(snapshot, view, members) {
            return Found::Stop(outcome);
        }
        // Members nominated by an earlier run are planned again on their nodes only, once.
        let adopted: Vec<Option<String>> = members
            .iter()
            .map(|(p, _)| self.cluster.take_adopted(&p.key.uid))
            .collect();
        let any_adopted = adopted.iter().any(Option::is_some);
        // Nothing more to evict for an adopted plan: the gang waits for what terminates.
        let nothing = |not_helpful| {
            if any_adopted && members.iter().any(|(p, _)| waiting_on_node(p, snapshot)) {
                Found::Stop(Outcome::Waiting)
            } else {
                Found::Nothing(Outcome::NoVictims(not_helpful))
            }
        };
        // A gang evicts only what every member outranks.
        let priority = preempt::gang_priority(members.iter().map(|(p, _)| p.priority)).unwrap_or(0);
        let reservations = self.cluster.reservations();
        let deciding: Vec<&PodKey> = members.iter().map(|(p, _)| &p.key).collect();
        let promised = self.cluster.promised_victims(&deciding);
        let queues = &self.queues;
        let own = round
            .queues_in_use
            .then(|| members.first().and_then(|(p, _)| queues.of(p).ok()));
        let me = preempt::Contender {
            priority,
            queue: own.flatten(),
        };
        let same_queue = |p: &PodInfo| {
            let them = preempt::Contender {
                priority: p.priority,
                queue: queues.of(p).ok(),
            };
            preempt::may_preempt(&me, &them)
        };
        let (cands, keys) = candidates(
            snapshot,
            view,
            priority,
            own.map(|_| &same_queue as &dyn Fn(&PodInfo) -> bool),
            &|uid| !reservations.is_empty() && reservations.contains(uid),
            &promised,
            None,
        );
        let started = std::time::Instant::now();
        let mut masks = self.member_masks(snapshot, &round.volumes, members);
        let not_helpful = masks
            .iter()
            .flatten()
            .map(|m| m.iter().filter(|a| !**a).count())
            .min()
            .unwrap_or(0);
        for (mask, node) in masks.iter_mut().zip(&adopted) {
            if let (Some(m), Some(node)) = (mask.as_mut(), node)
                && let Some(only) = on_node_only(snapshot, node, Some(m))
            {
                *m = only;
            }
        }
        if cands.units.is_empty() && cands.freeing.is_empty() {
            return nothing(not_helpful);
        }
        let search = GangSearch {
            members,
            masks: &masks,
            domains,
        };
        let best = search.best(&mut self.placer, snapshot, &cands, &[]);
        round.preemption_times.push(started.elapsed());
        let plan = match best {
            Err(NotPlanned) => return Found::Stop(Outcome::NotTried),
            Ok(None) => return nothing(not_helpful),
            Ok(Some(plan)) => plan,
        };
        let nodes: Vec<usize> = plan.plan.placements.iter().map(|p| p.0).collect();
        let victims = victims_of(&cands, &keys, &plan.plan.units, &nodes);
        Found::Plan(GangPreempted { plan, victims })
    }

    /// Why the gang may not preempt now, if so: a member's requests are wrong, a member
    /// never preempts, or victims evicted earlier are still terminating.
    fn gang_not_eligible(
        &self,
        snapshot: &Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
    ) -> Option<Outcome> {
        if members.iter().any(|(p, _)| p.demand.is_err()) {
            return Some(Outcome::NotTried);
        }
        if members.iter().any(|(p, _)| p.never_preempts) {
            return Some(Outcome::Never);
        }
        let nominations = self.cluster.nominations();
        members
            .iter()
            .any(|(p, _)| waiting_for_victims(p, nominations.get(&p.key.uid), view, snapshot))
            .then_some(Outcome::Waiting)
    }

    /// Each member's filter mask over every node (`None`: its filters reject everything).
    pub(super) fn member_masks(
        &self,
        snapshot: &Snapshot,
        volumes: &VolumeIndex,
        members: &[(&Arc<PodInfo>, Verdicts)],
    ) -> Vec<Option<Vec<bool>>> {
        members
            .iter()
            .map(|(p, v)| {
                let f = self.profile.filter_alone(snapshot, volumes, v, p).ok()?;
                Some(
                    f.mask()
                        .map_or_else(|| vec![true; snapshot.nodes.len()], <[bool]>::to_vec),
                )
            })
            .collect()
    }

    /// Evicts the plan's victims and nominates every member to its planned place (the
    /// devices held for it from this round on). `why` ends the victims' Events.
    pub(super) async fn nominate_gang(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[(&Arc<PodInfo>, Verdicts)],
        plan: &GangPlan,
        victims: Victims,
        why: Option<&str>,
        report: &mut RoundReport,
    ) -> CarriedOut {
        let mut nominate = Vec::new();
        let mut noms = Vec::new();
        let promised = victims.promised();
        for (&i, (n, gpus)) in plan.order.iter().zip(&plan.plan.placements) {
            let (pod, _) = &members[i];
            let Ok(d) = &pod.demand else { continue };
            let node = snapshot.state.inventory(*n).name.clone();
            nominate.push((pod.key.clone(), node));
            noms.push(nomination(snapshot, pod, d, *n, gpus, &promised));
        }
        let victims = victims.evicted;
        let where_ = Self::nodes_of(snapshot, &victims.iter().collect::<Vec<_>>());
        let by = &members[plan.order[0]].0.key;
        let carried = self
            .carry_out(by, &where_, &victims, &nominate, why, true)
            .await;
        report.preempted += carried.evicted();
        if let Some(refused) = &carried.refused {
            // No further this round: the gang backs off and plans again. Once a victim is
            // evicted the members stay nominated (the room made is the gang's, and the
            // plan made again counts the terminating victims); else none is.
            for (pod, _) in members {
                self.unfinished.insert(pod.key.uid.clone());
            }
            let kept = carried.evicted() > 0;
            if kept {
                for n in noms {
                    self.cluster.nominate(n, snapshot);
                }
            }
            tracing::info!(gang = %by, evicted = carried.evicted(), error = %refused, "gang preemption stopped");
            return CarriedOut {
                outcome: Outcome::Unfinished {
                    by: "preemption",
                    why: format!(
                        "stopped after evicting {} of {} pod(s): {refused}; {} and the gang is tried again",
                        carried.evicted(),
                        victims.len(),
                        if kept {
                            "the members stay nominated to the room made"
                        } else {
                            "no member was nominated"
                        }
                    ),
                },
                gone: carried.gone,
            };
        }
        for n in noms {
            self.cluster.nominate(n, snapshot);
        }
        let node = nominate
            .iter()
            .map(|(_, n)| n.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join(",");
        tracing::info!(gang = %by, nodes = %node, victims = victims.len(), "gang preempting");
        CarriedOut {
            outcome: Outcome::Nominated { node, victims },
            gone: carried.gone,
        }
    }
}

/// A pod's preemption as planned: its requests, core's plan and the victims' keys.
pub(super) struct Preempted {
    pub demand: crate::k8s::demand::PodDemand,
    pub plan: preempt::Preemption,
    pub victims: Victims,
}

/// A gang's preemption as planned: core's plan with the member order, the victims' keys.
pub(super) struct GangPreempted {
    pub plan: GangPlan,
    pub victims: Victims,
}

/// A member's requests could not be read: the gang is not planned.
pub(super) struct NotPlanned;

/// The cheapest gang plan found, and the member order its placements follow.
pub(super) struct GangPlan {
    pub plan: preempt::GangPreemption,
    pub order: Vec<usize>,
}

/// A gang's victim search over its topology domains.
pub(super) struct GangSearch<'a, 'p> {
    pub members: &'a [(&'p Arc<PodInfo>, Verdicts)],
    pub masks: &'a [Option<Vec<bool>>],
    pub domains: &'a [Option<Vec<bool>>],
}

impl GangSearch<'_, '_> {
    /// The cheapest plan over the domains, largest members placed first, each within its
    /// filter mask and the domain, not evicting the units marked in `excluded`.
    pub(super) fn best(
        &self,
        placer: &mut gpuplace_core::Placer,
        snapshot: &Snapshot,
        cands: &preempt::Candidates<'_>,
        excluded: &[bool],
    ) -> Result<Option<GangPlan>, NotPlanned> {
        let demand = |i: usize| self.members[i].0.demand.as_ref().ok();
        let order = preempt::largest_first(
            (0..self.members.len()).map(|i| demand(i).map_or(0, |d| d.request.total_gpu_milli())),
        );
        let mut best: Option<GangPlan> = None;
        for domain in self.domains {
            let within = super::preempt::masks_within(&order, self.masks, domain.as_deref());
            let asks: Vec<(&gpuplace_model::Request, Option<&[bool]>)> = order
                .iter()
                .zip(&within)
                .filter_map(|(&i, m)| Some((&demand(i)?.request, Some(m.as_slice()))))
                .collect();
            if asks.len() != self.members.len() {
                return Err(NotPlanned);
            }
            let plan = preempt::find_for_all(placer, &snapshot.state, &asks, cands, excluded);
            if let Some(plan) = plan
                && best.as_ref().is_none_or(|b| plan.cost < b.plan.cost)
            {
                best = Some(GangPlan {
                    plan,
                    order: order.clone(),
                });
            }
        }
        Ok(best)
    }
}
