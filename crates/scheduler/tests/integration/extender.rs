//! The extender over HTTP against the in-memory API (with watch lag), with kube-scheduler's
//! side simulated: filter, prioritize, then bind on the node kube-scheduler would pick
//! (the first passing node, a random one, or the best-scored one). No GPU is ever given
//! twice, and every bound pod carries an assignment for the node it was bound to.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpuplace_scheduler::extender::http::{ExtenderMetrics, router};
use gpuplace_scheduler::extender::{Extender, ExtenderConfig, FilterMode};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::api::ServerCosts;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common::*;

pub(crate) async fn call(app: &Router, verb: &str, body: Vec<u8>) -> (StatusCode, Value, String) {
    let response = app
        .clone()
        .oneshot(
            Request::post(format!("/{verb}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).to_string();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    )
}

pub(crate) fn app(api: &MemoryApi, mode: FilterMode) -> Router {
    let config = ExtenderConfig {
        filter_mode: mode,
        ..Default::default()
    };
    router(
        Arc::new(Extender::new(api.clone(), config)),
        ExtenderMetrics::default(),
        1 << 20,
    )
}

#[derive(Clone, Copy, Debug)]
enum Pick {
    First,
    Random,
    Best,
}

/// kube-scheduler's side for one pod: the node it binds, or None when nothing passes.
async fn schedule(
    app: &Router,
    pod: &k8s_openapi::api::core::v1::Pod,
    nodes: &[String],
    pick: Pick,
    rng: &mut ChaCha8Rng,
) -> Option<String> {
    let args =
        |names: &[String]| serde_json::to_vec(&json!({"Pod": pod, "NodeNames": names})).unwrap();
    let (status, filtered, text) = call(app, "filter", args(nodes)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(filtered["Error"], "", "{text}");
    let passing: Vec<String> = serde_json::from_value(filtered["NodeNames"].clone()).unwrap();
    for name in &passing {
        assert!(
            nodes.contains(name),
            "filter returned a node it was not given"
        );
    }
    if passing.is_empty() {
        return None;
    }
    let (status, scores, text) = call(app, "prioritize", args(&passing)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let scores: Vec<(String, i64)> = scores
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().unwrap().to_string(),
                h["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(scores.iter().all(|(_, s)| (0..=10).contains(s)));
    assert!(
        scores.iter().any(|(_, s)| *s == 10),
        "the best node gets 10: {scores:?}"
    );
    let node = match pick {
        Pick::First => passing[0].clone(),
        Pick::Random => passing[rng.random_range(0..passing.len())].clone(),
        Pick::Best => scores.iter().max_by_key(|(_, s)| *s).unwrap().0.clone(),
    };
    let meta = &pod.metadata;
    let bind = json!({"PodName": meta.name, "PodNamespace": meta.namespace, "PodUID": meta.uid, "Node": node});
    let (status, result, text) = call(app, "bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(result["Error"], "", "{text}");
    Some(node)
}

fn shaped(name: &str, rng: &mut ChaCha8Rng) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = match rng.random_range(0..4) {
        0 => pod(name, [1, 2, 4, 8][rng.random_range(0..4)], json!({})),
        1 => pod(name, 1, share("500")),
        2 => pod(
            name,
            2,
            json!({"metadata": {"annotations": {"gpuplace.io/topology": "nvlink"}}}),
        ),
        _ => pod(name, 1, json!({})),
    };
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod
}

#[tokio::test]
async fn mixed_workload_never_double_books_whatever_kube_scheduler_picks() {
    for (mode, pick) in [
        (FilterMode::All, Pick::First),
        (FilterMode::All, Pick::Random),
        (FilterMode::All, Pick::Best),
        (FilterMode::Best, Pick::First),
    ] {
        let api = MemoryApi::new().with_costs(ServerCosts {
            watch_delay: (Duration::ZERO, Duration::from_millis(30)),
            seed: 7,
            ..ServerCosts::default()
        });
        let mut names = Vec::new();
        for i in 0..6 {
            let name = format!("n{i}");
            if i % 2 == 0 {
                api.put_node(nvlink_node(&name));
            } else {
                api.put_node(node(&name, 4, json!({})));
            }
            names.push(name);
        }
        let app = app(&api, mode);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut bound = 0;
        for i in 0..40 {
            let p = shaped(&format!("p{i}"), &mut rng);
            api.put_pod(p.clone());
            if let Some(node) = schedule(&app, &p, &names, pick, &mut rng).await {
                bound += 1;
                assert_eq!(
                    bound_node(&api, &format!("p{i}")).as_deref(),
                    Some(node.as_str())
                );
                let a = assignment(&api, &format!("p{i}")).expect("assignment with the Binding");
                assert_eq!(
                    a.node, node,
                    "the assignment is for the node kube-scheduler picked"
                );
            }
            assert_no_double_booking(&api);
        }
        assert!(bound >= 20, "{mode:?} {pick:?}: only {bound} bound");
    }
}

#[tokio::test]
async fn verbs_answer_as_kube_scheduler_expects() {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("big"));
    api.put_node(node("small", 1, json!({})));
    api.put_node(node(
        "tainted",
        8,
        json!({"spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}}),
    ));
    let mut p = pod("train", 2, json!({}));
    p.metadata.uid = Some("uid-train".into());
    api.put_pod(p.clone());
    let app = app(&api, FilterMode::All);
    let names = ["big", "small", "tainted", "ghost"];
    let args = serde_json::to_vec(&json!({"Pod": p, "NodeNames": names})).unwrap();
    let (_, filtered, _) = call(&app, "filter", args.clone()).await;
    let (_, scores, _) = call(&app, "prioritize", args).await;
    // Full Node objects in, full Node objects out (nodeCacheCapable: false).
    let list = json!({"Pod": p, "Nodes": {"items": [api.node("big"), api.node("small")]}});
    let (_, by_objects, _) = call(&app, "filter", serde_json::to_vec(&list).unwrap()).await;
    assert_eq!(by_objects["Nodes"]["items"].as_array().unwrap().len(), 1);
    assert_eq!(by_objects["Nodes"]["items"][0]["metadata"]["name"], "big");
    let bind =
        json!({"PodName": "train", "PodNamespace": "ml", "PodUID": "uid-train", "Node": "big"});
    let (_, bound, _) = call(&app, "bind", serde_json::to_vec(&bind).unwrap()).await;
    let (_, again, _) = call(
        &app,
        "bind",
        serde_json::to_vec(&json!({"PodName": "train",
        "PodNamespace": "ml", "PodUID": "uid-train", "Node": "small"}))
        .unwrap(),
    )
    .await;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    insta::assert_snapshot!(
        [
            format!("filter:\n{}", pretty(&filtered)),
            format!("prioritize:\n{}", pretty(&scores)),
            format!("bind:\n{}", pretty(&bound)),
            format!("bind again elsewhere:\n{}", pretty(&again)),
        ]
        .join("\n")
    );
}

#[tokio::test]
async fn bad_bodies_get_400_with_the_reason() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 8, json!({})));
    let config = ExtenderConfig::default();
    let app = router(
        Arc::new(Extender::new(api.clone(), config)),
        ExtenderMetrics::default(),
        256,
    );
    for (verb, body, expect) in [
        ("filter", b"not json".to_vec(), "request body is not JSON"),
        ("prioritize", b"[]".to_vec(), "expected a JSON object"),
        (
            "filter",
            b"{\"NodeNames\": []}".to_vec(),
            "missing field Pod",
        ),
        (
            "bind",
            b"{\"PodName\": \"p\"}".to_vec(),
            "missing field PodNamespace",
        ),
        ("filter", vec![b' '; 1000], "larger than 256 bytes"),
    ] {
        let (status, _, text) = call(&app, verb, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{verb}: {text}");
        assert!(text.contains(expect), "{verb}: {text}");
    }
    // A bind for a pod nobody filtered and the cache does not hold is refused, not a panic.
    let bind = json!({"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u", "Node": "n1"});
    let (status, result, _) = call(&app, "bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        result["Error"].as_str().unwrap().contains("not known"),
        "{result}"
    );
}

#[tokio::test]
async fn preferences_decide_first_in_both_modes() {
    let api = MemoryApi::new();
    for i in 0..3 {
        api.put_node(node(&format!("n{i}"), 8, json!({})));
    }
    // FGD alone would pack the replica next to the running one on n0.
    api.put_pod(pod(
        "db-0",
        1,
        json!({"metadata": {"labels": {"app": "db"}, "uid": "u0"},
            "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}}),
    ));
    let mut replica = pod(
        "db-1",
        1,
        json!({"metadata": {"labels": {"app": "db"}},
            "spec": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                    "topologyKey": "kubernetes.io/hostname"}}]}}}}),
    );
    replica.metadata.uid = Some("u1".into());
    api.put_pod(replica.clone());
    let names = ["n0", "n1", "n2"];
    let args = serde_json::to_vec(&json!({"Pod": replica, "NodeNames": names})).unwrap();
    let (_, best, _) = call(&app(&api, FilterMode::Best), "filter", args.clone()).await;
    let chosen = best["NodeNames"][0].as_str().unwrap().to_string();
    assert_ne!(chosen, "n0", "mode best honours the preference: {best}");
    let (_, scores, _) = call(&app(&api, FilterMode::All), "prioritize", args).await;
    let score = |host: &str| {
        scores
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["Host"] == host)
            .unwrap()["Score"]
            .as_i64()
            .unwrap()
    };
    assert!(
        score("n0") < score("n1") && score("n0") < score("n2"),
        "{scores}"
    );
}

