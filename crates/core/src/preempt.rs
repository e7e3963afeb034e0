//! Preemption's victim search (kube-scheduler's DefaultPreemption, for GPUs): which
//! lower-priority pods to evict, on which node, so that a request fits with the exact
//! devices it needs (its topology requirement included), at the least cost.
//!
//! Per node, as kube-scheduler does: every candidate victim is taken off; if the request
//! still does not fit, the node cannot help. Otherwise victims are given back one unit at
//! a time (those whose eviction would violate a disruption budget first, then the others,
//! highest priority first) as long as the request still fits; what cannot be given back
//! is evicted. A unit is a pod or a whole gang: a gang member is never evicted unless its
//! whole gang is. Pods already terminating free what they hold at no cost.
//!
//! Among the nodes that can help, the plan with the least [`Cost`] wins: disruption budget
//! violations, then the highest victim priority, then the number of victims, then GPU
//! freed beyond the need, then fragmentation after the request is placed.

use gpuplace_model::Request;

use crate::state::ClusterState;

mod candidates;
mod node_plan;
mod per_node;
pub use candidates::{Amounts, Candidates, Cost, Holder, Preemption, Ranked, Unit, amounts_of};
pub(crate) use candidates::{free_amounts, give, take, violations};
use node_plan::{Scratch, plan_on};
use per_node::{ByNode, PerNode};

/// Whether evicting the candidates that hold `evictable` on node `n` could let `request`
/// fit there: something is evictable, the node's GPUs are of a model the request allows
/// (the fit refuses others at once), and its free GPU milli, CPU and memory with
/// `evictable` cover the request. Necessary, not sufficient (the search decides), so a
/// driver may skip the victim search where no node passes. Always true where GPUs are
/// time-sliced (a request takes another share per node there, so its amounts bound
/// nothing).
pub fn room_possible(
    state: &ClusterState,
    n: usize,
    evictable: &Amounts,
    request: &Request,
) -> bool {
    if state.any_time_sliced() {
        return true;
    }
    if evictable.iter().all(|&a| a == 0) {
        return false;
    }
    if refuses_model(state, n, request) {
        return false;
    }
    let free = free_amounts(state, n);
    let need = amounts_of(request);
    (0..3).all(|d| evictable[d] + free[d] >= need[d])
}

/// Whether `request` refuses node `n`'s GPU model (the fit refuses the node at once).
pub(crate) fn refuses_model(state: &ClusterState, n: usize, request: &Request) -> bool {
    !request.allowed_models.is_empty() && !request.allows_model(state.inventory(n).gpu_model())
}

/// A pod as priority preemption weighs it: its priority and, where queues serve, its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contender<Q> {
    pub priority: i32,
    /// `None` when no queues serve (and for every pod then).
    pub queue: Option<Q>,
}

/// Whether priority preemption lets `preemptor` evict `victim` (kube-scheduler's
/// DefaultPreemption): only pods of lower priority, and where queues serve only pods of the
/// preemptor's own queue (taking from another queue is reclaim's,
/// [`crate::fairshare::Entitlement`]). One rule for the scheduler and the simulator.
pub fn may_preempt<Q: PartialEq>(preemptor: &Contender<Q>, victim: &Contender<Q>) -> bool {
    victim.priority < preemptor.priority && victim.queue == preemptor.queue
}

/// Whether a unit (one pod, or a gang) may be a victim: it has running members and each
/// may be evicted (`members` yields whether the preemptor may evict that member). A gang
/// is evicted whole or not at all, never in part. One rule for the scheduler and the
/// simulator.
pub fn unit_may_be_evicted(members: impl IntoIterator<Item = bool>) -> bool {
    let mut any = false;
    for allowed in members {
        if !allowed {
            return false;
        }
        any = true;
    }
    any
}

/// The priority a gang preempts with: its lowest member's (a gang evicts only what every
/// member outranks); `None` for no members.
pub fn gang_priority(members: impl IntoIterator<Item = i32>) -> Option<i32> {
    members.into_iter().min()
}

/// The order a unit's members are planned in: the most GPU first, ties in member order
/// (`milli`: each member's GPU milli).
pub fn largest_first(milli: impl IntoIterator<Item = u64>) -> Vec<usize> {
    let milli: Vec<u64> = milli.into_iter().collect();
    let mut order: Vec<usize> = (0..milli.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(milli[i]));
    order
}

/// Which node each of `candidates`' units and terminating pods touches, over `nodes`
/// nodes; skips the units marked in `taken` and the terminating pods marked in `freed`
/// (what a gang's earlier members already counted on). A unit is listed once on each
/// node one of its members is on.
fn by_node(nodes: usize, candidates: &Candidates<'_>, taken: &[bool], freed: &[bool]) -> ByNode {
    let units = || {
        (0..candidates.units.len())
            .filter(|&u| !taken.get(u).copied().unwrap_or(false))
            .flat_map(move |u| {
                let members = candidates.members(u);
                members.iter().enumerate().filter_map(move |(i, m)| {
                    let first_here = !members[..i].iter().any(|o| o.node == m.node);
                    first_here.then_some((m.node, u))
                })
            })
    };
    let freeing = || {
        candidates
            .freeing
            .iter()
            .enumerate()
            .filter(|&(i, _)| !freed.get(i).copied().unwrap_or(false))
            .map(|(i, h)| (h.node, i))
    };
    ByNode {
        units: PerNode::build(nodes, units),
        freeing: PerNode::build(nodes, freeing),
    }
}

