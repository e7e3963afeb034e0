//! Placement invariants, checked over random clusters and request streams for every policy:
//! capacity is never exceeded, a multi-GPU request gets all its GPUs or none, state totals
//! agree with the nodes, and the same seed gives the same placements.

use std::sync::Arc;

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_model::{GpuNeed, GpuTopology, Link, NodeInventory, PcieLevel, Request};
use proptest::prelude::*;

fn node_strategy() -> impl Strategy<Value = (u64, u64, u32, bool)> {
    (
        prop_oneof![Just(8_000u64), Just(32_000), Just(96_000)],
        prop_oneof![Just(16_384u64), Just(262_144)],
        prop_oneof![Just(0u32), Just(1), Just(2), Just(4), Just(8)],
        any::<bool>(),
    )
}

fn request_strategy() -> impl Strategy<Value = Request> {
    let cpu = 0u64..40_000;
    let mem = 0u64..100_000;
    let gpu = prop_oneof![
        Just((0u32, 0u32)),
        (1u32..1000).prop_map(|m| (1, m)),
        Just((1, 1000)),
        Just((2, 1000)),
        Just((4, 1000)),
        Just((8, 1000)),
    ];
    let models = prop_oneof![
        3 => Just(vec![]),
        1 => Just(vec!["T4".to_string()]),
        1 => Just(vec!["A100".to_string(), "V100".to_string()]),
    ];
    let topologies = [
        GpuTopology::Any,
        GpuTopology::Nvlink,
        GpuTopology::PcieSwitch,
        GpuTopology::Numa,
    ];
    let need = prop_oneof![
        4 => Just(GpuNeed::default()),
        1 => (0usize..4, 0usize..4, any::<bool>()).prop_map(move |(t, p, exclude)| GpuNeed {
            topology: topologies[t],
            prefer: topologies[p],
            exclude_models: if exclude { vec!["t4".into()] } else { vec![] },
            ..Default::default()
        }),
    ];
    (cpu, mem, gpu, models, need).prop_map(
        |(cpu_milli, memory_mib, (gpu_count, gpu_milli), models, need)| Request {
            cpu_milli,
            memory_mib,
            gpu_count,
            gpu_milli,
            allowed_models: models,
            need,
        },
    )
}

fn build(nodes: &[(u64, u64, u32, bool)], requests: &[Request]) -> ClusterState {
    let models = ["T4", "A100", "V100"];
    let inventories = nodes
        .iter()
        .enumerate()
        .map(|(i, &(cpu, mem, gpus, linked))| {
            let mut node = NodeInventory::uniform(&format!("n{i}"), cpu, mem, gpus, models[i % 3]);
            if linked {
                // Two NUMA domains, split like the PCIe levels.
                for g in &mut node.gpus {
                    g.numa_node = Some(u32::from(g.index < gpus / 2));
                }
                for a in 0..gpus {
                    for b in a + 1..gpus {
                        node.links.push(Link {
                            a,
                            b,
                            nvlinks: u32::from((a / 2) == (b / 2)) * 2,
                            pcie: if (a < gpus / 2) == (b < gpus / 2) {
                                PcieLevel::SameCpu
                            } else {
                                PcieLevel::CrossCpu
                            },
                        });
                    }
                }
            }
            node
        })
        .collect();
    let mut state = ClusterState::new(inventories).expect("generated inventories are valid");
    state.set_workload(Arc::new(TargetWorkload::from_requests(requests, 0.95)));
    state
}

