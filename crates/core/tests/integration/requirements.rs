//! Pods' GPU requirements: every placement meets them, and the requirement's device search
//! agrees with brute force on random topologies up to 16 GPUs.

use gpuplace_core::require::{self, PairRules};
use gpuplace_core::topology::LinkMatrix;
use gpuplace_core::{ClusterState, FitFailure, Placer, Policy};
use gpuplace_model::{GpuNeed, GpuTopology, Link, NodeInventory, PcieLevel, Request};
use proptest::prelude::*;

use crate::common::dgx1;

const LEVELS: [PcieLevel; 6] = [
    PcieLevel::CrossCpu,
    PcieLevel::SameCpu,
    PcieLevel::HostBridge,
    PcieLevel::MultiSwitch,
    PcieLevel::SingleSwitch,
    PcieLevel::SameBoard,
];

const TOPOLOGIES: [GpuTopology; 4] = [
    GpuTopology::Any,
    GpuTopology::Nvlink,
    GpuTopology::PcieSwitch,
    GpuTopology::Numa,
];

/// A node of `gpus` GPUs whose pairs take `pairs` (NVLink count, PCIe level) in turn and
/// whose GPUs take `numa` in turn.
fn node(
    name: &str,
    gpus: u32,
    pairs: &[(u32, usize)],
    numa: &[Option<u32>],
    memory: u64,
) -> NodeInventory {
    let mut node = NodeInventory::uniform(name, 128_000, 1 << 20, gpus, "A100-SXM4-80GB");
    let mut i = 0;
    for a in 0..gpus {
        for b in a + 1..gpus {
            let (nvlinks, level) = pairs[i % pairs.len()];
            i += 1;
            node.links.push(Link {
                a,
                b,
                nvlinks,
                pcie: LEVELS[level],
            });
        }
    }
    for (g, gpu) in node.gpus.iter_mut().enumerate() {
        gpu.numa_node = numa[g % numa.len()];
        gpu.memory_mib = memory;
    }
    node
}

/// Every qualifying set; the best by (largest score, smallest cut to the rest of the
/// pool, lexicographically smallest).
fn brute(
    links: &LinkMatrix,
    rules: &PairRules,
    t: GpuTopology,
    pool: &[usize],
    k: usize,
) -> Option<Vec<usize>> {
    let mut best: Option<(u64, u64, Vec<usize>)> = None;
    let n = pool.len();
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize != k {
            continue;
        }
        let set: Vec<usize> = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| pool[i])
            .collect();
        if !require::meets(links, rules, t, &set) {
            continue;
        }
        let score = links.set_score(&set);
        let cut: u64 = set
            .iter()
            .flat_map(|&a| {
                pool.iter()
                    .filter(|b| !set.contains(b))
                    .map(move |&b| (a, b))
            })
            .map(|(a, b)| u64::from(links.pair(a, b)))
            .sum();
        let better = match &best {
            None => true,
            Some((s, c, p)) => score > *s || (score == *s && (cut < *c || (cut == *c && set < *p))),
        };
        if better {
            best = Some((score, cut, set));
        }
    }
    best.map(|(_, _, s)| s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn requirement_search_agrees_with_brute_force(
        gpus in 2u32..=16,
        pairs in prop::collection::vec((0u32..3, 0usize..6), 1..40),
        numa in prop::collection::vec(prop_oneof![Just(None), Just(Some(0u32)), Just(Some(1))], 1..4),
        free_mask in any::<u16>(),
        k in 2usize..=8,
        t in 0usize..4,
    ) {
        let inv = node("n", gpus, &pairs, &numa, 81920);
        let links = LinkMatrix::from_inventory(&inv);
        let rules = PairRules::from_inventory(&inv);
        let pool: Vec<usize> = (0..gpus as usize).filter(|g| free_mask & (1 << g) != 0).collect();
        let topology = TOPOLOGIES[t];
        let got = require::select(&links, &rules, topology, &pool, k).map(|s| s.positions);
        let want = brute(&links, &rules, topology, &pool, k);
        prop_assert_eq!(got.is_some(), want.is_some());
        prop_assert_eq!(require::exists(&links, &rules, topology, &pool, k), want.is_some());
        if let (Some(got), Some(want)) = (got, want) {
            // The same objective value (score, cut); the set itself where the unconstrained
            // search's tie order applies may differ only among equals.
            prop_assert!(require::meets(&links, &rules, topology, &got));
            prop_assert_eq!(links.set_score(&got), links.set_score(&want));
        }
    }

    #[test]
    fn every_placement_meets_every_requirement(
        shapes in prop::collection::vec(
            (prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], 0usize..4, 0usize..4, any::<bool>(), any::<bool>()),
            1..60),
        policy in 0usize..3,
    ) {
        let policy = [Policy::Fgd, Policy::BestFit, Policy::Spread][policy];
        let mut nodes = Vec::new();
        for i in 0..6u32 {
            let pairs: Vec<(u32, usize)> = (0..28).map(|p| ((p * 7 + i) % 3, ((p * 5 + i) % 6) as usize)).collect();
            let mut inv = node(&format!("n{i}"), 8, &pairs, &[Some(0), Some(0), Some(1), Some(1)], if i % 2 == 0 { 40960 } else { 81920 });
            if i % 3 == 2 {
                for g in &mut inv.gpus {
                    g.model = "Tesla-V100-SXM2-32GB".into();
                }
            }
            nodes.push(inv);
        }
        let mut state = ClusterState::new(nodes.clone()).unwrap();
        let mut placer = Placer::new(policy, 7);
        for (count, t, p, big, no_v100) in shapes {
            let need = GpuNeed {
                topology: TOPOLOGIES[t],
                prefer: TOPOLOGIES[p],
                models: vec![],
                exclude_models: if no_v100 { vec!["v100".into()] } else { vec![] },
                min_memory_mib: if big { 65536 } else { 0 },
            };
            let request = Request { cpu_milli: 1000, memory_mib: 1024, gpu_count: count, gpu_milli: 1000, allowed_models: vec![], need: need.clone() };
            let Ok(decision) = placer.place(&mut state, &request) else { continue };
            let inv = &nodes[decision.node];
            let positions: Vec<usize> = decision.gpus.iter().map(|&(g, _)| g).collect();
            prop_assert_eq!(positions.len(), count as usize);
            for &g in &positions {
                prop_assert!(need.allows_model(&inv.gpus[g].model));
                prop_assert!(need.allows_memory(inv.gpus[g].memory_mib));
            }
            prop_assert!(require::meets(state.links(decision.node), state.pair_rules(decision.node), need.topology, &positions));
        }
    }
}

