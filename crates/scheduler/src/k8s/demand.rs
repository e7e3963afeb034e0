//! What a pod asks for, computed as Kubernetes does, and the assignment the scheduler
//! records on it.

use std::collections::BTreeMap;

use gpuplace_model::Request;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use gpuplace_model::need_of_container;
pub use gpuplace_model::{
    ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Allocated, Assignment, ContainerAssignment,
    ContainerKind,
};

pub use crate::k8s::demand_error::{DemandError, milli_value};
pub use gpuplace_model::SHARE_RESOURCE;
/// The former way to ask for a share (a pod annotation beside `nvidia.com/gpu: 1`), refused
/// with a message saying what to write instead: the kubelet hands such a pod a whole GPU and
/// refuses a second share of it. Shares are the resource [`SHARE_RESOURCE`].
pub use gpuplace_model::keys::GPU_MILLI_ANNOTATION;
pub use gpuplace_model::keys::POD_GROUP_LABEL;

/// Resources of one container, as a map from resource name to milli-units.
fn container_requests(c: &Container) -> Result<BTreeMap<String, i128>, DemandError> {
    let mut out = BTreeMap::new();
    let resources = c.resources.as_ref();
    // A limit without a request means the request equals the limit (Kubernetes defaulting).
    if let Some(limits) = resources.and_then(|r| r.limits.as_ref()) {
        for (name, q) in limits {
            out.insert(name.clone(), milli_value(q)?);
        }
    }
    if let Some(requests) = resources.and_then(|r| r.requests.as_ref()) {
        for (name, q) in requests {
            out.insert(name.clone(), milli_value(q)?);
        }
    }
    Ok(out)
}

/// GPU need of one container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerDemand {
    pub name: String,
    pub kind: ContainerKind,
    pub gpu_count: u32,
    pub gpu_milli: u32,
    /// Asked as the share resource (slices of one GPU), not whole devices.
    #[serde(default)]
    pub share: bool,
}

impl ContainerDemand {
    fn need(&self) -> gpuplace_model::ContainerNeed {
        gpuplace_model::ContainerNeed {
            name: self.name.clone(),
            kind: self.kind,
            count: self.gpu_count,
            milli: if self.is_share() { self.gpu_milli } else { 0 },
        }
    }

    /// A share of one GPU (the share resource), not whole devices.
    pub fn is_share(&self) -> bool {
        self.share
    }
}

/// Everything placement needs about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDemand {
    /// The pod's effective request (init containers counted as Kubernetes does).
    pub request: Request,
    /// GPU-using containers in admission order (init containers first).
    pub containers: Vec<ContainerDemand>,
    /// Scalar resources besides CPU, memory and GPUs, as kube-scheduler's NodeResourcesFit
    /// counts them: extended resources in their units (e.g. `example.com/fpga: 1`),
    /// `ephemeral-storage` and `hugepages-*` in bytes. (Every pod also takes one of the
    /// node's `pods` slots; that is counted per pod, not stored here.)
    pub extended: BTreeMap<String, i64>,
}

impl PodDemand {
    /// Whether the pod asks for a share of one GPU (the share resource).
    pub fn is_share(&self) -> bool {
        self.containers.iter().any(ContainerDemand::is_share)
    }
}

/// Computes a pod's demand as Kubernetes does (1.29+ rules): per resource, the larger of
/// the app containers' and sidecars' sum and the largest init container plus the sidecars
/// started before it, plus pod overhead. The GPU count is the distinct devices the kubelet
/// hands the pod's containers (see [`gpuplace_model::fresh_devices`]), which is the same
/// number. `gpu_resource` is e.g. `nvidia.com/gpu`.
pub fn pod_demand(pod: &Pod, gpu_resource: &str) -> Result<PodDemand, DemandError> {
    refuse_milli_annotation(pod, gpu_resource)?;
    let Effective { sums, containers } = effective_requests(pod, gpu_resource)?;
    let gpus = gpus_of(&containers, &sums, gpu_resource)?;
    let whole = |milli: i128| u64::try_from(milli / 1000).unwrap_or(u64::MAX);
    Ok(PodDemand {
        request: Request {
            cpu_milli: u64::try_from(sums.get("cpu").copied().unwrap_or(0)).unwrap_or(u64::MAX),
            memory_mib: whole(sums.get("memory").copied().unwrap_or(0)).div_ceil(1 << 20),
            gpu_count: gpus.count,
            gpu_milli: gpus.milli,
            allowed_models: Vec::new(),
            need: crate::k8s::need::gpu_need(pod.metadata.annotations.as_ref())?,
        },
        extended: extended_of(&sums, gpu_resource),
        containers,
    })
}

