//! The make-room stage, after preemption in PostFilter: a pod that fits nowhere, for which
//! no priority preemption exists, may have pods that opted in moved out of its way
//! (core's [`gpuplace_core::defrag::make_room`]: the fewest GPUs moved, then pods; every
//! moved pod has a planned place; budgets never broken).
//!
//! Carried out as preemption is: each moved pod is evicted through the Eviction API (a
//! budget that now refuses stops the plan there), told why in an Event (`Moved to make
//! room for ml/train-8`), and its place is planned for the replacement its controller makes
//! ([`super::defrag::Steers`]); the pending pod is nominated to the node with the freed
//! devices held for it, exactly as a preemptor waits for its victims, and told in an Event.

use std::sync::Arc;

use gpuplace_core::defrag::{self, Limits};

use super::defrag::{Eligibility, MovableSet, Steer, movable_set};
use super::preempt::{Nomination, victim_list};
use super::{RoundReport, Scheduler};
use crate::api::{ApiError, ClusterApi, ClusterView, PodKey};
use crate::framework::filter::Verdicts;
use crate::framework::{FilterInput, Profile};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// What make-room did.
pub(super) enum Made {
    /// Pods moved (evicted, their places planned); the pod is nominated to `node`.
    Moving { node: String, moved: Vec<PodKey> },
    /// Only a disruption budget stands in the way (found when planning, or the first
    /// eviction was refused).
    Blocked(String),
    /// No plan: nothing that may move makes room.
    Nothing,
}

