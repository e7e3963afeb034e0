//! gpuplace's multi-GPU weighting: with 8-GPU pods too rare for FGD's coverage cut, FGD
//! sees no difference between filling a partly used node and breaking a free one; gpuplace
//! fills the partly used one, whatever the seeded node order.

use std::sync::Arc;

use crate::common::gpus;
use gpuplace_core::{ClusterState, Ideas, Placer, Policy, TargetWorkload};
use gpuplace_model::NodeInventory;

/// Node `a` has 2 of 8 GPUs free, node `b` all 8: where does a 1-GPU pod go?
fn choice(policy: Policy, seed: u64) -> String {
    let node = |name: &str| NodeInventory::uniform(name, 96_000, 1 << 20, 8, "G2");
    let mut state = ClusterState::new(vec![node("a"), node("b")]).unwrap();
    // 99 one-GPU pods for each 8-GPU pod: the cut keeps only the 1-GPU shape.
    let mut seen = vec![gpus(1, 1000); 99];
    seen.push(gpus(8, 1000));
    let workload = TargetWorkload::from_requests(&seen, 0.95);
    assert!(workload.shapes().iter().all(|(s, _)| s.gpu_count == 1));
    state.set_workload(Arc::new(workload));
    state
        .apply(
            0,
            &gpus(6, 1000),
            &(0..6).map(|g| (g, 1000)).collect::<Vec<_>>(),
        )
        .unwrap();
    let decision = Placer::new(policy, seed)
        .choose(&state, &gpus(1, 1000), None)
        .unwrap();
    state.inventory(decision.node).name.clone()
}

#[test]
fn a_partly_used_node_is_filled_before_a_free_one_is_broken() {
    let without = Policy::Gpuplace(Ideas {
        multi: false,
        ..Ideas::POLICY
    });
    let mut broke_free = 0;
    for seed in 0..16 {
        assert_eq!(choice(Policy::GPUPLACE, seed), "a", "seed {seed}");
        broke_free += usize::from(choice(without, seed) == "b");
        broke_free += usize::from(choice(Policy::Fgd, seed) == "b");
    }
    // Without the weighting both nodes score the same and the seeded order decides.
    assert!(broke_free > 0);
}

#[test]
fn multi_gpu_shapes_weigh_by_the_gpus_they_ask() {
    let mut seen = vec![gpus(1, 1000); 99];
    seen.push(gpus(8, 1000));
    let w = TargetWorkload::from_requests(&seen, 0.95);
    // An 8-GPU node with one GPU used: the 8-GPU shape (cut by FGD) cannot use its 7 free
    // GPUs; it counts 8 times its pods' share of the kept pods (1/99).
    let seven = [0, 1000, 1000, 1000, 1000, 1000, 1000, 1000];
    let expected = 8.0 / 99.0 * 7000.0;
    assert!((w.multi_fragmentation_of("G2", 90_000, &seven) - expected).abs() < 1e-6);
    // Free: it fits, nothing is lost; FGD's own measure counts nothing either way.
    assert_eq!(w.multi_fragmentation_of("G2", 96_000, &[1000; 8]), 0.0);
    assert_eq!(w.fragmentation_of("G2", 90_000, &seven), 0.0);
    // A shape the cut keeps is not counted twice: once per pod in F_n(M), the rest here.
    let mut common = vec![gpus(1, 1000); 50];
    common.extend(vec![gpus(2, 1000); 50]);
    let w = TargetWorkload::from_requests(&common, 0.95);
    let one_free = [1000, 0, 0, 0];
    let total = w.fragmentation_of("G2", 90_000, &one_free)
        + w.multi_fragmentation_of("G2", 90_000, &one_free);
    assert!((total - 2.0 * 0.5 * 1000.0).abs() < 1e-6, "{total}");
}
