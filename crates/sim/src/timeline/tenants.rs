//! Tenants in the timeline replay: the trace's pods shared among queues (core's
//! [`gpuplace_core::fairshare`], the same arithmetic the scheduler runs), from a tenants
//! file (`--tenants`):
//!
//! ```yaml
//! queues:
//!   - {name: research, guaranteed: {nvidia.com/gpu: "40%"}, weight: 2}
//!   - {name: prod, guaranteed: {nvidia.com/gpu: "30%"}, reclaimable: false}
//!   - {name: batch, limit: {nvidia.com/gpu: "50%"}, usageHalfLife: 1h}
//! assign:
//!   by: hash            # hash | qos | shape
//!   shares: {research: 0.5, prod: 0.2, batch: 0.3}
//! ```
//!
//! Amounts are quantities (`"16"`, `"0.5"`, `500m`; memory `64Gi`) or a percent of the
//! cluster's capacity. Pods go to queues by a hash of their name (`shares`), by their qos
//! class (`classes: {LS: prod, BE: batch}`, `default: research`), or by shape (`rules`:
//! the first of `{minGpus, maxGpus, share, queue}` that matches, else `default`).
//! `usageHalfLife` (a duration; `--usage-half-life` for queues that set none) orders the
//! queues by their usage over time ([`gpuplace_core::fairshare::Ledger`]) as the
//! scheduler's Queue objects do.

use std::collections::BTreeMap;

use gpuplace_core::fairshare::{
    AmountError, AmountRules, Bounds, DIMS, QueueSpec, QueueTree, parse_half_life, read_bounds,
};
use gpuplace_model::Request;
use serde::Deserialize;

use crate::trace::{TracePod, name_hash, qos_priority};

/// A tenants file as written.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantsFile {
    pub queues: Vec<TenantQueue>,
    pub assign: Assign,
}

/// One queue of a tenants file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantQueue {
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub guaranteed: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub limit: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub weight: Option<f64>,
    #[serde(default)]
    pub reclaimable: Option<bool>,
    /// How fast its usage over time fades (`1h`, `30m`, `0`: none), for it and the queues
    /// under it that set none.
    #[serde(default)]
    pub usage_half_life: Option<String>,
}

/// How pods are given to queues.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "by", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Assign {
    /// By a hash of the pod's name, in these proportions.
    Hash { shares: BTreeMap<String, f64> },
    /// By the pod's qos class.
    Qos {
        classes: BTreeMap<String, String>,
        default: String,
    },
    /// By the pod's shape.
    Shape {
        rules: Vec<ShapeRule>,
        default: String,
    },
}

/// A shape rule: every condition given must hold.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShapeRule {
    #[serde(default)]
    pub min_gpus: Option<u32>,
    #[serde(default)]
    pub max_gpus: Option<u32>,
    /// A share of one GPU (true) or whole GPUs (false).
    #[serde(default)]
    pub share: Option<bool>,
    pub queue: String,
}

/// Why a tenants file cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TenantsError {
    #[error("queue {queue}: {field}.{resource}: {value} is not a quantity or a percent")]
    Amount {
        queue: String,
        field: &'static str,
        resource: String,
        value: String,
    },
    #[error(
        "queue {queue}: {field}: unknown resource {resource:?} (nvidia.com/gpu, nvidia.com/gpu.<model>, cpu, memory)"
    )]
    Resource {
        queue: String,
        field: &'static str,
        resource: String,
    },
    #[error("queue {0}: {1}")]
    Queue(String, String),
    #[error("assign names queue {0}, which the file does not define (or which has child queues)")]
    UnknownQueue(String),
    #[error("assign: {0}")]
    Assign(String),
    #[error(
        "the top queues' guarantees of {resource} add up to {percent:.1}% of the cluster ({queues}): they can add up to 100% at most"
    )]
    OverCluster {
        resource: &'static str,
        percent: f64,
        queues: String,
    },
}

/// Tenants ready for a replay: the tree and each pod's queue.
#[derive(Clone, Debug)]
pub struct Tenants {
    pub tree: QueueTree,
    /// Per trace pod, its queue's index in `tree`.
    pub queue_of: Vec<usize>,
}

