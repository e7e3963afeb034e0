//! The kube-scheduler extender's JSON (k8s.io/kube-scheduler/extender/v1). The Go structs
//! have no JSON tags, so their keys are Go field names in PascalCase and Go decodes them
//! case-insensitively: gpuplace writes PascalCase and reads any case. The Pod, Node and
//! NodeList inside keep their own (camelCase) keys.
//!
//! Decoding never panics: a body that is not JSON, not an object, or whose fields have the
//! wrong shape is refused with a [`WireError`] that names the problem (HTTP 400).

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::Value;

/// Why a request body was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    /// JSON of the wrong shape (not an object, a missing field, a field of the wrong type).
    #[error("{0}")]
    Invalid(String),
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
    /// The candidate node names, in the order given (taken from `NodeNames`, else read
    /// from the Node objects).
    pub fn take_names(&mut self) -> Vec<String> {
        match (self.node_names.take(), &self.nodes) {
            (Some(names), _) => names,
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
    pub failed_nodes: Reasons,
    pub failed_and_unresolvable_nodes: Reasons,
    pub error: String,
}

/// Node name -> why it failed, in the order the nodes were given, written as a JSON
/// object (`map[string]string` in Go). Reasons are shared: thousands of nodes failing for
/// one reason hold one text.
#[derive(Debug, Default, PartialEq)]
pub struct Reasons(pub Vec<(String, std::sync::Arc<str>)>);

impl Reasons {
    pub fn insert(&mut self, node: String, why: std::sync::Arc<str>) {
        self.0.push((node, why));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The reason given for `node`, if any.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == node).map(|(_, w)| &**w)
    }
}

impl Serialize for Reasons {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (node, why) in &self.0 {
            map.serialize_entry(node, &**why)?;
        }
        map.end()
    }
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

/// The `items` of a NodeList (the rest of it is not needed).
#[derive(serde::Deserialize)]
struct NodeItems {
    #[serde(default)]
    items: Vec<Node>,
}

fn custom<E: serde::de::Error>(field: &str, e: impl std::fmt::Display) -> E {
    E::custom(format_args!("field {field}: {e}"))
}

impl<'de> serde::Deserialize<'de> for ExtenderArgs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ExtenderArgs;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object (ExtenderArgs: Pod, Nodes or NodeNames)")
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<ExtenderArgs, M::Error> {
                let (mut pod, mut nodes, mut names) = (None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    // Go matches field names case-insensitively.
                    match key.to_ascii_lowercase().as_str() {
                        "pod" => {
                            pod = map
                                .next_value::<Option<Pod>>()
                                .map_err(|e| custom::<M::Error>("Pod", e))?
                        }
                        "nodes" => {
                            nodes = map
                                .next_value::<Option<NodeItems>>()
                                .map_err(|e| custom::<M::Error>("Nodes", e))?
                                .map(|l| l.items)
                        }
                        "nodenames" => {
                            names = map
                                .next_value::<Option<Vec<String>>>()
                                .map_err(|e| custom::<M::Error>("NodeNames", e))?
                        }
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                let pod = pod.ok_or_else(|| serde::de::Error::custom("missing field Pod"))?;
                Ok(ExtenderArgs {
                    pod,
                    nodes,
                    node_names: names,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

impl<'de> serde::Deserialize<'de> for BindingArgs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = BindingArgs;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a JSON object (ExtenderBindingArgs: PodName, PodNamespace, PodUID, Node)",
                )
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<BindingArgs, M::Error> {
                let mut fields: [Option<String>; 4] = Default::default();
                const NAMES: [&str; 4] = ["PodName", "PodNamespace", "PodUID", "Node"];
                while let Some(key) = map.next_key::<String>()? {
                    let lower = key.to_ascii_lowercase();
                    match NAMES.iter().position(|n| n.to_ascii_lowercase() == lower) {
                        Some(i) => {
                            fields[i] = map
                                .next_value::<Option<String>>()
                                .map_err(|e| custom::<M::Error>(NAMES[i], e))?
                        }
                        None => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                let mut take = |i: usize| {
                    fields[i].take().filter(|s| !s.is_empty()).ok_or_else(|| {
                        serde::de::Error::custom(format_args!("missing field {}", NAMES[i]))
                    })
                };
                Ok(BindingArgs {
                    pod_name: take(0)?,
                    pod_namespace: take(1)?,
                    pod_uid: take(2)?,
                    node: take(3)?,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8], limit: usize) -> Result<T, WireError> {
    if body.len() > limit {
        return Err(WireError::TooLarge(limit));
    }
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            WireError::Invalid(e.to_string())
        } else {
            WireError::NotJson(e.to_string())
        }
    })
}

/// Decodes `ExtenderArgs` (filter and prioritize).
pub fn decode_args(body: &[u8], limit: usize) -> Result<ExtenderArgs, WireError> {
    decode(body, limit)
}

/// Decodes `ExtenderBindingArgs`.
pub fn decode_binding(body: &[u8], limit: usize) -> Result<BindingArgs, WireError> {
    decode(body, limit)
}

/// The NodeList of `nodes` kept in the order given, for a filter reply to a request that
/// sent full Node objects.
pub fn node_list(nodes: Vec<Node>) -> Value {
    serde_json::json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": nodes})
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
