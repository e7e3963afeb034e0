//! Inventories shared by the core's integration tests.

use gpuplace_model::{Link, NodeInventory, PcieLevel};

/// DGX-1 (V100) hybrid cube mesh: GPUs 0-3 and 4-7 fully NVLinked, plus i <-> i+4.
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
