//! A claim still allocated after its pod is gone (the resource claim controller has not
//! yet deallocated it) keeps its devices: the scheduler counts them, plans nothing onto
//! them, says why the next pod waits, and places it once the claim is deallocated.

use std::time::{Duration, Instant};

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::claims::{claim, claim_pod, dra_node, held, rounds};
use crate::common::*;

#[tokio::test]
async fn an_allocated_claim_whose_pod_is_gone_keeps_its_devices_until_deallocated() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    api.put_resource_claim(claim("first", 8, json!({})));
    api.put_pod(claim_pod("a", &["first"]));
    let mut scheduler = Scheduler::new(api.clone(), config());
    rounds(&mut scheduler, 1).await;
    assert_eq!(bound_node(&api, "a").as_deref(), Some("d1"));
    assert_eq!(held(&api, "first").0.len(), 8);
    // The pod goes; the controller has not deallocated its claim yet.
    api.hold_claim_releases();
    api.delete_pod("ml", "a");
    api.put_resource_claim(claim("second", 4, json!({})));
    api.put_pod(claim_pod("b", &["second"]));
    rounds(&mut scheduler, 2).await;
    assert_eq!(bound_node(&api, "b"), None);
    assert!(held(&api, "second").0.is_empty());
    let message = last_message(&api, "b");
    assert!(
        message.contains("0/1 nodes are available: 1 Insufficient GPUs for its ResourceClaims"),
        "told it waits for GPUs, not sent to a write the record refuses: {message}"
    );
    // Deallocated: the pod is placed without waiting for a timer (the state says so).
    api.release_held_claims();
    let now = Instant::now() + Duration::from_secs(45);
    scheduler.round(now).await.unwrap();
    scheduler.drain_writes(now).await;
    assert_eq!(bound_node(&api, "b").as_deref(), Some("d1"));
    assert_eq!(held(&api, "second").0.len(), 4);
    crate::claims::assert_no_device_twice(&api);
}
