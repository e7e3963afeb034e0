//! The make-room stage, after preemption in PostFilter: a pod that fits nowhere, for which
//! no priority preemption exists, may have pods that opted in moved out of its way
//! (core's [`gpuplace_core::defrag::make_room`]: the fewest GPUs moved, then pods; every
//! moved pod has a planned place; budgets never broken).
//!
//! Carried out all or nothing: every eviction of the plan is first checked with a dry run
//! of the Eviction API (budgets, UIDs); if one would be refused, no pod moves. Then the
//! pending pod's `nominatedNodeName` is written (the API records whom the room is for
//! before any pod moves), each moved pod is evicted, told why in an Event (`Moved to make
//! room for ml/train-8`), and its place is planned for the replacement its controller
//! makes ([`super::defrag::Steers`]); the pending pod waits with the freed devices held for
//! it, exactly as a preemptor waits for its victims, and is told in an Event. An eviction
//! refused between the check and the move (a budget tightened) stops the plan: no further
//! pod moves this round, the places planned for the replacements of pods already evicted
//! stay held until they land (no moved pod is stranded), and the room made stays the
//! waiting pod's: it stays nominated, and once the moved pods are gone a later round plans
//! again on its nominated node first and finishes the plan there. A leader killed midway
//! or after its last move leaves the nomination, which the next leader adopts as a hold.

use std::sync::Arc;
use std::time::Duration;

use gpuplace_core::cycle::Found;
use gpuplace_core::defrag::{self, Limits, ROOM_RETRY};

use super::defrag::{Eligibility, MovableSet, movable_set};
use super::moves::{Announce, Moves, PlannedMove, planned_moves};
use super::preempt::victims_named_for;
use super::room_shape::RoomShape;
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView, PodKey};
use crate::framework::Filtering;
use crate::framework::filter::Verdicts;
use crate::framework::volumes::VolumeIndex;
use crate::k8s::pod_info::PodInfo;
use crate::shared::nominations::{HoldLimit, Nomination};
use crate::snapshot::Snapshot;

/// What make-room did.
pub(super) enum Made {
    /// Pods moved (evicted, their places planned); the pod is nominated to `node`.
    Moving { node: String, moved: Vec<PodKey> },
    /// Only a disruption budget stands in the way (found when planning, or the plan's
    /// dry run was refused): nothing moved.
    Blocked(String),
    /// An eviction was refused midway: the pods before it moved (their replacements keep
    /// their places), no more will this round; the pod stays nominated to the room made
    /// (when a pod moved), which a later round finishes.
    Stopped(String),
    /// No plan: nothing that may move makes room.
    Nothing,
    /// A search for pods of this shape found nothing lately; the next is not made before
    /// this long.
    Later(Duration),
}

impl Made {
    /// What it says of the pod's way out (for the `unblocked by` segment).
    pub(super) fn unblock(&self) -> Option<String> {
        match self {
            Made::Moving { node, moved } => Some(format!(
                "make-room under way: {} pod(s) moving off node {node}",
                moved.len()
            )),
            Made::Blocked(why) => Some(format!("a make-room plan, not carried out: {why}")),
            Made::Stopped(why) => Some(format!("a make-room plan, stopped midway: {why}")),
            Made::Nothing => None,
            Made::Later(wait) => Some(format!(
                "nothing found: no pods that may move make room for its shape; make-room looks again in {} s",
                wait.as_secs().max(1)
            )),
        }
    }

