//! GPUs, links between them and a node's inventory.
//!
//! The inventory is what the node agent publishes (as JSON in the Node annotation
//! [`INVENTORY_ANNOTATION`]) and what the scheduler and simulator place against.
//!
//! Schema (JSON, all fields named in snake_case):
//! ```json
//! { "name": "node-a", "cpu_milli": 96000, "memory_mib": 786432,
//!   "gpus": [ { "id": "GPU-0a..", "index": 0, "uuid": "GPU-0a..", "model": "A100",
//!               "memory_mib": 81920, "numa_node": 0, "healthy": true } ],
//!   "links": [ { "a": 0, "b": 1, "nvlinks": 12, "pcie": "single-switch" } ],
//!   "labels": { "nvidia.com/gpu.product": "A100" } }
//! ```
//! `milli_capacity` defaults to 1000, `healthy` to true, `numa_node` to none.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::request::MILLI_PER_GPU;

/// Node annotation that carries a JSON [`NodeInventory`].
pub use crate::keys::INVENTORY_ANNOTATION;

/// One physical GPU on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Device ID as the kubelet sees it (usually the UUID).
    pub id: String,
    /// Index on the node (NVML's enumeration order, `nvidia-smi -i`).
    pub index: u32,
    /// Device node number (`/dev/nvidia<minor>`) when it differs from the index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub memory_mib: u64,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default = "default_true")]
    pub healthy: bool,
    /// Shareable capacity in milli-GPU; 1000 for a whole GPU.
    #[serde(default = "default_milli")]
    pub milli_capacity: u32,
}

impl Gpu {
    /// N of the GPU's device node `/dev/nvidia<N>`.
    pub fn device_node(&self) -> u32 {
        self.minor.unwrap_or(self.index)
    }
}

fn default_true() -> bool {
    true
}

fn default_milli() -> u32 {
    MILLI_PER_GPU
}

/// PCIe distance between two GPUs, nearest last (NVIDIA's topology levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PcieLevel {
    /// Across CPU sockets (SYS).
    CrossCpu,
    /// Same CPU / NUMA node (NODE).
    SameCpu,
    /// Behind the same host bridge (PHB).
    HostBridge,
    /// Several PCIe switches apart (PXB).
    MultiSwitch,
    /// Same PCIe switch (PIX).
    SingleSwitch,
    /// Same board (e.g. dual-GPU cards).
    SameBoard,
}

impl PcieLevel {
    /// Pair score used by NVIDIA's allocator for this level (10..60).
    pub fn score(self) -> u32 {
        match self {
            PcieLevel::CrossCpu => 10,
            PcieLevel::SameCpu => 20,
            PcieLevel::HostBridge => 30,
            PcieLevel::MultiSwitch => 40,
            PcieLevel::SingleSwitch => 50,
            PcieLevel::SameBoard => 60,
        }
    }
}

/// The connection between two GPUs of one node, by GPU index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub a: u32,
    pub b: u32,
    /// Number of NVLink links between the two (0 when none).
    #[serde(default)]
    pub nvlinks: u32,
    pub pcie: PcieLevel,
}

impl Link {
    /// Pair score: PCIe level score plus 100 per NVLink link.
    pub fn score(&self) -> u32 {
        self.pcie.score() + 100 * self.nvlinks
    }
}

/// Everything placement needs to know about one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub links: Vec<Link>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Time-slicing replicas per GPU its device plugin advertises (NVIDIA's time-slicing):
    /// a pod asking one whole GPU gets one replica, a share of ⌊1000 / replicas⌋ milli of
    /// one GPU. 1 without time-slicing.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// Why an inventory is not acceptable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InventoryError {
    #[error("inventory is not valid JSON: {0}")]
    Json(String),
    #[error("node name is empty")]
    EmptyName,
    #[error("gpu index {0} appears more than once")]
    DuplicateIndex(u32),
    #[error("gpu id {0:?} appears more than once")]
    DuplicateId(String),
    #[error("gpu {0} has an empty id")]
    EmptyId(u32),
    #[error("gpu {index} has milli capacity {milli}, expected 1..=1000")]
    BadMilli { index: u32, milli: u32 },
    #[error("link {a}-{b} names a gpu index that is not in the inventory")]
    UnknownLinkEnd { a: u32, b: u32 },
    #[error("link {0}-{0} joins a gpu to itself")]
    SelfLink(u32),
    #[error("replicas must be between 1 and 64, got {0}")]
    BadReplicas(u32),
    #[error("link {a}-{b} is listed more than once")]
    DuplicateLink { a: u32, b: u32 },
}