fn check_capacity(state: &ClusterState) {
    let mut idle = 0u64;
    for n in 0..state.len() {
        let inv = state.inventory(n);
        let s = state.node(n);
        assert!(s.cpu_free <= inv.cpu_milli);
        assert!(s.memory_free <= inv.memory_mib);
        for (g, gpu) in inv.gpus.iter().enumerate() {
            assert!(s.gpu_free[g] <= gpu.milli_capacity, "gpu over capacity");
        }
        idle += s.gpu_idle();
    }
    assert_eq!(idle, state.gpu_idle_milli());
    // The reserve's free milli per model follow every change.
    for (model, free) in state.reserve().free_per_model() {
        let counted: u64 = (0..state.len())
            .filter(|&n| state.inventory(n).gpu_model() == model)
            .map(|n| state.node(n).gpu_idle())
            .sum();
        assert_eq!(free, counted, "free milli of {model}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn capacity_never_exceeded_and_gangs_of_gpus_are_whole(
        nodes in proptest::collection::vec(node_strategy(), 1..12),
        requests in proptest::collection::vec(request_strategy(), 1..80),
        seed in any::<u64>(),
    ) {
        for policy in Policy::ALL {
            let mut state = build(&nodes, &requests);
            let mut placer = Placer::new(policy, seed);
            for request in &requests {
                let before = state.gpu_allocated_milli();
                match placer.place(&mut state, request) {
                    Ok(decision) => {
                        prop_assert_eq!(decision.gpus.len(), request.gpu_count as usize);
                        let mut positions: Vec<usize> = decision.gpus.iter().map(|g| g.0).collect();
                        positions.sort_unstable();
                        positions.dedup();
                        prop_assert_eq!(positions.len(), request.gpu_count as usize);
                        prop_assert!(decision.gpus.iter().all(|g| g.1 == request.gpu_milli));
                        prop_assert!(request.allows_model(state.inventory(decision.node).gpu_model()) || request.gpu_count == 0);
                        prop_assert_eq!(state.gpu_allocated_milli(), before + request.total_gpu_milli());
                    }
                    Err(why) => {
                        // Nothing taken, and every node accounted for in the explanation.
                        prop_assert_eq!(state.gpu_allocated_milli(), before);
                        prop_assert_eq!(why.nodes, state.len());
                    }
                }
                check_capacity(&state);
            }
        }
    }

    #[test]
    fn same_seed_same_placements(
        nodes in proptest::collection::vec(node_strategy(), 1..10),
        requests in proptest::collection::vec(request_strategy(), 1..60),
        seed in any::<u64>(),
    ) {
        for policy in Policy::ALL {
            let run = || {
                let mut state = build(&nodes, &requests);
                let mut placer = Placer::new(policy, seed);
                requests
                    .iter()
                    .map(|r| placer.place(&mut state, r).ok())
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(run(), run());
        }
    }

    #[test]
    fn release_restores_the_state(
        nodes in proptest::collection::vec(node_strategy(), 1..8),
        requests in proptest::collection::vec(request_strategy(), 1..40),
    ) {
        let mut state = build(&nodes, &requests);
        let empty_frag = state.total_frag();
        let mut placer = Placer::new(Policy::Fgd, 7);
        let mut placed = Vec::new();
        for r in &requests {
            if let Ok(d) = placer.place(&mut state, r) {
                placed.push((d, r.clone()));
            }
        }
        for (d, r) in placed.iter().rev() {
            prop_assert!(state.release(d.node, r, &d.gpus).is_ok());
        }
        prop_assert_eq!(state.gpu_allocated_milli(), 0);
        prop_assert!((state.total_frag() - empty_frag).abs() < 1e-6);
        for n in 0..state.len() {
            prop_assert_eq!(state.node(n).cpu_free, state.inventory(n).cpu_milli);
        }
    }

    /// The node-class index is an optimisation only: with it, every decision (node, GPUs,
    /// score, and the reasons when nothing fits) equals the full scan's, under masks,
    /// releases and state copies.
    #[test]
    fn class_index_decides_as_the_scan_does(
        nodes in proptest::collection::vec(node_strategy(), 1..16),
        requests in proptest::collection::vec(request_strategy(), 1..60),
        masks in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 16), 60),
        seed in any::<u64>(),
    ) {
        let weighted: [(Policy, &[(Policy, i64)]); 2] = [
            (Policy::Fgd, &[(Policy::Fgd, 2), (Policy::BestFit, 1)]),
            (Policy::BestFit, &[(Policy::Binpack, 1), (Policy::GpuPacking, 3)]),
        ];
        let configs = Policy::ALL
            .iter()
            .map(|&p| (p, &[][..]))
            .chain(weighted);
        for (policy, weights) in configs {
            let mut state = build(&nodes, &requests);
            let mut indexed = Placer::new(policy, seed).with_weights(weights).unwrap();
            let mut scan = Placer::new(policy, seed)
                .with_index(false)
                .with_weights(weights)
                .unwrap();
            let mut placed = Vec::new();
            for (i, request) in requests.iter().enumerate() {
                let mask = (i % 3 == 1).then(|| &masks[i][..state.len()]);
                let a = indexed.choose(&state, request, mask);
                let b = scan.choose(&state, request, mask);
                crate::common::same_answer(policy, &a, &b)?;
                if let Ok(d) = a {
                    state.apply(d.node, request, &d.gpus).unwrap();
                    placed.push((d, request.clone()));
                }
                if i % 7 == 6
                    && let Some((d, r)) = placed.pop()
                {
                    state.release(d.node, &r, &d.gpus).unwrap();
                }
                if i % 11 == 10 {
                    state = state.clone();
                }
            }
        }
    }
}

