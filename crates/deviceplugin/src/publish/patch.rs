//! What gpuplace writes on its Node, computed without I/O: the inventory annotation and
//! GFD's labels as one JSON merge patch, and whether a Node already carries them.

use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory, keys};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

/// A label value as Kubernetes accepts it: at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending with an alphanumeric (GFD writes `NVIDIA-A100-SXM4-80GB`).
pub fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// What the Node says besides the inventory: how many times each GPU is advertised, and
/// the DRA driver serving the GPUs (DRA mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Publish {
    pub replicas: u32,
    pub dra_driver: Option<String>,
}

impl From<u32> for Publish {
    fn from(replicas: u32) -> Self {
        Publish {
            replicas,
            dra_driver: None,
        }
    }
}

/// The merge patch that publishes `inventory` (GPUs advertised `replicas` times each; the
/// DRA driver's label in DRA mode).
pub fn node_patch(inventory: &NodeInventory, publish: impl Into<Publish>) -> Value {
    let Publish {
        replicas,
        dra_driver,
    } = publish.into();
    let mut labels = serde_json::Map::new();
    // A node that served its GPUs through DRA and now runs the device plugin loses the
    // label (null removes it), or the scheduler would keep its device plugin pods away.
    labels.insert(
        keys::DRA_DRIVER_LABEL.into(),
        dra_driver.map_or(Value::Null, |d| json!(label_value(&d))),
    );
    labels.insert(
        keys::GPU_COUNT_LABEL.into(),
        json!(inventory.gpus.len().to_string()),
    );
    labels.insert(keys::GPU_REPLICAS_LABEL.into(), json!(replicas.to_string()));
    if let Some(gpu) = inventory.gpus.first() {
        let product = label_value(&gpu.model);
        if !product.is_empty() {
            labels.insert(keys::GPU_PRODUCT_LABEL.into(), json!(product));
        }
        if gpu.memory_mib > 0 {
            labels.insert(
                keys::GPU_MEMORY_LABEL.into(),
                json!(gpu.memory_mib.to_string()),
            );
        }
    }
    json!({"metadata": {
        "annotations": {INVENTORY_ANNOTATION: inventory.to_json()},
        "labels": labels,
    }})
}

/// GPU Feature Discovery's own label: when the Node has it, GFD owns the `nvidia.com/gpu.*`
/// labels and gpuplace writes only its annotation.
pub use gpuplace_model::keys::GFD_TIMESTAMP_LABEL;

/// Whether GPU Feature Discovery labels this node.
pub fn gfd_present(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(GFD_TIMESTAMP_LABEL))
}

/// The patch for `inventory` on `node` as last seen: without GFD's labels where GFD runs.
pub fn desired(
    inventory: &NodeInventory,
    publish: impl Into<Publish>,
    node: Option<&Node>,
) -> Value {
    let publish = publish.into();
    let dra = publish.dra_driver.clone();
    let mut patch = node_patch(inventory, publish);
    if node.is_some_and(gfd_present)
        && let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut)
    {
        // GFD owns the GPU labels; the DRA driver's label is still gpuplace's.
        meta.insert(
            "labels".into(),
            json!({keys::DRA_DRIVER_LABEL: dra.map(|d| label_value(&d))}),
        );
    }
    patch
}

/// Whether every annotation and label of `patch` already holds on `node`.
pub fn in_place(node: &Node, patch: &Value) -> bool {
    let holds = |field: &str, have: Option<&std::collections::BTreeMap<String, String>>| {
        patch["metadata"][field].as_object().is_none_or(|want| {
            want.iter()
                .all(|(k, v)| have.and_then(|h| h.get(k)).map(String::as_str) == v.as_str())
        })
    };
    holds("annotations", node.metadata.annotations.as_ref())
        && holds("labels", node.metadata.labels.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(
            label_value("NVIDIA A100-SXM4-80GB"),
            "NVIDIA-A100-SXM4-80GB"
        );
        assert_eq!(label_value(" (Tesla) "), "Tesla");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn gfd_keeps_its_labels_and_stale_values_are_found() {
        let inv = NodeInventory::uniform("n1", 0, 0, 4, "A100");
        let mut node: Node = serde_json::from_value(json!({"metadata": {"name": "n1",
            "labels": {"nvidia.com/gfd.timestamp": "1", "nvidia.com/gpu.product": "GFD-NAME"}}}))
        .unwrap();
        let want = desired(&inv, 1, Some(&node));
        let labels = want["metadata"]["labels"].as_object().unwrap();
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["gpuplace.io/dra-driver"],
            "GFD's labels stay GFD's; only the DRA label is gpuplace's"
        );
        assert!(
            labels["gpuplace.io/dra-driver"].is_null(),
            "removed in device plugin mode"
        );
        let dra = desired(
            &inv,
            Publish {
                replicas: 1,
                dra_driver: Some("gpu.gpuplace.io".into()),
            },
            Some(&node),
        );
        assert_eq!(
            dra["metadata"]["labels"]["gpuplace.io/dra-driver"],
            "gpu.gpuplace.io"
        );
        assert!(!in_place(&node, &dra), "the DRA label is missing");
        assert!(!in_place(&node, &want), "the annotation is missing");
        node.metadata.annotations = Some(
            [(INVENTORY_ANNOTATION.to_string(), inv.to_json())]
                .into_iter()
                .collect(),
        );
        assert!(in_place(&node, &want));
        // Without GFD our labels are part of it, and a stale one is found.
        node.metadata.labels = Some(
            [("nvidia.com/gpu.count".to_string(), "2".to_string())]
                .into_iter()
                .collect(),
        );
        let want = desired(&inv, 1, Some(&node));
        assert_eq!(want["metadata"]["labels"]["nvidia.com/gpu.count"], "4");
        assert!(!in_place(&node, &want));
    }

    #[test]
    fn patch_carries_the_inventory_and_gfd_labels() {
        let mut inv = NodeInventory::uniform("n1", 0, 0, 4, "NVIDIA A100");
        for g in &mut inv.gpus {
            g.memory_mib = 81920;
        }
        let patch = node_patch(&inv, 2);
        let meta = &patch["metadata"];
        let text = meta["annotations"][INVENTORY_ANNOTATION].as_str().unwrap();
        assert_eq!(NodeInventory::from_json(text).unwrap(), inv);
        assert_eq!(meta["labels"]["nvidia.com/gpu.product"], "NVIDIA-A100");
        assert_eq!(meta["labels"]["nvidia.com/gpu.memory"], "81920");
        assert_eq!(meta["labels"]["nvidia.com/gpu.count"], "4");
        assert_eq!(meta["labels"]["nvidia.com/gpu.replicas"], "2");
    }
}
