//! Node scoring policies. Higher scores win; equal top scores are broken at random.
//!
//! The paper's baselines (`random`, `dotprod`, `gpu-clustering`, `gpu-packing`, `best-fit`,
//! `fgd`) follow the FGD authors' simulator exactly, integer truncation included, because
//! truncation decides how many nodes tie and so how the random tie-break spreads pods.

use std::fmt;
use std::str::FromStr;

use gpuplace_model::{NodeInventory, Request};

use crate::state::NodeState;

pub(crate) mod kube_default;

/// CPU milli the paper normalises by (128 cores).
pub(crate) const MAX_SPEC_CPU: f64 = 128_000.0;
/// GPU milli the paper normalises by (8 GPUs).
pub(crate) const MAX_SPEC_GPU: f64 = 8_000.0;

/// A node scoring policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The first node (in cluster order) that fits.
    FirstFit,
    /// The paper's BestFit: least CPU and GPU left after placement.
    BestFit,
    /// The opposite of best-fit: most CPU and GPU left after placement.
    WorstFit,
    /// Most allocated (CPU, memory, GPU) after placement, like kube's MostAllocated.
    Binpack,
    /// Least allocated after placement, like kube's LeastAllocated (its default).
    Spread,
    /// A random node that fits.
    Random,
    /// Tetris' dot product of free and requested (CPU, GPU), smallest wins.
    DotProd,
    /// Partially used GPUs first, then free GPUs on used nodes, then untouched nodes.
    GpuPacking,
    /// Nodes already running pods of the same class (shared, k-GPU) first.
    GpuClustering,
    /// Fragmentation gradient descent: the node whose fragmentation grows least.
    Fgd,
    /// What stock Kubernetes does: kube-scheduler's default scoring (NodeResourcesFit
    /// LeastAllocated plus NodeResourcesBalancedAllocation, on CPU and memory; GPUs only
    /// counted) over the part of the cluster its rotating scan finds
    /// (`percentageOfNodesToScore`), equal scores broken uniformly, and the kubelet's
    /// device choice (any free devices; see [`kube_default`]).
    KubeDefault,
    /// Stock Kubernetes 1.34+ with the pod's GPUs claimed through DRA: kube-scheduler
    /// places the pod as `kube-default` does (DRA devices are not scored) and its
    /// structured allocator takes the first devices of the node's ResourceSlice that
    /// match, in the slice's order (see [`kube_default::first_devices`]).
    KubeDra,
    /// gpuplace's own policy: FGD's fragmentation drop, minus the GPU milli the placement
    /// strands or leaves without CPU, minus what a flexible pod takes out of a model's
    /// reserve, with shares kept balanced across gap sizes (see [`Ideas`] and docs/policy.md).
    /// `Ideas::POLICY` is the policy; the others are its ablations.
    Gpuplace(Ideas),
}

/// The ideas the `gpuplace` policy adds to FGD, each of which an ablation turns off (and
/// one, `fine`, that it leaves off and an ablation turns on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ideas {
    /// Subtract the GPU milli a placement leaves that no shape of the workload can use any
    /// more (below every share, or without the CPU any shape needs), in milli like FGD's
    /// drop.
    pub stranded: bool,
    /// Subtract the growth of idle GPU milli the node's CPU cannot feed at the workload's
    /// CPU per GPU (see [`TargetWorkload::unfed_of`](crate::TargetWorkload::unfed_of)).
    pub unfed: bool,
    /// For shares: keep the cluster's partly used GPUs balanced across free sizes (change
    /// of the sum of squared gap counts, Csirik et al.'s Sum-of-Squares rule).
    pub balance: bool,
    /// Pods that could run on other models pay for the GPU milli they take out of a model's
    /// reserve for pods restricted to models (see [`ModelReserve`](crate::ModelReserve)).
    pub reserve: bool,
    /// Count a multi-GPU shape once per GPU it asks, and keep every such shape however
    /// rare: FGD's probabilities count pods, and its 95% coverage cut drops the rare shapes
    /// (on the openb default trace every multi-GPU one), so FGD is indifferent between
    /// filling a partly used node and breaking a free one. Over time that is what makes
    /// 8-GPU pods wait: a k-GPU pod that finds no room leaves k GPUs of demand waiting
    /// (see [`TargetWorkload::multi_fragmentation_of`](crate::TargetWorkload)).
    pub multi: bool,
    /// A ten times finer score (1000 points instead of FGD's 100), so fewer nodes tie.
    /// Off in the policy: on the 1,213-node traces it is within 0.03 points either way, but
    /// on clusters of 8-128 nodes it loses part of the packing that FGD's coarse ties give
    /// (the tied node first in the seeded order takes the pod): 13.0% less unallocated GPU
    /// than FGD instead of 14.0% (docs/results.md, small clusters).
    pub fine: bool,
}

