//! The devices the plugin advertises, and the way back from a device ID to a physical GPU.
//!
//! With time-slicing replicas each GPU is advertised `replicas` times as `<uuid>::<n>`;
//! without, as its UUID. Every decision about device IDs goes through [`DeviceTable`].

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::topology::{self, LinkMatrix};
use gpuplace_kubelet_api::v1beta1::{Device, NumaNode, TopologyInfo};
use gpuplace_kubelet_api::{HEALTHY, UNHEALTHY};
use gpuplace_model::{Gpu, NodeInventory};

/// Separator between a GPU's UUID and its replica number.
pub const REPLICA_SEPARATOR: &str = "::";

/// One advertised device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertised {
    pub id: String,
    /// Position of the physical GPU in the inventory.
    pub gpu: usize,
    pub replica: u32,
}

/// A device ID the plugin refuses, with the reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceIdError {
    #[error("unknown device ID {0:?}")]
    Unknown(String),
    #[error("device ID {0:?} is listed more than once")]
    Duplicate(String),
    #[error("device {0:?} is unhealthy")]
    Unhealthy(String),
    #[error("no device IDs in the request")]
    Empty,
}

/// Why a preferred allocation cannot be computed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreferenceError {
    #[error(transparent)]
    Device(#[from] DeviceIdError),
    #[error("allocation size {size} is out of range (1..={available} available)")]
    Size { size: i64, available: usize },
    #[error("must-include device {0:?} is not among the available devices")]
    MustNotAvailable(String),
    #[error("{must} must-include devices exceed the allocation size {size}")]
    MustExceedsSize { must: usize, size: usize },
}

/// The advertised devices of one inventory snapshot.
#[derive(Clone, Debug)]
pub struct DeviceTable {
    inventory: Arc<NodeInventory>,
    devices: Vec<Advertised>,
    by_id: HashMap<String, usize>,
    links: LinkMatrix,
}

