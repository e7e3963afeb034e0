//! Defragmentation's plans: which pods to move, and where, so that a pending pod (or gang)
//! that fits nowhere can run ("make room"), or so that the fleet's fragmentation falls
//! ([`rebalance`]).
//!
//! The pods that may move are the caller's [`Movables`]: pods a controller re-creates that
//! opted in and are old enough, a gang only whole, each with the nodes it may be placed on
//! again. A move is only planned when the moved pod has a place: after the pending pod
//! takes its devices, every moved pod is placed again by the caller's placer (on another
//! node, or on other GPUs of the same node); if one cannot be, the plan is not made.
//! Disruption budgets are hard limits here: a move past a budget is never planned (unlike
//! priority preemption, nobody outranks anybody).
//!
//! Make room, per node, as the victim search does: every movable unit on the node is taken
//! off; if the pending pod still does not fit, the node cannot help. Otherwise units are
//! given back, the ones holding most GPU first, as long as the pod still fits; what cannot
//! be given back moves. The nodes' plans are ranked by [`MoveCost`] (GPUs moved, then pods
//! moved) and the cheapest whose moved pods all find a place wins, fragmentation after
//! breaking ties.

mod eligible;
mod memo;
mod pace;
mod plan;
mod rebalance;
mod settings;

use gpuplace_model::Request;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::devices::choose_gpus_on;
use crate::placer::Placer;
use crate::policy::Policy;
use crate::preempt::{give, take, violations};
use crate::state::{ClusterState, NodeState};

pub use eligible::{MoveCandidate, may_move, unit_may_move};
pub use memo::{ROOM_RETRY, RoomMemo};
pub use pace::{Fleet, RebalancePace};
pub use plan::{Movables, Move, MoveCost, Placement, RoomPlan};
pub use rebalance::{Rebalance, rebalance, rebalance_in_place};
pub use settings::{
    Limits, MAX_MIN_AGE, Mode, REBALANCE_COOLDOWN, REBALANCE_MIN_GAIN_MILLI, Settings, UnknownMode,
};

/// Nodes whose plans are checked for places for their moved pods, cheapest first (each
/// check places every moved pod again).
const VERIFIED_NODES: usize = 8;

/// Plans room for `request` on the nodes `allowed` lets it use; `None` when no set of moves
/// within `limits` lets it fit with every moved pod placed again. `state` is used to try
/// the plan and is left as it was.
pub fn make_room(
    placer: &mut Placer,
    state: &mut ClusterState,
    request: &Request,
    allowed: Option<&[bool]>,
    movables: &Movables<'_>,
    limits: Limits,
) -> Option<RoomPlan> {
    make_room_for_all(placer, state, &[(request, allowed)], movables, limits)
}

/// Whether moves could ever make room for `members`: moved pods take back what they free,
/// so after any plan the cluster holds every member on top of what it holds now.
pub fn room_possible<'r>(
    state: &ClusterState,
    members: impl IntoIterator<Item = &'r Request>,
) -> bool {
    let asked: u64 = members.into_iter().map(Request::total_gpu_milli).sum();
    asked <= state.gpu_idle_milli()
}

/// Plans room for every member of a gang at once (members that fit are placed as they
/// are, each other one makes room given what the earlier ones took); all or nothing.
/// `state` is used to try the plan and is left as it was.
pub fn make_room_for_all(
    placer: &mut Placer,
    state: &mut ClusterState,
    members: &[(&Request, Option<&[bool]>)],
    movables: &Movables<'_>,
    limits: Limits,
) -> Option<RoomPlan> {
    if !room_possible(state, members.iter().map(|(r, _)| *r)) {
        return None;
    }
    let mut log = Vec::new();
    let plan = plan_all(placer, state, members, movables, limits, &mut log);
    undo(state, &mut log, 0);
    plan
}

