//! The attributes a GPU is known by in DRA (Kubernetes 1.34+): what gpuplace's DRA driver
//! publishes in its ResourceSlices and what the scheduler evaluates a claim's CEL selectors
//! against, computed here once for both from the inventory.

use std::collections::BTreeMap;

use crate::inventory::{Link, NodeInventory, PcieLevel};

/// Inventory label carrying the NVIDIA driver's version (NVML fills it; GFD's name).
pub const DRIVER_VERSION_LABEL: &str = "nvidia.com/cuda.driver-version.full";

/// The device name of GPU `index` in gpuplace's ResourceSlices (`gpu-3`): DNS labels,
/// stable across restarts and the same on every node of a kind, as users expect to read in
/// allocations.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index of a device name, `None` for names gpuplace's driver never publishes.
pub fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One GPU's DRA attributes and capacities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttributes {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub numa_node: Option<u32>,
    /// Its NVLink-connected component (numbered by its first member's position).
    pub nvlink_domain: i64,
    /// Its greedy fully-NVLinked clique (a DGX-1's two quads).
    pub nvlink_clique: i64,
    /// The GPUs behind one PCIe switch.
    pub pcie_switch: i64,
    /// The NVIDIA driver's version as a semantic version, when known.
    pub driver_version: Option<String>,
    pub memory_mib: u64,
    pub milli: u32,
    pub healthy: bool,
}

/// The attributes of every GPU of `inventory`, in inventory order.
pub fn device_attributes(inventory: &NodeInventory) -> Vec<DeviceAttributes> {
    let groups = Groups::of(inventory);
    let version = driver_version(inventory);
    inventory
        .gpus
        .iter()
        .enumerate()
        .map(|(i, gpu)| DeviceAttributes {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            model: gpu.model.clone(),
            numa_node: gpu.numa_node,
            nvlink_domain: groups.nvlink_domain[i],
            nvlink_clique: groups.nvlink_clique[i],
            pcie_switch: groups.pcie_switch[i],
            driver_version: version.clone(),
            memory_mib: gpu.memory_mib,
            milli: gpu.milli_capacity.max(1),
            healthy: gpu.healthy,
        })
        .collect()
}

/// The driver version as a semantic version (`550.54.15` -> `550.54.15`; `535.104` ->
/// `535.104.0`), `None` when unknown or not numeric.
pub fn driver_version(inventory: &NodeInventory) -> Option<String> {
    let raw = inventory.labels.get(DRIVER_VERSION_LABEL)?;
    let mut parts: Vec<&str> = raw.trim().split('.').collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    while parts.len() < 3 {
        parts.push("0");
    }
    // Semantic versions forbid leading zeros.
    let parts: Vec<String> = parts
        .iter()
        .map(|p| p.parse::<u64>().map(|n| n.to_string()))
        .collect::<Result<_, _>>()
        .ok()?;
    Some(parts.join("."))
}

/// Topology groups by position in the inventory: NVLink-connected components, greedy
/// fully-NVLinked cliques (a DGX-1's two quads), and GPUs behind one PCIe switch.
struct Groups {
    nvlink_domain: Vec<i64>,
    nvlink_clique: Vec<i64>,
    pcie_switch: Vec<i64>,
}

impl Groups {
    fn of(inventory: &NodeInventory) -> Groups {
        let n = inventory.gpus.len();
        let position: BTreeMap<u32, usize> = inventory
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| (g.index, i))
            .collect();
        let mut nvlinked = vec![vec![false; n]; n];
        let mut switched = vec![vec![false; n]; n];
        for Link {
            a,
            b,
            nvlinks,
            pcie,
        } in &inventory.links
        {
            let (Some(&a), Some(&b)) = (position.get(a), position.get(b)) else {
                continue;
            };
            nvlinked[a][b] = *nvlinks > 0;
            nvlinked[b][a] = *nvlinks > 0;
            let near = *pcie >= PcieLevel::SingleSwitch;
            switched[a][b] = near;
            switched[b][a] = near;
        }
        Groups {
            nvlink_domain: components(&nvlinked),
            nvlink_clique: cliques(&nvlinked),
            pcie_switch: components(&switched),
        }
    }
}

/// Connected components, numbered by their first member.
fn components(adjacent: &[Vec<bool>]) -> Vec<i64> {
    let n = adjacent.len();
    let mut group = vec![-1i64; n];
    let mut next = 0;
    for start in 0..n {
        if group[start] >= 0 {
            continue;
        }
        let mut stack = vec![start];
        group[start] = next;
        while let Some(i) = stack.pop() {
            for j in 0..n {
                if adjacent[i][j] && group[j] < 0 {
                    group[j] = next;
                    stack.push(j);
                }
            }
        }
        next += 1;
    }
    group
}

/// Greedy cliques in index order: each GPU joins the first group all of whose members it
/// is linked to.
fn cliques(adjacent: &[Vec<bool>]) -> Vec<i64> {
    let n = adjacent.len();
    let mut group = vec![-1i64; n];
    let mut next = 0;
    for start in 0..n {
        if group[start] >= 0 {
            continue;
        }
        let mut members = vec![start];
        group[start] = next;
        for j in start + 1..n {
            if group[j] < 0 && members.iter().all(|&m| adjacent[m][j]) {
                group[j] = next;
                members.push(j);
            }
        }
        next += 1;
    }
    group
}