impl Made {
    /// The part of the failure message that says what defragmentation did.
    pub(super) fn message(&self) -> Option<String> {
        match self {
            Made::Moving { node, moved } => Some(format!(
                "defragmentation: moving {} pod(s) to make room on node {node}: {}.",
                moved.len(),
                victim_list(moved)
            )),
            Made::Blocked(why) => Some(format!("defragmentation: {why}.")),
            Made::Nothing => None,
        }
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// Plans and starts moves so that `pod`, which fits nowhere, can run.
    pub(super) async fn make_room(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        report: &mut RoundReport,
    ) -> Made {
        let Ok(demand) = pod.demand.clone() else {
            return Made::Nothing;
        };
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
        let Ok(filtered) = profile.filter(verdicts, &input) else {
            return Made::Nothing;
        };
        let mask = filtered.mask().map(<[bool]>::to_vec);
        let started = std::time::Instant::now();
        let set = self.movable_now(snapshot, view, &|_| false);
        if set.movables.units() == 0 {
            return Made::Nothing;
        }
        // A plan is tried on a copy (the snapshot's holders are borrowed by the movables).
        let mut trial = snapshot.state.clone();
        let limits = Limits {
            max_pods: self.config.defrag.max_moves,
            max_milli: u64::MAX,
        };
        let plan = defrag::make_room(
            &mut self.placer,
            &mut trial,
            &demand.request,
            mask.as_deref(),
            &set.movables,
            limits,
        );
        self.preemption_times.push(started.elapsed());
        let Some(plan) = plan else {
            // Say so when only a budget stands in the way.
            if set.movables.candidates.budgets.iter().any(|&b| b < 1) {
                let mut unbounded = set.movables.clone();
                unbounded.candidates.budgets.fill(i32::MAX);
                let mut trial = snapshot.state.clone();
                if defrag::make_room(
                    &mut self.placer,
                    &mut trial,
                    &demand.request,
                    mask.as_deref(),
                    &unbounded,
                    limits,
                )
                .is_some()
                {
                    return Made::Blocked(
                        "the pods in the way are covered by a PodDisruptionBudget that allows no disruption now".into(),
                    );
                }
            }
            return Made::Nothing;
        };
        let moves = planned_moves(snapshot, &set, &plan.moves);
        let place = &plan.placements[0];
        let inventory = snapshot.state.inventory(place.node);
        let node = inventory.name.clone();
        let gpus: Vec<(String, u32)> = place
            .gpus
            .iter()
            .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
            .collect();
        drop(set);
        let why = format!("Moved to make room for {}", pod.key);
        let moved = self.start_moves(Some(&pod.key), &why, &moves).await;
        if moved.is_empty() {
            let why = self.last_move_error.take().unwrap_or_default();
            return Made::Blocked(format!("the eviction was refused ({why})"));
        }
        report.made_room += moved.len();
        self.cluster.nominations.insert(Nomination {
            key: pod.key.clone(),
            priority: pod.priority,
            node: node.clone(),
            request: demand.request.clone(),
            gpus,
            extended: demand.extended.clone(),
            victims: moved.clone(),
        });
        self.cluster.nominations.restore(&pod.key.uid, snapshot);
        if self.gate.is_open()
            && let Err(e) = self.api.nominate(&pod.key, Some(&node)).await
        {
            tracing::info!(pod = %pod.key, error = %e, "nominatedNodeName not written");
        }
        self.events.emit(
            &pod.key,
            "Normal",
            "MakingRoom",
            format!(
                "Moving {} pod(s) to make room on node {node}: {}",
                moved.len(),
                victim_list(&moved)
            ),
        );
        tracing::info!(pod = %pod.key, %node, moved = moved.len(), "making room");
        Made::Moving { node, moved }
    }

    /// Evicts the moved pods one by one through the Eviction API, each told `why`, each
    /// replacement's place planned; stops at the first refusal. Returns the pods moved.
    pub(super) async fn start_moves(
        &mut self,
        for_pod: Option<&PodKey>,
        why: &str,
        moves: &[PlannedMove],
    ) -> Vec<PodKey> {
        let mut moved = Vec::new();
        if !self.gate.is_open() {
            return moved;
        }
        for m in moves {
            let key = &m.pod.key;
            match self.api.evict_to_move(key).await {
                Ok(()) | Err(ApiError::NotFound(_)) => {}
                Err(e) => {
                    tracing::info!(pod = %key, error = %e, "move refused; the plan stops here");
                    self.last_move_error = Some(e.to_string());
                    // A budget that allows no disruption wakes it when it changes; any
                    // other refusal is tried again after a backoff.
                    if let Some(p) = for_pod
                        && !matches!(e, ApiError::Blocked(_))
                    {
                        self.unfinished.insert(p.uid.clone());
                    }
                    break;
                }
            }
            let Some(owner) = m.pod.controller.as_ref() else {
                continue;
            };
            self.events.emit(
                key,
                "Normal",
                "Moved",
                format!("{why} (from node {} to node {})", m.from, m.to),
            );
            self.steers.push(Steer {
                moved: key.clone(),
                owner: owner.uid.clone(),
                // The replacement asks what the pod asked (the held request may be
                // clamped on an over-committed node).
                request: m
                    .pod
                    .demand
                    .as_ref()
                    .map_or_else(|_| m.request.clone(), |d| d.request.clone()),
                node: m.to.clone(),
                gpus: m.gpus.clone(),
                extended: m
                    .pod
                    .demand
                    .as_ref()
                    .map(|d| d.extended.clone())
                    .unwrap_or_default(),
                for_pod: for_pod.cloned(),
                since: std::time::Instant::now(),
            });
            moved.push(key.clone());
        }
        moved
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// The pods that may move now: the round's reserved pods, victims promised to a
    /// preemptor and the pods `also` names aside.
    pub(super) fn movable_now<'s>(
        &self,
        snapshot: &'s Snapshot,
        view: &ClusterView,
        also: &dyn Fn(&str) -> bool,
    ) -> MovableSet<'s> {
        let reservations = &self.cluster.reservations;
        let promised = self.cluster.nominations.victims(&[]);
        let skip = |uid: &str| {
            (!reservations.is_empty() && reservations.contains(uid))
                || promised.contains(uid)
                || also(uid)
        };
        let rules = Eligibility {
            min_age: self.config.defrag.min_age,
            now: k8s_openapi::jiff::Timestamp::now(),
            skip: &skip,
        };
        let profile = Profile {
            volumes: &self.volumes,
        };
        movable_set(snapshot, view, &profile, &rules)
    }

