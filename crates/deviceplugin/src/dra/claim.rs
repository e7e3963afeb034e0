//! From a ResourceClaim's allocation to what the node prepares, without I/O: which of the
//! node's GPUs the claim got (only this driver's results, only this node's pool), how much
//! of each (a whole GPU, or the milli and memory a share consumed), and the environment the
//! containers get, the same as the device plugin's.

use std::collections::BTreeMap;

use gpuplace_model::{NodeInventory, quantity_milli};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};

use super::slices::{MEMORY_CAPACITY, MILLI_CAPACITY, UNHEALTHY_TAINT, device_index};
use crate::kubelet::service::{DEVICE_IDS_ENV, ShareLimit, VISIBLE_DEVICES_ENV, share_limit_envs};

/// The claim the kubelet names in a prepare or unprepare call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Why a claim cannot be prepared on this node; the text goes back to the kubelet and into
/// the pod's events.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("ResourceClaim {0} is not in the API (deleted while the pod was starting?)")]
    NotFound(ClaimRef),
    #[error(
        "ResourceClaim {claim} now has UID {found}: the kubelet's claim was deleted and another created under its name"
    )]
    Replaced { claim: Box<ClaimRef>, found: String },
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(ClaimRef),
    #[error(
        "ResourceClaim {claim}: device {device:?} of pool {pool:?} is not on this node (pool {node:?})"
    )]
    OtherPool {
        claim: Box<ClaimRef>,
        device: String,
        pool: String,
        node: String,
    },
    #[error("ResourceClaim {claim}: device {device:?} is not one of this node's GPUs")]
    UnknownDevice {
        claim: Box<ClaimRef>,
        device: String,
    },
    #[error(
        "ResourceClaim {claim}: GPU {device:?} is unhealthy (taint {UNHEALTHY_TAINT}) and the claim does not tolerate it"
    )]
    Unhealthy {
        claim: Box<ClaimRef>,
        device: String,
    },
    #[error(
        "ResourceClaim {claim}: consumed capacity {name}={value:?} of {device:?} is not usable: {why}"
    )]
    BadCapacity {
        claim: Box<ClaimRef>,
        device: String,
        name: String,
        value: String,
        why: String,
    },
}

/// One GPU (or share of one) a claim got on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's request this device answers.
    pub request: String,
    pub pool: String,
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    pub uuid: String,
    /// The GPU's device node number (`/dev/nvidia<N>`).
    pub minor: u32,
    /// Milli-GPU of the device the claim holds: 1000 (or the GPU's capacity) when whole.
    pub milli: u32,
    /// The memory limit of a share in MiB; the GPU's memory when whole.
    pub memory_mib: u64,
    /// Whether the claim holds part of the GPU (others may hold the rest).
    pub share: bool,
}

/// What the node prepared for one claim (kept in the checkpoint).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub claim: ClaimRef,
    pub devices: Vec<PreparedDevice>,
}

/// Where the claim is to be prepared.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    pub driver: &'a str,
    /// This node's pool (its name).
    pub pool: &'a str,
    pub inventory: &'a NodeInventory,
}

