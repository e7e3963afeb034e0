//! Node filters that Kubernetes applies before resources: cordons, taints and tolerations
//! (readiness included: as in kube-scheduler, a node that is not ready or unreachable is
//! refused through the `node.kubernetes.io/not-ready` and `/unreachable` taints the node
//! lifecycle controller puts on it, so pods that tolerate them may still land there),
//! nodeSelector and required node affinity. Each failure carries the phrase
//! kube-scheduler uses, so `FailedScheduling` events read the same.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};

use crate::k8s::pod_info::SchedulingTerms;

/// Why a node was filtered out before resources were looked at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeRejection {
    Unschedulable,
    Taint(String),
    Affinity,
    Extended(String),
}

impl NodeRejection {
    /// The phrase after the count in `0/N nodes are available: ...`.
    pub fn phrase(&self) -> String {
        match self {
            NodeRejection::Unschedulable => "node(s) were unschedulable".to_string(),
            NodeRejection::Taint(t) => format!("node(s) had untolerated taint {{{t}}}"),
            NodeRejection::Affinity => {
                "node(s) didn't match Pod's node affinity/selector".to_string()
            }
            NodeRejection::Extended(r) if r == "pods" => "Too many pods".to_string(),
            NodeRejection::Extended(r) if r == crate::k8s::dra::DRA_GPUS => {
                "node(s) had no gpuplace DRA driver (their GPUs come through the device plugin)"
                    .to_string()
            }
            NodeRejection::Extended(r) if r == crate::k8s::dra::PLUGIN_GPUS => {
                "node(s) serve their GPUs through DRA claims, not the device plugin (and no gpuplace DeviceClass names the resource as its extendedResourceName, or the pod asks a share)".to_string()
            }
            NodeRejection::Extended(r) => format!("Insufficient {r}"),
        }
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

pub fn labels(node: &Node) -> &BTreeMap<String, String> {
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key_matches = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(key) => key == taint.key,
    };
    if !key_matches {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint the pod does not tolerate.
pub fn untolerated_taint(node: &Node, terms: Option<&SchedulingTerms>) -> Option<String> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref())?;
    let tolerations = terms.and_then(|t| t.tolerations.as_deref()).unwrap_or(&[]);
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| format!("{}: {}", t.key, t.value.as_deref().unwrap_or("")))
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value, values.first()) else {
                return false;
            };
            match (v.parse::<i64>(), bound.parse::<i64>()) {
                (Ok(v), Ok(b)) if req.operator == "Gt" => v > b,
                (Ok(v), Ok(b)) => v < b,
                _ => false,
            }
        }
        _ => false,
    }
}

pub fn term_matches(
    term: &NodeSelectorTerm,
    node: &Node,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing (as in Kubernetes).
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name")
                .then_some(node.metadata.name.as_deref())
                .flatten();
            requirement_matches(r, value)
        })
}

/// Whether `node` matches `selector` (terms ORed, expressions ANDed), as a required node
/// affinity or a PersistentVolume's node affinity reads it.
pub fn matches_selector(node: &Node, selector: &NodeSelector) -> bool {
    let labels = labels(node);
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node, labels))
}

/// nodeSelector and required node affinity (terms ORed, expressions ANDed).
pub fn matches_affinity(node: &Node, terms: Option<&SchedulingTerms>) -> bool {
    let labels = labels(node);
    let Some(terms) = terms else {
        return true;
    };
    if let Some(selector) = &terms.node_selector
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    match &terms.required_node_affinity {
        Some(selector) => matches_selector(node, selector),
        None => true,
    }
}