    /// Make-room for a gang whose waiting `members` fit nowhere at once and for which no
    /// preemption exists: every member planned within one of `domains` (largest first),
    /// the moves started and every member nominated to its place; `None` when no plan.
    pub(super) async fn make_room_gang(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
        report: &mut RoundReport,
    ) -> Option<super::post_filter::Outcome> {
        let masks = self.member_masks(snapshot, members);
        let demands: Vec<&crate::k8s::demand::PodDemand> = members
            .iter()
            .map(|(p, _)| p.demand.as_ref().ok())
            .collect::<Option<_>>()?;
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(demands[i].request.total_gpu_milli()));
        let set = self.movable_now(snapshot, view, &|_| false);
        if set.movables.units() == 0 {
            return None;
        }
        let limits = Limits {
            max_pods: self.config.defrag.max_moves,
            max_milli: u64::MAX,
        };
        let mut trial = snapshot.state.clone();
        let mut best: Option<defrag::RoomPlan> = None;
        for domain in domains {
            let within: Vec<Vec<bool>> = order
                .iter()
                .map(|&i| {
                    let mut m = masks[i].clone().unwrap_or_default();
                    if let Some(d) = domain {
                        m.iter_mut().zip(d).for_each(|(a, b)| *a &= *b);
                    }
                    m
                })
                .collect();
            let asks: Vec<(&gpuplace_model::Request, Option<&[bool]>)> = order
                .iter()
                .zip(&within)
                .map(|(&i, m)| (&demands[i].request, Some(m.as_slice())))
                .collect();
            let plan = defrag::make_room_for_all(
                &mut self.placer,
                &mut trial,
                &asks,
                &set.movables,
                limits,
            );
            if let Some(plan) = plan
                && best.as_ref().is_none_or(|b| plan.cost < b.cost)
            {
                best = Some(plan);
            }
        }
        let plan = best?;
        let moves = planned_moves(snapshot, &set, &plan.moves);
        let places: Vec<MemberPlace> = order
            .iter()
            .zip(&plan.placements)
            .map(|(&i, p)| {
                let inventory = snapshot.state.inventory(p.node);
                MemberPlace {
                    member: i,
                    node: inventory.name.clone(),
                    gpus: p
                        .gpus
                        .iter()
                        .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
                        .collect(),
                }
            })
            .collect();
        drop(set);
        let first = &members[order[0]].0.key;
        let why = format!("Moved to make room for the gang of {first}");
        let moved = self.start_moves(Some(first), &why, &moves).await;
        if moved.is_empty() {
            return None;
        }
        report.made_room += moved.len();
        for MemberPlace {
            member: i,
            node,
            gpus,
        } in &places
        {
            let (pod, _) = &members[*i];
            self.cluster.nominations.insert(Nomination {
                key: pod.key.clone(),
                priority: pod.priority,
                node: node.clone(),
                request: demands[*i].request.clone(),
                gpus: gpus.clone(),
                extended: demands[*i].extended.clone(),
                victims: moved.clone(),
            });
            self.cluster.nominations.restore(&pod.key.uid, snapshot);
            if self.gate.is_open()
                && let Err(e) = self.api.nominate(&pod.key, Some(node)).await
            {
                tracing::info!(pod = %pod.key, error = %e, "nominatedNodeName not written");
            }
        }
        let nodes: std::collections::BTreeSet<&str> =
            places.iter().map(|p| p.node.as_str()).collect();
        let node = nodes.into_iter().collect::<Vec<_>>().join(",");
        tracing::info!(gang = %first, %node, moved = moved.len(), "making room for a gang");
        Some(super::post_filter::Outcome::Moving { node, moved })
    }
}

/// Where a gang member goes: its index, the node, GPU IDs and milli.
struct MemberPlace {
    member: usize,
    node: String,
    gpus: Vec<(String, u32)>,
}

/// `moves` (of pods of `set`) with names: pod, from, to, GPU IDs.
pub(super) fn planned_moves(
    snapshot: &Snapshot,
    set: &MovableSet<'_>,
    moves: &[defrag::Move],
) -> Vec<PlannedMove> {
    moves
        .iter()
        .map(|m| {
            let h = &set.movables.candidates.holders[m.holder];
            let inventory = snapshot.state.inventory(m.to);
            PlannedMove {
                pod: Arc::clone(&set.pods[m.holder]),
                from: snapshot.state.inventory(h.node).name.clone(),
                to: inventory.name.clone(),
                request: h.request.clone(),
                gpus: m
                    .gpus
                    .iter()
                    .map(|&(g, milli)| (inventory.gpus[g].id.clone(), milli))
                    .collect(),
            }
        })
        .collect()
}

/// One move as planned: the pod, where it is and where its replacement goes.
pub(super) struct PlannedMove {
    pub pod: Arc<PodInfo>,
    pub from: String,
    pub to: String,
    pub request: gpuplace_model::Request,
    pub gpus: Vec<(String, u32)>,
}
