//! The device plugin's GPU resource (`nvidia.com/gpu`) served through DRA on nodes without
//! the device plugin (DRAExtendedResource, beta in Kubernetes 1.36): where gpuplace's
//! DeviceClass names that resource as its `extendedResourceName`, a pod that asks
//! `nvidia.com/gpu: N` may be placed on a node whose GPUs are published as a ResourceSlice.
//! The scheduler then does what kube-scheduler's DynamicResources plugin does: it makes one
//! ResourceClaim for the pod (owned by it, annotated
//! `resource.kubernetes.io/extended-resource-claim: "true"`, one request per GPU container),
//! allocates it the GPUs its policy chose, and writes the pod's
//! `status.extendedResourceClaimStatus` (which request serves which container) before the
//! Binding; the kubelet prepares the claim and hands each container its devices. Pure:
//! the API adapters send what these build.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ContainerExtendedResourceRequest, PodExtendedResourceClaimStatus,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceClass, DeviceRequest,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::write::{PlacedGpu, WriteError, device_result, node_selector};
use super::{DELETE_PROTECTION, DraSettings, ShapeRequest};
pub use super::{EXTENDED_CLAIM_ANNOTATION, EXTENDED_REF, is_extended, owner_of};
use crate::k8s::demand::ContainerDemand;
use crate::k8s::pod_info::PodKey;
use gpuplace_model::{ContainerKind, MILLI_PER_GPU};

/// The DeviceClass of gpuplace's driver that serves the device plugin's GPU resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuClass {
    /// The DeviceClass.
    pub class: String,
    /// Its driver (whose devices the claim is allocated).
    pub driver: String,
    /// The extended resource it serves (`nvidia.com/gpu`).
    pub resource: String,
}

/// The gpuplace DeviceClass that serves `gpu_resource` (its `spec.extendedResourceName`),
/// if one does: the first by name among gpuplace's classes (`settings.classes`).
pub fn class_for<'a>(
    classes: impl IntoIterator<Item = &'a DeviceClass>,
    settings: &DraSettings,
    gpu_resource: &str,
) -> Option<Arc<GpuClass>> {
    classes
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| c.spec.extended_resource_name.as_deref() == Some(gpu_resource))
        .filter_map(|c| c.metadata.name.as_deref())
        .filter(|name| settings.classes.iter().any(|c| c == name))
        .min()
        .map(|class| {
            Arc::new(GpuClass {
                class: class.to_string(),
                driver: settings.driver.clone(),
                resource: gpu_resource.to_string(),
            })
        })
}

/// One request of the claim: the GPUs of one container (or, for init containers, the
/// most any of them needs beyond what later containers' requests give it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendedRequest {
    pub name: String,
    pub count: u32,
}

/// A container served by a request of the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestMapping {
    pub container: String,
    pub request: String,
}

/// What a pod's GPU containers ask through the claim, and which request serves which
/// container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendedAsk {
    pub requests: Vec<ExtendedRequest>,
    /// A container may be served by several requests (an init container by those of the
    /// containers that run after it).
    pub mappings: Vec<RequestMapping>,
}

impl ExtendedAsk {
    /// Devices asked, over every request.
    pub fn count(&self) -> u32 {
        self.requests.iter().map(|r| r.count).sum()
    }
}

/// The claim's requests for `containers` (a pod's GPU containers in admission order, init
/// containers first), as kube-scheduler 1.36 makes them: each container that runs to the
/// end (app containers and sidecars) gets a request of its own; an init container first
/// uses the requests of the long-running containers after it and asks only the rest, and
/// of those rests one request (the largest) serves every init container. `None` for a
/// share (a part of one GPU is not an extended resource) or when the count differs from
/// `gpu_count`, the pod's effective GPUs, so the claim holds exactly what was placed.
pub fn ask_of(containers: &[ContainerDemand], gpu_count: u32) -> Option<ExtendedAsk> {
    if gpu_count == 0 || containers.iter().any(ContainerDemand::is_share) {
        return None;
    }
    let name = |i: usize| format!("container-{i}-gpus");
    let long: Vec<Option<ExtendedRequest>> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (c.kind != ContainerKind::Init && c.gpu_count > 0).then(|| ExtendedRequest {
                name: name(i),
                count: c.gpu_count,
            })
        })
        .collect();
    let mapping = |container: &str, request: &str| RequestMapping {
        container: container.to_string(),
        request: request.to_string(),
    };
    let mut mappings: Vec<RequestMapping> = long
        .iter()
        .zip(containers)
        .filter_map(|(r, c)| r.as_ref().map(|r| mapping(&c.name, &r.name)))
        .collect();
    let mut largest: Option<ExtendedRequest> = None;
    let mut short: Vec<String> = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        if c.kind != ContainerKind::Init || c.gpu_count == 0 {
            continue;
        }
        let mut got = 0;
        for r in long[i..].iter().flatten() {
            if got >= c.gpu_count {
                break;
            }
            got += r.count;
            mappings.push(mapping(&c.name, &r.name));
        }
        let rest = c.gpu_count.saturating_sub(got);
        if rest > 0 {
            if largest.as_ref().is_none_or(|l| l.count < rest) {
                largest = Some(ExtendedRequest {
                    name: name(i),
                    count: rest,
                });
            }
            short.push(c.name.clone());
        }
    }
    if let Some(l) = &largest {
        mappings.extend(short.iter().map(|c| mapping(c, &l.name)));
    }
    let requests: Vec<ExtendedRequest> = largest
        .into_iter()
        .chain(long.into_iter().flatten())
        .collect();
    let ask = ExtendedAsk { requests, mappings };
    (ask.count() == gpu_count).then_some(ask)
}

