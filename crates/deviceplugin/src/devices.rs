//! The devices the plugin advertises, and the way back from a device ID to a physical GPU.
//!
//! With time-slicing replicas each GPU is advertised `replicas` times as `<uuid>::<n>`;
//! without, as its UUID. With shares on, each GPU is also advertised as 1000 slices
//! `<uuid>::m<k>` of the share resource (`gpuplace.io/gpu-milli`): a pod asking 250 milli
//! gets 250 slices of one GPU, and the kubelet counts them. Every decision about device IDs
//! goes through [`DeviceTable`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::topology::{self, LinkMatrix};
use gpuplace_kubelet_api::v1beta1::{Device, NumaNode, TopologyInfo};
use gpuplace_kubelet_api::{HEALTHY, UNHEALTHY};
use gpuplace_model::{Gpu, NodeInventory};

/// Separator between a GPU's UUID and its replica number.
pub const REPLICA_SEPARATOR: &str = "::";
/// Separator between a GPU's UUID and its slice number (milli-GPU shares).
pub const SLICE_SEPARATOR: &str = "::m";

/// The GPU ID of a share slice's device ID (`GPU-0::m17` -> `GPU-0`), `None` for others.
pub fn slice_gpu(id: &str) -> Option<&str> {
    let (gpu, k) = id.rsplit_once(SLICE_SEPARATOR)?;
    (!k.is_empty() && k.bytes().all(|b| b.is_ascii_digit())).then_some(gpu)
}

/// One advertised device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertised {
    pub id: String,
    /// Position of the physical GPU in the inventory.
    pub gpu: usize,
    pub replica: u32,
    /// A milli-GPU slice of the share resource, not a whole device.
    pub slice: bool,
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
    #[error("device {0:?} belongs to the other resource (whole GPUs vs. milli-GPU slices)")]
    WrongResource(String),
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
    /// Where the slices start in `devices` (all of them when shares are off).
    first_slice: usize,
}

impl DeviceTable {
    pub fn new(inventory: Arc<NodeInventory>, replicas: u32) -> Self {
        Self::with_shares(inventory, replicas, false)
    }

