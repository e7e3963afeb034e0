//! Claims whose requests list `firstAvailable` subrequests, through the real scheduling
//! loop on the in-memory API: each claim gets the first subrequest that has a place now,
//! its results name `<request>/<subrequest>` (as the API server requires), and a pod none
//! of whose ways fits waits until one does. The extender judges such a pod the same way.

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use crate::claims::{assert_no_device_twice, claim, claim_pod, dra_node, held, rounds};
use crate::common::*;
use crate::extender::{app, call};

/// A claim whose one request `gpu` asks `counts[0]` GPUs, else `counts[1]`, ... (its
/// subrequests named `n<count>`).
fn flexible(name: &str, counts: &[u32]) -> ResourceClaim {
    let subrequests: Vec<serde_json::Value> = counts
        .iter()
        .map(|c| json!({"name": format!("n{c}"), "deviceClassName": "gpu.gpuplace.io", "count": c}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}}
    }))
    .unwrap()
}

/// The request names a claim's allocation results carry, and how many devices.
fn answered(api: &MemoryApi, name: &str) -> (Vec<String>, usize) {
    let c = api.resource_claim("ml", name).expect("claim");
    let results = c
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default();
    let mut requests: Vec<String> = results.iter().map(|r| r.request.clone()).collect();
    requests.dedup();
    (requests, results.len())
}

#[tokio::test]
async fn each_claim_gets_its_first_subrequest_that_has_a_place() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    let mut scheduler = Scheduler::new(api.clone(), config());

    // The node is empty: the first choice, eight GPUs.
    api.put_resource_claim(flexible("big", &[8, 4]));
    api.put_pod(claim_pod("big", &["big"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(bound_node(&api, "big").as_deref(), Some("d1"));
    assert_eq!(answered(&api, "big"), (vec!["gpu/n8".to_string()], 8));
    api.delete_pod("ml", "big");
    // Deallocated, as the resource claim controller does when its last user is gone.
    api.put_resource_claim(flexible("big", &[8, 4]));

    // Six GPUs taken: neither eight nor four fits, two does.
    api.put_resource_claim(claim("pin", 6, json!({})));
    api.put_pod(claim_pod("pin", &["pin"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(held(&api, "pin").0.len(), 6);
    api.put_resource_claim(flexible("flex", &[8, 4, 2]));
    api.put_pod(claim_pod("flex", &["flex"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(
        answered(&api, "flex"),
        (vec!["gpu/n2".to_string()], 2),
        "{}",
        last_message(&api, "flex")
    );

    // Nothing free: no way fits, the pod waits and is told why (for its first way).
    api.put_resource_claim(flexible("later", &[4, 1]));
    api.put_pod(claim_pod("later", &["later"]));
    rounds(&mut scheduler, 2).await;
    assert!(bound_node(&api, "later").is_none());
    assert_eq!(answered(&api, "later"), (Vec::new(), 0));
    let said = last_message(&api, "later");
    assert!(said.contains("0/1 nodes are available"), "{said}");

    // Six GPUs free again: its first way fits.
    api.delete_pod("ml", "pin");
    rounds(&mut scheduler, 3).await;
    assert_eq!(bound_node(&api, "later").as_deref(), Some("d1"));
    assert_eq!(answered(&api, "later"), (vec!["gpu/n4".to_string()], 4));
    assert_no_device_twice(&api);
}

#[tokio::test]
async fn the_extender_passes_and_binds_a_node_where_a_later_way_fits() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    api.put_resource_claim(claim("pin", 6, json!({})));
    api.put_pod(claim_pod("pin", &["pin"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(held(&api, "pin").0.len(), 6);

    // Behind kube-scheduler: its allocator would take the two-GPU subrequest on d1.
    api.put_resource_claim(flexible("flex", &[8, 2]));
    let mut pod = claim_pod("flex", &["flex"]);
    pod.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    api.put_pod(pod);
    let pod = api.pod("ml", "flex").unwrap();
    let app = app(&api, gpuplace_scheduler::extender::FilterMode::Best);
    let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": ["d1"]})).unwrap();
    let (_, filtered, text) = call(&app, "filter", body).await;
    assert_eq!(filtered["NodeNames"], json!(["d1"]), "{text}");
    let meta = &pod.metadata;
    let bind = json!({"PodName": meta.name, "PodNamespace": meta.namespace,
        "PodUID": meta.uid, "Node": "d1"});
    let (_, bound, text) = call(&app, "bind", serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(bound["Error"], "", "{text}");
    assert_eq!(bound_node(&api, "flex").as_deref(), Some("d1"));
}
