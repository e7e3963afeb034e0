//! What the driver publishes: the node's GPUs as `resource.k8s.io/v1` ResourceSlices, one
//! device per GPU, computed from the inventory alone (no I/O).
//!
//! Each device carries the attributes users select on (`index`, `uuid`, `model`,
//! `numaNode`, `nvlinkDomain`, `nvlinkClique`, `pcieSwitch`, `driverVersion`) and two
//! capacities: `milli` (1000 per GPU) and `memory`. Both are consumable
//! (`allowMultipleAllocations`): a claim that asks no capacity takes the whole GPU (the
//! `milli` default is 1000); a share asks `capacity.requests: {milli: 250}` and, if it wants
//! a memory figure other than its share of the GPU's memory, `memory`. An unhealthy GPU is
//! tainted `NoSchedule`, so no new claim gets it.

use std::collections::BTreeMap;

use gpuplace_model::NodeInventory;
use gpuplace_model::device_attributes::device_attributes;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The driver name gpuplace registers by default.
pub const DEFAULT_DRIVER: &str = "gpu.gpuplace.io";
/// The taint an unhealthy GPU carries (its effect is `NoSchedule`).
pub const UNHEALTHY_TAINT: &str = "gpu.gpuplace.io/unhealthy";
/// The consumable capacity of a GPU's compute, in milli-GPU.
pub const MILLI_CAPACITY: &str = "milli";
/// The consumable capacity of a GPU's memory.
pub const MEMORY_CAPACITY: &str = "memory";
/// Devices per slice: the API allows 64 per slice when devices carry taints.
pub const DEVICES_PER_SLICE: usize = 64;
/// Inventory label carrying the NVIDIA driver's version (NVML fills it; GFD's name).
pub use gpuplace_model::device_attributes::DRIVER_VERSION_LABEL;

/// One slice to publish: its object name and spec.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceSpec {
    pub name: String,
    pub spec: ResourceSliceSpec,
}

pub use gpuplace_model::device_attributes::{device_index, device_name};

/// The slice object names of `node` for `driver`: `<node>-<driver>-<k>`, with dots kept
/// (object names are DNS subdomains) and cut to the API's 253 characters.
pub fn slice_name(node: &str, driver: &str, k: usize) -> String {
    let mut name = format!("{node}-{driver}-{k}");
    if name.len() > 253 {
        let suffix = format!("-{driver}-{k}");
        let keep = 253usize.saturating_sub(suffix.len());
        name = format!("{}{suffix}", &node[..keep.min(node.len())]);
    }
    name
}

/// What the slices of one node are made of.
#[derive(Clone, Copy, Debug)]
pub struct SliceInput<'a> {
    pub inventory: &'a NodeInventory,
    pub driver: &'a str,
    pub node: &'a str,
    /// The pool's generation: bumped on every change so that readers drop older slices.
    pub generation: i64,
    /// GPUs may be shared (consumable capacity); else each device is exclusive.
    pub shares: bool,
}

/// The slices of one node; the pool is the node's.
pub fn node_slices(input: SliceInput<'_>) -> Vec<SliceSpec> {
    let SliceInput {
        inventory,
        driver,
        node,
        generation,
        shares,
    } = input;
    let devices: Vec<Device> = device_attributes(inventory)
        .into_iter()
        .map(|gpu| {
            let mut attributes = BTreeMap::new();
            attributes.insert("type".to_string(), string("gpu"));
            attributes.insert("index".to_string(), int(i64::from(gpu.index)));
            attributes.insert("uuid".to_string(), string(&gpu.uuid));
            attributes.insert("model".to_string(), string(&gpu.model));
            if let Some(numa) = gpu.numa_node {
                attributes.insert("numaNode".to_string(), int(i64::from(numa)));
            }
            attributes.insert("nvlinkDomain".to_string(), int(gpu.nvlink_domain));
            attributes.insert("nvlinkClique".to_string(), int(gpu.nvlink_clique));
            attributes.insert("pcieSwitch".to_string(), int(gpu.pcie_switch));
            if let Some(version) = gpu.driver_version.clone() {
                attributes.insert(
                    "driverVersion".to_string(),
                    DeviceAttribute {
                        version: Some(version),
                        ..Default::default()
                    },
                );
            }
            Device {
                name: device_name(gpu.index),
                attributes: Some(attributes),
                capacity: Some(capacity(gpu.memory_mib, gpu.milli, shares)),
                allow_multiple_allocations: shares.then_some(true),
                taints: (!gpu.healthy).then(|| {
                    vec![DeviceTaint {
                        key: UNHEALTHY_TAINT.to_string(),
                        value: Some("true".to_string()),
                        effect: "NoSchedule".to_string(),
                        time_added: None,
                    }]
                }),
                ..Default::default()
            }
        })
        .collect();
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(DEVICES_PER_SLICE)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(k, devices)| SliceSpec {
            name: slice_name(node, driver, k),
            spec: ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(node.to_string()),
                pool: ResourcePool {
                    name: node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

/// The GPU's capacities; with shares off they only inform (no request policy).
fn capacity(memory_mib: u64, milli: u32, shares: bool) -> BTreeMap<String, DeviceCapacity> {
    let mut capacity = BTreeMap::new();
    let milli = milli.max(1);
    if !shares {
        let plain = |value: String| DeviceCapacity {
            value: Quantity(value),
            request_policy: None,
        };
        capacity.insert(MILLI_CAPACITY.to_string(), plain(milli.to_string()));
        capacity.insert(
            MEMORY_CAPACITY.to_string(),
            plain(format!("{memory_mib}Mi")),
        );
        return capacity;
    }
    capacity.insert(
        MILLI_CAPACITY.to_string(),
        DeviceCapacity {
            value: Quantity(milli.to_string()),
            // No request: the whole GPU. A share rounds up to whole milli.
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity(milli.to_string())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity("1".to_string()),
                    max: Some(Quantity(milli.to_string())),
                    step: Some(Quantity("1".to_string())),
                }),
                valid_values: None,
            }),
        },
    );
    capacity.insert(
        MEMORY_CAPACITY.to_string(),
        DeviceCapacity {
            value: Quantity(format!("{memory_mib}Mi")),
            // No request takes no memory figure: the share's limit is then its milli's part.
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity("0".to_string())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity("0".to_string()),
                    max: None,
                    step: None,
                }),
                valid_values: None,
            }),
        },
    );
    capacity
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

fn int(n: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(n),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
