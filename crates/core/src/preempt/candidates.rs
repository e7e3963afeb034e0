//! What the victim search reads and answers: the pods it may evict (grouped in units that
//! go together), what each holds, the disruption budgets, and a plan with its cost.

use gpuplace_model::Request;

use crate::state::{ClusterState, NodeState};

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
    /// Empty, with room for `pods` holders in `units` units (a reclaim lists thousands:
    /// grown by pushes, the lists were copied a dozen times a search).
    pub fn with_capacity(pods: usize, units: usize) -> Candidates<'a> {
        Candidates {
            holders: Vec::with_capacity(pods),
            units: Vec::with_capacity(units),
            ..Candidates::default()
        }
    }

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

impl Preemption {
    /// Its rank among the nodes' plans.
    pub fn ranked(&self) -> Ranked {
        Ranked {
            cost: self.cost,
            node: self.node,
        }
    }
}

/// What orders the nodes' plans ([`super::cheaper`]): a plan's cost and node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ranked {
    pub cost: Cost,
    pub node: usize,
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