impl Ideas {
    /// The `gpuplace` policy.
    pub const POLICY: Ideas = Ideas {
        stranded: true,
        unfed: true,
        balance: true,
        reserve: true,
        multi: true,
        fine: false,
    };
}

/// A policy name that is not known.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown policy {0:?}; known: {known}", known = Policy::names().join(", "))]
pub struct UnknownPolicy(pub String);

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 11] = [
        Policy::Random,
        Policy::DotProd,
        Policy::GpuClustering,
        Policy::GpuPacking,
        Policy::BestFit,
        Policy::Fgd,
        Policy::FirstFit,
        Policy::WorstFit,
        Policy::Binpack,
        Policy::Spread,
        Policy::Gpuplace(Ideas::POLICY),
    ];

    /// `gpuplace`, then each of its ideas turned off alone and the finer score turned on
    /// (the ablation), then FGD.
    pub const ABLATION: [Policy; 8] = [
        Policy::Gpuplace(Ideas::POLICY),
        Policy::Gpuplace(Ideas {
            stranded: false,
            ..Ideas::POLICY
        }),
        Policy::Gpuplace(Ideas {
            unfed: false,
            ..Ideas::POLICY
        }),
        Policy::Gpuplace(Ideas {
            balance: false,
            ..Ideas::POLICY
        }),
        Policy::Gpuplace(Ideas {
            reserve: false,
            ..Ideas::POLICY
        }),
        Policy::Gpuplace(Ideas {
            multi: false,
            ..Ideas::POLICY
        }),
        Policy::Gpuplace(Ideas {
            fine: true,
            ..Ideas::POLICY
        }),
        Policy::Fgd,
    ];

    /// Policies outside `all`, named on their own: `kube-default` (stock Kubernetes, the
    /// baseline an operator runs today) and `kube-dra` (the same with the GPUs claimed
    /// through DRA and allocated by kube-scheduler).
    pub const EXTRA: [Policy; 2] = [Policy::KubeDefault, Policy::KubeDra];

    /// gpuplace's own policy.
    pub const GPUPLACE: Policy = Policy::Gpuplace(Ideas::POLICY);

    /// The default of the scheduler and the extender: `gpuplace`, which leaves less GPU
    /// unallocated than FGD on every shared trace, and on average on clusters of 8 to 128
    /// nodes sampled from it.
    pub const DEFAULT: Policy = Policy::GPUPLACE;

    /// The six policies the FGD paper compares.
    pub const PAPER: [Policy; 6] = [
        Policy::Random,
        Policy::DotProd,
        Policy::GpuClustering,
        Policy::GpuPacking,
        Policy::BestFit,
        Policy::Fgd,
    ];

    /// Whether it models stock kube-scheduler (its queue, its partial node scan), with
    /// device-plugin GPUs or with claims.
    pub fn is_kube_scheduler(self) -> bool {
        matches!(self, Policy::KubeDefault | Policy::KubeDra)
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::FirstFit => "first-fit",
            Policy::BestFit => "best-fit",
            Policy::WorstFit => "worst-fit",
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Random => "random",
            Policy::DotProd => "dotprod",
            Policy::GpuPacking => "gpu-packing",
            Policy::GpuClustering => "gpu-clustering",
            Policy::Fgd => "fgd",
            Policy::KubeDefault => "kube-default",
            Policy::KubeDra => "kube-dra",
            Policy::Gpuplace(ideas) => match ideas {
                Ideas {
                    stranded: false, ..
                } => "gpuplace-no-stranded",
                Ideas { unfed: false, .. } => "gpuplace-no-unfed",
                Ideas { balance: false, .. } => "gpuplace-no-balance",
                Ideas { reserve: false, .. } => "gpuplace-no-reserve",
                Ideas { multi: false, .. } => "gpuplace-no-multi",
                Ideas { fine: true, .. } => "gpuplace-fine",
                _ => "gpuplace",
            },
        }
    }

    pub fn names() -> Vec<&'static str> {
        Policy::ALL
            .iter()
            .chain(&Policy::EXTRA)
            .map(|p| p.name())
            .collect()
    }

    /// Parses a comma-separated list; `all` and `paper` expand to those sets.
    pub fn parse_list(text: &str) -> Result<Vec<Policy>, UnknownPolicy> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => out.extend(Policy::ALL),
                "paper" => out.extend(Policy::PAPER),
                "ablation" => out.extend(Policy::ABLATION),
                name => out.push(name.parse()?),
            }
        }
        if out.is_empty() {
            return Err(UnknownPolicy(text.to_string()));
        }
        let mut seen = Vec::new();
        out.retain(|p| {
            let fresh = !seen.contains(p);
            seen.push(*p);
            fresh
        });
        Ok(out)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        let alias = match wanted.as_str() {
            "bestfit" => "best-fit",
            "worstfit" => "worst-fit",
            "firstfit" => "first-fit",
            "dotproduct" | "dot-product" => "dotprod",
            "gpupacking" | "packing" => "gpu-packing",
            "gpuclustering" | "clustering" => "gpu-clustering",
            "most-allocated" => "binpack",
            "least-allocated" => "spread",
            "kube" | "kubernetes" | "kube-scheduler" | "default-scheduler" => "kube-default",
            other => other,
        };
        Policy::ALL
            .into_iter()
            .chain(Policy::ABLATION)
            .chain(Policy::EXTRA)
            .find(|p| p.name() == alias)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Fraction of the paper's normalisers left after placement (0 best .. 1 worst).
