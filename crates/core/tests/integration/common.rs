//! Inventories shared by the core's integration tests.

use gpuplace_model::{GpuNeed, Link, NodeInventory, PcieLevel, Request};

/// DGX-1 (V100) hybrid cube mesh: GPUs 0-3 and 4-7 fully NVLinked, plus i <-> i+4.
#[allow(dead_code)]
pub fn dgx1(name: &str) -> NodeInventory {
    let mut inv = NodeInventory::uniform(name, 80_000, 1 << 19, 8, "Tesla-V100-SXM2-32GB");
    for a in 0..8u32 {
        for b in a + 1..8 {
            let linked = (a / 4 == b / 4) || b == a + 4;
            inv.links.push(Link {
                a,
                b,
                nvlinks: u32::from(linked),
                pcie: if a / 4 == b / 4 {
                    PcieLevel::SameCpu
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    inv
}

/// A pod of `count` GPUs of `milli` each, 1 CPU core and 1 GiB.
#[allow(dead_code)]
pub fn gpus(count: u32, milli: u32) -> Request {
    Request {
        cpu_milli: 1000,
        memory_mib: 1024,
        gpu_count: count,
        gpu_milli: milli,
        allowed_models: vec![],
        need: GpuNeed::default(),
    }
}

/// The node-class index's and the full scan's answers to one request agree: the same
/// decision, or the same reasons.
#[allow(dead_code)]
pub fn same_answer(
    policy: gpuplace_core::Policy,
    a: &Result<gpuplace_core::Decision, gpuplace_core::Unschedulable>,
    b: &Result<gpuplace_core::Decision, gpuplace_core::Unschedulable>,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    match (a, b) {
        (Ok(x), Ok(y)) => prop_assert_eq!(x, y, "policy {}", policy),
        (Err(x), Err(y)) => prop_assert_eq!(x.message("gpu"), y.message("gpu")),
        _ => prop_assert!(false, "policy {}: {:?} vs {:?}", policy, a, b),
    }
    Ok(())
}