fn plan_all<'r>(
    placer: &mut Placer,
    trial: &mut ClusterState,
    members: &[(&'r Request, Option<&[bool]>)],
    movables: &'r Movables<'_>,
    limits: Limits,
    log: &mut Vec<Change<'r>>,
) -> Option<RoomPlan> {
    let mut taken = vec![false; movables.units()];
    let mut plan = RoomPlan {
        placements: Vec::with_capacity(members.len()),
        units: Vec::new(),
        moves: Vec::new(),
        cost: MoveCost::default(),
    };
    for &(request, allowed) in members {
        if let Ok(d) = placer.choose(trial, request, allowed) {
            trial.apply(d.node, request, &d.gpus).ok()?;
            log.push(Change::Applied(d.node, request, d.gpus.clone()));
            plan.placements.push(Placement {
                node: d.node,
                gpus: d.gpus,
            });
            continue;
        }
        // After the plan the cluster holds the request on top of what it holds now.
        if request.total_gpu_milli() > trial.gpu_idle_milli() {
            return None;
        }
        let left = Limits {
            max_pods: limits
                .max_pods
                .saturating_sub(plan.cost.pods_moved as usize),
            max_milli: limits.max_milli.saturating_sub(plan.cost.milli_moved),
        };
        let ranked = rank_nodes(trial, request, allowed, movables, &taken, &plan.units, left);
        let found = ranked
            .iter()
            .take(VERIFIED_NODES)
            .find_map(|c| place_moved(placer, trial, request, movables, c, log))?;
        for &u in &found.units {
            taken[u] = true;
        }
        plan.units.extend(found.units);
        plan.moves.extend(found.moves);
        plan.placements.push(found.placement);
        plan.cost.milli_moved += found.cost.milli_moved;
        plan.cost.pods_moved += found.cost.pods_moved;
    }
    plan.cost.frag_milli = trial.total_frag().round() as u64;
    Some(plan)
}

/// A node whose movable units, once gone, let the request fit.
struct NodeCandidate {
    node: usize,
    units: Vec<usize>,
    cost: MoveCost,
}

/// Per node allowed, the units that would have to move for `request` to fit there, ranked
/// by cost; nodes over `limits` or whose moves break a disruption budget are left out.
fn rank_nodes(
    state: &ClusterState,
    request: &Request,
    allowed: Option<&[bool]>,
    movables: &Movables<'_>,
    taken: &[bool],
    already: &[usize],
    limits: Limits,
) -> Vec<NodeCandidate> {
    let cands = &movables.candidates;
    let by_node = UnitsByNode::of(state.len(), movables, taken);
    let mut scratch = NodeState::default();
    let mut out = Vec::new();
    for (n, units) in by_node.iter() {
        if allowed.is_some_and(|m| !m.get(n).copied().unwrap_or(false)) {
            continue;
        }
        let Some(chosen) = units_to_move(state, n, request, movables, units, &mut scratch) else {
            continue;
        };
        let cost = MoveCost {
            milli_moved: chosen.iter().map(|&u| movables.unit_milli(u)).sum(),
            pods_moved: chosen.iter().map(|&u| cands.members(u).len() as u32).sum(),
            frag_milli: 0,
        };
        if cost.pods_moved as usize > limits.max_pods || cost.milli_moved > limits.max_milli {
            continue;
        }
        if !cands.budgets.is_empty() {
            let all: Vec<usize> = already.iter().chain(&chosen).copied().collect();
            if violations(cands, &all).iter().any(|&v| v > 0) {
                continue;
            }
        }
        out.push(NodeCandidate {
            node: n,
            units: chosen,
            cost,
        });
    }
    // Equal costs: the node first in name order (as preemption breaks ties), so that the
    // plan does not depend on the order the driver lists its nodes in.
    out.sort_by(|a, b| {
        a.cost.cmp(&b.cost).then_with(|| {
            state
                .inventory(a.node)
                .name
                .cmp(&state.inventory(b.node).name)
        })
    });
    out
}

/// The movable units not taken yet on each node, each node's in unit order (a unit with
/// members on several nodes is on each): a count and a fill over the units, not a sort of
/// every (node, unit) pair, which a search over thousands of units paid each time.
struct UnitsByNode {
    /// Node `n`'s units are `units[starts[n]..starts[n + 1]]`.
    starts: Vec<usize>,
    units: Vec<usize>,
}

impl UnitsByNode {
    fn of(nodes: usize, movables: &Movables<'_>, taken: &[bool]) -> Self {
        let cands = &movables.candidates;
        // Each (node, unit) once: one read of the holders, then a count and a fill.
        let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(cands.holders.len());
        let mut starts = vec![0usize; nodes + 1];
        for (u, unit) in cands.units.iter().enumerate() {
            if taken[u] {
                continue;
            }
            let members = &cands.holders[unit.members.clone()];
            for (i, m) in members.iter().enumerate() {
                let again = i > 0 && members[..i].iter().any(|o| o.node == m.node);
                if m.node < nodes && !again {
                    pairs.push((m.node as u32, u as u32));
                    starts[m.node + 1] += 1;
                }
            }
        }
        for n in 0..nodes {
            starts[n + 1] += starts[n];
        }
        let mut next = starts.clone();
        let mut units = vec![0usize; pairs.len()];
        for &(n, u) in &pairs {
            units[next[n as usize]] = u as usize;
            next[n as usize] += 1;
        }
        UnitsByNode { starts, units }
    }

    /// Each node with units, in node order, and its units.
    fn iter(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.starts
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(n, w)| (n, &self.units[w[0]..w[1]]))
    }
}