fn leftover_after(state: &NodeState, request: &Request) -> f64 {
    let cpu_left = state.cpu_free.saturating_sub(request.cpu_milli) as f64;
    let gpu_left = state.gpu_idle().saturating_sub(request.total_gpu_milli()) as f64;
    0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
}

/// Mean allocated share of CPU, memory and (on GPU nodes) GPU after placement.
fn allocated_after(node: &NodeInventory, state: &NodeState, request: &Request) -> f64 {
    let share = |capacity: u64, free: u64, want: u64| {
        if capacity == 0 {
            None
        } else {
            Some(1.0 - free.saturating_sub(want) as f64 / capacity as f64)
        }
    };
    let gpu_capacity: u64 = state.gpu_capacity.iter().map(|&c| u64::from(c)).sum();
    let parts = [
        share(node.cpu_milli, state.cpu_free, request.cpu_milli),
        share(node.memory_mib, state.memory_free, request.memory_mib),
        share(gpu_capacity, state.gpu_idle(), request.total_gpu_milli()),
    ];
    let (sum, count) = parts
        .iter()
        .flatten()
        .fold((0.0, 0), |(s, c), v| (s + v, c + 1));
    if count == 0 { 0.0 } else { sum / count as f64 }
}

/// Score of the simple policies (all but FGD and Random) for a request that fits.
pub(crate) fn simple_score(
    policy: Policy,
    n: usize,
    node: &NodeInventory,
    state: &NodeState,
    request: &Request,
) -> i64 {
    let request = &*crate::replicas::effective_on(node, request);
    match policy {
        Policy::FirstFit => -(n as i64),
        Policy::BestFit => ((1.0 - leftover_after(state, request)) * 100.0) as i64,
        Policy::WorstFit => (leftover_after(state, request) * 100.0) as i64,
        Policy::Binpack => (allocated_after(node, state, request) * 100.0) as i64,
        Policy::Spread => ((1.0 - allocated_after(node, state, request)) * 100.0) as i64,
        Policy::DotProd => {
            let free_cpu = state.cpu_free as f64 / MAX_SPEC_CPU;
            let free_gpu = state.gpu_idle() as f64 / MAX_SPEC_GPU;
            let want_cpu = request.cpu_milli as f64 / MAX_SPEC_CPU;
            let want_gpu = request.total_gpu_milli() as f64 / MAX_SPEC_GPU;
            let dot = (free_cpu * want_cpu + free_gpu * want_gpu) / 2.0;
            (100.0 * (1.0 - dot)) as i64
        }
        Policy::GpuPacking => gpu_packing_score(state, request),
        Policy::GpuClustering => gpu_clustering_score(state, request),
        Policy::KubeDefault | Policy::KubeDra => kube_default::score(node, state, request),
        Policy::Random | Policy::Fgd | Policy::Gpuplace(_) => 0,
    }
}

fn gpu_packing_score(state: &NodeState, request: &Request) -> i64 {
    if request.gpu_count == 0 {
        return 0;
    }
    let fully_free = state.fully_free_gpus() as i64;
    if fully_free == state.gpu_free.len() as i64 {
        return (100 / 3 - fully_free).max(fully_free);
    }
    // The GPUs a least-free-first allocation would use.
    let mut order: Vec<usize> = (0..state.gpu_free.len()).collect();
    order.sort_by_key(|&g| state.gpu_free[g]);
    let mut wanted = request.gpu_count;
    let mut free_to_use = 0i64;
    let mut ratio_on_used = 0i64;
    for g in order {
        if wanted == 0 {
            break;
        }
        let free = state.gpu_free[g];
        if free >= request.gpu_milli && free > 0 {
            wanted -= 1;
            if free == state.gpu_capacity[g] {
                free_to_use += 1;
            }
            ratio_on_used += i64::from(free) * 100 / 1000;
        }
    }
    if free_to_use > 0 {
        (100 / 2 - free_to_use).max(100 / 3)
    } else {
        (100 - ratio_on_used / 10).max(100 / 2)
    }
}

