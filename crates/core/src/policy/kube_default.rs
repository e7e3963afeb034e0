//! `kube-default`: what a stock Kubernetes cluster does with a GPU pod, so the simulator
//! can predict what users run today.
//!
//! - kube-scheduler (v1.26 to v1.33, default profile) scores a feasible node by two plugins
//!   of weight 1: NodeResourcesFit with `LeastAllocated` on CPU and memory
//!   (`(allocatable - requested) * 100 / allocatable` per resource, integer, averaged), where
//!   the pod counts its non-zero requests (100m CPU, 200 MiB when it asks none), and
//!   NodeResourcesBalancedAllocation (`(1 - |f_cpu - f_memory| / 2) * 100`, `f` the requested
//!   fractions after placement, capped at 1). Extended resources such as `nvidia.com/gpu`
//!   are only counted, never scored; equal top scores go to a random node.
//! - The kubelet gives the pod any free devices of the resource: without a preferred
//!   allocation from the plugin its device manager takes them in map order, which is no
//!   order; a share goes to any GPU it fits on.

use gpuplace_model::{NodeInventory, Request};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::state::NodeState;

/// kube-scheduler's default CPU request for scoring a container that asks none (milli).
const DEFAULT_CPU_MILLI: u64 = 100;
/// Its default memory request for scoring, bytes (200 MB, as `DefaultMemoryRequest`).
const DEFAULT_MEMORY_BYTES: u64 = 200 * 1024 * 1024;
/// A score's top (`framework.MaxNodeScore`).
const MAX_NODE_SCORE: i64 = 100;

/// LeastAllocated plus BalancedAllocation of `request` on `node` in `state` (0 to 200).
pub(crate) fn score(node: &NodeInventory, state: &NodeState, request: &Request) -> i64 {
    let mib = 1024 * 1024;
    let cpu_used = node.cpu_milli.saturating_sub(state.cpu_free);
    let memory_used = node.memory_mib.saturating_sub(state.memory_free) * mib;
    let cpu = Resource {
        allocatable: node.cpu_milli,
        requested: cpu_used + request.cpu_milli,
        non_zero: cpu_used + request.cpu_milli.max(DEFAULT_CPU_MILLI),
    };
    let memory = Resource {
        allocatable: node.memory_mib * mib,
        requested: memory_used + request.memory_mib * mib,
        non_zero: memory_used + (request.memory_mib * mib).max(DEFAULT_MEMORY_BYTES),
    };
    least_allocated(&[cpu, memory]) + balanced(&[cpu, memory])
}

/// One resource of a node as the two plugins see it after placement.
#[derive(Clone, Copy)]
struct Resource {
    allocatable: u64,
    /// What the pods ask, this one included.
    requested: u64,
    /// The same with the defaults for pods that ask none (LeastAllocated's view).
    non_zero: u64,
}

/// NodeResourcesFit's `leastResourceScorer`, weights 1.
fn least_allocated(resources: &[Resource]) -> i64 {
    let total: i64 = resources
        .iter()
        .map(|r| {
            if r.allocatable == 0 || r.non_zero > r.allocatable {
                0
            } else {
                ((r.allocatable - r.non_zero) as i128 * MAX_NODE_SCORE as i128
                    / r.allocatable as i128) as i64
            }
        })
        .sum();
    total / resources.len().max(1) as i64
}

/// NodeResourcesBalancedAllocation's `balancedResourceScorer`.
fn balanced(resources: &[Resource]) -> i64 {
    let fractions: Vec<f64> = resources
        .iter()
        .filter(|r| r.allocatable > 0)
        .map(|r| (r.requested as f64 / r.allocatable as f64).min(1.0))
        .collect();
    let std = match fractions.len() {
        0 | 1 => 0.0,
        2 => ((fractions[0] - fractions[1]) / 2.0).abs(),
        n => {
            let mean = fractions.iter().sum::<f64>() / n as f64;
            (fractions.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / n as f64).sqrt()
        }
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

/// kube-scheduler's structured allocator (`kube-dra`): it walks the node's ResourceSlice
/// in its order (gpuplace's driver lists a node's GPUs by position) and takes the first
/// devices that match and have room, so `count` whole GPUs are the first `count` of
/// `available` (positions, ascending) and a share goes to the first GPU it fits on. With
/// a `matchAttribute` constraint it backtracks: the first set in that order that meets it
/// ([`crate::require::first_set`]).
pub(crate) fn first_devices(available: &[usize], count: usize) -> Vec<usize> {
    available.iter().copied().take(count).collect()
}

/// The kubelet's pick of `count` whole GPUs among `available`: any of them.
pub(crate) fn whole_gpus(rng: &mut ChaCha8Rng, available: &[usize], count: usize) -> Vec<usize> {
    let mut pool = available.to_vec();
    let count = count.min(pool.len());
    for i in 0..count {
        let j = rng.random_range(i..pool.len());
        pool.swap(i, j);
    }
    pool.truncate(count);
    pool.sort_unstable();
    pool
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn state(node: &NodeInventory, cpu_used: u64, memory_used: u64) -> NodeState {
        NodeState {
            cpu_free: node.cpu_milli - cpu_used,
            memory_free: node.memory_mib - memory_used,
            gpu_free: vec![1000; node.gpus.len()],
            gpu_capacity: vec![1000; node.gpus.len()],
            version: 0,
            classes: vec![],
            frag: 0.0,
        }
    }

    fn req(cpu: u64, memory: u64) -> Request {
        Request {
            cpu_milli: cpu,
            memory_mib: memory,
            gpu_count: 1,
            gpu_milli: 1000,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    #[test]
    fn scores_as_kube_scheduler_does() {
        let node = NodeInventory::uniform("n", 96_000, 393_216, 8, "A100");
        // Empty node, a pod of 8 CPUs and 32 GiB: LeastAllocated (91 + 91) / 2 = 91
        // ((96000-8000)*100/96000 = 91.67 -> 91); fractions 1/12 and 1/12: balanced 100.
        assert_eq!(score(&node, &state(&node, 0, 0), &req(8_000, 32_768)), 191);
        // Half the CPU used, no memory: the fuller node scores lower and unbalanced.
        let half = score(&node, &state(&node, 48_000, 0), &req(8_000, 32_768));
        // cpu (96-56)/96 = 41, memory 91 -> 66; fractions 0.583, 0.083 -> std 0.25 -> 75.
        assert_eq!(half, 66 + 75);
        // A pod that asks nothing counts 100m and 200 MB for LeastAllocated.
        let tiny = NodeInventory::uniform("t", 1_000, 1_000, 1, "T4");
        assert_eq!(
            score(&tiny, &state(&tiny, 0, 0), &req(0, 0)),
            90 / 2 + 80 / 2 + 100
        );
    }

    #[test]
    fn the_kubelet_picks_any_free_gpus() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let picked = whole_gpus(&mut rng, &[1, 3, 4, 6], 2);
            assert_eq!(picked.len(), 2);
            assert!(picked.iter().all(|g| [1, 3, 4, 6].contains(g)));
            seen.insert(picked);
        }
        // Not always the lowest: every pair comes up.
        assert_eq!(seen.len(), 6);
        assert_eq!(whole_gpus(&mut rng, &[2], 3), vec![2]);
    }
}