impl DeviceTable {
    pub fn new(inventory: Arc<NodeInventory>, replicas: u32) -> Self {
        let mut devices = Vec::new();
        for (gpu, g) in inventory.gpus.iter().enumerate() {
            if replicas <= 1 {
                devices.push(Advertised {
                    id: g.id.clone(),
                    gpu,
                    replica: 0,
                });
            } else {
                for replica in 0..replicas {
                    devices.push(Advertised {
                        id: format!("{}{REPLICA_SEPARATOR}{replica}", g.id),
                        gpu,
                        replica,
                    });
                }
            }
        }
        let by_id = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.clone(), i))
            .collect();
        let links = LinkMatrix::from_inventory(&inventory);
        DeviceTable {
            inventory,
            devices,
            by_id,
            links,
        }
    }

    pub fn inventory(&self) -> &NodeInventory {
        &self.inventory
    }

    pub fn gpu(&self, position: usize) -> &Gpu {
        &self.inventory.gpus[position]
    }

    /// The ListAndWatch view: every device with health and NUMA node.
    pub fn list(&self) -> Vec<Device> {
        self.devices
            .iter()
            .map(|d| {
                let gpu = self.gpu(d.gpu);
                Device {
                    id: d.id.clone(),
                    health: if gpu.healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                    topology: gpu.numa_node.map(|n| TopologyInfo {
                        nodes: vec![NumaNode { id: i64::from(n) }],
                    }),
                }
            })
            .collect()
    }

    fn lookup(&self, id: &str) -> Result<&Advertised, DeviceIdError> {
        self.by_id
            .get(id)
            .map(|&i| &self.devices[i])
            .ok_or_else(|| DeviceIdError::Unknown(id.to_string()))
    }

    /// Resolves IDs to advertised devices: every ID known, none twice, optionally healthy.
    pub fn resolve(
        &self,
        ids: &[String],
        need_healthy: bool,
    ) -> Result<Vec<&Advertised>, DeviceIdError> {
        if ids.is_empty() {
            return Err(DeviceIdError::Empty);
        }
        let mut out: Vec<&Advertised> = Vec::with_capacity(ids.len());
        for id in ids {
            let device = self.lookup(id)?;
            if out.iter().any(|d| d.id == *id) {
                return Err(DeviceIdError::Duplicate(id.clone()));
            }
            if need_healthy && !self.gpu(device.gpu).healthy {
                return Err(DeviceIdError::Unhealthy(id.clone()));
            }
            out.push(device);
        }
        Ok(out)
    }

    /// Distinct physical GPUs behind `devices`, in first-seen order.
    pub fn physical(&self, devices: &[&Advertised]) -> Vec<usize> {
        let mut gpus: Vec<usize> = Vec::new();
        for d in devices {
            if !gpus.contains(&d.gpu) {
                gpus.push(d.gpu);
            }
        }
        gpus
    }

    /// `ids` without the ones this table does not know, and the unknown ones.
    pub fn known(&self, ids: &[String]) -> (Vec<String>, Vec<String>) {
        ids.iter()
            .cloned()
            .partition(|id| self.by_id.contains_key(id.as_str()))
    }

    /// The device IDs that carry out a plan: `must_include` first, then for each planned
    /// physical GPU (by inventory ID) an offered device of it; if a planned GPU is not on
    /// offer (still held by a terminating pod), the rest by the topology-aware choice.
    pub fn ids_for_plan(
        &self,
        planned: &[String],
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<Vec<String>, PreferenceError> {
        let offered = self.resolve(available, false)?;
        let mut chosen: Vec<&Advertised> = if must_include.is_empty() {
            Vec::new()
        } else {
            self.resolve(must_include, false)?
        };
        let wanted = usize::try_from(size).unwrap_or(0);
        for gpu_id in planned {
            if chosen.len() >= wanted {
                break;
            }
            if chosen.iter().any(|c| self.gpu(c.gpu).id == *gpu_id) {
                continue;
            }
            if let Some(d) = offered
                .iter()
                .find(|d| self.gpu(d.gpu).id == *gpu_id && !chosen.iter().any(|c| c.id == d.id))
            {
                chosen.push(d);
            }
        }
        let ids: Vec<String> = chosen.iter().map(|d| d.id.clone()).collect();
        if ids.len() >= wanted {
            return Ok(ids);
        }
        self.preferred(available, &ids, size).map(|(ids, _)| ids)
    }

    /// The best `size` device IDs from `available`, including all of `must_include`.
    ///
    /// Physical GPUs are chosen by the exact topology search of `gpuplace-core` (largest
    /// NVLink/PCIe pair score, then the fewest good links broken among the GPUs left);
    /// with replicas, each chosen GPU contributes one replica before any gets a second.
    /// Returns the IDs and the pair score of the physical set.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<(Vec<String>, u64), PreferenceError> {
        let available = self.resolve(available, false)?;
        let must = if must_include.is_empty() {
            Vec::new()
        } else {
            self.resolve(must_include, false)?
        };
        if size < 1 || size as usize > available.len() {
            return Err(PreferenceError::Size {
                size,
                available: available.len(),
            });
        }
        let size = size as usize;
        if must.len() > size {
            return Err(PreferenceError::MustExceedsSize {
                must: must.len(),
                size,
            });
        }
        if let Some(missing) = must
            .iter()
            .find(|m| !available.iter().any(|a| a.id == m.id))
        {
            return Err(PreferenceError::MustNotAvailable(missing.id.clone()));
        }
        let must_gpus = self.physical(&must);
        let candidate_gpus: Vec<usize> = self
            .physical(&available)
            .into_iter()
            .filter(|&g| self.gpu(g).healthy || must_gpus.contains(&g))
            .collect();
        let wanted = size.min(candidate_gpus.len()).max(must_gpus.len());
        let set = topology::select(&self.links, &candidate_gpus, &must_gpus, wanted)
            .unwrap_or_else(|| topology::DeviceSet {
                positions: must_gpus.clone(),
                score: self.links.set_score(&must_gpus),
            });
        // Must-include devices first, then one replica per chosen GPU, then more replicas
        // round the chosen GPUs, then anything available.
        let mut chosen: Vec<&Advertised> = must.clone();
        let mut round = 0;
        while chosen.len() < size && round <= available.len() {
            for &g in &set.positions {
                if chosen.len() >= size {
                    break;
                }
                let per_gpu = chosen.iter().filter(|d| d.gpu == g).count();
                if per_gpu > round {
                    continue;
                }
                if let Some(next) = available
                    .iter()
                    .find(|d| d.gpu == g && !chosen.iter().any(|c| c.id == d.id))
                {
                    chosen.push(next);
                }
            }
            round += 1;
        }
        for d in &available {
            if chosen.len() >= size {
                break;
            }
            if !chosen.iter().any(|c| c.id == d.id) {
                chosen.push(d);
            }
        }
        Ok((chosen.iter().map(|d| d.id.clone()).collect(), set.score))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::{Link, PcieLevel};

    fn four() -> Arc<NodeInventory> {
        let mut node = NodeInventory::uniform("n", 1, 1, 4, "A100");
        for (i, g) in node.gpus.iter_mut().enumerate() {
            g.id = format!("GPU-{i}");
            g.uuid = g.id.clone();
            g.numa_node = Some(i as u32 / 2);
        }
        for a in 0..4u32 {
            for b in a + 1..4 {
                let pair = a / 2 == b / 2;
                node.links.push(Link {
                    a,
                    b,
                    nvlinks: if pair { 4 } else { 0 },
                    pcie: if pair {
                        PcieLevel::SameCpu
                    } else {
                        PcieLevel::CrossCpu
                    },
                });
            }
        }
        Arc::new(node)
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replicas_are_advertised_and_map_back() {
        let table = DeviceTable::new(four(), 2);
        let list = table.list();
        assert_eq!(list.len(), 8);
        assert_eq!(list[1].id, "GPU-0::1");
        assert_eq!(list[2].topology.as_ref().unwrap().nodes[0].id, 0);
        let devices = table
            .resolve(&ids(&["GPU-0::1", "GPU-0::0", "GPU-3::0"]), true)
            .unwrap();
        assert_eq!(table.physical(&devices), vec![0, 3]);
    }

    #[test]
    fn bad_ids_are_named() {
        let mut inv = (*four()).clone();
        inv.gpus[2].healthy = false;
        let table = DeviceTable::new(Arc::new(inv), 1);
        assert_eq!(
            table
                .resolve(&ids(&["GPU-9"]), true)
                .unwrap_err()
                .to_string(),
            "unknown device ID \"GPU-9\""
        );
        assert_eq!(
            table.resolve(&ids(&["GPU-0", "GPU-0"]), true).unwrap_err(),
            DeviceIdError::Duplicate("GPU-0".into())
        );
        assert_eq!(
            table.resolve(&ids(&["GPU-2"]), true).unwrap_err(),
            DeviceIdError::Unhealthy("GPU-2".into())
        );
        assert_eq!(table.resolve(&[], true).unwrap_err(), DeviceIdError::Empty);
    }

    #[test]
    fn preferred_keeps_pairs_and_honours_must_include() {
        let table = DeviceTable::new(four(), 1);
        let all = ids(&["GPU-0", "GPU-1", "GPU-2", "GPU-3"]);
        let (set, score) = table.preferred(&all, &[], 2).unwrap();
        assert_eq!(set, ids(&["GPU-0", "GPU-1"]));
        assert_eq!(score, 420);
        let (set, _) = table.preferred(&all, &ids(&["GPU-3"]), 2).unwrap();
        assert_eq!(set, ids(&["GPU-3", "GPU-2"]));
        // One GPU out of 1, 2, 3: take 1, whose partner is gone, not half of 2-3.
        let (set, _) = table
            .preferred(&ids(&["GPU-1", "GPU-2", "GPU-3"]), &[], 1)
            .unwrap();
        assert_eq!(set, ids(&["GPU-1"]));
        assert!(matches!(
            table.preferred(&all, &[], 5),
            Err(PreferenceError::Size { .. })
        ));
        assert!(matches!(
            table.preferred(&all, &[], 0),
            Err(PreferenceError::Size { .. })
        ));
        assert!(matches!(
            table.preferred(&ids(&["GPU-0"]), &ids(&["GPU-1"]), 1),
            Err(PreferenceError::MustNotAvailable(_))
        ));
        assert!(matches!(
            table.preferred(&all, &ids(&["GPU-0", "GPU-1"]), 1),
            Err(PreferenceError::MustExceedsSize { .. })
        ));
    }

    #[test]
    fn preferred_spreads_replicas_over_good_gpus() {
        let table = DeviceTable::new(four(), 2);
        let all: Vec<String> = table.list().into_iter().map(|d| d.id).collect();
        let (set, _) = table.preferred(&all, &[], 5).unwrap();
        // One replica on each of the four GPUs before any GPU gets a second.
        assert_eq!(
            set,
            ids(&["GPU-0::0", "GPU-1::0", "GPU-2::0", "GPU-3::0", "GPU-0::1"])
        );
        let (set, _) = table.preferred(&all, &[], 2).unwrap();
        assert_eq!(set, ids(&["GPU-0::0", "GPU-1::0"]));
    }
}