fn gpu_clustering_score(state: &NodeState, request: &Request) -> i64 {
    let class = match request.gpu_count {
        0 => return 0,
        _ if request.is_fractional() => 0,
        n => n,
    };
    let left = state.gpu_idle() as i64;
    let fill = 25 * (MAX_SPEC_GPU as i64 - left) / MAX_SPEC_GPU as i64;
    let has_class = state.classes.iter().any(|(c, n)| *c == class && *n > 0);
    let tier = if has_class {
        if state.classes.len() == 1 { 75 } else { 50 }
    } else if state.classes.is_empty() {
        25
    } else {
        0
    };
    fill + tier
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_lists_parse() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert_eq!(
            Policy::parse_list("fgd, best-fit,fgd").unwrap(),
            vec![Policy::Fgd, Policy::BestFit]
        );
        assert_eq!(Policy::parse_list("paper").unwrap().len(), 6);
        for p in Policy::ABLATION.into_iter().chain(Policy::EXTRA) {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert_eq!(
            "kube-scheduler".parse::<Policy>().unwrap(),
            Policy::KubeDefault
        );
        assert_eq!(
            Policy::parse_list("gpuplace,ablation").unwrap(),
            Policy::ABLATION.to_vec()
        );
        assert_eq!(Policy::GPUPLACE.name(), "gpuplace");
        assert_eq!(Policy::DEFAULT.name(), "gpuplace");
        let err = Policy::parse_list("fgd,nope").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown policy \"nope\"; known: random")
        );
        assert!(Policy::parse_list(" , ").is_err());
    }

    fn state(cpu: u64, gpus: &[u32]) -> NodeState {
        NodeState {
            cpu_free: cpu,
            memory_free: 0,
            gpu_free: gpus.to_vec(),
            gpu_capacity: vec![1000; gpus.len()],
            version: 0,
            classes: vec![],
            frag: 0.0,
        }
    }

    fn req(cpu: u64, count: u32, milli: u32) -> Request {
        Request {
            cpu_milli: cpu,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    #[test]
    fn packing_tiers() {
        let r = req(0, 1, 500);
        // Untouched 8-GPU node: 33 - 8 = 25.
        assert_eq!(gpu_packing_score(&state(0, &[1000; 8]), &r), 25);
        // A used node but the pod needs a free GPU: 50 - 1.
        assert_eq!(gpu_packing_score(&state(0, &[1000, 200]), &r), 49);
        // A shared GPU with 600 free: 100 - 60/10 = 94.
        assert_eq!(gpu_packing_score(&state(0, &[1000, 600]), &r), 94);
    }

    #[test]
    fn clustering_tiers() {
        let mut s = state(0, &[1000; 8]);
        let share = req(0, 1, 500);
        assert_eq!(gpu_clustering_score(&s, &share), 25);
        s.classes = vec![(0, 1)];
        s.gpu_free[0] = 500;
        assert_eq!(gpu_clustering_score(&s, &share), 75 + 25 * 500 / 8000);
        s.classes.push((1, 1));
        assert_eq!(gpu_clustering_score(&s, &share), 50 + 1);
        assert_eq!(gpu_clustering_score(&s, &req(0, 2, 1000)), 1);
        assert_eq!(gpu_clustering_score(&s, &req(1, 0, 0)), 0);
    }

    #[test]
    fn best_fit_prefers_fuller_nodes() {
        let node = NodeInventory::uniform("n", 128_000, 1, 8, "T4");
        let r = req(8000, 1, 1000);
        let full = simple_score(Policy::BestFit, 0, &node, &state(16_000, &[1000, 0]), &r);
        let empty = simple_score(Policy::BestFit, 0, &node, &state(128_000, &[1000; 8]), &r);
        assert!(full > empty);
        let dot_full = simple_score(Policy::DotProd, 0, &node, &state(16_000, &[1000, 0]), &r);
        let dot_empty = simple_score(Policy::DotProd, 0, &node, &state(128_000, &[1000; 8]), &r);
        assert!(dot_full > dot_empty);
    }
}