#[tokio::test]
async fn queue_limits_hold_in_extender_mode() {
    let api = MemoryApi::new().with_costs(ServerCosts {
        watch_delay: (Duration::from_millis(200), Duration::from_millis(400)),
        ..ServerCosts::default()
    });
    api.put_node(node("n1", 8, json!({})));
    api.put_queue(
        "c",
        serde_json::from_value(json!({"limit": {"nvidia.com/gpu": "2"}})).unwrap(),
    );
    let app = app(&api, FilterMode::Best);
    let nodes = vec!["n1".to_string()];
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let in_c = |name: &str| {
        let mut p = pod(
            name,
            1,
            json!({"metadata": {"labels": {"gpuplace.io/queue": "c"}}}),
        );
        p.metadata.uid = Some(format!("uid-{name}"));
        api.put_pod(p.clone());
        p
    };
    for name in ["c0", "c1"] {
        let p = in_c(name);
        assert!(
            schedule(&app, &p, &nodes, Pick::Best, &mut rng)
                .await
                .is_some()
        );
    }
    // The third: no node passes, for the queue's limit (counted from reservations the
    // lagging watch has not shown bound yet).
    let p = in_c("c2");
    let body = serde_json::to_vec(&json!({"Pod": p, "NodeNames": nodes})).unwrap();
    let (_, filtered, text) = call(&app, "filter", body).await;
    assert_eq!(filtered["NodeNames"], json!([]), "{text}");
    assert_eq!(
        filtered["FailedAndUnresolvableNodes"]["n1"],
        "queue c is at its limit of 2 GPUs."
    );
    // A bind without a filter (a race between kube-scheduler's cycles) is refused too.
    let bind = json!({"PodName": "c2", "PodNamespace": "ml", "PodUID": "uid-c2", "Node": "n1"});
    let (_, result, _) = call(&app, "bind", serde_json::to_vec(&bind).unwrap()).await;
    assert!(
        result["Error"]
            .as_str()
            .unwrap()
            .contains("queue c is at its limit of 2 GPUs"),
        "{result}"
    );
    // A missing queue is named.
    let mut lost = pod(
        "lost",
        1,
        json!({"metadata": {"labels": {"gpuplace.io/queue": "nope"}}}),
    );
    lost.metadata.uid = Some("uid-lost".into());
    let body = serde_json::to_vec(&json!({"Pod": lost, "NodeNames": nodes})).unwrap();
    let (_, filtered, _) = call(&app, "filter", body).await;
    assert_eq!(
        filtered["FailedAndUnresolvableNodes"]["n1"],
        "queue nope does not exist."
    );
    assert_no_double_booking(&api);
}

