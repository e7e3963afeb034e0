//! Every waiting pod told why and until when (the segments after its FailedScheduling
//! message, its condition and `gpuplace status`'s parse of them): a 4-GPU NVLink pod
//! blocked by two 1-GPU pods in different quads is told fragmentation, with the blocks, and
//! when it is expected to start (their declared ends); a queue's pod behind others in fair
//! order is told so, with its queue's standing.

use std::time::{Duration, Instant};

use gpuplace_scheduler::Scheduler;
use gpuplace_scheduler::k8s::queue::QueueSpec;
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

/// A 1-GPU pod running on GPU `gpu` of node `n1` for `minutes` more (declared).
fn running(name: &str, gpu: u32, minutes: u64) -> k8s_openapi::api::core::v1::Pod {
    let assignment = json!({
        "node": "n1", "policy": "test", "time": "2026-01-01T00:00:00Z",
        "containers": [{"name": "main", "devices": [{"index": gpu, "id": format!("GPU-n1-{gpu}"), "milli": 1000}]}]
    });
    pod(
        name,
        1,
        json!({
            "metadata": {"annotations": {
                "gpuplace.io/assignment": assignment.to_string(),
                "gpuplace.io/expected-duration": format!("{minutes}m")
            }},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"}
        }),
    )
}

#[tokio::test]
async fn a_quad_pod_blocked_by_two_singles_is_told_fragmentation_and_when_it_starts() {
    let api = MemoryApi::new();
    api.put_node(linked_node("n1", 4));
    api.put_pod(running("single-a", 0, 30));
    api.put_pod(running("single-b", 4, 90));
    let mut quad = pod(
        "quad",
        4,
        json!({"metadata": {"annotations": {"gpuplace.io/topology": "nvlink"}}}),
    );
    quad.spec.as_mut().unwrap().priority = Some(0);
    api.put_pod(quad);
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t = Instant::now();
    scheduler.round(t).await.unwrap();
    let message = last_message(&api, "quad");
    let parsed = gpuplace_core::waiting::Waiting::parse(&message);
    assert_eq!(
        parsed.blocked_by.as_deref(),
        Some("fragmentation"),
        "{message}"
    );
    assert!(
        parsed
            .message
            .contains("Fragmentation: 6 GPU(s) with room for it free across 1 of the 1 node(s) it may use, 4 asked on one node linked by NVLink; the largest block is 3 on node n1."),
        "{message}"
    );
    assert_eq!(parsed.position.as_deref(), Some("1 of 1 in the cluster"));
    // single-a ends in 30 minutes: its quad is whole again then (not at single-b's end).
    let start = parsed.expected_start.unwrap();
    assert!(
        start.ends_with("(in 30m)") || start.ends_with("(in 29m)"),
        "{start}"
    );
    // The pod's condition says the same.
    let condition = api
        .pod("ml", "quad")
        .and_then(|p| p.status?.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert_eq!(condition, message);
    let _ = Duration::ZERO;
}

/// A 1-GPU pod of Job `job` running on GPU `gpu` of node `n1`, declaring nothing itself,
/// and its Job, started now with a deadline of `minutes`.
fn job_pod(
    job: &str,
    gpu: u32,
    minutes: u64,
) -> (
    k8s_openapi::api::core::v1::Pod,
    k8s_openapi::api::batch::v1::Job,
) {
    let mut p = running(&format!("{job}-x"), gpu, 0);
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("gpuplace.io/expected-duration");
    p.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": format!("uid-{job}"),
            "controller": true
        }))
        .unwrap(),
    ]);
    let started = k8s_openapi::jiff::Timestamp::now().to_string();
    let j = serde_json::from_value(json!({
        "metadata": {"name": job, "namespace": "ml", "uid": format!("uid-{job}")},
        "spec": {"activeDeadlineSeconds": minutes * 60,
            "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}}},
        "status": {"startTime": started}
    }))
    .unwrap();
    (p, j)
}