impl Tenants {
    /// The tree for a cluster of `capacity` (GPU milli, CPU milli, memory MiB; percents are
    /// of it) and the queue of each of `pods`.
    pub fn new(
        file: &TenantsFile,
        capacity: [u64; DIMS],
        pods: &[TracePod],
    ) -> Result<Tenants, TenantsError> {
        let mut specs = Vec::new();
        for q in &file.queues {
            specs.push(QueueSpec {
                name: q.name.clone(),
                parent: q.parent.clone(),
                guaranteed: bounds(&q.name, "guaranteed", &q.guaranteed, capacity)?,
                limit: bounds(&q.name, "limit", &q.limit, capacity)?,
                weight: q.weight.unwrap_or(1.0),
                reclaimable: q.reclaimable.unwrap_or(true),
                usage_half_life_ms: q
                    .usage_half_life
                    .as_deref()
                    .map(parse_half_life)
                    .transpose()
                    .map_err(|e| {
                        TenantsError::Queue(q.name.clone(), format!("usageHalfLife: {e}"))
                    })?,
            });
        }
        let tree = QueueTree::build(specs);
        for n in tree.nodes.iter().skip(1) {
            if let Some(p) = &n.problem {
                return Err(TenantsError::Queue(n.spec.name.clone(), p.to_string()));
            }
        }
        over_cluster(&tree, capacity)?;
        let leaf = |name: &str| {
            tree.index(name)
                .filter(|&q| tree.is_leaf(q))
                .ok_or_else(|| TenantsError::UnknownQueue(name.to_string()))
        };
        let chooser = Chooser::new(&file.assign, &leaf)?;
        let queue_of = pods.iter().map(|p| chooser.queue(p)).collect();
        Ok(Tenants { tree, queue_of })
    }
}

/// Refuses top queues whose guarantees add up past the cluster: no placement could honour
/// them all at once.
fn over_cluster(tree: &QueueTree, capacity: [u64; DIMS]) -> Result<(), TenantsError> {
    let top = &tree.nodes[gpuplace_core::fairshare::ROOT].children;
    for (d, &cap) in capacity.iter().enumerate() {
        let sum: u64 = top
            .iter()
            .map(|&q| tree.nodes[q].spec.guaranteed.floor(d))
            .sum();
        if sum > cap {
            let queues: Vec<String> = top
                .iter()
                .filter(|&&q| tree.nodes[q].spec.guaranteed.floor(d) > 0)
                .map(|&q| tree.nodes[q].spec.name.clone())
                .collect();
            return Err(TenantsError::OverCluster {
                resource: gpuplace_core::fairshare::DIM_NAMES[d],
                percent: sum as f64 * 100.0 / cap.max(1) as f64,
                queues: queues.join(", "),
            });
        }
    }
    Ok(())
}

/// The queue of a pod, as the file's `assign` says.
enum Chooser {
    /// Cumulative shares (0..1] and queues.
    Hash(Vec<(f64, usize)>),
    Qos(BTreeMap<i32, usize>, usize),
    Shape(Vec<(ShapeRule, usize)>, usize),
}

impl Chooser {
    fn new(
        assign: &Assign,
        leaf: &dyn Fn(&str) -> Result<usize, TenantsError>,
    ) -> Result<Chooser, TenantsError> {
        Ok(match assign {
            Assign::Hash { shares } => {
                let total: f64 = shares.values().sum();
                if shares.is_empty()
                    || !total.is_finite()
                    || total <= 0.0
                    || shares.values().any(|s| !(s.is_finite() && *s >= 0.0))
                {
                    return Err(TenantsError::Assign(
                        "shares must be non-negative numbers that add up to more than 0".into(),
                    ));
                }
                let mut at = 0.0;
                let mut cumulative = Vec::new();
                for (name, share) in shares {
                    at += share / total;
                    cumulative.push((at, leaf(name)?));
                }
                Chooser::Hash(cumulative)
            }
            Assign::Qos { classes, default } => {
                let mut by = BTreeMap::new();
                for (class, name) in classes {
                    let priority = qos_priority(class).map_err(TenantsError::Assign)?;
                    by.insert(priority, leaf(name)?);
                }
                Chooser::Qos(by, leaf(default)?)
            }
            Assign::Shape { rules, default } => {
                let mut out = Vec::new();
                for r in rules {
                    out.push((r.clone(), leaf(&r.queue)?));
                }
                Chooser::Shape(out, leaf(default)?)
            }
        })
    }

    fn queue(&self, pod: &TracePod) -> usize {
        match self {
            Chooser::Hash(cumulative) => {
                let x = (name_hash(&pod.name) % 1_000_000) as f64 / 1_000_000.0;
                cumulative
                    .iter()
                    .find(|(at, _)| x < *at)
                    .or(cumulative.last())
                    .map_or(0, |(_, q)| *q)
            }
            Chooser::Qos(by, default) => by.get(&pod.priority).copied().unwrap_or(*default),
            Chooser::Shape(rules, default) => rules
                .iter()
                .find(|(r, _)| matches(r, &pod.request))
                .map_or(*default, |(_, q)| *q),
        }
    }
}

fn matches(rule: &ShapeRule, request: &Request) -> bool {
    let share = request.gpu_count == 1 && request.gpu_milli < 1000;
    rule.min_gpus.is_none_or(|m| request.gpu_count >= m)
        && rule.max_gpus.is_none_or(|m| request.gpu_count <= m)
        && rule.share.is_none_or(|s| s == share)
}