/// The old share annotation is refused with how to ask for a share instead.
fn refuse_milli_annotation(pod: &Pod, gpu_resource: &str) -> Result<(), DemandError> {
    let annotations = pod.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(GPU_MILLI_ANNOTATION)) {
        None => Ok(()),
        Some(text) => Err(DemandError::Annotation {
            annotation: GPU_MILLI_ANNOTATION,
            message: format!(
                "{text:?}: a share is asked as the container resource {SHARE_RESOURCE} (e.g. limits {{{SHARE_RESOURCE}: {}}}) instead of {gpu_resource}: 1 with this annotation, which the kubelet would count as a whole GPU",
                text.trim()
            ),
        }),
    }
}

/// A pod's effective requests (milli-units by resource) and its GPU containers in the
/// kubelet's admission order (init containers first).
struct Effective {
    sums: BTreeMap<String, i128>,
    containers: Vec<ContainerDemand>,
}

/// Per resource, the larger of the app containers' and sidecars' sum and the largest init
/// container plus the sidecars started before it, plus pod overhead.
fn effective_requests(pod: &Pod, gpu_resource: &str) -> Result<Effective, DemandError> {
    let spec = pod.spec.as_ref();
    let empty = Vec::new();
    let containers = spec.map(|s| &s.containers).unwrap_or(&empty);
    let inits = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty);
    let mut sums: BTreeMap<String, i128> = BTreeMap::new();
    let mut gpu_containers = Vec::new();
    for c in containers {
        for (k, v) in &container_requests(c)? {
            *sums.entry(k.clone()).or_default() += v;
        }
        push_gpu(&mut gpu_containers, c, gpu_resource, ContainerKind::App)?;
    }
    let mut init_max: BTreeMap<String, i128> = BTreeMap::new();
    let mut sidecars: BTreeMap<String, i128> = BTreeMap::new();
    let mut all_gpu = Vec::new();
    for c in inits {
        let r = container_requests(c)?;
        let restartable = c.restart_policy.as_deref() == Some("Always");
        if restartable {
            for (k, v) in &r {
                *sidecars.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &sidecars {
                let e = init_max.entry(k.clone()).or_default();
                *e = (*e).max(*v);
            }
        } else {
            let keys: Vec<&String> = r.keys().chain(sidecars.keys()).collect();
            for k in keys {
                let candidate =
                    r.get(k).copied().unwrap_or(0) + sidecars.get(k).copied().unwrap_or(0);
                let e = init_max.entry(k.clone()).or_default();
                *e = (*e).max(candidate);
            }
        }
        let kind = if restartable {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        };
        push_gpu(&mut all_gpu, c, gpu_resource, kind)?;
    }
    for (k, v) in sidecars {
        *sums.entry(k).or_default() += v;
    }
    for (k, v) in init_max {
        let e = sums.entry(k).or_default();
        *e = (*e).max(v);
    }
    if let Some(overhead) = spec.and_then(|s| s.overhead.as_ref()) {
        for (k, q) in overhead {
            *sums.entry(k.clone()).or_default() += milli_value(q)?;
        }
    }
    all_gpu.extend(gpu_containers);
    Ok(Effective {
        sums,
        containers: all_gpu,
    })
}

/// GPUs a pod asks, as core places them.
struct GpuAsk {
    count: u32,
    milli: u32,
}

/// Whole GPUs (the distinct devices the kubelet hands the containers), or one GPU's share
/// (the pod's effective request of the share resource); never both.
fn gpus_of(
    containers: &[ContainerDemand],
    sums: &BTreeMap<String, i128>,
    gpu_resource: &str,
) -> Result<GpuAsk, DemandError> {
    let shares = containers.iter().filter(|c| c.is_share()).count();
    if shares > 0 && shares < containers.len() {
        return Err(DemandError::MixedPod {
            resource: gpu_resource.to_string(),
        });
    }
    if shares > 0 {
        // One GPU, shared by the pod's containers: the share is the pod's effective
        // request of the share resource, which is what the kubelet's slices add up to.
        let total = sums.get(SHARE_RESOURCE).copied().unwrap_or(0) / 1000;
        if !(1..=1000).contains(&total) {
            return Err(DemandError::ShareTooLarge(total));
        }
        return Ok(GpuAsk {
            count: 1,
            milli: total as u32,
        });
    }
    let needs: Vec<gpuplace_model::ContainerNeed> =
        containers.iter().map(ContainerDemand::need).collect();
    Ok(match gpuplace_model::fresh_devices(&needs) {
        0 => GpuAsk { count: 0, milli: 0 },
        n => GpuAsk {
            count: n,
            milli: 1000,
        },
    })
}

