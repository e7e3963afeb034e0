//! Queues: the `queues.gpuplace.io` CRD (cluster-scoped) and how a pod finds its queue.
//!
//! A pod's queue is its label `gpuplace.io/queue`, else its namespace's annotation
//! `gpuplace.io/default-queue`, else `default` (which exists without an object: open, no
//! guarantee, no limit). Resource lists count `nvidia.com/gpu` in GPUs (a share as a
//! fraction: `"0.5"`, `500m`), `nvidia.com/gpu.<model>` for GPUs of one model, `cpu` and
//! `memory`, written as Kubernetes quantities.

use std::collections::BTreeMap;

use gpuplace_core::fairshare::{
    AmountError, AmountRules, Bounds, QueueSpec as CoreSpec, read_bounds,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::gang::PodGroupCondition as QueueCondition;

/// The pod label naming its queue.
pub const QUEUE_LABEL: &str = "gpuplace.io/queue";
/// The namespace annotation naming its pods' queue when they name none.
pub const DEFAULT_QUEUE_ANNOTATION: &str = "gpuplace.io/default-queue";

/// A queue of a tree of queues sharing the cluster's GPUs.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpuplace.io",
    version = "v1alpha1",
    kind = "Queue",
    status = "QueueStatus",
    shortname = "gq",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent"}"#,
    printcolumn = r#"{"name":"Guaranteed","type":"string","jsonPath":".status.guaranteedGPUs"}"#,
    printcolumn = r#"{"name":"Limit","type":"string","jsonPath":".status.limitGPUs"}"#,
    printcolumn = r#"{"name":"Allocated","type":"string","jsonPath":".status.allocatedGPUs"}"#,
    printcolumn = r#"{"name":"Fair share","type":"string","jsonPath":".status.fairShareGPUs"}"#,
    printcolumn = r#"{"name":"Decayed use","type":"string","jsonPath":".status.usage.decayedGPUs"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingPods"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// The parent queue (none: under the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What the queue gets whenever its pods ask for it (reclaimed from queues above
    /// theirs if need be).
    #[serde(default)]
    #[schemars(schema_with = "amounts_schema")]
    pub guaranteed: BTreeMap<String, serde_json::Value>,
    /// What the queue and everything under it never goes past.
    #[serde(default)]
    #[schemars(schema_with = "amounts_schema")]
    pub limit: BTreeMap<String, serde_json::Value>,
    /// Its part of what nobody is guaranteed, against its siblings' (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Whether its pods above its guarantee may be preempted for other queues (default
    /// true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimable: Option<bool>,
    /// How fast the queue's usage over time fades, for it and the queues under it that set
    /// none (a duration: `1h`, `30m`, `1h30m`; `0`: fair order by the allocation now). The
    /// scheduler's `--usage-half-life` where no queue on the path sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_half_life: Option<String>,
}

fn amounts_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]
        }
    })
}

/// What the scheduler last saw of a queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// What its pods and its children's hold (quantities).
    #[serde(default)]
    pub allocated: BTreeMap<String, String>,
    /// What its waiting pods ask for.
    #[serde(default)]
    pub pending: BTreeMap<String, String>,
    /// Its fair share now (guarantee, then its weight's part of the rest, as far as asked).
    #[serde(default)]
    pub fair_share: BTreeMap<String, String>,
    /// What it holds above its guarantee (reclaimable when the queue is).
    #[serde(default)]
    pub borrowed: BTreeMap<String, String>,
    #[serde(default)]
    pub pending_pods: u32,
    /// GPUs as printed by `kubectl get queues`.
    #[serde(default)]
    #[serde(rename = "guaranteedGPUs")]
    pub guaranteed_gpus: String,
    #[serde(default)]
    #[serde(rename = "limitGPUs")]
    pub limit_gpus: String,
    #[serde(default)]
    #[serde(rename = "allocatedGPUs")]
    pub allocated_gpus: String,
    #[serde(default)]
    #[serde(rename = "fairShareGPUs")]
    pub fair_share_gpus: String,
    /// Its usage over time (when it keeps any), as of `usage.updated`: the scheduler's one
    /// record of it, read back after a restart or a change of leader. Written `null` when
    /// the queue keeps none (the status is merged: a field left out would stay).
    #[serde(default)]
    pub usage: Option<QueueUsage>,
    /// `Valid`: `True`, or `False` with why the queue serves no pod; `UsageHalfLife`
    /// (when the spec sets one): `False` with why it was refused (the last valid one is
    /// kept).
    #[serde(default)]
    pub conditions: Vec<QueueCondition>,
}

