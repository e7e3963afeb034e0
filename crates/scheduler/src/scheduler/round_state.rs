//! One round's own state (kube-scheduler's CycleState), and what deciding one unit reads
//! beyond the snapshot. Made when the round starts, dropped when it ends: nothing in them
//! outlives the round.

use std::time::{Duration, Instant};

use crate::framework::volumes::VolumeIndex;

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
}

impl RoundState {
    /// A round at `now` with `volumes`.
    pub fn new(now: Instant, volumes: VolumeIndex) -> Self {
        RoundState {
            now,
            volumes,
            queues_in_use: false,
            preemption_times: Vec::new(),
        }
    }
}

/// What deciding one unit reads beyond the snapshot: the round's own state and the nodes
/// its queue's per-model limits leave (`None`: any).
pub(super) struct Deciding<'r> {
    pub round: &'r mut RoundState,
    pub narrow: Option<&'r [bool]>,
}