/// The Job controller does not copy a Job's activeDeadlineSeconds onto its pods: the
/// scheduler reads it from the Job, from the Job's start.
#[tokio::test]
async fn a_job_pods_end_is_its_jobs_deadline() {
    let api = MemoryApi::new();
    api.put_node(linked_node("n1", 4));
    for (job, gpu, minutes) in [("train-a", 0, 30), ("train-b", 4, 90)] {
        let (p, j) = job_pod(job, gpu, minutes);
        api.put_pod(p);
        api.put_job(j);
    }
    api.put_pod(pod(
        "quad",
        4,
        json!({"metadata": {"annotations": {"gpuplace.io/topology": "nvlink"}}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let message = last_message(&api, "quad");
    let parsed = gpuplace_core::waiting::Waiting::parse(&message);
    let start = parsed.expected_start.expect(&message);
    assert!(
        start.ends_with("(in 30m)") || start.ends_with("(in 29m)"),
        "{start}"
    );
}

#[tokio::test]
async fn a_pod_behind_others_in_fair_order_is_told_so_with_its_queue() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 2, json!({})));
    for q in ["a", "b"] {
        api.put_queue(q, serde_json::from_value::<QueueSpec>(json!({})).unwrap());
    }
    // b holds nothing and is served first: its pod takes the last 2 GPUs; a's waits.
    api.put_pod(pod(
        "a0",
        2,
        json!({"metadata": {"labels": {"gpuplace.io/queue": "a"}}}),
    ));
    api.put_pod(pod(
        "b0",
        2,
        json!({"metadata": {"labels": {"gpuplace.io/queue": "b"}}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let waiting = ["a0", "b0"]
        .into_iter()
        .find(|n| bound_node(&api, n).is_none())
        .unwrap();
    let parsed = gpuplace_core::waiting::Waiting::parse(&last_message(&api, waiting));
    let q = &waiting[..1];
    assert_eq!(
        parsed.blocked_by.as_deref(),
        Some("others ahead in fair share")
    );
    assert_eq!(
        parsed.position.as_deref(),
        Some(format!("2 of 2 in the cluster, 1 of 1 in queue {q}").as_str())
    );
    assert_eq!(
        parsed.queue.as_deref(),
        Some(
            format!("queue {q}: allocated 0, fair share 1, guarantee 0, limit none GPUs").as_str()
        )
    );
}

/// Written on change: a pod that waits for the same reason while its position, the free
/// GPU counts and its expected start move gets one `FailedScheduling` Event and one
/// condition write, however many times it is tried; its latest message is kept for the
/// on-demand views (`gpuplace status`, the map); another blocker is written at once, and
/// the same meaning again once [`SAME_MEANING_FOR`] has passed (under the Event TTL).
#[tokio::test(start_paused = true)]
async fn a_pod_waiting_for_the_same_reason_is_written_once() {
    use gpuplace_scheduler::scheduler::SAME_MEANING_FOR;
    let api = MemoryApi::new();
    api.put_node(node("n", 4, json!({})));
    api.put_pod(pod("low", 3, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    scheduler.round(t).await.unwrap();
    api.put_pod(pod("big", 4, json!({})));
    let failed = |api: &MemoryApi| {
        api.events()
            .iter()
            .filter(|e| e.pod.name == "big" && e.reason == "FailedScheduling")
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
    };
    let mut messages = std::collections::BTreeSet::new();
    for i in 0..20 {
        // Others arrive behind it and take the one free GPU in turn: its position and
        // the free count move from attempt to attempt.
        api.put_pod(pod(&format!("w{i}"), 8, json!({})));
        t += Duration::from_secs(301);
        scheduler.round(t).await.unwrap();
        scheduler.drain_writes(t).await;
        let uid = api
            .pod("ml", "big")
            .and_then(|p| p.metadata.uid)
            .unwrap_or_default();
        let reasons = scheduler.reasons().snapshot();
        messages.insert(
            reasons
                .get(&uid)
                .map(|r| r.message.clone())
                .unwrap_or_default(),
        );
    }
    assert!(messages.len() > 1, "the message moved: {messages:?}");
    assert_eq!(failed(&api).len(), 1, "{:?}", failed(&api));
    let condition = api
        .pod("ml", "big")
        .and_then(|p| p.status?.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message);
    assert_eq!(
        condition.as_deref(),
        failed(&api).first().map(String::as_str)
    );
    // Another blocker: the node goes; written at once.
    api.delete_node("n");
    t += Duration::from_secs(301);
    scheduler.round(t).await.unwrap();
    scheduler.drain_writes(t).await;
    assert_eq!(failed(&api).len(), 2, "{:?}", failed(&api));
    // The same meaning again past SAME_MEANING_FOR: written again (the Event expires).
    tokio::time::advance(SAME_MEANING_FOR).await;
    t += SAME_MEANING_FOR;
    scheduler.round(t).await.unwrap();
    scheduler.drain_writes(t).await;
    assert_eq!(failed(&api).len(), 3, "{:?}", failed(&api));
}