/// Extended resources other than GPUs and shares (which are placed on the node's
/// inventory, not counted), in whole units rounded up.
fn extended_of(sums: &BTreeMap<String, i128>, gpu_resource: &str) -> BTreeMap<String, i64> {
    sums.iter()
        .filter(|(k, _)| {
            !matches!(k.as_str(), "cpu" | "memory" | "pods" | SHARE_RESOURCE)
                && k.as_str() != gpu_resource
        })
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| {
            (
                k.clone(),
                i64::try_from(v.div_euclid(1000) + i128::from(v.rem_euclid(1000) != 0))
                    .unwrap_or(i64::MAX),
            )
        })
        .collect()
}

/// Adds `c`'s GPU need, read as the device plugin reads it ([`need_of_container`]).
fn push_gpu(
    out: &mut Vec<ContainerDemand>,
    c: &Container,
    gpu_resource: &str,
    kind: ContainerKind,
) -> Result<(), DemandError> {
    let quantity = |resource: &str| quantity_of(c, resource);
    if let Some(need) = need_of_container(&c.name, kind, gpu_resource, quantity)? {
        out.push(ContainerDemand {
            name: need.name,
            kind,
            gpu_count: need.count,
            gpu_milli: if need.milli > 0 { need.milli } else { 1000 },
            share: need.milli > 0,
        });
    }
    Ok(())
}

/// The container's request of `resource`, else its limit (Kubernetes defaults a missing
/// request to the limit).
pub fn quantity_of<'c>(c: &'c Container, resource: &str) -> Option<&'c str> {
    let resources = c.resources.as_ref()?;
    resources
        .requests
        .as_ref()
        .and_then(|r| r.get(resource))
        .or_else(|| resources.limits.as_ref().and_then(|l| l.get(resource)))
        .map(|q| q.0.as_str())
}

