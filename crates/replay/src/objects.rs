//! The Kubernetes objects of a replay, each labelled [`MANAGED_BY`](crate::MANAGED_BY):
//! fake Nodes (as KWOK makes them: capacity, allocatable, gpuplace's inventory annotation
//! and a Ready condition, no kubelet), Pods, Queues and PodGroups.

use std::collections::BTreeMap;

use gpuplace_model::keys::{
    GPU_PRODUCT_LABEL, GPU_RESOURCE, INVENTORY_ANNOTATION, MODEL_ANNOTATION, POD_GROUP_LABEL,
    SHARE_RESOURCE, TOPOLOGY_ANNOTATION, TOPOLOGY_PREFERENCE_ANNOTATION,
};
use gpuplace_model::{GpuTopology, NodeInventory, Request};
use gpuplace_scheduler::k8s::gang::{PodGroup, PodGroupSpec};
use gpuplace_scheduler::k8s::queue::{Queue, QueueSpec};
use gpuplace_sim::timeline::tenants::TenantQueue;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use crate::labels::{MANAGED_BY, MANAGED_BY_VALUE, RUN_LABEL};
use crate::plan::PlannedPod;
use crate::pod_base::PodBase;

/// The label that marks a replay's fake nodes.
pub const FAKE_NODE_LABEL: &str = "gpuplace.io/replay-fake-node";
/// The taint every fake node carries (`NoSchedule`): no kubelet runs there, so nothing
/// but the replay's pods, which tolerate it, may land on one (a DaemonSet's pods or a
/// shared cluster's pending pods would otherwise be bound to a node that never runs them).
pub const FAKE_NODE_TAINT: &str = "gpuplace.io/replay-fake-node";
pub use crate::labels::PLANNED_LABEL;
/// The most pods a fake node takes (the kubelet's `maxPods` is 110 by default; trace nodes
/// run more small pods than that).
const FAKE_NODE_PODS: u32 = 250;

/// An object that could not be made from its input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    #[error("queue {queue}: {field}.{resource}: {value} is not a quantity or a percent")]
    Amount {
        queue: String,
        field: &'static str,
        resource: String,
        value: String,
    },
    #[error("{0}")]
    Build(String),
}

/// The labels of everything run `run` makes.
pub fn run_labels(run: &str) -> BTreeMap<String, String> {
    [
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (RUN_LABEL.to_string(), run.to_string()),
    ]
    .into()
}

/// A fake node for `inventory`, named `name`: allocatable CPU and memory as the trace's
/// node, its GPUs whole (`nvidia.com/gpu`) and as shares (`gpuplace.io/gpu-milli`).
pub fn fake_node(run: &str, name: &str, inventory: &NodeInventory) -> Result<Node, ObjectError> {
    let mut inventory = inventory.clone();
    inventory.name = name.to_string();
    for (i, g) in inventory.gpus.iter_mut().enumerate() {
        g.id = format!("{name}-gpu{i}");
    }
    let gpus = inventory.gpus.iter().filter(|g| g.healthy).count();
    let resources = json!({
        "cpu": format!("{}m", inventory.cpu_milli),
        "memory": format!("{}Mi", inventory.memory_mib),
        "pods": FAKE_NODE_PODS.to_string(),
        GPU_RESOURCE: gpus.to_string(),
        SHARE_RESOURCE: (gpus * 1000).to_string(),
    });
    let mut labels = run_labels(run);
    labels.insert("kubernetes.io/hostname".into(), name.into());
    labels.insert(FAKE_NODE_LABEL.into(), "true".into());
    if let Some(g) = inventory.gpus.first() {
        labels.insert(GPU_PRODUCT_LABEL.into(), label_value(&g.model));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels,
            "annotations": {INVENTORY_ANNOTATION: inventory.to_json()}},
        "spec": {"taints": [fake_node_taint()]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "gpuplace replay: a fake node (no kubelet)"}]
        }
    }))
    .map_err(|e| ObjectError::Build(format!("node {name}: {e}")))
}

/// The taint of a fake node, as the Node's `spec.taints` holds it.
pub fn fake_node_taint() -> serde_json::Value {
    json!({"key": FAKE_NODE_TAINT, "value": "true", "effect": "NoSchedule"})
}

