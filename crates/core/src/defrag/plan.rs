//! What make-room and rebalancing plan over: the pods that may move, and the plans (moves,
//! places, cost).

use crate::preempt::{Candidates, Holder};

/// The pods that may move: units (one pod, or a whole gang) of holders, and per holder the
/// nodes it may be placed on again (`None`: any node).
#[derive(Clone, Debug, Default)]
pub struct Movables<'a> {
    /// Units, holders and disruption budgets (a unit's priority and `freeing` are not
    /// used: what terminating pods free is the scheduler's to wait for).
    pub candidates: Candidates<'a>,
    /// Per holder (index into `candidates.holders`), where it may go.
    pub allowed: Vec<Option<Vec<bool>>>,
}

impl<'a> Movables<'a> {
    /// Adds a unit of `members`, made at `created_ms` (its first member's creation on the
    /// driver's clock: of equal units the older is kept and placed first), each with the
    /// nodes it may be placed on again.
    pub fn push_unit(
        &mut self,
        created_ms: i64,
        members: impl IntoIterator<Item = (Holder<'a>, Option<Vec<bool>>)>,
    ) {
        // Straight into the flat lists: a make-room search lists thousands of units.
        let allowed = &mut self.allowed;
        let holders = members.into_iter().map(|(holder, nodes)| {
            allowed.push(nodes);
            holder
        });
        self.candidates.push_unit(0, created_ms, holders);
    }

    pub(super) fn created(&self, u: usize) -> i64 {
        self.candidates.units[u].created_ms
    }

    pub fn units(&self) -> usize {
        self.candidates.units.len()
    }

    pub(super) fn unit_milli(&self, u: usize) -> u64 {
        self.candidates
            .members(u)
            .iter()
            .flat_map(|m| m.gpus)
            .map(|&(_, m)| u64::from(m))
            .sum()
    }
}

/// What a plan costs, compared in field order (less is better).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct MoveCost {
    /// Milli-GPU held by the moved pods.
    pub milli_moved: u64,
    /// Pods moved (every member of a moved gang counts).
    pub pods_moved: u32,
    /// The cluster's fragmentation after the plan (milli-GPU, FGD's measure).
    pub frag_milli: u64,
}

/// One pod's move: holder `holder` goes to node `to`, GPUs `gpus` (position, milli).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub holder: usize,
    pub to: usize,
    pub gpus: Vec<(usize, u32)>,
}

/// Where a pending pod goes once the moves are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub node: usize,
    pub gpus: Vec<(usize, u32)>,
}

/// A plan to make room: per pending member (in the order asked) its place, the units that
/// move and each moved pod's new place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomPlan {
    pub placements: Vec<Placement>,
    /// Indices into the movables' units.
    pub units: Vec<usize>,
    pub moves: Vec<Move>,
    pub cost: MoveCost,
}