proptest! {
    /// The extender ranks nodes with `score_nodes`: a node fits there exactly when the
    /// state says so, the node `choose` picks has the highest score, and the scores per
    /// class of identical nodes equal those of a scan.
    #[test]
    fn node_scores_agree_with_choose(
        nodes in proptest::collection::vec(node_strategy(), 1..12),
        requests in proptest::collection::vec(request_strategy(), 1..30),
        seed in any::<u64>(),
    ) {
        for policy in Policy::ALL.iter().copied().filter(|p| *p != Policy::Random) {
            let mut state = build(&nodes, &[]);
            let mut placer = Placer::new(policy, seed);
            let mut scan = Placer::new(policy, seed).with_index(false);
            let all: Vec<usize> = (0..state.len()).collect();
            for request in &requests {
                let scores = placer.score_nodes(&state, request, &all);
                // Scored once per class of identical nodes, exactly as node by node.
                prop_assert_eq!(&scores, &scan.score_nodes(&state, request, &all), "policy {}", policy);
                let fits: Vec<_> = all.iter().map(|&n| state.fit(n, request)).collect();
                prop_assert_eq!(&placer.fit_nodes(&state, request, &all), &fits);
                for (n, s) in scores.iter().enumerate() {
                    prop_assert_eq!(s.is_ok(), state.fit(n, request).is_ok());
                }
                if let Ok(d) = placer.choose(&state, request, None) {
                    let best = scores.iter().filter_map(|s| s.as_ref().ok()).max().copied();
                    prop_assert_eq!(Some(d.score), best, "policy {}", policy);
                    prop_assert_eq!(scores[d.node].as_ref().ok().copied(), best);
                    state.apply(d.node, request, &d.gpus).unwrap();
                } else {
                    prop_assert!(scores.iter().all(|s| s.is_err()));
                }
            }
        }
    }
}

/// A 16-GPU box of eight NVLinked pairs: an 8-GPU request must take four whole pairs, and
/// the search must stay exact.
#[test]
fn sixteen_gpus_take_whole_pairs() {
    let mut node = NodeInventory::uniform("big", 256_000, 1 << 20, 16, "H100");
    for a in 0..16u32 {
        for b in a + 1..16 {
            node.links.push(Link {
                a,
                b,
                nvlinks: if a / 2 == b / 2 { 12 } else { 0 },
                pcie: if (a < 8) == (b < 8) {
                    PcieLevel::SameCpu
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    let links = gpuplace_core::topology::LinkMatrix::from_inventory(&node);
    let all: Vec<usize> = (0..16).collect();
    let set = gpuplace_core::topology::select(&links, &all, &[], 8).unwrap();
    assert_eq!(set.positions, vec![0, 1, 2, 3, 4, 5, 6, 7]);
    // 4 pairs * 1220 + 24 other pairs on the same CPU * 20.
    assert_eq!(set.score, 4 * 1220 + 24 * 20);
}

/// The device-set search against brute force over every subset: same objective value
/// (largest internal pair score, then smallest cut to the GPUs left, then lowest indexes).
mod exactness {
    use gpuplace_core::topology::{LinkMatrix, select};
    use gpuplace_model::{Link, NodeInventory, PcieLevel};
    use proptest::prelude::*;

    fn brute(links: &LinkMatrix, available: &[usize], must: &[usize], k: usize) -> Vec<usize> {
        let n = available.len();
        type Key = (u64, std::cmp::Reverse<u64>, std::cmp::Reverse<Vec<usize>>);
        let mut best: Option<(Key, Vec<usize>)> = None;
        for mask in 0u32..(1 << n) {
            let set: Vec<usize> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| available[i])
                .collect();
            if set.len() != k || !must.iter().all(|m| set.contains(m)) {
                continue;
            }
            let inner = links.set_score(&set);
            let cut: u64 = set
                .iter()
                .flat_map(|&a| {
                    available
                        .iter()
                        .filter(|b| !set.contains(b))
                        .map(move |&b| (a, b))
                })
                .map(|(a, b)| u64::from(links.pair(a, b)))
                .sum();
            let key = (
                inner,
                std::cmp::Reverse(cut),
                std::cmp::Reverse(set.clone()),
            );
            if best.as_ref().is_none_or(|(k0, _)| key > *k0) {
                best = Some((key, set));
            }
        }
        best.map(|(_, s)| s).unwrap_or_default()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn select_is_optimal(
            n in 2u32..10,
            seed_links in proptest::collection::vec((0u32..4, 0usize..6), 45),
            k in 1usize..6,
            drop in proptest::collection::vec(any::<bool>(), 10),
            must_first in any::<bool>(),
        ) {
            let mut node = NodeInventory::uniform("n", 1, 1, n, "X");
            let levels = [PcieLevel::CrossCpu, PcieLevel::SameCpu, PcieLevel::HostBridge,
                          PcieLevel::MultiSwitch, PcieLevel::SingleSwitch, PcieLevel::SameBoard];
            let mut i = 0;
            for a in 0..n {
                for b in a + 1..n {
                    let (nv, lvl) = seed_links[i % seed_links.len()];
                    node.links.push(Link { a, b, nvlinks: nv, pcie: levels[lvl] });
                    i += 1;
                }
            }
            let links = LinkMatrix::from_inventory(&node);
            let available: Vec<usize> = (0..n as usize).filter(|&g| !drop[g] || g == 0).collect();
            prop_assume!(k <= available.len());
            let must: Vec<usize> = if must_first { vec![available[0]] } else { vec![] };
            let got = select(&links, &available, &must, k).unwrap();
            let want = brute(&links, &available, &must, k);
            let score = |s: &[usize]| links.set_score(s);
            prop_assert_eq!(score(&got.positions), score(&want));
            prop_assert_eq!(got.positions, want);
        }
    }
}
