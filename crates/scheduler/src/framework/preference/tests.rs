use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::*;

fn node(name: &str, labels: Value, spec: Value) -> Arc<Node> {
    let mut l = json!({"kubernetes.io/hostname": name});
    if let (Some(l), Some(extra)) = (l.as_object_mut(), labels.as_object()) {
        l.extend(extra.clone());
    }
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": l}, "spec": spec}))
            .unwrap(),
    )
}

fn pod(name: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
    let mut s = json!({"containers": []});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": name, "labels": labels},
        "spec": s
    }))
    .unwrap();
    Arc::new(PodInfo::from_pod(&pod, "nvidia.com/gpu"))
}

fn score(nodes: &[Arc<Node>], placed: &[Vec<Arc<PodInfo>>], p: &PodInfo) -> Vec<i64> {
    let placed = Placed {
        nodes,
        pods: placed,
        extra: &[],
    };
    scores(&placed, p, &vec![true; nodes.len()])
}

#[test]
fn preferred_node_affinity_ranks_matching_nodes_first() {
    let nodes = [
        node("a", json!({"zone": "a"}), json!({})),
        node("b", json!({"zone": "b", "fast": "yes"}), json!({})),
        node("c", json!({"zone": "b"}), json!({})),
    ];
    let p = pod(
        "p",
        json!({}),
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}},
            {"weight": 30, "preference": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]}}
        ]}}}),
    );
    assert!(wanted(&p, false, false));
    let s = score(&nodes, &[vec![], vec![], vec![]], &p);
    // Raw 0, 40, 10, scaled to 0, 100, 25, weight 2.
    assert_eq!(s, [0, 200, 50]);
}

#[test]
fn soft_taints_are_avoided_unless_tolerated() {
    let nodes = [
        node(
            "a",
            json!({}),
            json!({"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}),
        ),
        node("b", json!({}), json!({})),
    ];
    assert!(has_soft_taint(&nodes[0]) && !has_soft_taint(&nodes[1]));
    let plain = pod("p", json!({}), json!({}));
    assert!(!wanted(&plain, false, false) && wanted(&plain, false, true));
    let s = score(&nodes, &[vec![], vec![]], &plain);
    assert!(s[0] < s[1], "{s:?}");
    let tolerant = pod(
        "t",
        json!({}),
        json!({"tolerations": [{"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}]}),
    );
    let s = score(&nodes, &[vec![], vec![]], &tolerant);
    assert_eq!(s[0], s[1]);
}

#[test]
fn preferred_anti_affinity_and_existing_pods_preferences() {
    let nodes = [
        node("n0", json!({}), json!({})),
        node("n1", json!({}), json!({})),
        node("n2", json!({}), json!({})),
    ];
    let db = pod("db", json!({"app": "db"}), json!({}));
    // A cache that prefers web pods on its node (scored symmetrically).
    let cache = pod(
        "cache",
        json!({"app": "cache"}),
        json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}},
                "topologyKey": "kubernetes.io/hostname"}}]}}}),
    );
    let placed = vec![vec![db], vec![], vec![cache]];
    let replica = pod(
        "r",
        json!({"app": "db"}),
        json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                "topologyKey": "kubernetes.io/hostname"}}]}}}),
    );
    let s = score(&nodes, &placed, &replica);
    assert!(s[0] < s[1] && s[1] == s[2], "{s:?}");
    let web = pod("w", json!({"app": "web"}), json!({}));
    assert!(wanted(&web, true, false));
    let s = score(&nodes, &placed, &web);
    assert!(s[2] > s[0] && s[0] == s[1], "{s:?}");
}

#[test]
fn schedule_anyway_spread_prefers_emptier_domains_and_ignores_nodes_without_the_key() {
    let nodes = [
        node("a1", json!({"zone": "a"}), json!({})),
        node("a2", json!({"zone": "a"}), json!({})),
        node("b1", json!({"zone": "b"}), json!({})),
        node("x", json!({}), json!({})),
    ];
    let member = |name: &str| pod(name, json!({"job": "s"}), json!({}));
    let placed = vec![
        vec![member("m0")],
        vec![member("m1")],
        vec![],
        vec![member("m2")],
    ];
    let p = pod(
        "p",
        json!({"job": "s"}),
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"job": "s"}}}]}),
    );
    let s = score(&nodes, &placed, &p);
    assert!(s[2] > s[0] && s[0] == s[1], "{s:?}");
    assert_eq!(s[3], 0, "a node without the key is not scored");
    // Nothing placed yet: every node with the key scores the same.
    let s = score(&nodes, &[vec![], vec![], vec![], vec![]], &p);
    assert!(s[0] == s[1] && s[1] == s[2], "{s:?}");
}

#[test]
fn best_nodes_keep_the_fitting_nodes_with_the_best_sum() {
    let scores = [5, 9, 9, 1];
    let allowed = [true, true, true, true];
    assert_eq!(
        best_nodes(&scores, &allowed, |n| n != 1),
        Some(vec![false, false, true, false])
    );
    assert_eq!(
        best_nodes(&scores, &[true, false, false, true], |_| true),
        Some(vec![true, false, false, false])
    );
    assert_eq!(best_nodes(&scores, &allowed, |_| false), None);
}
