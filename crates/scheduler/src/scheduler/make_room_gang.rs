//! Make-room for a gang (see [`super::make_room`] for the whole): every waiting member
//! planned at once within one topology domain, the moves carried out all or nothing, and
//! every member nominated to its place in the room made (also when a refusal stopped the
//! plan after a pod moved, for a later round to finish).

use std::sync::Arc;

use gpuplace_core::defrag::{self, Limits};

use super::make_room::unless_written;
use super::moves::{Announce, Moves, PlannedMove, planned_moves};
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView, PodKey};
use crate::framework::filter::Verdicts;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

impl<A: ClusterApi> Scheduler<A> {
    /// Plans make-room for a gang whose waiting `members` fit nowhere at once and for
    /// which no preemption exists: every member planned within one of `domains` (largest
    /// first); `None` when no plan.
    pub(super) fn plan_make_room_gang(
        &mut self,
        round: &mut RoundState,
        snapshot: &Snapshot,
        view: &ClusterView,
        members: &[(&Arc<PodInfo>, Verdicts)],
        domains: &[Option<Vec<bool>>],
    ) -> Option<GangRoom> {
        if self.cluster.pods().movable_candidates() == 0 {
            return None;
        }
        let masks = self.member_masks(snapshot, &round.volumes, members);
        let demands: Vec<&crate::k8s::demand::PodDemand> = members
            .iter()
            .map(|(p, _)| p.demand.as_ref().ok())
            .collect::<Option<_>>()?;
        let order = gpuplace_core::preempt::largest_first(
            demands.iter().map(|d| d.request.total_gpu_milli()),
        );
        let refused = self.refused_now(self.round_clock());
        let set = self.movable_now(snapshot, view, &round.volumes, &|uid| refused.contains(uid));
        if set.movables.units() == 0 {
            return None;
        }
        let limits = Limits {
            max_pods: self.config.defrag.settings.max_moves,
            max_milli: u64::MAX,
        };
        let mut trial = snapshot.state.clone();
        let mut best: Option<defrag::RoomPlan> = None;
        for domain in domains {
            let within = super::preempt::masks_within(&order, &masks, domain.as_deref());
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
        Some(GangRoom {
            moves,
            places,
            first: order[0],
        })
    }

    /// Starts a gang's planned moves and nominates every member to its place.
    pub(super) async fn make_room_gang(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[(&Arc<PodInfo>, Verdicts)],
        planned: GangRoom,
        report: &mut RoundReport,
    ) -> Option<super::post_filter::Outcome> {
        let GangRoom {
            moves,
            places,
            first,
        } = planned;
        let first = &members[first].0.key;
        let why = "Moved to make room for the gang of";
        let announce: Vec<Announce> = places
            .iter()
            .flat_map(|p| unless_written(members[p.member].0, &p.node))
            .collect();
        let moved = match self
            .start_moves(Some(first), why, &moves, &announce, Some(&mut *snapshot))
            .await
        {
            Moves::Done(moved) if !moved.is_empty() => moved,
            Moves::Done(_) => return None,
            Moves::Refused { pod: stays, why } => {
                self.refused_moves
                    .insert(stays.uid.clone(), self.round_clock());
                for (pod, _) in members {
                    self.unfinished.insert(pod.key.uid.clone());
                }
                return Some(super::post_filter::Outcome::Unfinished {
                    by: "defragmentation",
                    why,
                });
            }
            Moves::Stopped { why, moved } => {
                for (pod, _) in members {
                    self.unfinished.insert(pod.key.uid.clone());
                }
                // The room made so far stays the gang's, for a later round to finish.
                self.nominate_members(snapshot, members, &places, &moved);
                return Some(super::post_filter::Outcome::Unfinished {
                    by: "defragmentation",
                    why,
                });
            }
        };
        report.made_room += moved.len();
        self.nominate_members(snapshot, members, &places, &moved);
        let nodes: std::collections::BTreeSet<&str> =
            places.iter().map(|p| p.node.as_str()).collect();
        let node = nodes.into_iter().collect::<Vec<_>>().join(",");
        tracing::info!(gang = %first, %node, moved = moved.len(), "making room for a gang");
        Some(super::post_filter::Outcome::Moving { node, moved })
    }

    /// Nominates each member of a gang to its place in the room `moved` makes (nothing
    /// when no pod moved).
    fn nominate_members(
        &mut self,
        snapshot: &mut Snapshot,
        members: &[(&Arc<PodInfo>, Verdicts)],
        places: &[MemberPlace],
        moved: &[PodKey],
    ) {
        if moved.is_empty() {
            return;
        }
        for MemberPlace {
            member: i,
            node,
            gpus,
        } in places
        {
            let (pod, _) = &members[*i];
            let Ok(demand) = &pod.demand else { continue };
            self.nominate_to_room(snapshot, pod, demand, node, gpus.clone(), moved);
        }
    }
}

/// A make-room plan for a gang: the moves, each member's place, the member named in the
/// moved pods' Events.
pub(super) struct GangRoom {
    moves: Vec<PlannedMove>,
    places: Vec<MemberPlace>,
    first: usize,
}

/// Where a gang member goes: its index, the node, GPU IDs and milli.
struct MemberPlace {
    member: usize,
    node: String,
    gpus: Vec<(String, u32)>,
}
