//! Filters about other pods, end to end on the in-memory API: host ports, required pod
//! anti-affinity (the pod's own and existing pods'), pod affinity, and topology spread
//! with DoNotSchedule, including pods decided in the same round and gang members.

use std::time::Instant;

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

fn zoned(name: &str, zone: &str) -> k8s_openapi::api::core::v1::Node {
    node(name, 8, json!({"metadata": {"labels": {"zone": zone}}}))
}

fn nodes_of(api: &MemoryApi, prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = api
        .pods()
        .into_iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn anti_affinity_spreads_replicas_one_per_node_even_within_a_round() {
    let api = MemoryApi::new();
    for i in 0..3 {
        api.put_node(node(&format!("n{i}"), 8, json!({})));
    }
    for i in 0..4 {
        api.put_pod(pod(
            &format!("r{i}"),
            1,
            json!({"metadata": {"labels": {"app": "db"}},
                "spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (3, 1), "{report:?}");
    assert_eq!(nodes_of(&api, "r"), ["n0", "n1", "n2"]);
    // kube-scheduler checks existing pods' anti-affinity first, and says so.
    let failed = api
        .events()
        .into_iter()
        .find(|e| e.reason == "FailedScheduling")
        .unwrap();
    assert!(
        failed
            .message
            .contains("3 node(s) didn't satisfy existing pods anti-affinity rules"),
        "{}",
        failed.message
    );
    // A pod the replicas' anti-affinity selects cannot join them either (symmetry).
    api.put_pod(pod(
        "intruder",
        1,
        json!({"metadata": {"labels": {"app": "db"}}}),
    ));
    scheduler.round(Instant::now()).await.unwrap();
    let last = api.events().pop().unwrap();
    assert!(
        last.message
            .contains("didn't satisfy existing pods anti-affinity rules"),
        "{}",
        last.message
    );
}

#[tokio::test]
async fn host_ports_affinity_and_spread() {
    let api = MemoryApi::new();
    api.put_node(zoned("a1", "a"));
    api.put_node(zoned("a2", "a"));
    api.put_node(zoned("b1", "b"));
    let port = |name: &str| {
        pod(
            name,
            0,
            json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
        )
    };
    for i in 0..4 {
        api.put_pod(port(&format!("web{i}")));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (3, 1));
    assert!(
        api.events()
            .iter()
            .any(|e| e.message.contains("didn't have free ports"))
    );

    // Spread over zones with maxSkew 1: 4 pods go 2 and 2, never 3 in one zone.
    let api = MemoryApi::new();
    api.put_node(zoned("a1", "a"));
    api.put_node(zoned("a2", "a"));
    api.put_node(zoned("b1", "b"));
    for i in 0..4 {
        api.put_pod(pod(
            &format!("s{i}"),
            1,
            json!({"metadata": {"labels": {"job": "s"}},
                "spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"job": "s"}}}]}}),
        ));
    }
    // And a pod that must share a zone with job=s (pod affinity).
    api.put_pod(pod(
        "follower",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"job": "s"}}, "topologyKey": "zone"}]}}}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 5, "{report:?}");
    let placed = nodes_of(&api, "s");
    let in_b = placed.iter().filter(|n| *n == "b1").count();
    assert_eq!(in_b, 2, "{placed:?}");
    assert!(bound_node(&api, "follower").is_some());
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn preferences_are_honoured_when_they_can_be_and_never_block() {
    let api = MemoryApi::new();
    for i in 0..3 {
        api.put_node(node(&format!("n{i}"), 8, json!({})));
    }
    // FGD alone would pack 1-GPU replicas onto one node; preferred anti-affinity spreads them.
    for i in 0..4 {
        api.put_pod(pod(
            &format!("r{i}"),
            1,
            json!({"metadata": {"labels": {"app": "db"},
                    "creationTimestamp": format!("2030-01-01T00:00:0{i}Z")},
                "spec": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                        "topologyKey": "kubernetes.io/hostname"}}]}}}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 4, "a preference never leaves a pod pending");
    let mut first_three: Vec<String> = (0..3)
        .filter_map(|i| bound_node(&api, &format!("r{i}")))
        .collect();
    first_three.sort();
    assert_eq!(first_three, ["n0", "n1", "n2"]);

    // ScheduleAnyway spread over zones, and a PreferNoSchedule node used only when needed.
    let api = MemoryApi::new();
    api.put_node(zoned("a1", "a"));
    api.put_node(node(
        "b1",
        8,
        json!({"metadata": {"labels": {"zone": "b"}},
            "spec": {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}}),
    ));
    api.put_node(zoned("b2", "b"));
    for i in 0..2 {
        api.put_pod(pod(
            &format!("s{i}"),
            1,
            json!({"metadata": {"labels": {"job": "s"},
                    "creationTimestamp": format!("2030-01-01T00:00:0{i}Z")},
                "spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"job": "s"}}}]}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let mut zones: Vec<String> = nodes_of(&api, "s");
    zones.sort();
    assert_eq!(zones.len(), 2);
    assert!(zones.contains(&"a1".to_string()), "{zones:?}");
    assert!(
        zones.contains(&"b2".to_string()),
        "the soft-tainted node is avoided: {zones:?}"
    );
    // Whole-node pods: b2 and a1 have room left for none, so the tainted node takes it.
    api.put_pod(pod("big", 8, json!({})));
    scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(bound_node(&api, "big").as_deref(), Some("b1"));
    assert_no_double_booking(&api);
}
