//! Defragmentation's settings, memory and counts in one replay (see [`super::defrag`]).

use gpuplace_core::defrag::{RebalancePace, RoomMemo};
use gpuplace_core::{Placer, Policy};

use super::leaving::Owed;
use crate::timeline::options::{DefragSim, Ms};

/// What defragmentation did in one replay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DefragCounts {
    /// Plans carried out (make-room and rebalance steps).
    pub plans: u64,
    pub moved_pods: u64,
    pub moved_milli: u64,
    /// Milli-GPU times milliseconds of work lost by moves.
    pub lost_milli_ms: u128,
}

/// Defragmentation's settings and state in one replay.
pub(super) struct DefragState {
    pub(super) config: DefragSim,
    pub(super) counts: DefragCounts,
    /// Per request id (a shape: the trace's pods may go on any node), until when its
    /// make-room does not search again (core's rule, as the scheduler's).
    pub(super) failed: RoomMemo<usize, Ms>,
    /// When rebalancing looks and what it may move (core's, per unit: the simulator's
    /// controllers).
    pub(super) pace: RebalancePace<u32, Ms>,
    /// When each rebalance move's replacement is bound (moves in flight until then).
    pub(super) in_flight: Vec<Ms>,
    /// Moved pods' replacements waiting for their places (see [`super::steering`]).
    pub(super) steering: Vec<SteerWait>,
    /// Rebalanced pods go where an FGD placer of the replay's seed puts them (least
    /// fragmentation growth), as the scheduler's fresh one each look; this one is kept
    /// from look to look (its index follows the state's journal: the same choices
    /// without indexing every node again).
    pub(super) fgd: Placer,
}

impl DefragState {
    pub(super) fn new(config: DefragSim, seed: u64) -> Self {
        DefragState {
            config,
            pace: RebalancePace::default(),
            in_flight: Vec::new(),
            steering: Vec::new(),
            counts: DefragCounts::default(),
            failed: RoomMemo::default(),
            fgd: Placer::new(Policy::Fgd, seed),
        }
    }
}

/// A replacement bound at a later time than its re-create, waiting for its place.
#[derive(Debug)]
pub(super) struct SteerWait {
    /// The replacement's job.
    pub(super) job: u32,
    /// When its controller has made it: the first instant the scheduler tries it.
    pub(super) made: Ms,
    /// When it is decided at the latest (its leaving pods gone): its Binding as planned.
    pub(super) decided_by: Ms,
    /// Its place's part still the leaving pods' (one piece per leaving pod, until when).
    pub(super) owed: Vec<Owed>,
    /// Its place's first check, at `made`, is still to come.
    pub(super) unchecked: bool,
}

/// Whether trace pod `pod` is in the movable share `share` (a fixed hash of its index).
pub fn movable_pod(pod: u32, share: f64) -> bool {
    let h = u64::from(pod)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < share
}
