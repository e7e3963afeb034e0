//! Moves carried out, for make-room and for rebalancing: every eviction of a make-room plan
//! first checked with a dry run of the Eviction API (budgets, UIDs), then each moved pod
//! evicted, told why in an Event, and its place planned for the replacement its controller
//! makes ([`super::defrag::Steers`]). See [`super::make_room`] for the whole.

use std::sync::Arc;

use gpuplace_core::defrag;

use super::Scheduler;
use super::defrag::{MovableSet, Steer};
use crate::api::{ApiError, ClusterApi, PodKey};
use crate::k8s::pod_info::PodInfo;
use crate::k8s::queue::QUEUE_LABEL;
use crate::snapshot::Snapshot;

impl<A: ClusterApi> Scheduler<A> {
    /// Carries a plan out for `for_pod` (all or nothing: see the module's text), or for
    /// rebalancing (`None`: each move stands alone, so a refusal only stops the rest).
    ///
    /// `announce` are the nominations the plan makes room for: written once
    /// the dry run passed and before the first move, so that the API records whom the room
    /// is for while it is being made (a leader killed mid-plan or right after its last move
    /// leaves the next one a nomination to adopt as a hold, and the room goes to its pod);
    /// put back as they were when a refusal stops the plan before any pod moved (once one
    /// has, the room made stays the pod's, nominated, and the plan is finished in a later
    /// round).
    pub(super) async fn start_moves(
        &mut self,
        for_pod: Option<&PodKey>,
        why: &str,
        moves: &[PlannedMove],
        announce: &[Announce],
        mut snapshot: Option<&mut Snapshot>,
    ) -> Moves {
        if !self.gate.is_open() {
            return Moves::Done(Vec::new());
        }
        if for_pod.is_some() {
            for m in moves {
                match self.api.evict_to_move(&m.pod.key, true).await {
                    Ok(()) | Err(ApiError::NotFound(_)) => {}
                    Err(e) => {
                        tracing::info!(pod = %m.pod.key, error = %e, "the plan's dry run was refused; nothing moves");
                        self.retry_unless_budget(for_pod, &e);
                        return Moves::Refused {
                            pod: m.pod.key.clone(),
                            why: format!(
                                "moving {} would be refused ({e}); no pod was moved",
                                shown(for_pod, &m.pod.key)
                            ),
                        };
                    }
                }
            }
        }
        if !moves.is_empty() {
            self.announce(announce, true).await;
        }
        let mut moved = Vec::new();
        for m in moves {
            let key = &m.pod.key;
            // Looked at before every move: a replica whose lease lapsed mid-plan moves no
            // more (the new leader plans from what the cluster then shows).
            if !self.gate.is_open() {
                tracing::info!(
                    moved = moved.len(),
                    of = moves.len(),
                    "lease lost mid-plan; no more moves"
                );
                if let Some(p) = for_pod {
                    self.unfinished.insert(p.uid.clone());
                    return Moves::Stopped {
                        why: format!(
                            "the plan stopped after moving {} of {} pod(s): this scheduler lost its lease",
                            moved.len(),
                            moves.len()
                        ),
                        moved,
                    };
                }
                break;
            }
            match self.api.evict_to_move(key, false).await {
                Ok(()) | Err(ApiError::NotFound(_)) => {}
                Err(e) => {
                    tracing::info!(pod = %key, error = %e, "move refused; the plan stops here");
                    if for_pod.is_none() {
                        break;
                    }
                    // Stopped midway: tried again after a backoff whatever the refusal
                    // (the pods already moved changed the picture).
                    if let Some(p) = for_pod {
                        self.unfinished.insert(p.uid.clone());
                    }
                    // Nothing moved yet: nothing to finish, no room to hold.
                    if moved.is_empty() {
                        self.announce(announce, false).await;
                    }
                    return Moves::Stopped {
                        why: format!(
                            "the plan stopped after moving {} of {} pod(s): moving {} was refused ({e}); the moved pods' replacements keep their planned places, and the room made stays the pod's, to be finished in a later round",
                            moved.len(),
                            moves.len(),
                            shown(for_pod, key)
                        ),
                        moved,
                    };
                }
            }
            let Some(owner) = m.pod.controller.as_ref() else {
                continue;
            };
            self.events.emit(
                key,
                "Normal",
                "Moved",
                match for_pod {
                    // "Moved to make room for" whom, as the moved pod's namespace may see it.
                    Some(p) => format!(
                        "{why} {} (from node {} to node {})",
                        p.shown_to(&key.namespace),
                        m.from,
                        m.to
                    ),
                    None => format!("{why} (from node {} to node {})", m.from, m.to),
                },
            );
            let steer = Steer {
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
                since: self.round_clock(),
                queue_label: m.pod.labels.get(QUEUE_LABEL).cloned(),
            };
            self.steers.push_held(steer, snapshot.as_deref_mut());
            moved.push(key.clone());
        }
        Moves::Done(moved)
    }

    /// Writes (`on`) the nominations `announce` names, or puts back what they replaced,
    /// while the leader.
    async fn announce(&self, announce: &[Announce], on: bool) {
        for a in announce {
            if !self.gate.is_open() {
                return;
            }
            let node = if on { Some(&a.node) } else { a.before.as_ref() };
            if let Err(e) = self.api.nominate(&a.pod, node.map(String::as_str)).await {
                tracing::info!(pod = %a.pod, error = %e, "nominatedNodeName not written");
            }
        }
    }

    /// A refusal by a budget that allows no disruption waits for the budget to change;
    /// any other is tried again after a backoff.
    fn retry_unless_budget(&mut self, for_pod: Option<&PodKey>, e: &ApiError) {
        if let Some(p) = for_pod
            && !matches!(e, ApiError::Blocked(_))
        {
            self.unfinished.insert(p.uid.clone());
        }
    }
}

/// A nomination a make-room plan writes before its first move: the pod, the node, and the
/// pod's `nominatedNodeName` before (put back if the plan stops with nothing moved).
pub(super) struct Announce {
    pub pod: PodKey,
    pub node: String,
    pub before: Option<String>,
}

/// How carrying a plan out went.
pub(super) enum Moves {
    /// Every move made (for rebalancing: those before a refusal).
    Done(Vec<PodKey>),
    /// The dry run was refused for `pod`: nothing moved.
    Refused { pod: PodKey, why: String },
    /// Refused midway (or the lease lost): `moved`, the pods before, moved; no others.
    Stopped { why: String, moved: Vec<PodKey> },
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

/// `pod` as a message about `for_pod` may name it (a rebalance's messages go to no pod).
fn shown(for_pod: Option<&PodKey>, pod: &PodKey) -> String {
    match for_pod {
        Some(reader) => pod.shown_to(&reader.namespace),
        None => pod.to_string(),
    }
}