/// Prioritize right after filter (mode all) answers as a prioritize judged afresh, also when
/// the pod's preferences are scaled over the candidates (here a full node holds the highest
/// node-affinity weight: scaled over filter's candidates or over the ones that passed, the
/// preferred zone and the lighter taint swap places).
#[tokio::test]
async fn prioritize_after_filter_answers_as_a_fresh_prioritize() {
    let api = MemoryApi::new();
    let soft = |key: &str| json!({"key": key, "value": "x", "effect": "PreferNoSchedule"});
    api.put_node(node(
        "n0",
        8,
        json!({"metadata": {"labels": {"tier": "gold"}}}),
    ));
    api.put_node(node("n1", 8, json!({})));
    api.put_node(node(
        "n2",
        8,
        json!({"metadata": {"labels": {"zone": "a"}}, "spec": {"taints": [soft("t1"), soft("t2")]}}),
    ));
    api.put_node(node("n3", 8, json!({"spec": {"taints": [soft("t1")]}})));
    api.put_pod(pod(
        "big",
        8,
        json!({"metadata": {"uid": "u0"}, "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}}),
    ));
    let preferring = json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}},
        {"weight": 30, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}});
    let app = app(&api, FilterMode::All);
    for (name, extra) in [("plain", json!({})), ("preferring", preferring)] {
        let mut p = pod(name, 1, extra);
        p.metadata.uid = Some(format!("uid-{name}"));
        api.put_pod(p);
        // As kube-scheduler sends it: the informer's copy, resourceVersion included.
        let stored = api.pod("ml", name).unwrap();
        assert!(stored.metadata.resource_version.is_some());
        let names = ["n0", "n1", "n2", "n3"];
        let args = serde_json::to_vec(&json!({"Pod": stored, "NodeNames": names})).unwrap();
        let (_, filtered, _) = call(&app, "filter", args).await;
        let passing = filtered["NodeNames"].clone();
        assert_eq!(passing, json!(["n1", "n2", "n3"]), "{filtered}");
        let args = serde_json::to_vec(&json!({"Pod": stored, "NodeNames": passing})).unwrap();
        let (_, after_filter, _) = call(&app, "prioritize", args).await;
        let mut unversioned = stored.clone();
        unversioned.metadata.resource_version = None;
        let args = serde_json::to_vec(&json!({"Pod": unversioned, "NodeNames": passing})).unwrap();
        let (_, afresh, _) = call(&app, "prioritize", args).await;
        assert_eq!(after_filter, afresh, "pod {name}");
    }
}

