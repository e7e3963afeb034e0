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

/// A claim pod of `priority` using its own claim `claim`.
fn ranked(name: &str, claim: &str, priority: i32) -> k8s_openapi::api::core::v1::Pod {
    let mut p = claim_pod(name, &[claim]);
    p.spec.as_mut().unwrap().priority = Some(priority);
    p
}

fn deleting(api: &MemoryApi, name: &str) -> bool {
    api.pod("ml", name)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
}

#[tokio::test]
async fn a_preemptor_waits_for_its_gone_victims_claim_instead_of_evicting_another() {
    let api = MemoryApi::new();
    api.put_node(dra_node("d1"));
    for i in 0..4 {
        api.put_resource_claim(claim(&format!("l{i}"), 2, json!({})));
        api.put_pod(ranked(&format!("low-{i}"), &format!("l{i}"), 0));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    rounds(&mut scheduler, 1).await;
    let lows: Vec<String> = (0..4).map(|i| format!("low-{i}")).collect();
    assert!(lows.iter().all(|n| bound_node(&api, n).is_some()));
    // The controller is slow: a victim's claim outlives the victim for a while.
    api.hold_claim_releases();
    api.put_resource_claim(claim("h", 2, json!({})));
    api.put_pod(ranked("high", "h", 10));
    rounds(&mut scheduler, 1).await;
    let victims: Vec<&String> = lows.iter().filter(|n| deleting(&api, n)).collect();
    assert_eq!(victims.len(), 1, "one 2-GPU victim is enough");
    let victim = victims[0].clone();
    api.delete_pod("ml", &victim);
    rounds(&mut scheduler, 3).await;
    let evicted = lows
        .iter()
        .filter(|n| deleting(&api, n) || api.pod("ml", n).is_none())
        .count();
    assert_eq!(
        evicted, 1,
        "no second victim while the first one's claim is allocated"
    );
    assert_eq!(
        bound_node(&api, "high"),
        None,
        "its GPUs are still the claim's"
    );
    // Deallocated: the preemptor gets the victim's GPUs.
    api.release_held_claims();
    rounds(&mut scheduler, 3).await;
    assert_eq!(
        bound_node(&api, "high").as_deref(),
        Some("d1"),
        "{}",
        last_message(&api, "high")
    );
    assert_eq!(
        lows.iter()
            .filter(|n| bound_node(&api, n).is_some())
            .count(),
        3
    );
    crate::claims::assert_no_device_twice(&api);
}
