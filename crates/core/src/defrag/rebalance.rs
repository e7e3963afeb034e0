//! Rebalancing: moves that lower the fleet's fragmentation (FGD's measure against the
//! target workload) most per GPU moved, one at a time, each chosen on the state the earlier
//! ones left.
//!
//! Candidates are single movable pods (a gang is never rebalanced: moving one member would
//! split it, moving it whole is make-room's business) on the most fragmented nodes. Each is
//! taken off and placed again by the caller's placer (FGD's or gpuplace's: the place whose
//! fragmentation grows least); the move's gain is the fall of the cluster's fragmentation.
//! The best gain per milli-GPU moved is taken if it is at least the minimum gain; the search
//! stops when no move gains enough or the limits are reached.

use crate::placer::Placer;
use crate::state::ClusterState;

use super::{Limits, Movables, Move};

/// Nodes, most fragmented first, whose pods are candidates in one step.
const SOURCE_NODES: usize = 16;

/// What a rebalance plans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebalance {
    pub moves: Vec<Move>,
    /// The cluster's fragmentation before and after the moves (milli-GPU).
    pub frag_before: f64,
    pub frag_after: f64,
}

/// Plans moves that each lower fragmentation by at least `min_gain` milli-GPU, within
/// `limits`; none without a target workload.
pub fn rebalance(
    placer: &mut Placer,
    state: &ClusterState,
    movables: &Movables<'_>,
    limits: Limits,
    min_gain: f64,
) -> Rebalance {
    rebalance_in_place(placer, &mut state.clone(), movables, limits, min_gain)
}

/// [`rebalance`] tried on `state` itself, which is left as it was: a caller that keeps
/// one placer for every look (its index follows the state's journal) spares indexing a
/// copy each time. The plan is the same.
pub fn rebalance_in_place(
    placer: &mut Placer,
    state: &mut ClusterState,
    movables: &Movables<'_>,
    limits: Limits,
    min_gain: f64,
) -> Rebalance {
    let frag_before = state.total_frag();
    let sum = state.frag_sum();
    let mut out = Rebalance {
        moves: Vec::new(),
        frag_before,
        frag_after: frag_before,
    };
    if state.workload().is_none() {
        return out;
    }
    let cands = &movables.candidates;
    let mut moved = vec![false; cands.holders.len()];
    let mut milli_moved = 0u64;
    while out.moves.len() < limits.max_pods {
        let Some(best) = best_move(placer, state, movables, &moved, min_gain) else {
            break;
        };
        let h = &cands.holders[best.holder];
        let milli = h.request.total_gpu_milli();
        if milli_moved + milli > limits.max_milli {
            break;
        }
        if state.release(h.node, h.request, h.gpus).is_err() {
            break;
        }
        if state.apply(best.to, h.request, &best.gpus).is_err() {
            // Put back what was released a moment ago: cannot fail.
            let _ = state.apply(h.node, h.request, h.gpus);
            break;
        }
        milli_moved += milli;
        moved[best.holder] = true;
        out.moves.push(best);
    }
    out.frag_after = state.total_frag();
    // Undo the moves, latest first: what was done a moment ago undoes exactly.
    for m in out.moves.iter().rev() {
        let h = &cands.holders[m.holder];
        let _ = state.release(m.to, h.request, &m.gpus);
        let _ = state.apply(h.node, h.request, h.gpus);
    }
    state.undone_to(sum);
    out
}

/// Single-pod units not moved yet, on the most fragmented nodes.
fn sources(trial: &ClusterState, movables: &Movables<'_>, moved: &[bool]) -> Vec<usize> {
    let cands = &movables.candidates;
    let singles = || {
        cands
            .units
            .iter()
            .filter(|u| u.members.len() == 1)
            .map(|u| u.members.start)
            .filter(|&h| !moved[h] && cands.holders[h].request.total_gpu_milli() > 0)
    };
    let mut nodes: Vec<usize> = singles().map(|h| cands.holders[h].node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.sort_by(|&a, &b| {
        trial
            .node(b)
            .frag
            .total_cmp(&trial.node(a).frag)
            .then_with(|| trial.inventory(a).name.cmp(&trial.inventory(b).name))
    });
    nodes.truncate(SOURCE_NODES);
    singles()
        .filter(|&h| nodes.contains(&cands.holders[h].node))
        .collect()
}

/// The move with the best gain per milli-GPU moved (`trial` is left as it was).
fn best_move(
    placer: &mut Placer,
    trial: &mut ClusterState,
    movables: &Movables<'_>,
    moved: &[bool],
    min_gain: f64,
) -> Option<Move> {
    let cands = &movables.candidates;
    let mut best: Option<(f64, Move)> = None;
    for h in sources(trial, movables, moved) {
        let holder = &cands.holders[h];
        let before = trial.total_frag();
        if trial
            .release(holder.node, holder.request, holder.gpus)
            .is_err()
        {
            continue;
        }
        let allowed = movables.allowed.get(h).and_then(|a| a.as_deref());
        let choice = placer.choose(trial, holder.request, allowed).ok();
        let mut gain = f64::NEG_INFINITY;
        if let Some(d) = &choice
            && !(d.node == holder.node && d.gpus == holder.gpus)
            && trial.apply(d.node, holder.request, &d.gpus).is_ok()
        {
            gain = before - trial.total_frag();
            let _ = trial.release(d.node, holder.request, &d.gpus);
        }
        // Put back what was taken a moment ago: cannot fail.
        let _ = trial.apply(holder.node, holder.request, holder.gpus);
        let milli = holder.request.total_gpu_milli().max(1) as f64;
        let per = gain / milli;
        if let Some(d) = choice
            && gain >= min_gain
            && best.as_ref().is_none_or(|(b, _)| per > *b)
        {
            best = Some((
                per,
                Move {
                    holder: h,
                    to: d.node,
                    gpus: d.gpus,
                },
            ));
        }
    }
    best.map(|(_, m)| m)
}
