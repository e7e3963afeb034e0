//! One node's plan for a preemptor: the victims there at least cost (most important kept
//! first, disruption budgets honoured), the devices the request gets once they are gone,
//! and the cost with the fragmentation after. [`super::find`] chooses among the nodes'
//! plans, [`super::plans_on`] lists them.

use gpuplace_model::Request;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::per_node::ByNode;
use super::{
    Candidates, Cost, Holder, Preemption, amounts_of, free_amounts, give, take, violations,
};
use crate::devices::choose_gpus_on;
use crate::policy::Policy;
use crate::state::{ClusterState, NodeState};

/// Buffers reused from node to node (the search visits thousands).
pub(super) struct Scratch {
    node: NodeState,
    units: Vec<usize>,
    order: Vec<usize>,
}

impl Scratch {
    pub(super) fn new() -> Scratch {
        Scratch {
            node: NodeState::default(),
            units: Vec::new(),
            order: Vec::new(),
        }
    }
}

/// Copies `from` into `into` reusing its buffers (what fit checks and device choice read).
fn copy_state(into: &mut NodeState, from: &NodeState) {
    into.cpu_free = from.cpu_free;
    into.memory_free = from.memory_free;
    into.gpu_free.clone_from(&from.gpu_free);
    into.gpu_capacity.clone_from(&from.gpu_capacity);
}

/// The victims on node `n` (in `scratch.units`, most important first) and the node's state
/// once they and the terminating pods are gone (in `scratch.node`); false when evicting
/// cannot make `request` fit there.
fn victims_on(
    state: &ClusterState,
    n: usize,
    request: &Request,
    candidates: &Candidates<'_>,
    by: &ByNode,
    scratch: &mut Scratch,
) -> bool {
    if !amounts_cover(state, n, request, candidates, by) {
        return false;
    }
    copy_state(&mut scratch.node, state.node(n));
    for &i in by.freeing(n) {
        give(&mut scratch.node, &candidates.freeing[i as usize]);
    }
    scratch.units.clear();
    if state.fit_on(n, &scratch.node, request).is_ok() {
        // Terminating pods make room: nothing to evict, only to wait for.
        return true;
    }
    let here = |u: usize| candidates.members(u).iter().filter(move |m| m.node == n);
    for &u in by.units(n) {
        here(u as usize).for_each(|m| give(&mut scratch.node, m));
    }
    if state.fit_on(n, &scratch.node, request).is_err() {
        return false;
    }
    // Most important first (higher priority, then older), equals by the devices they hold
    // on the node (so the choice is the cluster's, not the order a driver listed its pods
    // in); those whose eviction violates a budget get their chance to stay before the
    // others.
    scratch.order.clear();
    scratch
        .order
        .extend(by.units(n).iter().map(|&u| u as usize));
    let first_gpu = |u: usize| here(u).flat_map(|m| m.gpus.iter().map(|g| g.0)).min();
    scratch.order.sort_by_key(|&u| {
        (
            std::cmp::Reverse(candidates.units[u].priority),
            candidates.units[u].created_ms,
            first_gpu(u).unwrap_or(usize::MAX),
            u,
        )
    });
    if !candidates.budgets.is_empty() {
        let violating = violations(candidates, &scratch.order);
        // Stable: violators first, each group in the order above.
        let mut ranked: Vec<(bool, usize)> = scratch
            .order
            .iter()
            .zip(violating)
            .map(|(&u, v)| (v == 0, u))
            .collect();
        ranked.sort_by_key(|&(good, _)| good);
        scratch.order.clear();
        scratch.order.extend(ranked.into_iter().map(|(_, u)| u));
    }
    for i in 0..scratch.order.len() {
        let u = scratch.order[i];
        here(u).for_each(|m| take(&mut scratch.node, m));
        if state.fit_on(n, &scratch.node, request).is_err() {
            here(u).for_each(|m| give(&mut scratch.node, m));
            scratch.units.push(u);
        }
    }
    scratch
        .units
        .sort_by_key(|&u| (std::cmp::Reverse(candidates.units[u].priority), u));
    true
}

