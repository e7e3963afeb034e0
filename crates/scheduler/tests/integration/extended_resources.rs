//! The device plugin's GPU resource (`nvidia.com/gpu`) served through DRA on nodes without
//! the device plugin (DRAExtendedResource): where gpuplace's DeviceClass names the resource
//! as its `extendedResourceName`, such a pod may go to a node whose GPUs are published as
//! a ResourceSlice; gpuplace makes its claim (owned by the pod, annotated), allocates it the
//! GPUs its policy chose, writes the pod's `extendedResourceClaimStatus`, then binds; a
//! failed Binding deletes the claim; the claim is the record after a restart.

use std::time::Instant;

use gpuplace_scheduler::Scheduler;
use gpuplace_scheduler::k8s::dra::extended::EXTENDED_CLAIM_ANNOTATION;
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;

use crate::claims::{assert_no_device_twice, claim, claim_pod, dra_node, results_of, rounds};
use crate::common::*;

fn gpu_class(resource: Option<&str>) -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": "gpu.gpuplace.io"},
        "spec": {"extendedResourceName": resource,
            "selectors": [{"cel": {"expression": "device.driver == \"gpu.gpuplace.io\""}}]}
    }))
    .unwrap()
}

/// The claims made for `pod`'s extended resources.
fn extended_claims(api: &MemoryApi, pod: &str) -> Vec<ResourceClaim> {
    api.resource_claims()
        .into_iter()
        .filter(|c| {
            c.metadata.annotations.as_ref().is_some_and(|a| {
                a.get(EXTENDED_CLAIM_ANNOTATION).map(String::as_str) == Some("true")
            }) && c
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Pod" && o.name == pod)
        })
        .collect()
}

/// A pod with two containers asking one GPU each.
fn two_container_pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        1,
        json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
    )
}

