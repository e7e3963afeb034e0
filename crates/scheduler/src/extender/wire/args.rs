//! `ExtenderArgs` as kube-scheduler sends them to filter and prioritize, read field by
//! field (names read by their own one-pass reader).

use k8s_openapi::api::core::v1::{Node, Pod};

use super::recent::Picked;
use crate::extender::names::Names;

/// `ExtenderArgs`: the pod, and the candidate nodes as full objects (`Nodes`, when the
/// extender is not node-cache capable) or as names (`NodeNames`).
#[derive(Debug)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<Node>>,
    pub node_names: Option<Names>,
    /// `NodeNames` were a filter answer's passing names, from these positions of its
    /// candidates (the kept answer's bytes came back).
    pub picked: Option<Picked>,
}

impl ExtenderArgs {
    /// The candidate node names, in the order given (taken from `NodeNames`, else read
    /// from the Node objects).
    pub fn take_names(&mut self) -> Names {
        match (self.node_names.take(), &self.nodes) {
            (Some(names), _) => names,
            (None, Some(nodes)) => nodes
                .iter()
                .map(|n| n.metadata.name.as_deref().unwrap_or_default())
                .collect(),
            (None, None) => Names::default(),
        }
    }
}

/// The `items` of a NodeList (the rest of it is not needed).
#[derive(serde::Deserialize)]
pub(super) struct NodeItems {
    #[serde(default)]
    pub items: Vec<Node>,
}

pub(super) fn custom<E: serde::de::Error>(field: &str, e: impl std::fmt::Display) -> E {
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
                            // Read raw, then by Names' one-pass reader (thousands of names).
                            let raw = map
                                .next_value::<Option<&'de serde_json::value::RawValue>>()
                                .map_err(|e| custom::<M::Error>("NodeNames", e))?;
                            names = raw
                                .map(|raw| Names::parse_json(raw.get()))
                                .transpose()
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
                    picked: None,
                })
            }
        }
        d.deserialize_map(Visit)
    }
}