/// Whether node `n`'s free GPU milli, CPU and memory, with what its terminating pods and
/// every candidate on it hold, cover `request` (else no eviction makes it fit, and the
/// node's state is not copied to find that out; a reclaim searches every node). Always
/// true where GPUs are time-sliced, as for [`room_possible`].
fn amounts_cover(
    state: &ClusterState,
    n: usize,
    request: &Request,
    candidates: &Candidates<'_>,
    by: &ByNode,
) -> bool {
    if state.any_time_sliced() {
        return true;
    }
    let mut have = free_amounts(state, n);
    let mut add = |h: &Holder<'_>| {
        have[0] += h.gpus.iter().map(|&(_, m)| u64::from(m)).sum::<u64>();
        have[1] += h.request.cpu_milli;
        have[2] += h.request.memory_mib;
    };
    for &i in by.freeing(n) {
        add(&candidates.freeing[i as usize]);
    }
    for &u in by.units(n) {
        candidates
            .members(u as usize)
            .iter()
            .filter(|m| m.node == n)
            .for_each(&mut add);
    }
    let need = amounts_of(request);
    (0..3).all(|d| have[d] >= need[d])
}

/// The cost of evicting `units` for `request`, without the fragmentation after.
fn cheap_cost(request: &Request, candidates: &Candidates<'_>, units: &[usize]) -> Cost {
    let members = || units.iter().flat_map(|&u| candidates.members(u));
    let held: u64 = members()
        .flat_map(|m| m.gpus)
        .map(|&(_, milli)| u64::from(milli))
        .sum();
    Cost {
        budget_violations: if candidates.budgets.is_empty() {
            0
        } else {
            violations(candidates, units).iter().sum()
        },
        top_priority: units.iter().map(|&u| candidates.units[u].priority).max(),
        victims: members().count() as u32,
        excess_milli: held.saturating_sub(request.total_gpu_milli()),
        frag_milli: 0,
    }
}

/// FGD's fragmentation of node `n` in state `after_victims` once `request` takes `gpus`.
fn frag_after(
    state: &ClusterState,
    n: usize,
    request: &Request,
    after_victims: &NodeState,
    gpus: &[(usize, u32)],
) -> u64 {
    let Some(w) = state.workload() else {
        return 0;
    };
    let mut after = after_victims.gpu_free.clone();
    for &(g, m) in gpus {
        after[g] = after[g].saturating_sub(m);
    }
    let frag = w.fragmentation_of(
        state.inventory(n).gpu_model(),
        after_victims.cpu_free.saturating_sub(request.cpu_milli),
        &after,
    );
    frag.round().max(0.0) as u64
}

/// Node `n`'s plan for `request`: the victims there at least cost, the devices the
/// request gets and the cost with the fragmentation after. `None` when no eviction there
/// lets it fit, or when its cost is already above `bound` before fragmentation (which
/// only breaks ties).
pub(super) fn plan_on(
    state: &ClusterState,
    n: usize,
    request: &Request,
    candidates: &Candidates<'_>,
    by: &ByNode,
    scratch: &mut Scratch,
    bound: Option<Cost>,
) -> Option<Preemption> {
    if by.units(n).is_empty() && by.freeing(n).is_empty() {
        return None;
    }
    if !victims_on(state, n, request, candidates, by, scratch) {
        return None;
    }
    let mut cost = cheap_cost(request, candidates, &scratch.units);
    if let Some(mut bound) = bound {
        bound.frag_milli = 0;
        if cost > bound {
            return None;
        }
    }
    // BestFit draws no random number: a node's plan is its own.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let gpus = choose_gpus_on(
        Policy::BestFit,
        &mut rng,
        state,
        n,
        &scratch.node,
        request,
        0,
    );
    if gpus.len() != request.gpu_count as usize {
        return None;
    }
    cost.frag_milli = frag_after(state, n, request, &scratch.node, &gpus);
    Some(Preemption {
        node: n,
        units: scratch.units.clone(),
        gpus,
        cost,
    })
}
