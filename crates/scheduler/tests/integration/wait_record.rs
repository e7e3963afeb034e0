//! The wait record is right: a pod behind 100 waiting pods of its queue (parked, not tried
//! in its round) is told its true place in the line; CPU short on the GPU nodes is
//! capacity (cpu), not its constraints; a gang its queue's limit holds back says so, with
//! its member count; the record is kept in the scheduler's memory, typed.

use std::time::{Duration, Instant};

use gpuplace_core::waiting::{Blocker, Place, Resource, Waiting};
use gpuplace_scheduler::Scheduler;
use gpuplace_scheduler::k8s::queue::QueueSpec;
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

/// A 1-GPU pod of queue `q`, made `minute` minutes into the day.
fn queued(name: &str, q: &str, minute: u32) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        1,
        json!({"metadata": {
            "labels": {"gpuplace.io/queue": q},
            "creationTimestamp": format!("2026-01-01T{:02}:{:02}:00Z", minute / 60, minute % 60)
        }}),
    )
}

#[tokio::test]
async fn a_pod_behind_100_waiting_pods_of_its_queue_is_told_its_true_position() {
    let api = MemoryApi::new();
    api.put_node(node("n", 1, json!({})));
    api.put_queue("a", serde_json::from_value::<QueueSpec>(json!({})).unwrap());
    api.put_pod(pod(
        "holder",
        1,
        json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}}),
    ));
    for i in 0..100 {
        api.put_pod(queued(&format!("p{i:03}"), "a", i));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    scheduler.round(t).await.unwrap();
    let first = Waiting::parse(&last_message(&api, "p000"));
    assert_eq!(
        first.position.as_deref(),
        Some("1 of 100 in the cluster, 1 of 100 in queue a")
    );
    // The 100 are parked (nothing changed for them); the late pod is tried alone.
    api.put_pod(queued("late", "a", 500));
    t += Duration::from_secs(1);
    let report = scheduler.round(t).await.unwrap();
    assert_eq!(report.unschedulable, 1, "only the late pod is tried");
    let late = Waiting::parse(&last_message(&api, "late"));
    assert_eq!(
        late.position.as_deref(),
        Some("101 of 101 in the cluster, 101 of 101 in queue a")
    );
    // The scheduler keeps the record, typed.
    let reasons = scheduler.reasons().snapshot();
    let uid = api.pod("ml", "late").unwrap().metadata.uid.unwrap();
    let record = reasons[&uid].record.clone().unwrap();
    let position = record.position.clone().unwrap();
    assert_eq!(position.in_cluster, Place { at: 101, of: 101 });
    assert_eq!(position.in_queue, Some(Place { at: 101, of: 101 }));
}

#[tokio::test]
async fn cpu_short_on_the_gpu_nodes_is_capacity_cpu() {
    let api = MemoryApi::new();
    // 3 CPUs, 4 GPUs: a CPU-only pod holds 2 CPUs, so a 1-GPU pod asking 2 does not fit.
    api.put_node(node(
        "n",
        4,
        json!({"status": {"allocatable": {"cpu": "3"}}}),
    ));
    api.put_pod(pod(
        "cpu-hog",
        0,
        json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}}),
    ));
    api.put_pod(pod("gpu", 1, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let message = last_message(&api, "gpu");
    assert!(
        message.starts_with("blocked by: capacity (cpu) | "),
        "{message}"
    );
    let uid = api.pod("ml", "gpu").unwrap().metadata.uid.unwrap();
    let record = scheduler.reasons().snapshot()[&uid].record.clone().unwrap();
    assert_eq!(record.blocker, Blocker::Capacity(Resource::Cpu));
}

#[tokio::test]
async fn a_gang_held_back_by_its_queue_limit_says_so_with_its_member_count() {
    let api = MemoryApi::new();
    api.put_node(node("n", 8, json!({})));
    api.put_queue(
        "c",
        serde_json::from_value::<QueueSpec>(json!({"limit": {"nvidia.com/gpu": 2}})).unwrap(),
    );
    api.put_group(group("train", 4, 60));
    for i in 0..4 {
        api.put_pod(pod(
            &format!("m{i}"),
            1,
            json!({"metadata": {"labels": {
                "gpuplace.io/queue": "c", "gpuplace.io/pod-group": "train"
            }}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(bound_count(&api, "m"), 0);
    for i in 0..4 {
        let message = last_message(&api, &format!("m{i}"));
        let parsed = Waiting::parse(&message);
        assert_eq!(
            parsed.blocked_by.as_deref(),
            Some("queue limit"),
            "{message}"
        );
        assert_eq!(
            parsed.gang.as_deref(),
            Some("ml/train, 4 member(s) waiting of 4 needed"),
            "{message}"
        );
    }
}
