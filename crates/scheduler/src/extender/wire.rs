//! The kube-scheduler extender's JSON (k8s.io/kube-scheduler/extender/v1). The Go structs
//! have no JSON tags, so their keys are Go field names in PascalCase and Go decodes them
//! case-insensitively: gpuplace writes PascalCase and reads any case. The Pod, Node and
//! NodeList inside keep their own (camelCase) keys.
//!
//! Decoding never panics: a body that is not JSON, not an object, or whose fields have the
//! wrong shape is refused with a [`WireError`] that names the problem (HTTP 400).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::{Map, Value};

/// Why a request body was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("missing field {0}")]
    Missing(&'static str),
    #[error("field {field}: {error}")]
    Field { field: &'static str, error: String },
}

/// `ExtenderArgs`: the pod, and the candidate nodes as full objects (`Nodes`, when the
/// extender is not node-cache capable) or as names (`NodeNames`).
#[derive(Debug)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<Node>>,
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, in the order given.
    pub fn names(&self) -> Vec<String> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(nodes)) => nodes
                .iter()
                .map(|n| n.metadata.name.clone().unwrap_or_default())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// `ExtenderBindingArgs`.
#[derive(Debug, PartialEq, Eq)]
pub struct BindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub node: String,
}

/// `ExtenderFilterResult`: the nodes that pass (as given: objects or names), and why the
/// others failed, split by whether preemption could help.
#[derive(Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct FilterResult {
    pub nodes: Option<Value>,
    pub node_names: Option<Vec<String>>,
    pub failed_nodes: BTreeMap<String, String>,
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    pub error: String,
}

/// One entry of `HostPriorityList`.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct BindingResult {
    pub error: String,
}

/// The top-level object of `body`, with its keys lower-cased (Go's case-insensitive match).
fn object(body: &[u8], limit: usize) -> Result<Map<String, Value>, WireError> {
    if body.len() > limit {
        return Err(WireError::TooLarge(limit));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| WireError::NotJson(e.to_string()))?;
    match value {
        Value::Object(map) => Ok(map
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()),
        _ => Err(WireError::NotObject),
    }
}

fn field<T: serde::de::DeserializeOwned>(
    map: &mut Map<String, Value>,
    key: &str,
    name: &'static str,
) -> Result<Option<T>, WireError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| WireError::Field {
                field: name,
                error: e.to_string(),
            }),
    }
}

/// Decodes `ExtenderArgs` (filter and prioritize).
pub fn decode_args(body: &[u8], limit: usize) -> Result<ExtenderArgs, WireError> {
    let mut map = object(body, limit)?;
    let pod: Pod = field(&mut map, "pod", "Pod")?.ok_or(WireError::Missing("Pod"))?;
    let nodes = match map.remove("nodes") {
        None | Some(Value::Null) => None,
        Some(Value::Object(list)) => {
            let items = list
                .get("items")
                .cloned()
                .unwrap_or(Value::Array(Vec::new()));
            let nodes: Vec<Node> = serde_json::from_value(items).map_err(|e| WireError::Field {
                field: "Nodes",
                error: e.to_string(),
            })?;
            Some(nodes)
        }
        Some(_) => {
            return Err(WireError::Field {
                field: "Nodes",
                error: "expected a NodeList object".into(),
            });
        }
    };
    let node_names: Option<Vec<String>> = field(&mut map, "nodenames", "NodeNames")?;
    Ok(ExtenderArgs {
        pod,
        nodes,
        node_names,
    })
}

/// Decodes `ExtenderBindingArgs`.
pub fn decode_binding(body: &[u8], limit: usize) -> Result<BindingArgs, WireError> {
    let mut map = object(body, limit)?;
    let mut text = |key: &str, name: &'static str| -> Result<String, WireError> {
        field::<String>(&mut map, key, name)?
            .filter(|s| !s.is_empty())
            .ok_or(WireError::Missing(name))
    };
    Ok(BindingArgs {
        pod_name: text("podname", "PodName")?,
        pod_namespace: text("podnamespace", "PodNamespace")?,
        pod_uid: text("poduid", "PodUID")?,
        node: text("node", "Node")?,
    })
}

/// The NodeList of `nodes` kept in the order given, for a filter reply to a request that
/// sent full Node objects.
pub fn node_list(nodes: Vec<Node>) -> Value {
    serde_json::json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": nodes})
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