fn bounds(
    queue: &str,
    field: &'static str,
    list: &BTreeMap<String, serde_json::Value>,
    capacity: [u64; DIMS],
) -> Result<Bounds, TenantsError> {
    let texts: Vec<(&str, String)> = list
        .iter()
        .map(|(resource, value)| (resource.as_str(), amount_text(value)))
        .collect();
    let rules = AmountRules {
        gpu_resource: "nvidia.com/gpu",
        capacity: Some(&capacity),
    };
    read_bounds(texts.iter().map(|(r, t)| (*r, t.as_str())), rules).map_err(|e| match e {
        AmountError::Resource { resource } => TenantsError::Resource {
            queue: queue.to_string(),
            field,
            resource,
        },
        AmountError::Amount {
            resource, value, ..
        } => TenantsError::Amount {
            queue: queue.to_string(),
            field,
            resource,
            value,
        },
    })
}

/// An amount as written: a string as it is, a number as its digits.
fn amount_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, gpus: u32, milli: u32, priority: i32) -> TracePod {
        TracePod {
            name: name.into(),
            priority,
            request: Request {
                cpu_milli: 1000,
                memory_mib: 1024,
                gpu_count: gpus,
                gpu_milli: milli,
                allowed_models: Vec::new(),
                need: Default::default(),
            },
            duration_s: None,
            gang: None,
        }
    }

    fn file(yaml_json: serde_json::Value) -> TenantsFile {
        serde_json::from_value(yaml_json).unwrap()
    }

    #[test]
    fn percents_quantities_and_assignment() {
        let f = file(serde_json::json!({
            "queues": [
                {"name": "a", "guaranteed": {"nvidia.com/gpu": "25%"}, "weight": 2},
                {"name": "b", "limit": {"nvidia.com/gpu": "4", "memory": "1Gi"}}
            ],
            "assign": {"by": "shape", "rules": [{"minGpus": 2, "queue": "a"}], "default": "b"}
        }));
        let pods = [pod("x", 4, 1000, 0), pod("y", 1, 500, 0)];
        let t = Tenants::new(&f, [16_000, 64_000, 65_536], &pods).unwrap();
        let a = t.tree.index("a").unwrap();
        let b = t.tree.index("b").unwrap();
        assert_eq!(t.tree.nodes[a].spec.guaranteed.dims[0], Some(4000));
        assert_eq!(
            t.tree.nodes[b].spec.limit.dims,
            [Some(4000), None, Some(1024)]
        );
        assert_eq!(t.queue_of, vec![a, b]);
    }

    #[test]
    fn hash_and_qos_assign_every_pod() {
        let f = file(serde_json::json!({
            "queues": [{"name": "a"}, {"name": "b"}],
            "assign": {"by": "hash", "shares": {"a": 1, "b": 3}}
        }));
        let pods: Vec<TracePod> = (0..4000)
            .map(|i| pod(&format!("p{i}"), 1, 1000, 0))
            .collect();
        let t = Tenants::new(&f, [8000, 0, 0], &pods).unwrap();
        let a = t.tree.index("a").unwrap();
        let in_a = t.queue_of.iter().filter(|&&q| q == a).count();
        assert!((800..1200).contains(&in_a), "{in_a}");
        let f = file(serde_json::json!({
            "queues": [{"name": "ls"}, {"name": "rest"}],
            "assign": {"by": "qos", "classes": {"LS": "ls"}, "default": "rest"}
        }));
        let t = Tenants::new(
            &f,
            [8000, 0, 0],
            &[pod("p", 1, 1000, 2), pod("q", 1, 1000, 0)],
        )
        .unwrap();
        assert_eq!(
            t.queue_of,
            vec![t.tree.index("ls").unwrap(), t.tree.index("rest").unwrap()]
        );
    }

    #[test]
    fn bad_files_are_named() {
        let err = |v: serde_json::Value| {
            Tenants::new(&file(v), [8000, 0, 0], &[])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(
                serde_json::json!({"queues": [{"name": "a", "limit": {"nvidia.com/gpu": "lots"}}],
                "assign": {"by": "hash", "shares": {"a": 1}}})
            ),
            "queue a: limit.nvidia.com/gpu: lots is not a quantity or a percent"
        );
        assert_eq!(
            err(serde_json::json!({"queues": [{"name": "a"}],
                "assign": {"by": "hash", "shares": {"z": 1}}})),
            "assign names queue z, which the file does not define (or which has child queues)"
        );
        assert!(
            err(serde_json::json!({"queues": [{"name": "a", "parent": "p"}],
                "assign": {"by": "hash", "shares": {"a": 1}}}))
            .contains("parent queue p does not exist")
        );
        assert!(
            serde_json::from_value::<TenantsFile>(serde_json::json!({
            "queues": [], "assign": {"by": "hash", "shares": {}}, "extra": 1}))
            .is_err()
        );
    }
}