    /// The part of the failure message, for a pod of `namespace`, that says what
    /// defragmentation did (the pods moved counted, never named).
    pub(super) fn message(&self, namespace: &str) -> Option<String> {
        match self {
            Made::Moving { node, moved } => Some(format!(
                "defragmentation: moving {} pod(s) to make room on node {node}: {}.",
                moved.len(),
                victims_named_for(moved, namespace)
            )),
            Made::Blocked(why) | Made::Stopped(why) => Some(format!("defragmentation: {why}.")),
            Made::Nothing => None,
            Made::Later(wait) => Some(format!(
                "defragmentation: no pods that may move made room for a pod like this one; it looks again in {} s.",
                wait.as_secs().max(1)
            )),
        }
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// Plans moves so that `pod`, which fits nowhere, can run (the chain's last step).
    pub(super) fn plan_make_room(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
    ) -> Found<RoomPlanned, Made> {
        let now = round.now;
        // No pod could move: nothing to filter, plan or search (as preemption skips when
        // no pod of lower priority exists).
        if self.cluster.pods().movable_candidates() == 0 {
            return Found::Nothing(Made::Nothing);
        }
        let Ok(demand) = pod.demand.clone() else {
            return Found::Nothing(Made::Nothing);
        };
        let Ok(filtered) = self
            .profile
            .filter_alone(snapshot, &round.volumes, verdicts, pod)
        else {
            return Found::Nothing(Made::Nothing);
        };
        let mask = filtered.mask().map(<[bool]>::to_vec);
        let shape = RoomShape::of(pod, &demand);
        if let Some(until) = shape
            .as_ref()
            .and_then(|s| self.room_memo.waiting_until(s, now))
        {
            return Found::Nothing(Made::Later(until - now));
        }
        let prefer = self.nominated_node(pod);
        let ask = RoomAsk {
            demand: &demand,
            mask: mask.as_deref(),
            shape: shape.as_ref(),
            prefer: prefer.as_deref(),
        };
        match self.plan_room(round, snapshot, view, &ask) {
            Ok(room) => Found::Plan(RoomPlanned {
                demand,
                mask,
                shape,
                room,
            }),
            Err(made) => Found::Nothing(made),
        }
    }

    /// Starts the planned moves for `pod`. A pod whose eviction the plan's dry run finds
    /// refused (a budget the view does not show, a pod changed) is left out of plans for
    /// [`REFUSED_FOR`] and the plan made again without it, up to [`PLAN_ATTEMPTS`] times.
    pub(super) async fn make_room(
        &mut self,
        round: &mut RoundState,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        pod: &Arc<PodInfo>,
        planned: RoomPlanned,
        report: &mut RoundReport,
    ) -> Made {
        let RoomPlanned {
            demand,
            mask,
            shape,
            room,
        } = planned;
        let mut next = Some(room);
        let mut refused = None;
        for _ in 0..PLAN_ATTEMPTS {
            let planned = match next.take() {
                Some(room) => room,
                None => match self.plan_room(
                    round,
                    snapshot,
                    view,
                    &RoomAsk {
                        demand: &demand,
                        mask: mask.as_deref(),
                        shape: shape.as_ref(),
                        prefer: self.nominated_node(pod).as_deref(),
                    },
                ) {
                    Ok(planned) => planned,
                    Err(made) => return refused.map_or(made, Made::Blocked),
                },
            };
            let why = "Moved to make room for";
            let announce = unless_written(pod, &planned.node);
            let moved = match self
                .start_moves(
                    Some(&pod.key),
                    why,
                    &planned.moves,
                    &announce,
                    Some(&mut *snapshot),
                )
                .await
            {
                Moves::Done(moved) if !moved.is_empty() => moved,
                // Not the leader: nothing moved, nothing to wait for.
                Moves::Done(_) => return Made::Nothing,
                Moves::Refused { pod: stays, why } => {
                    self.refused_moves
                        .insert(stays.uid.clone(), self.round_clock());
                    refused = Some(why);
                    continue;
                }
                Moves::Stopped { why, moved } => {
                    if !moved.is_empty() {
                        let RoomFor { node, gpus, .. } = planned;
                        self.nominate_to_room(snapshot, pod, &demand, &node, gpus, &moved);
                    }
                    return Made::Stopped(why);
                }
            };
            return self.nominate_for_room(snapshot, pod, &demand, planned, moved, report);
        }
        Made::Blocked(refused.unwrap_or_default())
    }

    /// Core's make-room plan for `demand` with the pods that may move now; `Err` with what
    /// to say when there is none.
    fn plan_room(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        ask: &RoomAsk<'_>,
    ) -> Result<RoomFor, Made> {
        let RoomAsk {
            demand,
            mask,
            shape,
            prefer,
        } = *ask;
        let now = round.now;
        // Moved pods take back what they free: a cluster too full is no failed search.
        if !defrag::room_possible(&snapshot.state, [&demand.request]) {
            return Err(Made::Nothing);
        }
        let started = std::time::Instant::now();
        let refused = self.refused_now(now);
        let set = self.movable_now(snapshot, view, &round.volumes, &|uid| refused.contains(uid));
        if set.movables.units() == 0 {
            return Err(Made::Nothing);
        }

        // A plan is tried on a copy (the snapshot's holders are borrowed by the movables).
        let mut trial = snapshot.state.clone();
        let limits = Limits {
            max_pods: self.config.defrag.settings.max_moves,
            max_milli: u64::MAX,
        };
        // A pod nominated to a room made for it (a plan stopped midway, or an earlier
        // leader's) has it finished there when that is possible: the pods already moved
        // then moved for it.
        let only = prefer.and_then(|node| super::preempt::on_node_only(snapshot, node, mask));
        let mut plan = only.as_deref().and_then(|only| {
            defrag::make_room(
                &mut self.placer,
                &mut snapshot.state.clone(),
                &demand.request,
                Some(only),
                &set.movables,
                limits,
            )
        });
        if plan.is_none() {
            plan = defrag::make_room(
                &mut self.placer,
                &mut trial,
                &demand.request,
                mask,
                &set.movables,
                limits,
            );
        }
        round.preemption_times.push(started.elapsed());
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
                    mask,
                    &unbounded,
                    limits,
                )
                .is_some()
                {
                    return Err(Made::Blocked(
                        "the pods in the way are covered by a PodDisruptionBudget that allows no disruption now".into(),
                    ));
                }
            }
            // A search that finds nothing is not made again for this shape for a while.
            if let Some(shape) = shape {
                self.room_memo
                    .found_nothing(shape.clone(), now + ROOM_RETRY);
            }
            return Err(Made::Nothing);
        };
        let moves = planned_moves(snapshot, &set, &plan.moves);
        let place = &plan.placements[0];
        let inventory = snapshot.state.inventory(place.node);
        Ok(RoomFor {
            moves,
            node: inventory.name.clone(),
            gpus: place
                .gpus
                .iter()
                .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
                .collect(),
        })
    }

    /// The node `pod` is nominated to (by this run, or adopted from the API), if any.
    fn nominated_node(&self, pod: &PodInfo) -> Option<String> {
        self.cluster
            .nomination(&pod.key.uid)
            .map(|n| n.node.clone())
            .or_else(|| pod.nominated.clone())
    }

    /// The pods whose move the server refused lately (left out of plans).
    pub(super) fn refused_now(
        &mut self,
        now: std::time::Instant,
    ) -> std::collections::HashSet<String> {
        self.refused_moves
            .retain(|_, at| now.saturating_duration_since(*at) < REFUSED_FOR);
        self.refused_moves.keys().cloned().collect()
    }

    /// `pod` waits for the room `moved` makes: nominated, the devices held, told why.
    /// Nominates `pod` to the room made for it on `node` (`gpus`), the moved pods its
    /// victims (its `nominatedNodeName` was written before the first move).
    pub(super) fn nominate_to_room(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &PodInfo,
        demand: &crate::k8s::demand::PodDemand,
        node: &str,
        gpus: Vec<(String, u32)>,
        moved: &[PodKey],
    ) {
        let nomination = Nomination {
            key: pod.key.clone(),
            priority: pod.priority,
            node: node.to_string(),
            request: demand.request.clone(),
            gpus,
            extended: demand.extended.clone(),
            victims: moved.to_vec(),
            adopted: false,
            hold: HoldLimit::First,
        };
        self.cluster.nominate(nomination, snapshot);
    }

    fn nominate_for_room(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &Arc<PodInfo>,
        demand: &crate::k8s::demand::PodDemand,
        planned: RoomFor,
        moved: Vec<PodKey>,
        report: &mut RoundReport,
    ) -> Made {
        let RoomFor { node, gpus, .. } = planned;
        report.made_room += moved.len();
        self.nominate_to_room(snapshot, pod, demand, &node, gpus, &moved);
        self.events.emit(
            &pod.key,
            "Normal",
            "MakingRoom",
            format!(
                "Moving {} pod(s) to make room on node {node}: {}",
                moved.len(),
                victims_named_for(&moved, &pod.key.namespace)
            ),
        );
        tracing::info!(pod = %pod.key, %node, moved = moved.len(), "making room");
        Made::Moving { node, moved }
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// The pods that may move now: the round's reserved pods, victims promised to a
    /// preemptor and the pods `also` names aside.
    pub(super) fn movable_now<'s>(
        &self,
        snapshot: &'s Snapshot,
        view: &ClusterView,
        volumes: &VolumeIndex,
        also: &dyn Fn(&str) -> bool,
    ) -> MovableSet<'s> {
        let reservations = self.cluster.reservations();
        let promised = self.cluster.promised_victims(&[]);
        let skip = |uid: &str| {
            (!reservations.is_empty() && reservations.contains(uid))
                || promised.contains(uid)
                || also(uid)
        };
        let rules = Eligibility {
            min_age: self.config.defrag.settings.min_age,
            now: self.wall.timestamp(self.round_clock()),
            skip: &skip,
        };
        let filtering = Filtering {
            profile: &self.profile,
            volumes,
        };
        movable_set(snapshot, view, filtering, &rules)
    }
}