/// The least costly plan for `request` among the nodes `allowed` (all when `None`), not
/// using the units marked in `taken`; `None` when no eviction lets it fit anywhere.
pub fn find(
    state: &ClusterState,
    request: &Request,
    candidates: &Candidates<'_>,
    allowed: Option<&[bool]>,
    taken: &[bool],
) -> Option<Preemption> {
    find_with(state, request, candidates, allowed, taken, &[])
}

/// [`find`], counting on no terminating pod marked in `freed`: a gang's earlier member
/// already took what it frees (in `state`), so a later member must not count it again.
fn find_with(
    state: &ClusterState,
    request: &Request,
    candidates: &Candidates<'_>,
    allowed: Option<&[bool]>,
    taken: &[bool],
    freed: &[bool],
) -> Option<Preemption> {
    let by = by_node(state.len(), candidates, taken, freed);
    let mut scratch = Scratch::new();
    let mut best: Option<Preemption> = None;
    for n in 0..state.len() {
        if allowed.is_some_and(|mask| !mask.get(n).copied().unwrap_or(false)) {
            continue;
        }
        // Fragmentation only breaks ties: a plan already worse is not finished.
        let bound = best.as_ref().map(|b| b.cost);
        let Some(plan) = plan_on(state, n, request, candidates, &by, &mut scratch, bound) else {
            continue;
        };
        if (best.as_ref()).is_none_or(|b| cheaper(state, plan.ranked(), b.ranked())) {
            best = Some(plan);
        }
    }
    best
}

/// The plans of the nodes marked in `allowed` where some eviction lets `request` fit, in
/// node order (the others have none): what [`find`] chooses from, for a driver that keeps
/// each node's plan while the node is unchanged and chooses with [`cheapest`].
pub fn plans_on(
    state: &ClusterState,
    request: &Request,
    candidates: &Candidates<'_>,
    allowed: &[bool],
) -> Vec<Preemption> {
    let by = by_node(state.len(), candidates, &[], &[]);
    let mut scratch = Scratch::new();
    (0..state.len())
        .filter(|&n| allowed.get(n).copied().unwrap_or(false))
        .filter_map(|n| plan_on(state, n, request, candidates, &by, &mut scratch, None))
        .collect()
}

/// The plan [`find`] would choose among `plans`.
pub fn cheapest(
    state: &ClusterState,
    plans: impl IntoIterator<Item = Preemption>,
) -> Option<Preemption> {
    plans.into_iter().reduce(|best, plan| {
        if cheaper(state, plan.ranked(), best.ranked()) {
            plan
        } else {
            best
        }
    })
}

/// Whether plan `a` is preferred to plan `b`: less cost, equals by node name (whatever
/// order the driver lists nodes in).
pub fn cheaper(state: &ClusterState, a: Ranked, b: Ranked) -> bool {
    a.cost < b.cost
        || (a.cost == b.cost && state.inventory(a.node).name < state.inventory(b.node).name)
}

/// A gang's plan: where each member goes (in the order asked) and whom they evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangPreemption {
    /// Per member: node and GPUs.
    pub placements: Vec<(usize, Vec<(usize, u32)>)>,
    pub units: Vec<usize>,
    /// Summed over members (the highest priority for `top_priority`); `frag_milli` is the
    /// cluster's fragmentation after.
    pub cost: Cost,
}

/// Plans every member of a gang at once: members that fit are placed by `placer`, the
/// others each evict victims (the cheapest plan given what earlier members took); all
/// members or none. `members` are requests with their allowed nodes; the units marked in
/// `excluded` are not evicted.
pub fn find_for_all(
    placer: &mut crate::Placer,
    state: &ClusterState,
    members: &[(&Request, Option<&[bool]>)],
    candidates: &Candidates<'_>,
    excluded: &[bool],
) -> Option<GangPreemption> {
    let mut trial = state.clone();
    let mut taken = excluded.to_vec();
    taken.resize(candidates.units.len(), false);
    let mut freed = vec![false; candidates.freeing.len()];
    let mut placements = Vec::with_capacity(members.len());
    let mut cost = Cost::default();
    let mut units = Vec::new();
    for (request, allowed) in members {
        if let Ok(d) = placer.choose(&trial, request, *allowed) {
            trial.apply(d.node, request, &d.gpus).ok()?;
            placements.push((d.node, d.gpus));
            continue;
        }
        let plan = find_with(&trial, request, candidates, *allowed, &taken, &freed)?;
        for (i, h) in candidates.freeing.iter().enumerate() {
            if h.node == plan.node && !freed[i] {
                freed[i] = true;
                trial.release(h.node, h.request, h.gpus).ok()?;
            }
        }
        for &u in &plan.units {
            taken[u] = true;
            for m in candidates.members(u) {
                trial.release(m.node, m.request, m.gpus).ok()?;
            }
        }
        trial.apply(plan.node, request, &plan.gpus).ok()?;
        cost.budget_violations += plan.cost.budget_violations;
        cost.top_priority = cost.top_priority.max(plan.cost.top_priority);
        cost.victims += plan.cost.victims;
        cost.excess_milli += plan.cost.excess_milli;
        units.extend(plan.units);
        placements.push((plan.node, plan.gpus));
    }
    cost.frag_milli = trial.total_frag().round() as u64;
    Some(GangPreemption {
        placements,
        units,
        cost,
    })
}