/// A queue's usage over time, decayed with its half-life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueUsage {
    /// The half-life it decays with (`1h`).
    pub half_life: String,
    /// When these figures were taken (RFC 3339, milliseconds).
    pub updated: String,
    /// Decayed GPU-seconds, CPU-seconds and MiB-seconds of it and the queues under it.
    #[serde(rename = "gpuSeconds")]
    pub gpu_seconds: f64,
    pub cpu_seconds: f64,
    #[serde(rename = "memoryMiBSeconds")]
    pub memory_mib_seconds: f64,
    /// What it held at that time (GPUs, CPUs, MiB): a scheduler that reads this back
    /// assumes the allocation went evenly from it to what it finds.
    #[serde(default, rename = "heldGPUs")]
    pub held_gpus: f64,
    #[serde(default, rename = "heldCPUs")]
    pub held_cpus: f64,
    #[serde(default, rename = "heldMemoryMiB")]
    pub held_memory_mib: f64,
    /// The GPUs it held on average over the recent past (decayed mean), as printed.
    #[serde(rename = "decayedGPUs")]
    pub decayed_gpus: String,
}

/// The scheduler writes finite figures only (a NaN read from a hand-written status is
/// never equal to itself, which costs one status write, no more).
impl Eq for QueueUsage {}

/// Why a queue's spec cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueSpecError {
    #[error(
        "{field}: unknown resource {resource:?}; a queue counts nvidia.com/gpu, nvidia.com/gpu.<model>, cpu and memory"
    )]
    UnknownResource {
        field: &'static str,
        resource: String,
    },
    #[error("{field}.{resource}: {value} is not a quantity")]
    Quantity {
        field: &'static str,
        resource: String,
        value: String,
    },
}

/// What `spec` says, as core's queue (`gpu_resource`: the scheduler's GPU resource name,
/// accepted beside `nvidia.com/gpu`).
pub fn core_spec(
    name: &str,
    spec: &QueueSpec,
    gpu_resource: &str,
) -> Result<CoreSpec, QueueSpecError> {
    Ok(CoreSpec {
        name: name.to_string(),
        parent: spec.parent.clone().filter(|p| !p.is_empty()),
        guaranteed: bounds(&spec.guaranteed, "guaranteed", gpu_resource)?,
        limit: bounds(&spec.limit, "limit", gpu_resource)?,
        weight: spec.weight.unwrap_or(1.0),
        reclaimable: spec.reclaimable.unwrap_or(true),
        // Checked apart (a bad one is refused without stopping the queue): see
        // `half_life`.
        usage_half_life_ms: None,
    })
}

/// The half-life `spec` sets (`None`: none set).
pub fn half_life(spec: &QueueSpec) -> Result<Option<u64>, gpuplace_core::fairshare::HalfLifeError> {
    spec.usage_half_life
        .as_deref()
        .map(gpuplace_core::fairshare::parse_half_life)
        .transpose()
}

