//! One round's own state (kube-scheduler's CycleState), and what deciding one unit reads
//! beyond the snapshot. Made when the round starts, dropped when it ends: nothing in them
//! outlives the round.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::line::Line;
use crate::framework::volumes::VolumeIndex;
use crate::k8s::pod_info::PodInfo;

/// One round's own state.
pub(super) struct RoundState {
    /// The round's time.
    pub now: Instant,
    /// Claims and volumes (built only when a waiting pod has claims).
    pub volumes: VolumeIndex,
    /// Whether this round orders units by queue (some queue is defined or named).
    pub queues_in_use: bool,
    /// How long each preemption search took (handed to the round's report).
    pub preemption_times: Vec<Duration>,
    /// The round's order, for the pods that wait in it.
    pub order: RoundOrder,
}

impl RoundState {
    /// A round at `now` with `volumes`.
    pub fn new(now: Instant, volumes: VolumeIndex) -> Self {
        RoundState {
            now,
            volumes,
            queues_in_use: false,
            preemption_times: Vec::new(),
            order: RoundOrder::default(),
        }
    }
}

/// What deciding one unit reads beyond the snapshot: the round's own state and the nodes
/// its queue's per-model limits leave (`None`: any).
pub(super) struct Deciding<'r> {
    pub round: &'r mut RoundState,
    pub narrow: Option<&'r [bool]>,
}

/// What the round placed by queue, and the line of every waiting unit, for the pods that
/// wait in it.
#[derive(Default)]
pub(super) struct RoundOrder {
    /// By queue: milli-GPU placed this round.
    pub placed: HashMap<usize, u64>,
    /// Every pod waiting for this scheduler when the round began.
    pub waiting: Vec<Arc<PodInfo>>,
    /// The line of their units (built when the first of them is told why it waits).
    pub line: Option<Line>,
}

impl RoundOrder {
    /// Queue `q`'s unit placed `milli` GPU.
    pub fn placed(&mut self, q: usize, milli: u64) {
        *self.placed.entry(q).or_default() += milli;
    }

    /// Milli-GPU placed this round by queues other than `q`.
    pub fn placed_by_others(&self, q: usize) -> u64 {
        self.placed
            .iter()
            .filter(|(k, _)| **k != q)
            .map(|(_, m)| m)
            .sum()
    }
}
