//! What the scheduler writes to a pod's claims before its Binding: the allocation of each
//! claim it allocates (the exact devices its policy chose, on the chosen node), the
//! delete-protection finalizer, and the pod in `status.reservedFor`; and the undo when the
//! Binding fails. Pure: the API adapters send what these build.

use std::hash::{Hash, Hasher};

use gpuplace_model::MILLI_PER_GPU;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaimConsumerReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use gpuplace_model::device_attributes::device_name;

use super::pod::ClaimPlan;
use super::{ClaimInfo, DELETE_PROTECTION};
use crate::k8s::pod_info::PodKey;

/// One GPU the placement gave the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacedGpu {
    pub index: u32,
    /// The GPU's memory, MiB.
    pub memory_mib: u64,
}

/// One claim's write: allocate it (or join it) and add the pod to its users.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimWrite {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The version decided on, sent as the precondition: a claim changed since (allocated
    /// by another scheduler, or by this one before a restart) is not overwritten.
    pub resource_version: String,
    /// The finalizers to set first when the claim lacks delete protection.
    pub finalizers: Option<Vec<String>>,
    /// The allocation to write; `None` when the pod joins an allocated claim.
    pub allocation: Option<AllocationResult>,
    /// `status.reservedFor` as it is to be: the claim's users and the pod.
    pub reserved_for: Vec<ResourceClaimConsumerReference>,
    /// The pod added (what an undo takes out).
    pub pod_uid: String,
}

/// Why a plan's writes cannot be built from a placement.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WriteError {
    #[error("the placement gave {got} GPUs where the claims ask {want}")]
    Count { got: usize, want: u32 },
}

pub(crate) fn consumer(pod: &PodKey) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

fn users_with(claim: &ClaimInfo, pod: &PodKey) -> Vec<ResourceClaimConsumerReference> {
    let mut users: Vec<_> = claim
        .reserved_for
        .iter()
        .map(super::Consumer::reference)
        .collect();
    if !users.iter().any(|u| u.uid == pod.uid) {
        users.push(consumer(pod));
    }
    users
}

fn protected(claim: &ClaimInfo) -> Option<Vec<String>> {
    (!claim.finalizers.iter().any(|f| f == DELETE_PROTECTION)).then(|| {
        let mut f = claim.finalizers.clone();
        f.push(DELETE_PROTECTION.to_string());
        f
    })
}

/// The node selector of an allocation on `node` (as kube-scheduler writes it).
pub fn node_selector(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

/// A share's ID: a UUID in the API's normal form, the same for the same claim, request
/// and device (so a write sent again is the same write).
fn share_id(claim_uid: &str, request: &str, device: &str) -> String {
    let half = |salt: u8| {
        let mut h = std::hash::DefaultHasher::new();
        (salt, claim_uid, request, device).hash(&mut h);
        h.finish()
    };
    let (a, b) = (half(1), half(2));
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn mebibytes(mib: u64) -> Quantity {
    Quantity(format!("{mib}Mi"))
}

/// The allocation result that gives `gpu` to `request` on `node`: its milli and memory
/// consumed (a share's memory, else its part of the GPU's), and a share ID derived from
/// `seed` (the claim's UID) so a write sent again is the same write.
pub(super) fn device_result(
    seed: &str,
    request: &super::ShapeRequest,
    gpu: &PlacedGpu,
    driver: &str,
    node: &str,
) -> DeviceRequestAllocationResult {
    let device = device_name(gpu.index);
    let memory = request
        .memory_mib
        .unwrap_or_else(|| gpu.memory_mib * u64::from(request.milli) / u64::from(MILLI_PER_GPU));
    let mut consumed = std::collections::BTreeMap::from([(
        "milli".to_string(),
        Quantity(request.milli.to_string()),
    )]);
    if memory > 0 {
        consumed.insert("memory".into(), mebibytes(memory));
    }
    DeviceRequestAllocationResult {
        request: request.name.clone(),
        driver: driver.to_string(),
        pool: node.to_string(),
        share_id: Some(share_id(seed, &request.name, &device)),
        device,
        consumed_capacity: Some(consumed),
        ..Default::default()
    }
}

/// The writes that give `pod` its claims on `node`: each claim of `plan.allocate` gets
/// `gpus` in the order of its requests (as the plan meets them), each claim of `plan.join` gets the pod as a user.
pub fn writes_for(
    plan: &ClaimPlan,
    pod: &PodKey,
    node: &str,
    gpus: &[PlacedGpu],
) -> Result<Vec<ClaimWrite>, WriteError> {
    if gpus.len() != plan.count as usize {
        return Err(WriteError::Count {
            got: gpus.len(),
            want: plan.count,
        });
    }
    let mut next = gpus.iter();
    // Sized to fit: the writes are held until the watch shows the pod bound, and a Vec
    // grown by pushes holds four (2 KiB or more a pod at a burst of claim pods).
    let mut writes = Vec::with_capacity(plan.allocate.len() + plan.join.len());
    for (claim, &pick) in plan.allocate.iter().zip(&plan.picks) {
        let option = claim.shape.as_ref().ok().and_then(|s| s.options.get(pick));
        let requests = option.map(|o| o.requests.as_slice()).unwrap_or_default();
        let mut results = Vec::new();
        for request in requests {
            let take = if request.all {
                usize::MAX
            } else {
                request.count as usize
            };
            for gpu in next.by_ref().take(take) {
                results.push(device_result(&claim.uid, request, gpu, &plan.driver, node));
            }
        }
        // Held as long as the write: no room for results that never come.
        results.shrink_to_fit();
        writes.push(ClaimWrite {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            resource_version: claim.resource_version.clone(),
            finalizers: protected(claim),
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                node_selector: Some(node_selector(node)),
                allocation_timestamp: None,
            }),
            reserved_for: users_with(claim, pod),
            pod_uid: pod.uid.clone(),
        });
    }
    for claim in &plan.join {
        writes.push(ClaimWrite {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            resource_version: claim.resource_version.clone(),
            finalizers: None,
            allocation: None,
            reserved_for: users_with(claim, pod),
            pod_uid: pod.uid.clone(),
        });
    }
    Ok(writes)
}

/// The status patch that carries `write` out (merge patch; its resourceVersion is the
/// precondition).
pub fn status_patch(write: &ClaimWrite, resource_version: &str) -> serde_json::Value {
    let mut status = serde_json::json!({ "reservedFor": write.reserved_for });
    if let Some(allocation) = &write.allocation {
        status["allocation"] = serde_json::to_value(allocation).unwrap_or_default();
    }
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    })
}

/// The status patch that undoes `write` on the claim as it stands now (`current`): the pod
/// out of `reservedFor`, and the allocation cleared when this write made it and no other
/// user is left. `None` when there is nothing to undo.
pub fn undo_patch(write: &ClaimWrite, current: &ClaimInfo) -> Option<serde_json::Value> {
    if current.uid != write.uid || !current.reserved_for_pod(&write.pod_uid) {
        return None;
    }
    let remaining: Vec<ResourceClaimConsumerReference> = current
        .reserved_for
        .iter()
        .filter(|c| c.uid != write.pod_uid)
        .map(super::Consumer::reference)
        .collect();
    let mut status = serde_json::json!({ "reservedFor": remaining });
    if write.allocation.is_some() && remaining.is_empty() {
        status["allocation"] = serde_json::Value::Null;
    }
    Some(serde_json::json!({
        "metadata": {"resourceVersion": current.resource_version},
        "status": status,
    }))
}