fn bounds(
    list: &BTreeMap<String, serde_json::Value>,
    field: &'static str,
    gpu_resource: &str,
) -> Result<Bounds, QueueSpecError> {
    let texts: Vec<(&str, String)> = list
        .iter()
        .map(|(resource, value)| {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (resource.as_str(), text)
        })
        .collect();
    let rules = AmountRules {
        gpu_resource,
        capacity: None,
    };
    read_bounds(texts.iter().map(|(r, t)| (*r, t.as_str())), rules).map_err(|e| match e {
        AmountError::Resource { resource } => QueueSpecError::UnknownResource { field, resource },
        AmountError::Amount {
            resource, value, ..
        } => QueueSpecError::Quantity {
            field,
            resource,
            value,
        },
    })
}

/// The queue a pod asks for: its label, else its namespace's default, else `default`.
pub fn queue_name<'a>(
    labels: &'a BTreeMap<String, String>,
    namespace_default: Option<&'a str>,
) -> &'a str {
    labels
        .get(QUEUE_LABEL)
        .map(String::as_str)
        .filter(|q| !q.is_empty())
        .or(namespace_default.filter(|q| !q.is_empty()))
        .unwrap_or(gpuplace_core::fairshare::DEFAULT_QUEUE)
}

/// The CRD manifest as YAML-compatible JSON (`gpuplace crd` prints it beside the PodGroup).
pub fn crd_json() -> serde_json::Value {
    use kube::CustomResourceExt;
    serde_json::to_value(Queue::crd()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> QueueSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_quantities_models_and_defaults() {
        let s = spec(serde_json::json!({
            "parent": "org",
            "guaranteed": {"nvidia.com/gpu": "4", "cpu": 32, "memory": "64Gi"},
            "limit": {"nvidia.com/gpu": "8.5", "nvidia.com/gpu.A100": "2"}
        }));
        let c = core_spec("team-a", &s, "nvidia.com/gpu").unwrap();
        assert_eq!(c.parent.as_deref(), Some("org"));
        assert_eq!(c.guaranteed.dims, [Some(4000), Some(32_000), Some(65_536)]);
        assert_eq!(c.limit.dims[0], Some(8500));
        assert_eq!(c.limit.models, vec![("A100".to_string(), 2000)]);
        assert_eq!(c.weight, 1.0);
        assert!(c.reclaimable);
    }

    #[test]
    fn bad_lists_are_named() {
        let s = spec(serde_json::json!({"guaranteed": {"nvidia.com/gpus": "4"}}));
        assert_eq!(
            core_spec("q", &s, "nvidia.com/gpu")
                .unwrap_err()
                .to_string(),
            "guaranteed: unknown resource \"nvidia.com/gpus\"; a queue counts nvidia.com/gpu, nvidia.com/gpu.<model>, cpu and memory"
        );
        let s = spec(serde_json::json!({"limit": {"cpu": "lots"}}));
        assert_eq!(
            core_spec("q", &s, "nvidia.com/gpu")
                .unwrap_err()
                .to_string(),
            "limit.cpu: lots is not a quantity"
        );
        let s = spec(serde_json::json!({"limit": {"cpu": "-2"}}));
        assert!(core_spec("q", &s, "nvidia.com/gpu").is_err());
    }

    #[test]
    fn a_pod_finds_its_queue() {
        let mut labels = BTreeMap::new();
        assert_eq!(queue_name(&labels, None), "default");
        assert_eq!(queue_name(&labels, Some("ns-q")), "ns-q");
        labels.insert(QUEUE_LABEL.to_string(), "team-a".to_string());
        assert_eq!(queue_name(&labels, Some("ns-q")), "team-a");
    }

    #[test]
    fn crd_is_cluster_scoped_with_columns() {
        let crd = crd_json();
        assert_eq!(crd["metadata"]["name"], "queues.gpuplace.io");
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let v = &crd["spec"]["versions"][0];
        assert!(v["additionalPrinterColumns"].as_array().unwrap().len() >= 6);
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(
            spec["guaranteed"]["additionalProperties"]["x-kubernetes-int-or-string"],
            true
        );
    }
}