/// The fewest GPUs' worth of `units` (on node `n`) that must move for `request` to fit
/// there; `None` when moving them all is not enough (or the request fits already).
fn units_to_move(
    state: &ClusterState,
    n: usize,
    request: &Request,
    movables: &Movables<'_>,
    units: &[usize],
    scratch: &mut NodeState,
) -> Option<Vec<usize>> {
    let cands = &movables.candidates;
    let from = state.node(n);
    scratch.cpu_free = from.cpu_free;
    scratch.memory_free = from.memory_free;
    scratch.gpu_free.clone_from(&from.gpu_free);
    scratch.gpu_capacity.clone_from(&from.gpu_capacity);
    if state.fit_on(n, scratch, request).is_ok() {
        return None;
    }
    let here = |u: usize| cands.members(u).iter().filter(move |m| m.node == n);
    for &u in units {
        here(u).for_each(|m| give(scratch, m));
    }
    if state.fit_on(n, scratch, request).is_err() {
        return None;
    }
    // Keep the largest in place first (moving them costs most); among equals, the one on
    // the lowest GPU, then the older (the devices and ages, not the driver's order of
    // pods, break ties, so the scheduler and the timeline replay choose alike).
    let lowest_gpu = |u: usize| here(u).flat_map(|m| m.gpus).map(|&(g, _)| g).min();
    let mut order = units.to_vec();
    order.sort_by_key(|&u| {
        let milli = std::cmp::Reverse(movables.unit_milli(u));
        (milli, lowest_gpu(u), movables.created(u), u)
    });
    let mut chosen = Vec::new();
    for u in order {
        here(u).for_each(|m| take(scratch, m));
        if state.fit_on(n, scratch, request).is_err() {
            here(u).for_each(|m| give(scratch, m));
            chosen.push(u);
        }
    }
    Some(chosen)
}

/// A node's plan whose moved pods all found a place (already applied to the trial state).
struct Found {
    placement: Placement,
    units: Vec<usize>,
    moves: Vec<Move>,
    cost: MoveCost,
}

