//! Rebalancing (`--defrag rebalance` or `all`), after a round's decisions: while pods wait
//! and the fleet's fragmentation (FGD's measure against the workload) is above the
//! threshold, at most every `rebalance_every`, core's [`gpuplace_core::defrag::rebalance`]
//! picks the moves that lower fragmentation most per GPU moved (each at least a GPU's
//! worth), within the hour's GPU budget and the moves allowed in flight. The moves are
//! carried out as make-room's are (Eviction API, Events, replacements steered). A pod whose
//! controller had a pod moved in the last hour is not moved again, so no move is undone.

use std::collections::HashMap;
use std::time::Instant;

use gpuplace_core::defrag::{self, Fleet, Limits};
use gpuplace_core::{Placer, Policy};

use super::moves::{Moves, PlannedMove, planned_moves};
use super::round_state::RoundState;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::snapshot::Snapshot;

impl<A: ClusterApi> Scheduler<A> {
    /// Rebalances when it is time (see the module's text).
    pub(super) async fn rebalance(
        &mut self,
        snapshot: &Snapshot,
        view: &ClusterView,
        round: &RoundState,
        now: Instant,
        report: &mut RoundReport,
    ) {
        if !self.config.defrag.settings.mode.rebalances() || !self.gate.is_open() {
            return;
        }
        let fleet = Fleet {
            pending: report.pending,
            frag_milli: snapshot.state.total_frag(),
            capacity_milli: snapshot.state.gpu_capacity_milli(),
            in_flight: self.steers.iter().filter(|s| s.for_pod.is_none()).count(),
        };
        let Some(limits) = self
            .rebalancing
            .limits(&self.config.defrag.settings, now, &fleet)
        else {
            return;
        };
        // A look with nothing that may move is still this interval's look (core's pace,
        // as the timeline counts it); nothing to plan.
        if self.cluster.pods().movable_candidates() == 0 {
            return;
        }
        let moves = self.plan_rebalance(snapshot, view, &round.volumes, limits);
        if moves.is_empty() {
            return;
        }
        let moved = match self
            .start_moves(None, "Moved to lower fragmentation", &moves, &[], None)
            .await
        {
            Moves::Done(moved) => moved,
            Moves::Refused { .. } | Moves::Stopped { .. } => Vec::new(),
        };
        for m in moves.iter().filter(|m| moved.contains(&m.pod.key)) {
            let milli: u64 = m.gpus.iter().map(|(_, milli)| u64::from(*milli)).sum();
            let controller = m.pod.controller.as_ref().map(|c| c.uid.clone());
            self.rebalancing.moved(now, controller, milli);
        }
        report.moved += moved.len();
        tracing::info!(moved = moved.len(), "rebalancing");
    }

    /// Moves within `limits`, none of a controller moved lately.
    fn plan_rebalance(
        &self,
        snapshot: &Snapshot,
        view: &ClusterView,
        volumes: &crate::framework::volumes::VolumeIndex,
        limits: Limits,
    ) -> Vec<PlannedMove> {
        let pace = &self.rebalancing;
        let owner_of: HashMap<&str, &str> = view
            .pods
            .iter()
            .filter_map(|p| Some((p.key.uid.as_str(), p.controller.as_ref()?.uid.as_str())))
            .collect();
        let moved_lately = |uid: &str| owner_of.get(uid).is_some_and(|o| pace.moved_lately(*o));
        let set = self.movable_now(snapshot, view, volumes, &moved_lately);
        let mut fgd = Placer::new(Policy::Fgd, self.config.seed);
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
