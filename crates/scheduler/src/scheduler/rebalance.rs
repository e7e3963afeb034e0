//! Rebalancing (`--defrag rebalance` or `all`), after a round's decisions: while pods wait
//! and the fleet's fragmentation (FGD's measure against the workload) is above the
//! threshold, at most every `rebalance_every`, core's [`gpuplace_core::defrag::rebalance`]
//! picks the moves that lower fragmentation most per GPU moved (each at least a GPU's
//! worth), within the hour's GPU budget and the moves allowed in flight. The moves are
//! carried out as make-room's are (Eviction API, Events, replacements steered). A pod whose
//! controller had a pod moved in the last hour is not moved again, so no move is undone.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use gpuplace_core::defrag::{self, Limits};
use gpuplace_core::{Placer, Policy};

use super::make_room::{PlannedMove, planned_moves};
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::snapshot::Snapshot;

const HOUR: Duration = Duration::from_secs(3600);
/// How long a controller whose pod moved is left alone (core's, as the simulator's).
const COOLDOWN: Duration = defrag::REBALANCE_COOLDOWN;

/// Rebalancing's memory between rounds.
#[derive(Debug, Default)]
pub struct Rebalancing {
    last: Option<Instant>,
    /// Moves in the last hour: when, and milli-GPU.
    recent: VecDeque<(Instant, u64)>,
    /// Controllers whose pods moved, and when.
    owners: HashMap<String, Instant>,
}

impl<A: ClusterApi> Scheduler<A> {
    /// Rebalances when it is time (see the module's text).
    pub(super) async fn rebalance(
        &mut self,
        snapshot: &Snapshot,
        view: &ClusterView,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let cfg = self.config.defrag.settings.clone();
        if !cfg.mode.rebalances() || report.pending == 0 || !self.gate.is_open() {
            return;
        }
        let r = &mut self.rebalancing;
        if r.last
            .is_some_and(|l| now.saturating_duration_since(l) < cfg.rebalance_every)
        {
            return;
        }
        r.last = Some(now);
        let capacity = snapshot.state.gpu_capacity_milli() as f64;
        if snapshot.state.total_frag() <= cfg.rebalance_threshold * capacity {
            return;
        }
        while r
            .recent
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= HOUR)
        {
            r.recent.pop_front();
        }
        r.owners
            .retain(|_, t| now.saturating_duration_since(*t) < COOLDOWN);
        let spent: u64 = r.recent.iter().map(|(_, m)| m).sum();
        let budget = ((cfg.budget_gpus_per_hour * 1000.0) as u64).saturating_sub(spent);
        let in_flight = self.steers.iter().filter(|s| s.for_pod.is_none()).count();
        let room = cfg.max_moves.saturating_sub(in_flight);
        if budget == 0 || room == 0 {
            return;
        }
        let moves = self.plan_rebalance(snapshot, view, room, budget);
        if moves.is_empty() {
            return;
        }
        let moved = match self
            .start_moves(None, "Moved to lower fragmentation", &moves, None)
            .await
        {
            super::make_room::Moves::Done(moved) => moved,
            super::make_room::Moves::Refused { .. } | super::make_room::Moves::Stopped(_) => {
                Vec::new()
            }
        };
        for m in moves.iter().filter(|m| moved.contains(&m.pod.key)) {
            let milli: u64 = m.gpus.iter().map(|(_, milli)| u64::from(*milli)).sum();
            self.rebalancing.recent.push_back((now, milli));
            if let Some(c) = &m.pod.controller {
                self.rebalancing.owners.insert(c.uid.clone(), now);
            }
        }
        report.moved += moved.len();
        tracing::info!(moved = moved.len(), "rebalancing");
    }

    /// At most `room` moves and `budget` milli-GPU, none of a controller moved lately.
    fn plan_rebalance(
        &self,
        snapshot: &Snapshot,
        view: &ClusterView,
        room: usize,
        budget: u64,
    ) -> Vec<PlannedMove> {
        let owners = &self.rebalancing.owners;
        let owner_of: HashMap<&str, &str> = view
            .pods
            .iter()
            .filter_map(|p| Some((p.key.uid.as_str(), p.controller.as_ref()?.uid.as_str())))
            .collect();
        let moved_lately = |uid: &str| owner_of.get(uid).is_some_and(|o| owners.contains_key(*o));
        let set = self.movable_now(snapshot, view, &moved_lately);
        let mut fgd = Placer::new(Policy::Fgd, self.config.seed);
        let limits = Limits {
            max_pods: room,
            max_milli: budget,
        };
        let plan = defrag::rebalance(
            &mut fgd,
            &snapshot.state,
            &set.movables,
            limits,
            defrag::REBALANCE_MIN_GAIN_MILLI,
        );
        planned_moves(snapshot, &set, &plan.moves)
    }
}
