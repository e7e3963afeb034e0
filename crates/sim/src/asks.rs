//! Giving a share of multi-GPU pods a topology requirement or preference, to measure what
//! guaranteeing it costs each policy (`gpuplace simulate --require-topology 0.3`).
//!
//! The openb node list carries no links, so nodes without links get an assumed layout from
//! their model and size: 8-GPU V100 boxes a DGX-1 hybrid cube mesh (GPUs 0-3 and 4-7 fully
//! NVLinked, plus i <-> i+4); 4-GPU V100 boxes every pair NVLinked; other 8-GPU boxes two
//! PCIe switches of four GPUs, one per NUMA node; 2- and 4-GPU boxes pairs behind one switch.

use gpuplace_model::{GpuTopology, Link, NodeInventory, PcieLevel};

use crate::workload::Workload;

/// Which pods get what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopologyAsk {
    pub topology: GpuTopology,
    /// Fraction (0-1) of multi-GPU pods that require `topology`.
    pub required: f64,
    /// Fraction (0-1) of the other multi-GPU pods that prefer it.
    pub preferred: f64,
}

/// A fraction outside 0..=1, or fractions summing past 1.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "topology fractions must be between 0 and 1 and sum to at most 1, got {required} required and {preferred} preferred"
)]
pub struct BadFractions {
    pub required: f64,
    pub preferred: f64,
}

/// The assumed links of a node that has none (see the module's text).
pub fn assumed_links(node: &mut NodeInventory) {
    if !node.links.is_empty() || node.gpus.len() < 2 {
        return;
    }
    let n = node.gpus.len() as u32;
    let v100 = node.gpu_model().contains("V100");
    let half = (n / 2).max(1);
    for g in &mut node.gpus {
        if g.numa_node.is_none() && n == 8 {
            g.numa_node = Some(g.index / half);
        }
    }
    for a in 0..n {
        for b in a + 1..n {
            let (nvlinks, pcie) = match (v100, n) {
                (true, 8) => (
                    u32::from(a / 4 == b / 4 || b == a + 4),
                    if a / 4 == b / 4 {
                        PcieLevel::SameCpu
                    } else {
                        PcieLevel::CrossCpu
                    },
                ),
                (true, _) => (1, PcieLevel::SameCpu),
                (false, 8) => (
                    0,
                    if a / 4 == b / 4 {
                        PcieLevel::SingleSwitch
                    } else {
                        PcieLevel::CrossCpu
                    },
                ),
                (false, _) => (
                    0,
                    if a / 2 == b / 2 {
                        PcieLevel::SingleSwitch
                    } else {
                        PcieLevel::SameCpu
                    },
                ),
            };
            node.links.push(Link {
                a,
                b,
                nvlinks,
                pcie,
            });
        }
    }
}

/// Applies `ask` to the workload (the same pods whatever the seed and policy); returns a
/// line for the report.
pub fn apply(workload: &mut Workload, ask: TopologyAsk) -> Result<String, BadFractions> {
    let ok = |f: f64| f.is_finite() && (0.0..=1.0).contains(&f);
    if !ok(ask.required) || !ok(ask.preferred) || ask.required + ask.preferred > 1.0 + 1e-9 {
        return Err(BadFractions {
            required: ask.required,
            preferred: ask.preferred,
        });
    }
    for node in &mut workload.nodes {
        assumed_links(node);
    }
    let (mut required, mut preferred, mut multi) = (0usize, 0usize, 0usize);
    for pod in &mut workload.pods {
        if pod.request.gpu_count < 2 {
            continue;
        }
        multi += 1;
        let draw = (crate::trace::name_hash(&pod.name) % 10_000) as f64 / 10_000.0;
        if draw < ask.required {
            pod.request.need.topology = ask.topology;
            required += 1;
        } else if draw < ask.required + ask.preferred {
            pod.request.need.prefer = ask.topology;
            preferred += 1;
        }
    }
    Ok(format!(
        "{required} of {multi} multi-GPU pods require {}, {preferred} prefer it (assumed links where the node list has none)",
        ask.topology
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v100_boxes_get_a_hybrid_cube_mesh_and_fractions_are_checked() {
        let mut node = NodeInventory::uniform("n", 96_000, 1 << 19, 8, "V100M32");
        assumed_links(&mut node);
        let nv: Vec<(u32, u32)> = node
            .links
            .iter()
            .filter(|l| l.nvlinks > 0)
            .map(|l| (l.a, l.b))
            .collect();
        assert_eq!(nv.len(), 16);
        assert!(nv.contains(&(0, 4)) && !nv.contains(&(0, 5)));
        let mut w = crate::builtin_workload(16);
        let line = apply(
            &mut w,
            TopologyAsk {
                topology: GpuTopology::Nvlink,
                required: 0.5,
                preferred: 0.0,
            },
        )
        .unwrap();
        assert!(line.contains("require nvlink"), "{line}");
        assert!(
            w.pods
                .iter()
                .any(|p| p.request.need.topology == GpuTopology::Nvlink)
        );
        let err = apply(
            &mut w,
            TopologyAsk {
                topology: GpuTopology::Nvlink,
                required: 0.8,
                preferred: 0.5,
            },
        );
        assert!(err.is_err());
    }
}
