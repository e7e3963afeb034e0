//! Claims whose requests list `firstAvailable` subrequests, through the real scheduling
//! loop on the in-memory API: each claim gets the first subrequest that has a place now,
//! its results name `<request>/<subrequest>` (as the API server requires), and a pod none
//! of whose ways fits waits until one does. The extender judges such a pod the same way. A
//! claim asking all of a node's GPUs gets every GPU of a wholly free node, the smallest.

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use crate::claims::{assert_no_device_twice, claim, claim_pod, dra_node, held, results_of, rounds};
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
    let results = results_of(api.resource_claim("ml", name).expect("claim"));
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

/// A claim asking every GPU of the node it gets (`allocationMode: All`).
fn all_of_a_node(name: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.gpuplace.io", "allocationMode": "All"}}]}}
    }))
    .unwrap()
}

/// The node a claim's devices are on, and how many.
fn devices_on(api: &MemoryApi, name: &str) -> (Vec<String>, usize) {
    let (devices, _) = held(api, name);
    let mut nodes: Vec<String> = devices
        .iter()
        .map(|d| d.split('/').next().unwrap_or_default().to_string())
        .collect();
    nodes.dedup();
    (nodes, devices.len())
}

#[tokio::test]
async fn a_claim_for_all_of_a_nodes_gpus_gets_every_gpu_of_a_free_node_the_smallest_first() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d8"));
    // d4: four of its eight GPUs unhealthy, so four is all it has.
    let mut small = dra_node("d4");
    let annotations = small.metadata.annotations.as_mut().unwrap();
    let mut inv =
        gpuplace_model::NodeInventory::from_json(&annotations["gpuplace.io/inventory"]).unwrap();
    for g in inv.gpus.iter_mut().filter(|g| g.index >= 4) {
        g.healthy = false;
    }
    annotations.insert("gpuplace.io/inventory".into(), inv.to_json());
    api.put_node(small);
    let mut scheduler = Scheduler::new(api.clone(), config());

    api.put_resource_claim(all_of_a_node("first"));
    api.put_pod(claim_pod("first", &["first"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(
        devices_on(&api, "first"),
        (vec!["d4".to_string()], 4),
        "{}",
        last_message(&api, "first")
    );
    assert_eq!(answered(&api, "first").0, ["gpu"]);

    // One GPU of d8 taken: d8 is not wholly free, so the next waits.
    api.put_resource_claim(claim("one", 1, json!({})));
    api.put_pod(claim_pod("one", &["one"]));
    rounds(&mut scheduler, 2).await;
    api.put_resource_claim(all_of_a_node("second"));
    api.put_pod(claim_pod("second", &["second"]));
    rounds(&mut scheduler, 2).await;
    assert!(bound_node(&api, "second").is_none());
    let said = last_message(&api, "second");
    assert!(said.contains("0/2 nodes are available"), "{said}");

    // d8 free again: the whole of it.
    api.delete_pod("ml", "one");
    rounds(&mut scheduler, 3).await;
    assert_eq!(devices_on(&api, "second"), (vec!["d8".to_string()], 8));
    assert_no_device_twice(&api);
}
