//! The kube-scheduler extender's JSON (k8s.io/kube-scheduler/extender/v1). The Go structs
//! have no JSON tags, so their keys are Go field names in PascalCase and Go decodes them
//! case-insensitively: gpuplace writes PascalCase and reads any case. The Pod, Node and
//! NodeList inside keep their own (camelCase) keys.
//!
//! Decoding never panics: a body that is not JSON, not an object, or whose fields have the
//! wrong shape is refused with a [`WireError`] that names the problem (HTTP 400).

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use serde_json::Value;

pub use super::names::Names;

mod args;
mod encode;
mod quick;
mod recent;

pub use args::ExtenderArgs;
use args::custom;
pub use recent::{Caller, Picked, RecentLists};

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

/// `ExtenderBindingArgs`.
#[derive(Debug, PartialEq, Eq)]
pub struct BindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub node: String,
}

/// `ExtenderFilterResult`: the nodes that pass (as given: objects or names), and why the
/// others failed, split by whether preemption could help. Nodes are named by their
/// position in the request's list (thousands of answers, no name copied); written by
/// [`FilterResult::to_json`].
#[derive(Debug, Default, PartialEq)]
pub struct FilterResult {
    /// The candidates' names, as the request gave them.
    names: Names,
    /// The passing nodes as Node objects (a request that sent objects).
    pub nodes: Option<Value>,
    /// The passing nodes by position (a request that sent names).
    passing: Option<Vec<u32>>,
    failed: Vec<(u32, Arc<str>)>,
    unresolvable: Vec<(u32, Arc<str>)>,
    pub error: String,
}

impl FilterResult {
    /// A result about the candidates `names` (none passing, none failed yet).
    pub fn about(names: Names) -> FilterResult {
        FilterResult {
            names,
            ..FilterResult::default()
        }
    }

    /// The call failed: no node passes, and `error` says why.
    pub fn failed_with(error: String) -> FilterResult {
        FilterResult {
            error,
            ..FilterResult::default()
        }
    }

    /// Candidate `i` fails where preemption could help.
    pub fn fail(&mut self, i: usize, why: Arc<str>) {
        self.failed.push((i as u32, why));
    }

    /// Candidate `i` fails where no preemption helps.
    pub fn fail_unresolvable(&mut self, i: usize, why: Arc<str>) {
        self.unresolvable.push((i as u32, why));
    }

    /// The candidates that pass, by position (answered as `NodeNames`).
    pub fn pass(&mut self, passing: impl IntoIterator<Item = usize>) {
        self.passing = Some(passing.into_iter().map(|i| i as u32).collect());
    }

    /// The passing nodes' names (`None`: answered with Node objects, or not at all).
    pub fn node_names(&self) -> Option<Vec<&str>> {
        let passing = self.passing.as_ref()?;
        Some(
            passing
                .iter()
                .map(|&i| self.names.get(i as usize))
                .collect(),
        )
    }

    /// Why `node` failed where preemption could help, if it did.
    pub fn failed(&self, node: &str) -> Option<&str> {
        self.reason(&self.failed, node)
    }

    /// Why `node` failed where no preemption helps, if it did.
    pub fn unresolvable(&self, node: &str) -> Option<&str> {
        self.reason(&self.unresolvable, node)
    }

    fn reason<'a>(&'a self, list: &'a [(u32, Arc<str>)], node: &str) -> Option<&'a str> {
        list.iter()
            .find(|(i, _)| self.names.get(*i as usize) == node)
            .map(|(_, why)| &**why)
    }
}

/// `HostPriorityList`: each candidate's score, in the order given (written by
/// [`Priorities::to_json`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Priorities {
    pub names: Names,
    pub scores: Vec<i64>,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct BindingResult {
    pub error: String,
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

/// Decodes `ExtenderArgs` (filter and prioritize): the usual body by the quick reader
/// (see [`quick`]), anything else through serde.
pub fn decode_args(body: &[u8], limit: usize) -> Result<ExtenderArgs, WireError> {
    if body.len() <= limit
        && let Some(args) = quick::args(body, None)
    {
        return Ok(args);
    }
    decode(body, limit)
}

/// [`decode_args`], with the candidates' list taken from `lists` when its bytes are those
/// of a list kept there (see [`recent`]); a filter request's list is kept in turn.
pub fn decode_args_recalling(
    body: &[u8],
    limit: usize,
    lists: &Mutex<RecentLists>,
    caller: Caller,
) -> Result<ExtenderArgs, WireError> {
    if body.len() <= limit
        && let Some(args) = quick::args(body, Some((lists, caller)))
    {
        return Ok(args);
    }
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