#[test]
fn a_four_gpu_nvlink_pod_gets_a_fully_linked_quad_or_an_exact_reason() {
    let nvlink4 = Request {
        cpu_milli: 1000,
        gpu_count: 4,
        gpu_milli: 1000,
        need: GpuNeed {
            topology: GpuTopology::Nvlink,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut state = ClusterState::new(vec![dgx1("dgx")]).unwrap();
    let mut placer = Placer::new(Policy::Fgd, 1);
    let d = placer.place(&mut state, &nvlink4).unwrap();
    assert_eq!(
        d.gpus.iter().map(|&(g, _)| g).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );

    // GPUs 0 and 5 taken: six are free but no quad is fully linked.
    let mut state = ClusterState::new(vec![dgx1("dgx")]).unwrap();
    let one = Request {
        cpu_milli: 1000,
        gpu_count: 1,
        gpu_milli: 1000,
        ..Default::default()
    };
    state.apply(0, &one, &[(0, 1000)]).unwrap();
    state.apply(0, &one, &[(5, 1000)]).unwrap();
    let why = placer.place(&mut state, &nvlink4).unwrap_err();
    assert_eq!(why.count(FitFailure::TopologyUnavailable), 1);
    assert_eq!(
        why.message("nvidia.com/gpu"),
        "0/1 nodes are available: 1 node(s) had no 4 GPUs linked by NVLink."
    );
    // A preference alone never refuses; three linked GPUs still fit a 3-GPU requirement.
    let preferred = Request {
        need: GpuNeed {
            prefer: GpuTopology::Nvlink,
            ..Default::default()
        },
        ..nvlink4.clone()
    };
    let mut trial = state.clone();
    assert!(placer.place(&mut trial, &preferred).is_ok());
    let three = Request {
        gpu_count: 3,
        ..nvlink4.clone()
    };
    let d = placer.place(&mut state, &three).unwrap();
    let got: Vec<usize> = d.gpus.iter().map(|&(g, _)| g).collect();
    assert!(got == vec![1, 2, 3] || got == vec![4, 6, 7], "{got:?}");
    let memory = Request {
        gpu_count: 1,
        gpu_milli: 1000,
        need: GpuNeed {
            min_memory_mib: 40 * 1024,
            ..Default::default()
        },
        ..Default::default()
    };
    let why = placer.place(&mut state, &memory).unwrap_err();
    assert_eq!(
        why.message("nvidia.com/gpu"),
        "0/1 nodes are available: 1 node(s) had no GPU with 40Gi of memory."
    );
}