/// Between filter and prioritize (mode all) the watch shows other pods: a pending one
/// keeps filter's judgement, a bound one moves the state, and prioritize then judges
/// afresh (its answer is the one a prioritize without filter's judgement gives).
#[tokio::test]
async fn prioritize_after_filter_judges_afresh_when_the_state_moved() {
    let api = MemoryApi::new();
    for n in ["n0", "n1", "n2"] {
        api.put_node(node(n, 8, json!({})));
    }
    let app = app(&api, FilterMode::All);
    let mut p = pod("p", 1, json!({}));
    p.metadata.uid = Some("uid-p".into());
    api.put_pod(p);
    let stored = api.pod("ml", "p").unwrap();
    let names = ["n0", "n1", "n2"];
    let args = serde_json::to_vec(&json!({"Pod": stored, "NodeNames": names})).unwrap();
    let (_, filtered, _) = call(&app, "filter", args).await;
    assert_eq!(filtered["NodeNames"], json!(names), "{filtered}");
    let prioritize = |pod: &k8s_openapi::api::core::v1::Pod| {
        serde_json::to_vec(&json!({"Pod": pod, "NodeNames": names})).unwrap()
    };
    // Every node alike: all score 10.
    api.put_pod(pod(
        "pending",
        2,
        json!({"metadata": {"uid": "uid-pending"}}),
    ));
    let (_, scores, _) = call(&app, "prioritize", prioritize(&stored)).await;
    assert_eq!(scores.as_array().unwrap().len(), 3);
    assert!(
        scores.as_array().unwrap().iter().all(|h| h["Score"] == 10),
        "{scores}"
    );
    // A pod bound to n1 fills it: prioritize must see that (0 where the pod no longer fits).
    api.put_pod(pod(
        "bound",
        8,
        json!({"metadata": {"uid": "uid-bound"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}),
    ));
    let (_, after_filter, _) = call(&app, "prioritize", prioritize(&stored)).await;
    let mut unversioned = stored.clone();
    unversioned.metadata.resource_version = None;
    let (_, afresh, _) = call(&app, "prioritize", prioritize(&unversioned)).await;
    assert_eq!(after_filter, afresh);
    assert_eq!(
        after_filter[1],
        json!({"Host": "n1", "Score": 0}),
        "{after_filter}"
    );
}