/// Every check that does not depend on free resources, in kube-scheduler's order.
pub fn check_node(node: &Node, terms: Option<&SchedulingTerms>) -> Result<(), NodeRejection> {
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        return Err(NodeRejection::Unschedulable);
    }
    if !matches_affinity(node, terms) {
        return Err(NodeRejection::Affinity);
    }
    if let Some(taint) = untolerated_taint(node, terms) {
        return Err(NodeRejection::Taint(taint));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn node(json: serde_json::Value) -> Node {
        let mut base = serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a", "gpu-gen": "8"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        merge(&mut base, json);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    /// The pod's terms, leaked so tests can pass them by reference inline.
    fn terms(pod: &Pod) -> Option<&'static SchedulingTerms> {
        SchedulingTerms::of(pod).map(|t| &*Box::leak(Box::new(t)))
    }

    #[test]
    fn taints_and_tolerations() {
        let n = node(serde_json::json!({"spec": {"taints": [
            {"key": "gpu", "value": "true", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"}
        ]}}));
        let plain = pod(serde_json::json!({"containers": []}));
        assert_eq!(
            check_node(&n, terms(&plain)),
            Err(NodeRejection::Taint("gpu: true".into()))
        );
        assert_eq!(
            NodeRejection::Taint("gpu: true".into()).phrase(),
            "node(s) had untolerated taint {gpu: true}"
        );
        let equal = pod(serde_json::json!({"containers": [], "tolerations": [
            {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}));
        assert_eq!(check_node(&n, terms(&equal)), Ok(()));
        let wrong = pod(serde_json::json!({"containers": [], "tolerations": [
            {"key": "gpu", "value": "false"}]}));
        assert!(check_node(&n, terms(&wrong)).is_err());
        let exists_all =
            pod(serde_json::json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(check_node(&n, terms(&exists_all)), Ok(()));
        let wrong_effect = pod(serde_json::json!({"containers": [], "tolerations": [
            {"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]}));
        assert!(check_node(&n, terms(&wrong_effect)).is_err());
    }

    #[test]
    fn selectors_and_affinity_operators() {
        let n = node(serde_json::json!({}));
        let sel =
            |s: serde_json::Value| pod(serde_json::json!({"containers": [], "nodeSelector": s}));
        assert!(matches_affinity(
            &n,
            terms(&sel(serde_json::json!({"zone": "a"})))
        ));
        assert!(!matches_affinity(
            &n,
            terms(&sel(serde_json::json!({"zone": "b"})))
        ));
        let aff = |exprs: serde_json::Value| {
            pod(
                serde_json::json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}}),
            )
        };
        let ok = |e: serde_json::Value| matches_affinity(&n, terms(&aff(e)));
        assert!(ok(
            serde_json::json!([{"key": "zone", "operator": "In", "values": ["a", "b"]}])
        ));
        assert!(!ok(
            serde_json::json!([{"key": "zone", "operator": "NotIn", "values": ["a"]}])
        ));
        assert!(ok(
            serde_json::json!([{"key": "zone", "operator": "Exists"}])
        ));
        assert!(ok(
            serde_json::json!([{"key": "rack", "operator": "DoesNotExist"}])
        ));
        assert!(ok(
            serde_json::json!([{"key": "gpu-gen", "operator": "Gt", "values": ["7"]}])
        ));
        assert!(!ok(
            serde_json::json!([{"key": "gpu-gen", "operator": "Lt", "values": ["8"]}])
        ));
        assert!(!ok(
            serde_json::json!([{"key": "gpu-gen", "operator": "Gt", "values": ["x"]}])
        ));
        assert!(!ok(serde_json::json!([
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "rack", "operator": "Exists"}])));
        let by_name = pod(
            serde_json::json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
        );
        assert!(matches_affinity(&n, terms(&by_name)), "terms are ORed");
    }

    #[test]
    fn cordoned_and_not_ready_nodes() {
        let p = pod(serde_json::json!({"containers": []}));
        let cordoned = node(serde_json::json!({"spec": {"unschedulable": true}}));
        assert_eq!(
            check_node(&cordoned, terms(&p)),
            Err(NodeRejection::Unschedulable)
        );
        // Readiness is judged through the lifecycle controller's taints, as kube-scheduler
        // does: a not-ready node is refused unless the pod tolerates the taint.
        let down = node(serde_json::json!({
            "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}));
        assert!(matches!(
            check_node(&down, terms(&p)),
            Err(NodeRejection::Taint(t)) if t.contains("not-ready")
        ));
        let tolerant = pod(serde_json::json!({"containers": [], "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]}));
        assert_eq!(check_node(&down, terms(&tolerant)), Ok(()));
        assert_eq!(
            NodeRejection::Unschedulable.phrase(),
            "node(s) were unschedulable"
        );
    }
}