impl NodeInventory {
    /// Parses and validates the JSON published in [`INVENTORY_ANNOTATION`].
    pub fn from_json(text: &str) -> Result<Self, InventoryError> {
        let inventory: NodeInventory =
            serde_json::from_str(text).map_err(|e| InventoryError::Json(e.to_string()))?;
        inventory.validate()?;
        Ok(inventory)
    }

    /// JSON for [`INVENTORY_ANNOTATION`].
    pub fn to_json(&self) -> String {
        // Serialising plain structs with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks unique ids and indexes, capacities in range, and links between known GPUs.
    pub fn validate(&self) -> Result<(), InventoryError> {
        if self.name.is_empty() {
            return Err(InventoryError::EmptyName);
        }
        if !(1..=64).contains(&self.replicas) {
            return Err(InventoryError::BadReplicas(self.replicas));
        }
        let mut indexes = std::collections::BTreeSet::new();
        let mut ids = std::collections::BTreeSet::new();
        for gpu in &self.gpus {
            if !indexes.insert(gpu.index) {
                return Err(InventoryError::DuplicateIndex(gpu.index));
            }
            if gpu.id.is_empty() {
                return Err(InventoryError::EmptyId(gpu.index));
            }
            if !ids.insert(gpu.id.as_str()) {
                return Err(InventoryError::DuplicateId(gpu.id.clone()));
            }
            if gpu.milli_capacity == 0 || gpu.milli_capacity > MILLI_PER_GPU {
                return Err(InventoryError::BadMilli {
                    index: gpu.index,
                    milli: gpu.milli_capacity,
                });
            }
        }
        let mut pairs = std::collections::BTreeSet::new();
        for link in &self.links {
            if link.a == link.b {
                return Err(InventoryError::SelfLink(link.a));
            }
            if !indexes.contains(&link.a) || !indexes.contains(&link.b) {
                return Err(InventoryError::UnknownLinkEnd {
                    a: link.a,
                    b: link.b,
                });
            }
            if !pairs.insert((link.a.min(link.b), link.a.max(link.b))) {
                return Err(InventoryError::DuplicateLink {
                    a: link.a,
                    b: link.b,
                });
            }
        }
        Ok(())
    }

    /// The node's GPU model: the model shared by its GPUs, or the first one when mixed.
    pub fn gpu_model(&self) -> &str {
        self.gpus.first().map(|g| g.model.as_str()).unwrap_or("")
    }

    /// A node of `count` identical whole GPUs with no topology (trace nodes, count-only nodes).
    pub fn uniform(name: &str, cpu_milli: u64, memory_mib: u64, count: u32, model: &str) -> Self {
        let gpus = (0..count)
            .map(|index| Gpu {
                id: format!("{name}-gpu{index}"),
                index,
                minor: None,
                uuid: String::new(),
                model: model.to_string(),
                memory_mib: 0,
                numa_node: None,
                healthy: true,
                milli_capacity: MILLI_PER_GPU,
            })
            .collect();
        NodeInventory {
            name: name.to_string(),
            cpu_milli,
            memory_mib,
            gpus,
            replicas: 1,
            links: Vec::new(),
            labels: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_gpu() -> NodeInventory {
        let mut node = NodeInventory::uniform("n", 8000, 1024, 2, "T4");
        node.links.push(Link {
            a: 0,
            b: 1,
            nvlinks: 2,
            pcie: PcieLevel::SingleSwitch,
        });
        node
    }

    #[test]
    fn json_round_trip_keeps_everything() {
        let node = two_gpu();
        let back = NodeInventory::from_json(&node.to_json()).unwrap();
        assert_eq!(back, node);
        assert_eq!(back.links[0].score(), 250);
    }

    #[test]
    fn defaults_fill_optional_fields() {
        let text = r#"{"name":"n","cpu_milli":1,"memory_mib":1,"gpus":[{"id":"g0","index":0}]}"#;
        let node = NodeInventory::from_json(text).unwrap();
        assert!(node.gpus[0].healthy);
        assert_eq!(node.gpus[0].milli_capacity, 1000);
    }

    #[test]
    fn bad_inventories_name_the_problem() {
        let mut node = two_gpu();
        node.gpus[1].index = 0;
        assert_eq!(node.validate(), Err(InventoryError::DuplicateIndex(0)));
        let mut node = two_gpu();
        node.links[0].b = 7;
        assert_eq!(
            node.validate().unwrap_err().to_string(),
            "link 0-7 names a gpu index that is not in the inventory"
        );
        let err = NodeInventory::from_json("{\"name\": 3}").unwrap_err();
        assert!(err.to_string().starts_with("inventory is not valid JSON"));
        let mut node = two_gpu();
        node.links.push(Link {
            a: 1,
            b: 0,
            nvlinks: 0,
            pcie: PcieLevel::CrossCpu,
        });
        assert!(matches!(
            node.validate(),
            Err(InventoryError::DuplicateLink { .. })
        ));
    }
}