    /// The table, with 1000 slices per GPU of the share resource when `shares` is on.
    pub fn with_shares(inventory: Arc<NodeInventory>, replicas: u32, shares: bool) -> Self {
        let mut devices = Vec::new();
        for (gpu, g) in inventory.gpus.iter().enumerate() {
            if replicas <= 1 {
                devices.push(Advertised {
                    id: g.id.clone(),
                    gpu,
                    replica: 0,
                    slice: false,
                });
            } else {
                for replica in 0..replicas {
                    devices.push(Advertised {
                        id: format!("{}{REPLICA_SEPARATOR}{replica}", g.id),
                        gpu,
                        replica,
                        slice: false,
                    });
                }
            }
        }
        let first_slice = devices.len();
        if shares {
            for (gpu, g) in inventory.gpus.iter().enumerate() {
                for k in 0..gpuplace_model::MILLI_PER_GPU {
                    devices.push(Advertised {
                        id: format!("{}{SLICE_SEPARATOR}{k}", g.id),
                        gpu,
                        replica: 0,
                        slice: true,
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
            first_slice,
        }
    }

    /// Whether the share resource is advertised.
    pub fn shares(&self) -> bool {
        self.first_slice < self.devices.len()
    }

    pub fn inventory(&self) -> &NodeInventory {
        &self.inventory
    }

    pub fn gpu(&self, position: usize) -> &Gpu {
        &self.inventory.gpus[position]
    }

    /// The ListAndWatch view of whole devices (or replicas): health and NUMA node.
    pub fn list(&self) -> Vec<Device> {
        self.list_of(false)
    }

    /// The ListAndWatch view of the share resource's slices (empty when shares are off).
    pub fn list_slices(&self) -> Vec<Device> {
        self.list_of(true)
    }

    fn list_of(&self, slices: bool) -> Vec<Device> {
        let range = if slices {
            self.first_slice..self.devices.len()
        } else {
            0..self.first_slice
        };
        self.devices[range]
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

    fn position(&self, id: &str) -> Result<usize, DeviceIdError> {
        self.by_id
            .get(id)
            .copied()
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
        // By position, not by comparing names: the kubelet offers every free slice (8,000
        // on an 8-GPU node with shares), and a pairwise check was quadratic in them.
        let mut seen = vec![false; self.devices.len()];
        for id in ids {
            let position = self.position(id)?;
            let device = &self.devices[position];
            if std::mem::replace(&mut seen[position], true) {
                return Err(DeviceIdError::Duplicate(id.clone()));
            }
            if need_healthy && !self.gpu(device.gpu).healthy {
                return Err(DeviceIdError::Unhealthy(id.clone()));
            }
            out.push(device);
        }
        Ok(out)
    }

    /// [`resolve`](Self::resolve), every ID also of the resource served: slices when
    /// `slices`, else whole devices.
    pub fn resolve_kind(
        &self,
        ids: &[String],
        need_healthy: bool,
        slices: bool,
    ) -> Result<Vec<&Advertised>, DeviceIdError> {
        let devices = self.resolve(ids, need_healthy)?;
        if let Some(d) = devices.iter().find(|d| d.slice != slices) {
            return Err(DeviceIdError::WrongResource(d.id.clone()));
        }
        Ok(devices)
    }

    /// Milli-GPU in use per GPU (inventory order) when `in_use` are the device IDs held by
    /// pods: a whole device (or replica) counts 1000, a slice 1. Unknown IDs are skipped.
    pub fn usage<'a>(&self, in_use: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
        let mut whole = vec![false; self.inventory.gpus.len()];
        let mut slices = vec![0u32; self.inventory.gpus.len()];
        let mut seen = std::collections::HashSet::new();
        for id in in_use {
            let Some(d) = self.by_id.get(id).map(|&i| &self.devices[i]) else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            if d.slice {
                slices[d.gpu] += 1;
            } else {
                whole[d.gpu] = true;
            }
        }
        whole
            .iter()
            .zip(&slices)
            .map(|(&w, &s)| {
                if w {
                    gpuplace_model::MILLI_PER_GPU + s
                } else {
                    s
                }
            })
            .collect()
    }

    /// `size` slices of one GPU for a share, from the kubelet's `available` slices,
    /// including `must_include` (slices reused from an init container, which fix the GPU).
    /// The GPU is `planned` (a GPU ID) when the kubelet offers enough of its slices: the
    /// scheduler's plan is trusted, since it counts every pod the node's record shows and
    /// the plugin's own view of other pods may lag. Otherwise (no plan, or its slices still
    /// held) the fullest healthy GPU with room by `usage` (milli held by pods, see
    /// [`usage`](Self::usage)): no whole use, and the share within 1000 (packing).
    /// Returns the IDs and whether the choice had room (`false`: no GPU had; the kubelet's
    /// own choice would not either, and the record will say what was given).
    pub fn slices_for(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
        usage: &[u32],
        planned: Option<&str>,
    ) -> Result<(Vec<String>, bool), PreferenceError> {
        let available = self.resolve_kind(available, false, true)?;
        let must = if must_include.is_empty() {
            Vec::new()
        } else {
            self.resolve_kind(must_include, false, true)?
        };
        let wanted = usize::try_from(size).unwrap_or(0);
        if wanted < 1 || wanted > available.len() + must.len() {
            return Err(PreferenceError::Size {
                size,
                available: available.len(),
            });
        }
        if must.len() > wanted {
            return Err(PreferenceError::MustExceedsSize {
                must: must.len(),
                size: wanted,
            });
        }
        let rest = wanted - must.len();
        let mut free = vec![0usize; self.inventory.gpus.len()];
        for d in &available {
            if !must.iter().any(|m| m.id == d.id) {
                free[d.gpu] += 1;
            }
        }
        let room = |g: usize| {
            let used = usage.get(g).copied().unwrap_or(0) as usize;
            used + rest <= gpuplace_model::MILLI_PER_GPU as usize && free[g] >= rest
        };
        let must_gpu = must.first().map(|m| m.gpu);
        let planned_gpu =
            planned.and_then(|id| self.inventory.gpus.iter().position(|g| g.id == id));
        let healthy = |g: usize| self.gpu(g).healthy;
        let fullest = (0..free.len())
            .filter(|&g| healthy(g) && room(g))
            .max_by_key(|&g| (usage.get(g).copied().unwrap_or(0), std::cmp::Reverse(g)));
        let (gpu, fits) = match (must_gpu, planned_gpu) {
            (Some(g), _) => (g, room(g)),
            (None, Some(g)) if healthy(g) && free[g] >= rest => (g, true),
            _ => match fullest {
                Some(g) => (g, true),
                // No GPU has room: the one with the most free slices (kubelet-like).
                None => match (0..free.len())
                    .filter(|&g| free[g] >= rest)
                    .max_by_key(|&g| free[g])
                {
                    Some(g) => (g, false),
                    None => (0, false),
                },
            },
        };
        let mut ids: Vec<String> = must.iter().map(|d| d.id.clone()).collect();
        ids.extend(
            available
                .iter()
                .filter(|d| d.gpu == gpu && !must.iter().any(|m| m.id == d.id))
                .take(rest)
                .map(|d| d.id.clone()),
        );
        // Too few on that GPU (only when nothing fits): top up from any GPU.
        for d in &available {
            if ids.len() >= wanted {
                break;
            }
            if !ids.contains(&d.id) {
                ids.push(d.id.clone());
            }
        }
        Ok((ids, fits))
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

    /// `ids` without the ones this table does not know, and the unknown ones. `ids` as
    /// they are when it knows them all (the kubelet offers every share of every GPU: a
    /// copy of each ID per request was most of the answer's cost).
    pub fn known<'a>(&self, ids: &'a [String]) -> (Cow<'a, [String]>, Vec<String>) {
        if ids.iter().all(|id| self.by_id.contains_key(id.as_str())) {
            return (Cow::Borrowed(ids), Vec::new());
        }
        let (known, unknown) = ids
            .iter()
            .cloned()
            .partition(|id| self.by_id.contains_key(id.as_str()));
        (Cow::Owned(known), unknown)
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
        usage: &[u32],
    ) -> Result<Vec<String>, PreferenceError> {
        let offered = self.resolve_kind(available, false, false)?;
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
        self.preferred_avoiding(available, &ids, size, usage)
            .map(|(ids, _)| ids)
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
        self.preferred_avoiding(available, must_include, size, &[])
    }

    /// [`preferred`](Self::preferred) without the GPUs whose `usage` is not 0 (shares in
    /// use: a GPU with a share is never handed out whole), unless too few GPUs are left.
    pub fn preferred_avoiding(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
        usage: &[u32],
    ) -> Result<(Vec<String>, u64), PreferenceError> {
        let available = self.resolve_kind(available, false, false)?;
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
        let busy = |g: usize| usage.get(g).is_some_and(|&u| u > 0) && !must_gpus.contains(&g);
        let mut candidate_gpus: Vec<usize> = self
            .physical(&available)
            .into_iter()
            .filter(|&g| (self.gpu(g).healthy || must_gpus.contains(&g)) && !busy(g))
            .collect();
        if candidate_gpus.len() < size {
            candidate_gpus.extend(
                self.physical(&available)
                    .into_iter()
                    .filter(|&g| self.gpu(g).healthy && busy(g)),
            );
        }
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
mod tests;