/// One change made to the trial state, to undo it if the plan fails.
enum Change<'r> {
    Released(usize, &'r Request, Vec<(usize, u32)>),
    Applied(usize, &'r Request, Vec<(usize, u32)>),
}

/// Undoes the changes in `log` from `from` on (latest first): what was done a moment ago
/// undoes exactly.
fn undo(trial: &mut ClusterState, log: &mut Vec<Change<'_>>, from: usize) {
    for c in log.drain(from..).rev() {
        let _ = match c {
            Change::Released(n, r, g) => trial.apply(n, r, &g),
            Change::Applied(n, r, g) => trial.release(n, r, &g),
        };
    }
}

/// Applies candidate `c` to `trial`: its units leave, `request` takes its devices, then
/// every moved pod is placed again, largest first; each change is logged. When the
/// request's devices cannot be chosen or a pod has no place, this candidate's changes are
/// undone and `None` returned.
fn place_moved<'r>(
    placer: &mut Placer,
    trial: &mut ClusterState,
    request: &'r Request,
    movables: &'r Movables<'_>,
    c: &NodeCandidate,
    log: &mut Vec<Change<'r>>,
) -> Option<Found> {
    let from = log.len();
    let found = try_place_moved(placer, trial, request, movables, c, log);
    if found.is_none() {
        undo(trial, log, from);
    }
    found
}

fn try_place_moved<'r>(
    placer: &mut Placer,
    trial: &mut ClusterState,
    request: &'r Request,
    movables: &'r Movables<'_>,
    c: &NodeCandidate,
    changes: &mut Vec<Change<'r>>,
) -> Option<Found> {
    let cands = &movables.candidates;
    // Moved pods (holder, its unit's creation), placed again largest first, then oldest.
    let mut moved: Vec<(usize, i64)> = Vec::new();
    for &u in &c.units {
        for i in cands.units[u].members.clone() {
            let h = &cands.holders[i];
            trial.release(h.node, h.request, h.gpus).ok()?;
            changes.push(Change::Released(h.node, h.request, h.gpus.to_vec()));
            moved.push((i, movables.created(u)));
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let node = trial.node(c.node).clone();
    let gpus = choose_gpus_on(Policy::BestFit, &mut rng, trial, c.node, &node, request, 0);
    if gpus.len() != request.gpu_count as usize {
        return None;
    }
    trial.apply(c.node, request, &gpus).ok()?;
    changes.push(Change::Applied(c.node, request, gpus.clone()));
    moved.sort_by_key(|&(i, created)| {
        let h = &cands.holders[i];
        (std::cmp::Reverse(h.request.total_gpu_milli()), created, i)
    });
    let mut moves = Vec::with_capacity(moved.len());
    for (i, _) in moved {
        let h = &cands.holders[i];
        let allowed = movables.allowed.get(i).and_then(|a| a.as_deref());
        let d = placer.choose(trial, h.request, allowed).ok()?;
        trial.apply(d.node, h.request, &d.gpus).ok()?;
        changes.push(Change::Applied(d.node, h.request, d.gpus.clone()));
        moves.push(Move {
            holder: i,
            to: d.node,
            gpus: d.gpus,
        });
    }
    Some(Found {
        placement: Placement { node: c.node, gpus },
        units: c.units.clone(),
        moves,
        cost: c.cost,
    })
}

/// Applies `plan` to `state` (for checks and for the simulator): the moved units leave, the
/// pending members take their places (`members` as given to the planner), the moved pods
/// take theirs, in the order planned.
pub fn apply_plan(
    state: &mut ClusterState,
    members: &[&Request],
    movables: &Movables<'_>,
    plan: &RoomPlan,
) -> Result<(), crate::StateError> {
    let cands = &movables.candidates;
    for &u in &plan.units {
        for h in cands.members(u) {
            state.release(h.node, h.request, h.gpus)?;
        }
    }
    for (request, p) in members.iter().zip(&plan.placements) {
        state.apply(p.node, request, &p.gpus)?;
    }
    for m in &plan.moves {
        let h = &cands.holders[m.holder];
        state.apply(m.to, h.request, &m.gpus)?;
    }
    Ok(())
}