/// The nomination of `pod` to `node` to write before a plan's moves, unless the API already
/// shows it (write on change).
pub(super) fn unless_written(pod: &PodInfo, node: &str) -> Vec<Announce> {
    if pod.nominated.as_deref() == Some(node) {
        return Vec::new();
    }
    vec![Announce {
        pod: pod.key.clone(),
        node: node.to_string(),
        before: pod.nominated.clone(),
    }]
}

/// How long a pod whose move the server refused is left out of plans.
pub(super) const REFUSED_FOR: std::time::Duration = std::time::Duration::from_secs(60);
/// Plans tried for one pod in one round, each without the pods refused before.
const PLAN_ATTEMPTS: usize = 3;

/// A make-room plan for one pod: the moves, and the node and devices it then takes.
struct RoomFor {
    moves: Vec<PlannedMove>,
    node: String,
    gpus: Vec<(String, u32)>,
}

/// What a make-room search is asked: the pod's requests, its filter mask, its memo shape
/// and the node it is nominated to (tried first).
#[derive(Clone, Copy)]
struct RoomAsk<'a> {
    demand: &'a crate::k8s::demand::PodDemand,
    mask: Option<&'a [bool]>,
    shape: Option<&'a RoomShape>,
    prefer: Option<&'a str>,
}

/// A make-room plan for one pod, with its requests, filter mask and memo shape (to plan
/// again when the server refuses a move).
pub(super) struct RoomPlanned {
    demand: crate::k8s::demand::PodDemand,
    mask: Option<Vec<bool>>,
    shape: Option<RoomShape>,
    room: RoomFor,
}
