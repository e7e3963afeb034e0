//! Helpers shared by the scheduler's end-to-end tests on the in-memory API.
#![allow(dead_code)]

use std::collections::HashMap;

use gpuplace_core::Policy;
use gpuplace_model::{Link, NodeInventory, PcieLevel};
use gpuplace_scheduler::SchedulerConfig;
use gpuplace_scheduler::k8s::demand::{ASSIGNMENT_ANNOTATION, Assignment};
use gpuplace_scheduler::k8s::gang::{PodGroup, PodGroupSpec};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

pub fn node(name: &str, gpus: u32, extra: serde_json::Value) -> Node {
    let mut v = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": gpus.to_string(),
                "gpuplace.io/gpu-milli": (gpus * 1000).to_string(), "pods": "110"}
        }
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
        for (k, v) in b {
            match a.get_mut(&k) {
                Some(e) if e.is_object() && v.is_object() => merge(e, v),
                _ => {
                    a.insert(k, v);
                }
            }
        }
    }
}

/// An 8-GPU node whose inventory annotation has NVLink pairs (0-1, 2-3, ...).
pub fn nvlink_node(name: &str) -> Node {
    linked_node(name, 2)
}

/// An 8-GPU A100 node whose GPUs are linked by NVLink in groups of `group` (0-1, 2-3... for
/// 2; 0-3, 4-7 for 4).
pub fn linked_node(name: &str, group: u32) -> Node {
    let mut inv = NodeInventory::uniform(name, 0, 0, 8, "A100");
    for g in &mut inv.gpus {
        g.id = format!("GPU-{name}-{}", g.index);
        g.uuid = g.id.clone();
    }
    for a in 0..8u32 {
        for b in a + 1..8 {
            inv.links.push(Link {
                a,
                b,
                nvlinks: if a / group == b / group { 12 } else { 0 },
                pcie: if a / 4 == b / 4 {
                    PcieLevel::SameCpu
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    node(
        name,
        8,
        json!({"metadata": {"annotations": {"gpuplace.io/inventory": inv.to_json()}}}),
    )
}

pub fn pod(name: &str, gpus: u32, extra: serde_json::Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "schedulerName": "gpuplace",
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]
        },
        "status": {"phase": "Pending"}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

/// The `extra` of [`pod`] for a share of one GPU: its one container asks
/// `gpuplace.io/gpu-milli: milli` instead of whole GPUs.
pub fn share(milli: &str) -> serde_json::Value {
    json!({"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"gpuplace.io/gpu-milli": milli}}}]}})
}

pub fn config() -> SchedulerConfig {
    SchedulerConfig {
        policy: Policy::Fgd,
        ..Default::default()
    }
}

pub fn assignment(api: &MemoryApi, name: &str) -> Option<Assignment> {
    let p = api.pod("ml", name)?;
    let text = p.metadata.annotations?.get(ASSIGNMENT_ANNOTATION)?.clone();
    Some(Assignment::from_json(&text).unwrap())
}

pub fn bound_node(api: &MemoryApi, name: &str) -> Option<String> {
    api.pod("ml", name)?.spec?.node_name
}

/// No device is given more than 1000 milli across all bound pods.
pub fn assert_no_double_booking(api: &MemoryApi) {
    let mut used: HashMap<(String, String), u32> = HashMap::new();
    for p in api.pods() {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Some(text) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
        else {
            continue;
        };
        let a = Assignment::from_json(text).unwrap();
        assert_eq!(a.node, node, "assignment and binding agree");
        let mut seen = std::collections::HashSet::new();
        for d in a.devices() {
            if seen.insert(d.id.clone()) {
                *used.entry((node.clone(), d.id.clone())).or_default() += d.milli;
            }
        }
    }
    for ((node, dev), milli) in used {
        assert!(milli <= 1000, "{node}/{dev} booked {milli} milli");
    }
}

pub fn group(name: &str, min: u32, timeout: u64) -> PodGroup {
    let mut g = PodGroup::new(
        name,
        PodGroupSpec {
            min_member: min,
            schedule_timeout_seconds: Some(timeout),
            topology_key: None,
        },
    );
    g.metadata.namespace = Some("ml".into());
    g
}

/// A number from the environment (the stresses' size and seed), else `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The stresses' API server: 2 ms a request, 32 in flight, watch events 0-2 s late, 3% each
/// of 409s, 500s and time-outs (drawn from `seed`), with `nodes` NVLink nodes `n000`...
pub fn faulty_api(seed: u64, nodes: usize) -> MemoryApi {
    use gpuplace_testkit::api::{Faults, ServerCosts};
    let api = MemoryApi::new().with_costs(ServerCosts {
        latency: std::time::Duration::from_millis(2),
        max_in_flight: 32,
        watch_delay: (std::time::Duration::ZERO, std::time::Duration::from_secs(2)),
        faults: Faults {
            conflict: 0.03,
            error: 0.03,
            timeout: 0.03,
        },
        seed,
    });
    for i in 0..nodes {
        api.put_node(nvlink_node(&format!("n{i:03}")));
    }
    api
}

/// Pods whose name starts with `prefix`, bound and not being deleted.
pub fn bound_count(api: &MemoryApi, prefix: &str) -> usize {
    api.pods()
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count()
}

/// kube-scheduler's part of a FailedScheduling message (what precedes the scheduler's own
/// segments: ` | blocked by: ...`).
pub fn kube_part(message: &str) -> String {
    gpuplace_core::waiting::Waiting::parse(message).message
}

/// The latest FailedScheduling message of pod `name`.
pub fn last_message(api: &MemoryApi, name: &str) -> String {
    api.events()
        .into_iter()
        .rev()
        .find(|e| e.pod.name == name && e.reason == "FailedScheduling")
        .map(|e| e.message)
        .unwrap_or_default()
}
