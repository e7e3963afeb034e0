//! The built-in workload: a synthetic cluster and pod list with the shape statistics of the
//! openb trace, so `gpuplace simulate` runs on a fresh machine with no files.
//!
//! The figures below were measured on `openb_node_list_gpu_node.csv` (node types and their
//! counts) and `openb_pod_list_default.csv` (the most common pod shapes, 91% of pods, and the
//! multi-GPU shapes, with their frequencies per 8,152 pods). No trace rows are copied: the
//! generator draws new pods from these frequencies with a fixed seed.

use gpuplace_model::{NodeInventory, Request};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::TracePod;

/// Node types of the openb GPU cluster: (count, CPU milli, memory MiB, GPUs, model).
const NODE_TYPES: [(u32, u64, u64, u32, &str); 15] = [
    (549, 96_000, 393_216, 8, "G2"),
    (387, 104_000, 524_288, 2, "T4"),
    (107, 16_000, 122_880, 2, "P100"),
    (39, 128_000, 786_432, 8, "G3"),
    (28, 32_000, 131_072, 4, "V100M16"),
    (22, 64_000, 262_144, 2, "P100"),
    (21, 96_000, 786_432, 8, "V100M32"),
    (19, 8_000, 32_768, 1, "V100M16"),
    (17, 96_000, 393_216, 4, "T4"),
    (9, 48_000, 376_832, 4, "V100M32"),
    (7, 64_000, 262_144, 8, "V100M16"),
    (3, 8_000, 61_440, 1, "P100"),
    (2, 8_000, 61_440, 2, "P100"),
    (2, 128_000, 1_048_576, 1, "A10"),
    (1, 82_000, 344_064, 8, "V100M16"),
];

/// Pod shapes: (pods per 8,152, CPU milli, memory MiB, GPU count, per-GPU milli).
const POD_SHAPES: [(u32, u64, u64, u32, u32); 46] = [
    (1047, 3152, 5600, 1, 810),
    (857, 11300, 49152, 1, 1000),
    (534, 11400, 48128, 1, 1000),
    (470, 3152, 5600, 1, 1000),
    (388, 11908, 47104, 1, 470),
    (364, 12500, 57344, 0, 0),
    (360, 8000, 30517, 1, 470),
    (284, 32000, 49152, 0, 0),
    (255, 18708, 64512, 1, 1000),
    (237, 11908, 47104, 1, 650),
    (195, 9810, 41560, 1, 1000),
    (163, 8000, 30517, 0, 0),
    (158, 15700, 58368, 1, 1000),
    (158, 12000, 24576, 1, 1000),
    (153, 11908, 47104, 1, 1000),
    (120, 15400, 51200, 0, 0),
    (111, 4000, 22888, 1, 320),
    (108, 16000, 32768, 1, 1000),
    (104, 8000, 16384, 1, 1000),
    (104, 4000, 24576, 1, 1000),
    (99, 12000, 16384, 1, 1000),
    (95, 16500, 51200, 0, 0),
    (93, 14200, 58368, 1, 1000),
    (84, 4000, 30517, 1, 230),
    (84, 24200, 93184, 1, 1000),
    (78, 4000, 15258, 1, 320),
    (75, 3152, 5600, 1, 590),
    (72, 8000, 30517, 1, 320),
    (72, 4152, 10600, 1, 550),
    (65, 11400, 77824, 1, 1000),
    (55, 8000, 32768, 1, 1000),
    (53, 4000, 15258, 1, 160),
    (51, 6000, 6144, 1, 460),
    (51, 11900, 77824, 1, 1000),
    (45, 4152, 10600, 1, 370),
    (44, 12000, 15360, 1, 1000),
    (43, 4000, 30517, 1, 320),
    (41, 8200, 33792, 1, 1000),
    (40, 4000, 31250, 1, 1000),
    (36, 15200, 80896, 1, 1000),
    (36, 88000, 327_680, 8, 1000),
    (8, 64200, 263_168, 8, 1000),
    (9, 32200, 132_096, 4, 1000),
    (6, 60200, 320_512, 4, 1000),
    (10, 16200, 66560, 2, 1000),
    (6, 30200, 160_768, 2, 1000),
];

/// GPU request of the original trace as a share of its cluster's capacity.
const TRACE_LOAD: f64 = 0.98;

/// Seed of the built-in pod list (fixed so every run sees the same workload).
const BUILTIN_SEED: u64 = 2023;

/// The built-in cluster: the openb node mix at `1/scale` of its size (at least one of each type).
pub fn cluster(scale: u32) -> Vec<NodeInventory> {
    let scale = scale.max(1);
    let mut nodes = Vec::new();
    for (t, &(count, cpu, mem, gpus, model)) in NODE_TYPES.iter().enumerate() {
        let count = count.div_ceil(scale);
        for i in 0..count {
            let name = format!("builtin-{model}-{t:02}-{i:04}").to_lowercase();
            nodes.push(NodeInventory::uniform(&name, cpu, mem, gpus, model));
        }
    }
    nodes
}

/// A pod list for `nodes` drawn from the trace's shape frequencies until its GPU request is
/// the trace's 98% of the cluster's GPU capacity.
pub fn pods(nodes: &[NodeInventory]) -> Vec<TracePod> {
    let capacity: u64 = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| u64::from(g.milli_capacity))
        .sum();
    let target = (capacity as f64 * TRACE_LOAD) as u64;
    let total_weight: u32 = POD_SHAPES.iter().map(|s| s.0).sum();
    let mut rng = ChaCha8Rng::seed_from_u64(BUILTIN_SEED);
    let mut pods = Vec::new();
    let mut requested = 0u64;
    while requested < target {
        let mut pick = rng.random_range(0..total_weight);
        let &(_, cpu, mem, count, milli) = POD_SHAPES
            .iter()
            .find(|s| {
                if pick < s.0 {
                    true
                } else {
                    pick -= s.0;
                    false
                }
            })
            .unwrap_or(&POD_SHAPES[0]);
        let request = Request {
            cpu_milli: cpu,
            memory_mib: mem,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: Vec::new(),
            need: Default::default(),
        };
        requested += request.total_gpu_milli();
        pods.push(TracePod {
            name: format!("builtin-pod-{:05}", pods.len()),
            priority: 0,
            request,
            duration_s: None,
            gang: None,
        });
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_scale_matches_the_trace_cluster() {
        let nodes = cluster(1);
        assert_eq!(nodes.len(), 1213);
        let gpus: usize = nodes.iter().map(|n| n.gpus.len()).sum();
        assert_eq!(gpus, 6212);
    }

    #[test]
    fn pods_are_deterministic_and_sized_to_the_cluster() {
        let nodes = cluster(8);
        let a = pods(&nodes);
        assert_eq!(a, pods(&nodes));
        let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
        let requested: u64 = a.iter().map(|p| p.request.total_gpu_milli()).sum();
        assert!(requested >= capacity * 98 / 100);
        assert!(a.iter().all(|p| p.request.validate().is_ok()));
    }
}