/// A label value from free text: at most 63 of its letters, digits, '-', '_' and '.'.
fn label_value(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// How pods are made.
#[derive(Clone, Debug)]
pub struct PodTemplate {
    /// The replay's run (its label).
    pub run: String,
    pub namespace: String,
    pub scheduler_name: String,
    /// The PriorityClass of each trace priority (0, 1, 2), when given.
    pub priority_classes: Option<[String; 3]>,
    /// The cluster's own pod template (tolerations, node selector, image...), if any.
    pub base: PodBase,
    /// GPUs through DRA: each pod claims them from its shape's ResourceClaimTemplate
    /// (the `claims` module) instead of asking the device plugin's resources.
    pub dra: bool,
}

/// The pod of `planned` (named `name`: a controller's new pod has its own) asking
/// `request`: CPU and memory requests, whole GPUs as `nvidia.com/gpu`, a share as
/// `gpuplace.io/gpu-milli`, models as `gpuplace.io/gpu-model`.
pub fn pod(
    template: &PodTemplate,
    planned: &PlannedPod,
    name: &str,
    request: &Request,
) -> Result<Pod, ObjectError> {
    let mut limits = serde_json::Map::new();
    let claims = template.dra && request.gpu_count > 0;
    if request.gpu_count > 0 && !claims {
        if request.gpu_milli < 1000 {
            limits.insert(SHARE_RESOURCE.into(), json!(request.gpu_milli.to_string()));
        } else {
            limits.insert(GPU_RESOURCE.into(), json!(request.gpu_count.to_string()));
        }
    }
    let mut labels = run_labels(&template.run);
    labels.insert(PLANNED_LABEL.into(), planned.name.clone());
    if let Some(q) = &planned.queue {
        labels.insert("gpuplace.io/queue".into(), q.clone());
    }
    if let Some(g) = &planned.gang {
        labels.insert(POD_GROUP_LABEL.into(), g.name.clone());
    }
    let mut annotations = serde_json::Map::new();
    if !request.allowed_models.is_empty() && !claims {
        annotations.insert(
            MODEL_ANNOTATION.into(),
            json!(request.allowed_models.join(",")),
        );
    }
    // How the GPUs must be linked: a claim's matchAttribute constraint with claims.
    if request.need.topology != GpuTopology::Any && !claims {
        annotations.insert(
            TOPOLOGY_ANNOTATION.into(),
            json!(request.need.topology.name()),
        );
    }
    if request.need.prefer != GpuTopology::Any {
        annotations.insert(
            TOPOLOGY_PREFERENCE_ANNOTATION.into(),
            json!(request.need.prefer.name()),
        );
    }
    let mut spec = serde_json::Map::new();
    spec.insert("schedulerName".into(), json!(template.scheduler_name));
    spec.insert("restartPolicy".into(), json!("Never"));
    // Fake nodes are tainted so that nothing else lands there; the replay's pods may.
    spec.insert(
        "tolerations".into(),
        json!([{"key": FAKE_NODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]),
    );
    let mut resources = json!({"requests": {"cpu": format!("{}m", request.cpu_milli),
        "memory": format!("{}Mi", request.memory_mib)}, "limits": limits});
    if claims {
        let claim = POD_CLAIM;
        resources["claims"] = json!([{"name": claim}]);
        spec.insert(
            "resourceClaims".into(),
            json!([{"name": claim,
                "resourceClaimTemplateName": template_name(request)}]),
        );
    }
    spec.insert(
        "containers".into(),
        json!([{"name": "main", "image": "registry.k8s.io/pause:3.9", "resources": resources}]),
    );
    if let Some(classes) = &template.priority_classes {
        let class = &classes[planned.priority.clamp(0, 2) as usize];
        spec.insert("priorityClassName".into(), json!(class));
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), json!(template.namespace));
    metadata.insert("labels".into(), json!(labels));
    metadata.insert("annotations".into(), json!(annotations));
    serde_json::from_value(template.base.fill(metadata, spec))
        .map_err(|e| ObjectError::Build(format!("pod {name}: {e}")))
}

/// The name a pod's claim has in its spec (and its container's `resources.claims`), with
/// `--dra` (the `claims` module).
pub const POD_CLAIM: &str = "gpu";

/// The template of the pods asking `request` (one per shape): `gpus-<n>` or
/// `share-<milli>`, with `-<topology>` for GPUs that must be linked so (`-nvlink`,
/// `-pcie-switch`, `-numa`) and `-m<hash>` for a list of allowed models.
pub fn template_name(request: &Request) -> String {
    let mut name = if request.gpu_milli < 1000 {
        format!("share-{}", request.gpu_milli)
    } else {
        format!("gpus-{}", request.gpu_count)
    };
    if request.need.topology != gpuplace_model::GpuTopology::Any {
        name.push_str(&format!("-{}", request.need.topology.name()));
    }
    if !request.allowed_models.is_empty() {
        name.push_str(&format!("-m{:08x}", models_hash(&request.allowed_models)));
    }
    name
}

/// FNV-1a of the models, in order: a stable short name for a list of any length.
fn models_hash(models: &[String]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in models.join(",").bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The PodGroup of a gang: every member must fit at once.
pub fn pod_group(run: &str, namespace: &str, name: &str, members: u32) -> PodGroup {
    let mut group = PodGroup::new(
        name,
        PodGroupSpec {
            min_member: members,
            schedule_timeout_seconds: None,
            topology_key: None,
        },
    );
    group.metadata.namespace = Some(namespace.to_string());
    group.metadata.labels = Some(run_labels(run));
    group
}

/// The Queue of a tenants file's queue; percents of the cluster are turned into amounts
/// (`capacity`: GPU milli, CPU milli, memory MiB).
pub fn queue(run: &str, q: &TenantQueue, capacity: [u64; 3]) -> Result<Queue, ObjectError> {
    let resolve = |field: &'static str, map: &BTreeMap<String, serde_json::Value>| {
        map.iter()
            .map(|(resource, value)| {
                resolve_amount(resource, value, capacity)
                    .map(|v| (resource.clone(), v))
                    .ok_or_else(|| ObjectError::Amount {
                        queue: q.name.clone(),
                        field,
                        resource: resource.clone(),
                        value: value.to_string(),
                    })
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
    };
    let mut queue = Queue::new(
        &q.name,
        QueueSpec {
            parent: q.parent.clone(),
            guaranteed: resolve("guaranteed", &q.guaranteed)?,
            limit: resolve("limit", &q.limit)?,
            weight: q.weight,
            reclaimable: q.reclaimable,
            usage_half_life: q.usage_half_life.clone(),
        },
    );
    queue.metadata.labels = Some(run_labels(run));
    Ok(queue)
}

/// An amount as the Queue takes it: quantities as they are, a percent of the cluster's
/// capacity of that resource as a quantity.
fn resolve_amount(
    resource: &str,
    value: &serde_json::Value,
    capacity: [u64; 3],
) -> Option<serde_json::Value> {
    let Some(text) = value.as_str() else {
        return value.is_number().then(|| value.clone());
    };
    let Some(percent) = text.strip_suffix('%') else {
        return Some(value.clone());
    };
    let share = percent.trim().parse::<f64>().ok()? / 100.0;
    if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
        return None;
    }
    let amount = if resource == "cpu" {
        format!("{}m", (capacity[1] as f64 * share).floor() as u64)
    } else if resource == "memory" {
        format!("{}Mi", (capacity[2] as f64 * share).floor() as u64)
    } else if resource.starts_with(GPU_RESOURCE) {
        format!("{}", (capacity[0] as f64 * share / 1000.0).floor() as u64)
    } else {
        return None;
    };
    Some(json!(amount))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned() -> PlannedPod {
        PlannedPod {
            name: "rp1-000001-0".into(),
            pod: 0,
            unit: 1,
            arrival_ms: 0,
            run_ms: 10,
            full_ms: 10,
            measured: true,
            warm: false,
            queue: Some("team-a".into()),
            gang: None,
            priority: 2,
        }
    }

    fn request(count: u32, milli: u32) -> Request {
        Request {
            cpu_milli: 4000,
            memory_mib: 8192,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: vec!["A100".into()],
            need: Default::default(),
        }
    }

    #[test]
    fn pods_ask_whole_gpus_or_a_share_and_carry_the_replays_labels() {
        let template = PodTemplate {
            run: "rp1-x".into(),
            namespace: "default".into(),
            scheduler_name: "gpuplace".into(),
            priority_classes: Some(["be".into(), "burst".into(), "ls".into()]),
            base: PodBase::default(),
            dra: false,
        };
        let whole = pod(&template, &planned(), "rp1-000001-0", &request(2, 1000)).expect("pod");
        let spec = whole.spec.expect("spec");
        let limits = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits[GPU_RESOURCE].0, "2");
        assert_eq!(spec.priority_class_name.as_deref(), Some("ls"));
        let labels = whole.metadata.labels.expect("labels");
        assert_eq!(labels[MANAGED_BY], MANAGED_BY_VALUE);
        assert_eq!(labels[RUN_LABEL], "rp1-x");
        assert_eq!(labels["gpuplace.io/queue"], "team-a");
        let share = pod(&template, &planned(), "x", &request(1, 300)).expect("pod");
        let limits = share.spec.expect("spec").containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits[SHARE_RESOURCE].0, "300");
        assert!(!limits.contains_key(GPU_RESOURCE));
    }

    #[test]
    fn pods_are_made_from_the_clusters_template() {
        let base = PodBase::parse(
            "metadata: {labels: {team: ml}}\nspec:\n  tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n  containers: [{name: app, image: mirror.local/pause:3.9}]\n",
        )
        .expect("template");
        let template = PodTemplate {
            run: "rp1-x".into(),
            namespace: "ml".into(),
            scheduler_name: "default-scheduler".into(),
            priority_classes: None,
            base,
            dra: false,
        };
        let made = pod(&template, &planned(), "rp1-000001-0", &request(2, 1000)).expect("pod");
        assert_eq!(made.metadata.namespace.as_deref(), Some("ml"));
        let labels = made.metadata.labels.expect("labels");
        assert_eq!(labels["team"], "ml");
        assert_eq!(labels[RUN_LABEL], "rp1-x");
        assert_eq!(labels["gpuplace.io/queue"], "team-a");
        let spec = made.spec.expect("spec");
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        // The template's toleration, then the replay's own for its fake nodes' taint.
        let tolerations = spec.tolerations.expect("tolerations");
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[1].key.as_deref(), Some(FAKE_NODE_TAINT));
        assert_eq!(tolerations[1].effect.as_deref(), Some("NoSchedule"));
        let c = &spec.containers[0];
        assert_eq!(
            (c.name.as_str(), c.image.as_deref()),
            ("app", Some("mirror.local/pause:3.9"))
        );
        let limits = c.resources.as_ref().and_then(|r| r.limits.clone());
        assert_eq!(limits.expect("limits")[GPU_RESOURCE].0, "2");
    }

    #[test]
    fn fake_nodes_hold_the_inventory_and_are_ready() {
        let inv = NodeInventory::uniform("openb-node-0001", 96_000, 786_432, 8, "A100 SXM4");
        let node = fake_node("rp1-x", "rp1-n0001", &inv).expect("node");
        let status = node.status.expect("status");
        let allocatable = status.allocatable.expect("allocatable");
        assert_eq!(allocatable[GPU_RESOURCE].0, "8");
        assert_eq!(allocatable[SHARE_RESOURCE].0, "8000");
        assert_eq!(allocatable["cpu"].0, "96000m");
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels[GPU_PRODUCT_LABEL], "A100-SXM4");
        let annotation = &node.metadata.annotations.expect("annotations")[INVENTORY_ANNOTATION];
        let back = NodeInventory::from_json(annotation).expect("inventory");
        assert_eq!(back.name, "rp1-n0001");
        assert_eq!(back.gpus[3].id, "rp1-n0001-gpu3");
        // Tainted: nothing but the replay's pods (which tolerate it) lands there.
        let taints = node.spec.and_then(|s| s.taints).expect("taints");
        assert_eq!(taints.len(), 1);
        assert_eq!(
            (taints[0].key.as_str(), taints[0].effect.as_str()),
            (FAKE_NODE_TAINT, "NoSchedule")
        );
    }

    #[test]
    fn queue_percents_become_amounts() {
        let q = TenantQueue {
            name: "a".into(),
            parent: None,
            guaranteed: [("nvidia.com/gpu".to_string(), json!("25%"))].into(),
            limit: [
                ("cpu".to_string(), json!("50%")),
                ("memory".to_string(), json!("64Gi")),
            ]
            .into(),
            weight: Some(2.0),
            reclaimable: None,
            usage_half_life: None,
        };
        let made = queue("rp1-x", &q, [16_000, 512_000, 1_000_000]).expect("queue");
        assert_eq!(made.spec.guaranteed["nvidia.com/gpu"], json!("4"));
        assert_eq!(made.spec.limit["cpu"], json!("256000m"));
        assert_eq!(made.spec.limit["memory"], json!("64Gi"));
        let bad = TenantQueue {
            guaranteed: [("nvidia.com/gpu".to_string(), json!("150%"))].into(),
            ..q
        };
        assert!(matches!(
            queue("rp1-x", &bad, [16_000, 1, 1]),
            Err(ObjectError::Amount { .. })
        ));
    }
}