/// GPU 0 of `node` held by a running claim pod.
fn pin_gpu0(api: &MemoryApi, node: &str) {
    api.put_resource_claim(claim("pin", 1, json!({})));
    let mut p = claim_pod("pin", &["pin"]);
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.status.as_mut().unwrap().phase = Some("Running".into());
    api.put_pod(p);
    let uid = api.pod("ml", "pin").unwrap().metadata.uid.unwrap();
    let mut c = api.resource_claim("ml", "pin").unwrap();
    c.status = Some(
        serde_json::from_value(json!({
            "allocation": {"devices": {"results": [{"request": "gpu",
                "driver": "gpu.gpuplace.io", "pool": node, "device": "gpu-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "pin", "uid": uid}]
        }))
        .unwrap(),
    );
    api.put_resource_claim(c);
}

#[tokio::test]
async fn a_gpu_resource_pod_gets_a_claim_of_its_own_on_a_dra_node() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    api.put_device_class(gpu_class(Some("nvidia.com/gpu")));
    pin_gpu0(&api, "d1");
    api.put_pod(two_container_pod("ext"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    rounds(&mut scheduler, 3).await;

    assert_eq!(
        bound_node(&api, "ext").as_deref(),
        Some("d1"),
        "{}",
        last_message(&api, "ext")
    );
    let claims = extended_claims(&api, "ext");
    assert_eq!(claims.len(), 1, "one claim made for the pod");
    let c = &claims[0];
    let name = c.metadata.name.clone().unwrap();
    assert!(name.starts_with("ext-extended-resources-"), "{name}");
    let results = results_of(c.clone());
    let devices: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(devices.len(), 2);
    assert!(
        !devices.contains(&"gpu-0"),
        "gpu-0 is the pinned pod's: {devices:?}"
    );
    let users = c
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.clone())
        .unwrap_or_default();
    assert_eq!(
        users.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
        ["ext"]
    );
    let status = api
        .extended_status_of("ml", "ext")
        .expect("extendedResourceClaimStatus");
    assert_eq!(status.resource_claim_name, name);
    let mut mapped: Vec<(String, String)> = status
        .request_mappings
        .iter()
        .map(|m| (m.container_name.clone(), m.resource_name.clone()))
        .collect();
    mapped.sort();
    assert_eq!(
        mapped,
        [
            ("a".to_string(), "nvidia.com/gpu".to_string()),
            ("b".into(), "nvidia.com/gpu".into())
        ]
    );
    assert_no_device_twice(&api);

    // The claim is the record: a pod asking the other six GPUs and one more waits, after a
    // restart too; six fit.
    api.put_pod(pod("seven", 7, json!({})));
    let mut restarted = Scheduler::new(api.clone(), config());
    rounds(&mut restarted, 2).await;
    assert!(bound_node(&api, "seven").is_none(), "only 5 GPUs are free");
    api.put_pod(pod("five", 5, json!({})));
    rounds(&mut restarted, 2).await;
    assert_eq!(
        bound_node(&api, "five").as_deref(),
        Some("d1"),
        "{}",
        last_message(&api, "five")
    );
    assert_no_device_twice(&api);
}

#[tokio::test]
async fn without_the_class_naming_the_resource_such_pods_keep_off_dra_nodes() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    api.put_device_class(gpu_class(None));
    api.put_pod(pod("ext", 1, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    rounds(&mut scheduler, 2).await;
    assert!(bound_node(&api, "ext").is_none());
    assert!(api.resource_claims().is_empty(), "no claim made");
    // Once the class names it, the pod goes.
    api.put_device_class(gpu_class(Some("nvidia.com/gpu")));
    rounds(&mut scheduler, 2).await;
    assert_eq!(
        bound_node(&api, "ext").as_deref(),
        Some("d1"),
        "{}",
        last_message(&api, "ext")
    );
    // A share is not an extended resource: it stays off the DRA node.
    api.put_pod(pod("share", 1, share("250")));
    rounds(&mut scheduler, 2).await;
    assert!(bound_node(&api, "share").is_none());
    assert!(extended_claims(&api, "share").is_empty());
}

#[tokio::test]
async fn device_plugin_nodes_and_dra_nodes_both_serve_the_resource() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    api.put_node(nvlink_node("dp"));
    api.put_device_class(gpu_class(Some("nvidia.com/gpu")));
    api.put_pod(pod("big-1", 8, json!({})));
    api.put_pod(pod("big-2", 8, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    rounds(&mut scheduler, 3).await;
    let mut nodes: Vec<String> = ["big-1", "big-2"]
        .iter()
        .map(|p| bound_node(&api, p).unwrap_or_else(|| panic!("{p}: {}", last_message(&api, p))))
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["d1", "dp"]);
    let on_dra = if bound_node(&api, "big-1").as_deref() == Some("d1") {
        "big-1"
    } else {
        "big-2"
    };
    let on_plugin = if on_dra == "big-1" { "big-2" } else { "big-1" };
    assert_eq!(extended_claims(&api, on_dra).len(), 1);
    assert_eq!(
        results_of(extended_claims(&api, on_dra)[0].clone()).len(),
        8
    );
    assert!(
        extended_claims(&api, on_plugin).is_empty(),
        "the device plugin serves it"
    );
    assert!(api.extended_status_of("ml", on_plugin).is_none());
}

#[tokio::test]
async fn a_failed_binding_deletes_the_claim_and_clears_the_status() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    api.put_device_class(gpu_class(Some("nvidia.com/gpu")));
    api.put_pod(pod("ext", 2, json!({})));
    api.fail_next_binds(1);
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    scheduler.drain_writes(Instant::now()).await;
    assert!(bound_node(&api, "ext").is_none());
    assert!(
        extended_claims(&api, "ext").is_empty(),
        "the claim made is deleted"
    );
    assert!(
        api.extended_status_of("ml", "ext").is_none(),
        "the status is cleared"
    );
    rounds(&mut scheduler, 3).await;
    assert_eq!(
        bound_node(&api, "ext").as_deref(),
        Some("d1"),
        "{}",
        last_message(&api, "ext")
    );
    assert_eq!(extended_claims(&api, "ext").len(), 1);
    assert_no_device_twice(&api);
}