/// The devices of `claim` (as read from the API) that this node prepares for the kubelet's
/// `asked` claim.
pub fn plan(
    asked: &ClaimRef,
    claim: Option<&ResourceClaim>,
    node: Node<'_>,
) -> Result<PreparedClaim, ClaimError> {
    let claim = claim.ok_or_else(|| ClaimError::NotFound(asked.clone()))?;
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != asked.uid {
        return Err(ClaimError::Replaced {
            claim: Box::new(asked.clone()),
            found,
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated(asked.clone()))?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref());
    let devices = results
        .into_iter()
        .flatten()
        .filter(|r| r.driver == node.driver)
        .map(|r| prepared_device(asked, r, node))
        .collect::<Result<_, _>>()?;
    Ok(PreparedClaim {
        claim: asked.clone(),
        devices,
    })
}

fn prepared_device(
    claim: &ClaimRef,
    result: &DeviceRequestAllocationResult,
    node: Node<'_>,
) -> Result<PreparedDevice, ClaimError> {
    if result.pool != node.pool {
        return Err(ClaimError::OtherPool {
            claim: Box::new(claim.clone()),
            device: result.device.clone(),
            pool: result.pool.clone(),
            node: node.pool.to_string(),
        });
    }
    let unknown = || ClaimError::UnknownDevice {
        claim: Box::new(claim.clone()),
        device: result.device.clone(),
    };
    let index = device_index(&result.device).ok_or_else(unknown)?;
    let gpu = node
        .inventory
        .gpus
        .iter()
        .find(|g| g.index == index)
        .ok_or_else(unknown)?;
    let tolerated = result
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.key.as_deref().is_none_or(|k| k == UNHEALTHY_TAINT));
    if !gpu.healthy && !tolerated {
        return Err(ClaimError::Unhealthy {
            claim: Box::new(claim.clone()),
            device: result.device.clone(),
        });
    }
    let whole = gpu.milli_capacity.max(1);
    let consumed = |name: &str| -> Result<Option<i128>, ClaimError> {
        let Some(q) = result.consumed_capacity.as_ref().and_then(|c| c.get(name)) else {
            return Ok(None);
        };
        let bad = |why: String| ClaimError::BadCapacity {
            claim: Box::new(claim.clone()),
            device: result.device.clone(),
            name: name.to_string(),
            value: q.0.clone(),
            why,
        };
        let milli = quantity_milli(&q.0).map_err(|e| bad(e.to_string()))?;
        Ok(Some(milli.div_euclid(1000)))
    };
    let milli = match consumed(MILLI_CAPACITY)? {
        Some(m) if m < 1 || m > i128::from(whole) => {
            return Err(ClaimError::BadCapacity {
                claim: Box::new(claim.clone()),
                device: result.device.clone(),
                name: MILLI_CAPACITY.into(),
                value: m.to_string(),
                why: format!("not within 1..={whole}"),
            });
        }
        Some(m) => m as u32,
        None => whole,
    };
    let memory_bytes = consumed(MEMORY_CAPACITY)?.unwrap_or(0).max(0);
    let memory_mib = match u64::try_from(memory_bytes / (1024 * 1024)).unwrap_or(u64::MAX) {
        0 => gpu.memory_mib * u64::from(milli) / u64::from(whole),
        asked => asked.min(gpu.memory_mib),
    };
    Ok(PreparedDevice {
        request: result.request.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
        share_id: result.share_id.clone(),
        uuid: gpu.uuid.clone(),
        minor: gpu.device_node(),
        milli,
        memory_mib,
        share: milli < whole,
    })
}

/// The environment every container of the claim gets: the device plugin's variables
/// (`NVIDIA_VISIBLE_DEVICES`, `GPUPLACE_DEVICE_IDS`, and a share's limits), so that a
/// workload reads the same whichever path gave it its GPUs.
pub fn claim_env(claim: &PreparedClaim) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let devices = &claim.devices;
    let visible = if devices.is_empty() {
        "void".to_string()
    } else {
        devices
            .iter()
            .map(|d| d.uuid.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    env.insert(VISIBLE_DEVICES_ENV.to_string(), visible);
    let ids: Vec<String> = devices
        .iter()
        .map(|d| {
            if d.share {
                format!("{}:{}", d.uuid, d.milli)
            } else {
                d.uuid.clone()
            }
        })
        .collect();
    env.insert(DEVICE_IDS_ENV.to_string(), ids.join(","));
    let shares: Vec<ShareLimit> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.share)
        .map(|(device, d)| ShareLimit {
            device,
            milli: u64::from(d.milli),
            memory_mib: d.memory_mib,
        })
        .collect();
    env.extend(share_limit_envs(&shares));
    env
}

#[cfg(test)]
mod tests;
