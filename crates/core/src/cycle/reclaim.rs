//! Reclaim's plan: the victim search's plans (preemption's, for a pod or a whole gang)
//! checked against every queue's guarantee. A plan that would take some queue below its
//! guarantee is searched again without that queue's pods on the nodes it took them from,
//! up to [`MAX_PLANS`] times. The scheduler and the simulator both plan reclaim here.

use crate::ClusterState;
use crate::fairshare::{Entitlement, Loss, Res};
use crate::preempt::Candidates;

/// Plans tried before giving up (each drops one queue's pods on the nodes it lost them).
pub const MAX_PLANS: usize = 32;

/// What evicting one of the victim search's units takes: its queue (a gang's from its
/// first member), the nodes its pods are on and what they hold (GPUs by their model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub queue: usize,
    pub nodes: Vec<usize>,
    pub res: Res,
}

impl Taken {
    /// Each of `candidates`' units, of the queue `unit_queue` gives.
    pub fn of_units(
        state: &ClusterState,
        candidates: &Candidates<'_>,
        unit_queue: &[usize],
    ) -> Vec<Taken> {
        (0..candidates.units.len())
            .map(|u| {
                let mut res = Res::default();
                let mut nodes = Vec::new();
                for h in candidates.members(u) {
                    let model = state.inventory(h.node).gpu_model();
                    res.add(&Res::of(h.request, Some(model)));
                    if !nodes.contains(&h.node) {
                        nodes.push(h.node);
                    }
                }
                Taken {
                    queue: unit_queue[u],
                    nodes,
                    res,
                }
            })
            .collect()
    }
}

/// A plan that keeps every queue at its guarantee, and what it takes from each queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WithinGuarantees<P> {
    pub plan: P,
    pub losses: Vec<Loss>,
}

/// What evicting `units` (of `taken`) takes from each queue.
pub fn losses(taken: &[Taken], units: &[usize]) -> Vec<Loss> {
    let mut losses: Vec<Loss> = Vec::new();
    for &u in units {
        let t = &taken[u];
        match losses.iter_mut().find(|l| l.queue == t.queue) {
            Some(l) => l.res.add(&t.res),
            None => losses.push(Loss {
                queue: t.queue,
                res: t.res.clone(),
            }),
        }
    }
    losses
}

/// Marks queue `v`'s units on the nodes the plan's `units` took its pods from.
fn exclude(taken: &[Taken], units: &[usize], v: usize, excluded: &mut [bool]) {
    let nodes: Vec<usize> = units
        .iter()
        .filter(|&&u| taken[u].queue == v)
        .flat_map(|&u| taken[u].nodes.iter().copied())
        .collect();
    for (u, t) in taken.iter().enumerate() {
        if t.queue == v && t.nodes.iter().any(|n| nodes.contains(n)) {
            excluded[u] = true;
        }
    }
}

/// The first plan `search` finds (given the units excluded so far) whose losses keep every
/// queue at its guarantee as `entitled` says; `taken` describes the search's units and
/// `units_of` gives a plan's evicted units.
pub fn plan_within_guarantees<P>(
    taken: &[Taken],
    entitled: &Entitlement<'_>,
    mut search: impl FnMut(&[bool]) -> Option<P>,
    units_of: impl Fn(&P) -> &[usize],
) -> Option<WithinGuarantees<P>> {
    let mut excluded = vec![false; taken.len()];
    for _ in 0..MAX_PLANS {
        let plan = search(&excluded)?;
        let losses = losses(taken, units_of(&plan));
        match entitled.check(&losses) {
            Ok(()) => return Some(WithinGuarantees { plan, losses }),
            Err(v) => exclude(taken, units_of(&plan), v, &mut excluded),
        }
    }
    None
}