/// Splits a placement's devices over the containers that use GPUs by the kubelet's rules
/// (see [`gpuplace_model::plan_containers`]): a container first reuses devices that earlier
/// regular init containers held, then takes the next fresh devices of the placement.
pub fn split_devices(
    containers: &[ContainerDemand],
    devices: &[gpuplace_model::DeviceShare],
) -> Vec<ContainerAssignment> {
    if containers.iter().any(ContainerDemand::is_share) {
        // Every container of a share pod uses the one GPU, with its own part of the share.
        return containers
            .iter()
            .map(|c| ContainerAssignment {
                name: c.name.clone(),
                devices: devices
                    .first()
                    .map(|d| gpuplace_model::DeviceShare {
                        milli: c.gpu_milli,
                        ..d.clone()
                    })
                    .into_iter()
                    .collect(),
            })
            .collect();
    }
    let needs: Vec<gpuplace_model::ContainerNeed> =
        containers.iter().map(ContainerDemand::need).collect();
    gpuplace_model::plan_containers(&needs, devices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(milli_value(&q("500m")).unwrap(), 500);
        assert_eq!(milli_value(&q("2")).unwrap(), 2000);
        assert_eq!(milli_value(&q("1.5")).unwrap(), 1500);
        assert_eq!(milli_value(&q("1Gi")).unwrap(), 1024 * 1024 * 1024 * 1000);
        assert_eq!(milli_value(&q("128974848")).unwrap(), 128_974_848_000);
        assert_eq!(milli_value(&q("129e6")).unwrap(), 129_000_000_000);
        assert_eq!(milli_value(&q("1k")).unwrap(), 1_000_000);
        assert_eq!(milli_value(&q("0.1m")).unwrap(), 1);
        assert!(milli_value(&q("ten")).is_err());
        assert!(milli_value(&q("1Xi")).is_err());
        assert!(matches!(
            milli_value(&q("-1")),
            Err(DemandError::Negative(_))
        ));
        assert!(milli_value(&q("")).is_err());
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn init_containers_count_as_kubernetes_does() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "init", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "500m", "example.com/fpga": "1"}}}
                ],
                "overhead": {"cpu": "100m"}
            }
        }));
        let d = pod_demand(&p, "nvidia.com/gpu").unwrap();
        // max(1.5 cores of apps, 4 of the init container) + 0.1 overhead.
        assert_eq!(d.request.cpu_milli, 4100);
        assert_eq!(d.request.memory_mib, 1024);
        assert_eq!(d.request.gpu_count, 2);
        assert_eq!(d.request.gpu_milli, 1000);
        assert_eq!(d.extended["example.com/fpga"], 1);
        let names: Vec<&str> = d.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["init", "a"]);
        let devices: Vec<gpuplace_model::DeviceShare> = (0..2)
            .map(|i| gpuplace_model::DeviceShare {
                index: i,
                id: format!("g{i}"),
                milli: 1000,
            })
            .collect();
        let split = split_devices(&d.containers, &devices);
        assert_eq!(split[0].devices.len(), 1);
        assert_eq!(split[1].devices.len(), 2);
    }

    #[test]
    fn shares_are_a_resource_and_bad_asks_are_named() {
        let share = |containers: serde_json::Value| {
            pod(serde_json::json!({"metadata": {"name": "p"}, "spec": containers}))
        };
        let p = share(serde_json::json!({
            "initContainers": [{"name": "i", "resources": {"limits": {"gpuplace.io/gpu-milli": "300"}}}],
            "containers": [
                {"name": "a", "resources": {"limits": {"gpuplace.io/gpu-milli": "250"}}},
                {"name": "b", "resources": {"limits": {"gpuplace.io/gpu-milli": "100"}}}
            ]
        }));
        let d = pod_demand(&p, "nvidia.com/gpu").unwrap();
        // max(250 + 100 of the apps, 300 of the init container), on one GPU.
        assert_eq!((d.request.gpu_count, d.request.gpu_milli), (1, 350));
        assert!(!d.extended.contains_key("nvidia.com/gpu"));
        let gpu = gpuplace_model::DeviceShare {
            index: 3,
            id: "g3".into(),
            milli: 350,
        };
        let split = split_devices(&d.containers, &[gpu]);
        let parts: Vec<(String, u32)> = split
            .iter()
            .map(|c| (c.devices[0].id.clone(), c.devices[0].milli))
            .collect();
        assert_eq!(
            parts,
            vec![("g3".into(), 300), ("g3".into(), 250), ("g3".into(), 100)]
        );
        let mixed = share(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"gpuplace.io/gpu-milli": "250", "nvidia.com/gpu": "1"}}}
        ]}));
        assert!(matches!(
            pod_demand(&mixed, "nvidia.com/gpu"),
            Err(DemandError::MixedShare { .. })
        ));
        let mixed = share(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"gpuplace.io/gpu-milli": "250"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]}));
        assert!(matches!(
            pod_demand(&mixed, "nvidia.com/gpu"),
            Err(DemandError::MixedPod { .. })
        ));
        let big = share(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"gpuplace.io/gpu-milli": "700"}}},
            {"name": "b", "resources": {"limits": {"gpuplace.io/gpu-milli": "700"}}}
        ]}));
        assert_eq!(
            pod_demand(&big, "nvidia.com/gpu").unwrap_err().to_string(),
            "the pod's gpuplace.io/gpu-milli totals 1400 (counted as Kubernetes counts requests); a share is of one GPU, at most 1000"
        );
        let old = pod(serde_json::json!({
            "metadata": {"name": "p", "annotations": {"gpuplace.io/gpu-milli": "250"}},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }));
        let e = pod_demand(&old, "nvidia.com/gpu").unwrap_err().to_string();
        let claimed = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}],
                     "containers": [{"name": "a", "resources": {"claims": [{"name": "gpu"}]}}]}
        }));
        let demand = pod_demand(&claimed, "nvidia.com/gpu").unwrap();
        assert_eq!(
            demand.request.gpu_count, 0,
            "a claim pod's GPUs come from its claims"
        );
        assert!(
            e.starts_with("annotation gpuplace.io/gpu-milli: \"250\": a share is asked as the container resource gpuplace.io/gpu-milli"),
            "{e}"
        );
        assert!(
            Assignment::from_json("{\"node\": 1}")
                .unwrap_err()
                .to_string()
                .starts_with("annotation gpuplace.io/assignment")
        );
    }
}
