//! Nodes whose states differ only by a symmetry of their GPUs share one class of the
//! node-class index. The index must still decide exactly as a scan of every node does:
//! same node, same GPUs, same score, same reasons. Clusters here are many copies of one
//! linked node type, so that permuted states meet often.

use std::sync::Arc;

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_model::{GpuNeed, GpuTopology, Link, NodeInventory, PcieLevel, Request};
use proptest::prelude::*;

/// `count` nodes of one of three 8-GPU designs: DGX-1's hybrid cube mesh, a two-socket
/// NVSwitch box, NVLinked pairs behind two PCIe switches; time-sliced (2 replicas) when
/// `sliced`.
fn cluster(design: usize, count: usize, sliced: bool, requests: &[Request]) -> ClusterState {
    let nodes = (0..count)
        .map(|i| {
            let mut node = NodeInventory::uniform(&format!("n{i}"), 64_000, 1 << 20, 8, "V100");
            if sliced {
                node.replicas = 2;
            }
            for g in &mut node.gpus {
                g.numa_node = Some(g.index / 4);
            }
            for a in 0..8u32 {
                for b in a + 1..8 {
                    let same_half = a / 4 == b / 4;
                    let nvlinks = match design {
                        0 => u32::from(same_half || b == a + 4) * 2,
                        1 => 12,
                        _ => u32::from(a / 2 == b / 2) * 2,
                    };
                    let pcie = if same_half {
                        PcieLevel::SingleSwitch
                    } else {
                        PcieLevel::CrossCpu
                    };
                    node.links.push(Link {
                        a,
                        b,
                        nvlinks,
                        pcie,
                    });
                }
            }
            node
        })
        .collect();
    let mut state = ClusterState::new(nodes).expect("valid inventories");
    state.set_workload(Arc::new(TargetWorkload::from_requests(requests, 0.95)));
    state
}

fn request_strategy() -> impl Strategy<Value = Request> {
    let gpu = prop_oneof![
        Just((0u32, 0u32)),
        prop_oneof![Just(250u32), Just(500), Just(700)].prop_map(|m| (1, m)),
        Just((1, 1000)),
        Just((2, 1000)),
        Just((3, 1000)),
        Just((4, 1000)),
    ];
    let topology = prop_oneof![
        Just(GpuTopology::Any),
        Just(GpuTopology::Nvlink),
        Just(GpuTopology::PcieSwitch),
        Just(GpuTopology::Numa),
    ];
    let need = prop_oneof![
        2 => Just(GpuNeed::default()),
        1 => (topology.clone(), any::<bool>()).prop_map(|(t, required)| GpuNeed {
            topology: if required { t } else { GpuTopology::Any },
            prefer: if required { GpuTopology::Any } else { t },
            ..Default::default()
        }),
    ];
    (prop_oneof![Just(1_000u64), Just(4_000)], gpu, need).prop_map(
        |(cpu_milli, (gpu_count, gpu_milli), need)| Request {
            cpu_milli,
            memory_mib: 1024,
            gpu_count,
            gpu_milli,
            allowed_models: vec![],
            need,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn index_over_symmetric_states_decides_as_the_scan_does(
        design in 0usize..3,
        count in 2usize..10,
        sliced in proptest::bool::weighted(0.2),
        requests in proptest::collection::vec(request_strategy(), 1..80),
        masks in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 10), 80),
        seed in any::<u64>(),
    ) {
        for policy in Policy::ALL {
            let mut state = cluster(design, count, sliced, &requests);
            let mut indexed = Placer::new(policy, seed);
            let mut scan = Placer::new(policy, seed).with_index(false);
            let mut placed = Vec::new();
            for (i, request) in requests.iter().enumerate() {
                let mask = (i % 4 == 1).then(|| &masks[i][..count]);
                let a = indexed.choose(&state, request, mask);
                let b = scan.choose(&state, request, mask);
                crate::common::same_answer(policy, &a, &b)?;
                if let Ok(d) = a {
                    state.apply(d.node, request, &d.gpus).expect("chosen GPUs fit");
                    placed.push((d, request.clone()));
                }
                if i % 5 == 4 && !placed.is_empty() {
                    // Release an early placement: states then differ in GPU positions.
                    let (d, r) = placed.remove(i % placed.len());
                    state.release(d.node, &r, &d.gpus).expect("placed before");
                }
            }
        }
    }
}
