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
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::devices::choose_gpus_on;
use crate::policy::Policy;
use crate::state::{ClusterState, NodeState};

mod per_node;
use per_node::{ByNode, PerNode};

/// What one pod holds on its node (as applied to the state), borrowed from the caller's
/// records (a search over tens of thousands of pods copies none of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder<'a> {
    pub node: usize,
    pub request: &'a Request,
    pub gpus: &'a [(usize, u32)],
    /// Indices into [`Candidates::budgets`] of the disruption budgets covering the pod.
    pub budgets: Vec<usize>,
}

/// GPU milli, CPU milli and memory MiB: what pods hold on a node, what a request asks.
pub type Amounts = [u64; 3];

/// What `request` asks, as [`Amounts`].
pub fn amounts_of(request: &Request) -> Amounts {
    [
        request.total_gpu_milli(),
        request.cpu_milli,
        request.memory_mib,
    ]
}

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

/// What node `n` has free, as [`Amounts`].
pub(crate) fn free_amounts(state: &ClusterState, n: usize) -> Amounts {
    let s = state.node(n);
    [
        s.gpu_free.iter().map(|&m| u64::from(m)).sum(),
        s.cpu_free,
        s.memory_free,
    ]
}

/// Pods evicted together or not at all: one pod, or every member of a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The highest priority of its members.
    pub priority: i32,
    /// When it was made (its first member's creation, ms on the driver's clock): of equal
    /// priorities the older stays and the newer is evicted, as kube-scheduler ranks them.
    pub created_ms: i64,
    /// Its members: a range of [`Candidates::holders`].
    pub members: std::ops::Range<usize>,
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

/// What the search may evict, and what frees itself.
#[derive(Clone, Debug, Default)]
pub struct Candidates<'a> {
    /// Every candidate pod; a unit's members are consecutive.
    pub holders: Vec<Holder<'a>>,
    /// Units the preemptor may evict (all of lower priority than it).
    pub units: Vec<Unit>,
    /// Pods already terminating: what they hold comes free without evicting anything.
    pub freeing: Vec<Holder<'a>>,
    /// Disruptions each budget still allows (a PodDisruptionBudget's `disruptionsAllowed`).
    pub budgets: Vec<i32>,
}

impl<'a> Candidates<'a> {
    /// Adds a unit of `members` (one pod, or a whole gang) of `priority`, made at
    /// `created_ms`.
    pub fn push_unit(
        &mut self,
        priority: i32,
        created_ms: i64,
        members: impl IntoIterator<Item = Holder<'a>>,
    ) {
        let start = self.holders.len();
        self.holders.extend(members);
        if self.holders.len() > start {
            self.units.push(Unit {
                priority,
                created_ms,
                members: start..self.holders.len(),
            });
        }
    }

    /// The members of unit `u`.
    pub fn members(&self, u: usize) -> &[Holder<'a>] {
        &self.holders[self.units[u].members.clone()]
    }
}

/// What a plan costs, compared in field order (less is better).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cost {
    /// Victims whose eviction goes past a disruption budget.
    pub budget_violations: u32,
    /// The highest victim priority (`None`: no victim, only terminating pods to wait for).
    pub top_priority: Option<i32>,
    /// Pods evicted (every member of an evicted gang counts).
    pub victims: u32,
    /// Milli-GPU the victims hold beyond what the request needs.
    pub excess_milli: u64,
    /// Fragmentation of the node after the request is placed (milli-GPU, FGD's measure).
    pub frag_milli: u64,
}

/// Where the preemptor goes and whom it evicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub node: usize,
    /// Indices into [`Candidates::units`].
    pub units: Vec<usize>,
    /// The GPUs (position, milli) the request gets once the victims are gone.
    pub gpus: Vec<(usize, u32)>,
    pub cost: Cost,
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

pub(crate) fn give(s: &mut NodeState, h: &Holder<'_>) {
    s.cpu_free += h.request.cpu_milli;
    s.memory_free += h.request.memory_mib;
    for &(g, m) in h.gpus {
        if let (Some(free), Some(cap)) = (s.gpu_free.get_mut(g), s.gpu_capacity.get(g)) {
            *free = (*free + m).min(*cap);
        }
    }
}

pub(crate) fn take(s: &mut NodeState, h: &Holder<'_>) {
    s.cpu_free = s.cpu_free.saturating_sub(h.request.cpu_milli);
    s.memory_free = s.memory_free.saturating_sub(h.request.memory_mib);
    for &(g, m) in h.gpus {
        if let Some(free) = s.gpu_free.get_mut(g) {
            *free = free.saturating_sub(m);
        }
    }
}

/// Which of `units` (in the order given) would violate a budget: each member takes one
/// disruption from every budget covering it; a member past zero violates.
pub(crate) fn violations(candidates: &Candidates<'_>, units: &[usize]) -> Vec<u32> {
    let mut left = candidates.budgets.clone();
    units
        .iter()
        .map(|&u| {
            let mut count = 0;
            for m in candidates.members(u) {
                let mut violated = false;
                for &b in &m.budgets {
                    if let Some(l) = left.get_mut(b) {
                        *l -= 1;
                        violated |= *l < 0;
                    }
                }
                count += u32::from(violated);
            }
            count
        })
        .collect()
}

/// Buffers reused from node to node (the search visits thousands).
struct Scratch {
    node: NodeState,
    units: Vec<usize>,
    order: Vec<usize>,
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
    let mut scratch = Scratch {
        node: NodeState {
            cpu_free: 0,
            memory_free: 0,
            gpu_free: Vec::new(),
            gpu_capacity: Vec::new(),
            version: 0,
            classes: Vec::new(),
            frag: 0.0,
        },
        units: Vec::new(),
        order: Vec::new(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut best: Option<Preemption> = None;
    for n in 0..state.len() {
        if allowed.is_some_and(|mask| !mask.get(n).copied().unwrap_or(false)) {
            continue;
        }
        if by.units(n).is_empty() && by.freeing(n).is_empty() {
            continue;
        }
        if !victims_on(state, n, request, candidates, &by, &mut scratch) {
            continue;
        }
        let mut cost = cheap_cost(request, candidates, &scratch.units);
        // Fragmentation only breaks ties: a plan already worse is not finished.
        if best.as_ref().is_some_and(|b| {
            let mut bound = b.cost;
            bound.frag_milli = 0;
            cost > bound
        }) {
            continue;
        }
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
            continue;
        }
        cost.frag_milli = frag_after(state, n, request, &scratch.node, &gpus);
        // Equal plans: the node first by name (whatever order the driver lists nodes in).
        let better = best.as_ref().is_none_or(|b| {
            cost < b.cost
                || (cost == b.cost && state.inventory(n).name < state.inventory(b.node).name)
        });
        if better {
            best = Some(Preemption {
                node: n,
                units: scratch.units.clone(),
                gpus,
                cost,
            });
        }
    }
    best
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