/// Whether a pod with these GPU containers may take its GPUs through the claim: as
/// [`ask_of`], without building the requests where no init container asks GPUs.
pub fn serves(containers: &[ContainerDemand], gpu_count: u32) -> bool {
    if gpu_count == 0 || containers.iter().any(ContainerDemand::is_share) {
        return false;
    }
    if containers
        .iter()
        .all(|c| c.kind != ContainerKind::Init || c.gpu_count == 0)
    {
        let sum: u32 = containers.iter().map(|c| c.gpu_count).sum();
        return sum == gpu_count;
    }
    ask_of(containers, gpu_count).is_some()
}

/// What the scheduler writes for a pod placed through its extended-resource claim: the
/// claim to create, its allocation, and the pod's status once the claim has its name.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtendedWrite {
    pub pod: PodKey,
    /// To create: `generateName: <pod>-extended-resources-`, owned by the pod (the garbage
    /// collector removes it with the pod), annotated, with delete protection.
    pub claim: ResourceClaim,
    /// The GPUs placement chose, handed to the requests in order.
    pub allocation: AllocationResult,
    /// `status.extendedResourceClaimStatus.requestMappings`.
    pub mappings: Vec<ContainerExtendedResourceRequest>,
}

impl ExtendedWrite {
    /// The pod's `status.extendedResourceClaimStatus` once the claim is named `claim`.
    pub fn status(&self, claim: &str) -> PodExtendedResourceClaimStatus {
        PodExtendedResourceClaimStatus {
            request_mappings: self.mappings.clone(),
            resource_claim_name: claim.to_string(),
        }
    }
}

/// The write that gives `pod` the GPUs `gpus` of `class` on `node` through `ask`.
pub fn write_for(
    pod: &PodKey,
    ask: &ExtendedAsk,
    class: &GpuClass,
    node: &str,
    gpus: &[PlacedGpu],
) -> Result<ExtendedWrite, WriteError> {
    if gpus.len() != ask.count() as usize {
        return Err(WriteError::Count {
            got: gpus.len(),
            want: ask.count(),
        });
    }
    let mut next = gpus.iter();
    let mut results = Vec::new();
    for r in &ask.requests {
        let request = ShapeRequest {
            name: r.name.clone(),
            count: r.count,
            milli: MILLI_PER_GPU,
            memory_mib: None,
            selectors: None,
            all: false,
        };
        for gpu in next.by_ref().take(r.count as usize) {
            results.push(device_result(&pod.uid, &request, gpu, &class.driver, node));
        }
    }
    Ok(ExtendedWrite {
        pod: pod.clone(),
        claim: claim_for(pod, ask, &class.class),
        allocation: AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: None,
            }),
            node_selector: Some(node_selector(node)),
            allocation_timestamp: None,
        },
        mappings: ask
            .mappings
            .iter()
            .map(|m| ContainerExtendedResourceRequest {
                container_name: m.container.clone(),
                resource_name: class.resource.clone(),
                request_name: m.request.clone(),
            })
            .collect(),
    })
}

/// The claim kube-scheduler would make for the pod: named by the server from
/// `<pod>-extended-resources-`, its requests exactly `count` devices of `class`.
fn claim_for(pod: &PodKey, ask: &ExtendedAsk, class: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(pod.namespace.clone()),
            generate_name: Some(format!("{}-extended-resources-", pod.name)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            annotations: Some([(EXTENDED_CLAIM_ANNOTATION.to_string(), "true".to_string())].into()),
            finalizers: Some(vec![DELETE_PROTECTION.to_string()]),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    ask.requests
                        .iter()
                        .map(|r| DeviceRequest {
                            name: r.name.clone(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: class.to_string(),
                                allocation_mode: Some("ExactCount".into()),
                                count: Some(i64::from(r.count)),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        },
        status: None,
    }
}

#[cfg(test)]
#[path = "extended_tests.rs"]
mod tests;
