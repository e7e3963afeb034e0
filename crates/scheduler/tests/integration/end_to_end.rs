//! The real scheduling loop against the in-memory API: mixed workloads, exact devices,
//! explained failures, conflicts, deletions mid-cycle, gangs, and a restart mid-stream.

use std::time::{Duration, Instant};

use gpuplace_scheduler::{EventRecord, Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;
use crate::wrapped::{Hooks, Wrapped};

#[tokio::test]
async fn mixed_workload_gets_exact_devices() {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("dgx"));
    api.put_node(node("t4", 2, json!({"metadata": {"labels": {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360"}}})));
    api.put_node(node("cpu", 0, json!({})));
    api.put_pod(pod("pair", 2, json!({})));
    api.put_pod(pod("half-a", 1, share("500")));
    api.put_pod(pod("half-b", 1, share("500")));
    api.put_pod(pod("cpu-only", 0, json!({})));
    api.put_pod(pod(
        "two-containers",
        0,
        json!({"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}),
    ));
    api.put_pod(pod(
        "other-scheduler",
        1,
        json!({"spec": {"schedulerName": "default-scheduler"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 5, "{report:?}");
    assert!(bound_node(&api, "other-scheduler").is_none());
    // The 2-GPU pod gets an NVLink pair.
    let pair = assignment(&api, "pair").unwrap();
    let idx: Vec<u32> = pair.containers[0].devices.iter().map(|d| d.index).collect();
    if pair.node == "dgx" {
        assert_eq!(idx[0] / 2, idx[1] / 2, "an NVLink pair: {idx:?}");
    }
    // Halves share one GPU rather than breaking two.
    let a = assignment(&api, "half-a").unwrap();
    let b = assignment(&api, "half-b").unwrap();
    assert_eq!(a.containers[0].devices[0].milli, 500);
    assert_eq!(
        (a.node.clone(), a.containers[0].devices[0].id.clone()),
        (b.node.clone(), b.containers[0].devices[0].id.clone())
    );
    // Per-container split.
    let two = assignment(&api, "two-containers").unwrap();
    assert_eq!(two.containers.len(), 2);
    assert_eq!(two.containers[0].devices.len(), 1);
    assert_eq!(two.containers[1].devices.len(), 2);
    assert_eq!(two.policy, "fgd");
    assert_no_double_booking(&api);
    let events = api.events();
    assert!(events.iter().filter(|e| e.reason == "Scheduled").count() >= 5);
    assert!(
        events
            .iter()
            .any(|e| e.message.starts_with("Successfully assigned ml/pair to "))
    );
}

#[tokio::test]
async fn failures_are_explained_like_kube_scheduler() {
    let api = MemoryApi::new();
    for i in 0..3 {
        api.put_node(node(&format!("small-{i}"), 1, json!({})));
    }
    for i in 0..2 {
        api.put_node(node(
            &format!("tainted-{i}"),
            8,
            json!({"spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}}),
        ));
    }
    api.put_pod(pod("big", 4, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.unschedulable, 1);
    let event = api.events().pop().unwrap();
    assert_eq!(event.reason, "FailedScheduling");
    assert_eq!(event.kind, "Warning");
    assert!(
        event.message.starts_with("blocked by: capacity (gpu) | ")
            && event
                .message
                .contains(" | position: 1 of 1 in the cluster | unblocked by: nothing found"),
        "{}",
        event.message
    );
    assert_eq!(
        kube_part(&event.message),
        "0/5 nodes are available: 3 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {gpu: true}. \
         Capacity: 3 GPU(s) with room for it free on the 3 node(s) it may use, 4 asked. \
         preemption: 0/5 nodes are available: 3 No preemption victims found for incoming pod, \
         2 Preemption is not helpful for scheduling."
    );
    // The pod's PodScheduled=False condition (this scheduler's own write) comes back as a
    // watch event: one round takes the view and retries nobody. Then, with nothing
    // changed, later rounds do not even look (no retry, no Event), however long it waits.
    let report = scheduler.round(t0 + Duration::from_secs(30)).await.unwrap();
    assert_eq!((report.unschedulable, report.bound), (0, 0), "{report:?}");
    let report = scheduler.round(t0 + Duration::from_secs(60)).await.unwrap();
    assert!(report.idle, "{report:?}");
    assert_eq!(api.events().len(), 1);
    // A new node wakes it; it is tried once its backoff (1 s) is over.
    api.put_node(node("big-node", 8, json!({})));
    let report = scheduler
        .round(t0 + Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        (report.bound, report.unschedulable, report.pending),
        (0, 0, 1)
    );
    assert_eq!(report.gpu_capacity_milli, 27_000);
    let report = scheduler.round(t0 + Duration::from_secs(1)).await.unwrap();
    assert_eq!(report.bound, 1);
    assert_eq!(bound_node(&api, "big").as_deref(), Some("big-node"));
    // Bad input: a malformed share annotation is explained, not a crash.
    api.put_pod(pod(
        "bad",
        1,
        json!({"metadata": {"annotations": {"gpuplace.io/gpu-milli": "half"}}}),
    ));
    scheduler.round(Instant::now()).await.unwrap();
    let event = api.events().pop().unwrap();
    assert!(
        event.message.contains("gpuplace.io/gpu-milli"),
        "{}",
        event.message
    );
}

/// Changes the world between the view and the writes.
#[derive(Clone)]
struct Meddling(fn(&MemoryApi));

impl Hooks for Meddling {
    fn after_view(&self, api: &MemoryApi) {
        (self.0)(api);
    }
}

/// Node `n` (2 GPUs), pod `p` asking both, and a scheduler whose API runs `action` after
/// each view.
fn meddled(action: fn(&MemoryApi)) -> (MemoryApi, Scheduler<Wrapped<Meddling>>) {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    api.put_pod(pod("p", 2, json!({})));
    let meddling = Wrapped {
        inner: api.clone(),
        hooks: Meddling(action),
    };
    (api, Scheduler::new(meddling, config()))
}

#[tokio::test]
async fn a_pod_written_after_the_view_but_unchanged_is_bound_with_its_fresh_version() {
    // The pod is written after the view (its resourceVersion moves, nothing it asks or
    // allows changes): the Binding's precondition gets a 409, a read finds the same pod,
    // and the Binding goes again with the fresh resourceVersion.
    let (api, mut scheduler) = meddled(|api| {
        if let Some(p) = api.pod("ml", "p") {
            api.put_pod(p);
        }
    });
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.conflicts), (1, 0), "{report:?}");
    assert_eq!(bound_node(&api, "p").as_deref(), Some("n"));
}

#[tokio::test]
async fn conflicts_and_deletions_leave_nothing_reserved() {
    // The pod is changed after the view (a label: what others' affinities and the queues
    // read): the Binding's resourceVersion precondition gets a 409, nothing binds.
    let (api, mut scheduler) = meddled(|api| {
        if let Some(mut p) = api.pod("ml", "p")
            && p.metadata.labels.is_none()
        {
            p.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
            api.put_pod(p);
        }
    });
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.conflicts), (0, 1));
    assert!(bound_node(&api, "p").is_none());
    assert!(assignment(&api, "p").is_none());
    // With a fresh view it binds.
    let mut scheduler = Scheduler::new(api.clone(), config());
    assert_eq!(scheduler.round(Instant::now()).await.unwrap().bound, 1);

    // Deleted after the view: 404, no binding.
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    api.put_pod(pod("gone", 1, json!({})));
    let meddling = Wrapped {
        inner: api.clone(),
        hooks: Meddling(|api| api.delete_pod("ml", "gone")),
    };
    let mut scheduler = Scheduler::new(meddling, config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 0);
    assert!(api.bindings().is_empty());

    // A refused Binding writes nothing (the assignment travels in the Binding), forgets
    // its reservation, and the GPU goes to a pod after the backoff.
    let api = MemoryApi::new();
    api.put_node(node("n", 1, json!({})));
    api.put_pod(pod("first", 1, json!({})));
    api.put_pod(pod(
        "second",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"}}),
    ));
    api.fail_next_binds(1);
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!((report.conflicts, report.bound), (1, 0));
    assert!(assignment(&api, "first").is_none(), "no half-written plan");
    assert!(scheduler.reservations().is_empty());
    let report = scheduler.round(t0 + Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        report.bound, 1,
        "the GPU was not left reserved for the failed pod"
    );
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn restart_mid_stream_never_double_books() {
    let api = MemoryApi::new();
    // 48 GPUs for 40 GPUs of requests.
    for i in 0..6 {
        api.put_node(nvlink_node(&format!("n{i}")));
    }
    for i in 0..40 {
        let (gpus, extra) = match i % 4 {
            0 => (1, share("300")),
            1 => (1, json!({})),
            2 => (2, json!({})),
            _ => (1, share("700")),
        };
        api.put_pod(pod(&format!("p{i:02}"), gpus, extra));
        if i == 19 {
            // First scheduler places the first half, then "crashes".
            let mut first = Scheduler::new(api.clone(), config());
            first.round(Instant::now()).await.unwrap();
        }
    }
    let mut second = Scheduler::new(
        api.clone(),
        SchedulerConfig {
            seed: 7,
            ..config()
        },
    );
    second.round(Instant::now()).await.unwrap();
    assert_no_double_booking(&api);
    let bound = api
        .pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count();
    assert_eq!(bound, 40);
}

#[tokio::test]
async fn gangs_are_all_or_nothing() {
    let api = MemoryApi::new();
    api.put_node(node("a", 4, json!({})));
    api.put_node(node("b", 4, json!({})));
    api.put_group(group("train", 3, 30));
    for i in 0..3 {
        api.put_pod(pod(
            &format!("w{i}"),
            4,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"}}}),
        ));
    }
    let start = Instant::now();
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(start).await.unwrap();
    assert_eq!(
        (report.bound, report.waiting_gangs),
        (0, 1),
        "two of three fit: none binds"
    );
    assert!(api.bindings().is_empty());
    // Why is said at once: on the PodGroup and to every member, not only at the timeout.
    let status = api.group("ml", "train").unwrap().status.unwrap();
    assert_eq!(status.phase, "Pending");
    let why = status
        .unschedulable_message()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("only 2 of 3 members fit at once"), "{why}");
    assert!(!why.contains(".."), "one period: {why}");
    let failed = |api: &MemoryApi| -> Vec<EventRecord> {
        api.events()
            .into_iter()
            .filter(|e| e.reason == "FailedScheduling")
            .collect()
    };
    assert_eq!(failed(&api).len(), 3, "each member told once");
    assert!(
        failed(&api)[0].message.contains("waits up to 30s"),
        "{}",
        failed(&api)[0].message
    );
    // The same reason is not repeated on every retry.
    scheduler
        .round(start + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(failed(&api).len(), 3);
    // After the timeout, the next attempt (an event: a node without GPUs joins) tells the
    // members again and backs them off.
    api.put_node(node("z", 0, json!({})));
    scheduler
        .round(start + Duration::from_secs(31))
        .await
        .unwrap();
    let failed = failed(&api);
    assert_eq!(failed.len(), 6);
    assert!(
        failed[5]
            .message
            .contains("only 2 of 3 members fit at once"),
        "{}",
        failed[5].message
    );
    assert!(!failed[5].message.contains(".."), "{}", failed[5].message);
    assert_eq!(
        api.group("ml", "train").unwrap().status.unwrap().phase,
        "Unschedulable"
    );
    // Capacity arrives: all three bind in one round (once their backoff is over).
    api.put_node(node("c", 4, json!({})));
    let report = scheduler
        .round(start + Duration::from_secs(40))
        .await
        .unwrap();
    assert_eq!(report.bound, 3);
    let status = api.group("ml", "train").unwrap().status.unwrap();
    assert_eq!((status.phase.as_str(), status.scheduled), ("Scheduled", 3));
    assert!(
        status.conditions.is_empty(),
        "scheduled: the reason is cleared"
    );
    assert_no_double_booking(&api);
}

/// A PodGroup made, or its status written by the scheduler, wakes its own members only: a
/// parked pod of no gang stays parked (it woke on every group status write, so it was
/// tried again in rounds the timeline replay did not have).
#[tokio::test]
async fn a_pod_group_wakes_only_its_own_members() {
    let api = MemoryApi::new();
    api.put_node(node("a", 4, json!({})));
    api.put_pod(pod("big", 8, json!({})));
    let start = Instant::now();
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(start).await.unwrap();
    assert_eq!(report.unschedulable, 1, "big fits nowhere and parks");
    // A gang arrives (its group, then its members: one of two fits); big is past its
    // backoff but parked: nothing that frees room happened.
    api.put_group(group("train", 2, 30));
    for i in 0..2 {
        api.put_pod(pod(
            &format!("w{i}"),
            4,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"}}}),
        ));
    }
    let report = scheduler
        .round(start + Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(report.waiting_gangs, 1);
    assert_eq!(report.unschedulable, 0, "big was not tried");
    assert!(api.group("ml", "train").unwrap().status.is_some());
    // The group's status written in that round wakes nobody either.
    let report = scheduler
        .round(start + Duration::from_secs(6))
        .await
        .unwrap();
    assert_eq!((report.unschedulable, report.waiting_gangs), (0, 0));
    assert!(api.bindings().is_empty());
}

/// Every kind of failure the loop explains, one pod each, on a cluster that has a bit of
/// everything; the Event messages are snapshots (tests/snapshots), so a change of wording
/// shows in review.
#[tokio::test]
async fn event_messages_snapshot() {
    let api = MemoryApi::new();
    api.put_node(node(
        "a100-0",
        2,
        json!({"metadata": {"labels": {"zone": "a", "nvidia.com/gpu.product": "A100"}}}),
    ));
    api.put_node(node(
        "a100-1",
        2,
        json!({"metadata": {"labels": {"zone": "b", "nvidia.com/gpu.product": "A100"}}}),
    ));
    api.put_node(node(
        "t4",
        1,
        json!({"metadata": {"labels": {"zone": "a", "nvidia.com/gpu.product": "Tesla-T4"}}}),
    ));
    api.put_node(node(
        "cordoned",
        8,
        json!({"spec": {"unschedulable": true}}),
    ));
    api.put_node(node(
        "down",
        8,
        // Not ready: the node lifecycle controller taints it (readiness is judged by taints).
        json!({"spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    ));
    api.put_node(node(
        "tainted",
        8,
        json!({"spec": {"taints": [{"key": "dedicated", "value": "infer", "effect": "NoExecute"}]}}),
    ));
    api.put_pod(pod("too-many-gpus", 4, json!({})));
    api.put_pod(pod(
        "wrong-zone",
        1,
        json!({"spec": {"nodeSelector": {"zone": "c"}}}),
    ));
    api.put_pod(pod(
        "huge-cpu",
        1,
        json!({"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "64"}, "limits": {"nvidia.com/gpu": "1"}}}]}}),
    ));
    api.put_pod(pod(
        "h100-only",
        1,
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}}}}}),
    ));
    api.put_pod(pod("bad-share", 1, share("1500")));
    api.put_pod(pod(
        "bad-cpu",
        0,
        json!({"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "two"}}}]}}),
    ));
    api.put_pod(pod(
        "fpga",
        0,
        json!({"spec": {"containers": [{"name": "main", "resources": {"limits": {"example.com/fpga": "1"}}}]}}),
    ));
    api.put_pod(pod(
        "orphan-member",
        1,
        json!({"metadata": {"labels": {"gpuplace.io/pod-group": "missing"}}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let mut lines: Vec<String> = api
        .events()
        .into_iter()
        .map(|e| format!("{} {} {}: {}", e.pod, e.kind, e.reason, e.message))
        .collect();
    lines.sort();
    insta::assert_snapshot!(lines.join("\n"));
}

/// A node whose device plugin time-slices its 2 GPUs into 4 replicas each (allocatable
/// `nvidia.com/gpu: 8`, label `nvidia.com/gpu.replicas: 4`): the scheduler keeps its two
/// real GPUs and places eight one-GPU pods, each a quarter of one GPU, four per GPU; a
/// ninth stays Pending.
#[tokio::test]
async fn time_sliced_replicas_keep_the_real_gpus_and_pack_one_gpu_pods() {
    let api = MemoryApi::new();
    let mut inv = gpuplace_model::NodeInventory::uniform("ts", 0, 0, 2, "A100");
    for g in &mut inv.gpus {
        g.id = format!("GPU-ts-{}", g.index);
    }
    api.put_node(node(
        "ts",
        8,
        json!({"metadata": {"labels": {"nvidia.com/gpu.replicas": "4"},
            "annotations": {"gpuplace.io/inventory": inv.to_json()}}}),
    ));
    for i in 0..9 {
        api.put_pod(pod(&format!("r{i}"), 1, json!({})));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 8, "{report:?}");
    let mut per_gpu: std::collections::HashMap<String, u32> = Default::default();
    for i in 0..9 {
        if let Some(a) = assignment(&api, &format!("r{i}")) {
            let d = &a.containers[0].devices[0];
            assert_eq!(d.milli, 250);
            *per_gpu.entry(d.id.clone()).or_default() += d.milli;
        }
    }
    assert_eq!(per_gpu.len(), 2, "{per_gpu:?}");
    assert!(per_gpu.values().all(|m| *m == 1000), "{per_gpu:?}");
    // A restarted scheduler counts the bound replicas the same way: still full.
    let mut again = Scheduler::new(api.clone(), config());
    let report = again.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 0, "{report:?}");
}

/// The real node's finding: a PodGroup of three 4-GPU pods on one 8-GPU node, then its
/// `minMember` lowered to 2. Two members bind; the PodGroup counts only bound members, and
/// the third carries a PodScheduled=False condition and an Event with its current reason.
#[tokio::test]
async fn a_gang_whose_min_member_is_lowered_counts_only_its_bound_members() {
    let api = MemoryApi::new();
    api.put_node(node("a", 8, json!({})));
    api.put_group(group("train", 3, 30));
    for i in 0..3 {
        api.put_pod(pod(
            &format!("w{i}"),
            4,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"}}}),
        ));
    }
    let start = Instant::now();
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(start).await.unwrap();
    assert_eq!(report.bound, 0);
    api.put_group(group("train", 2, 30));
    let mut t = start;
    for _ in 0..20 {
        t += Duration::from_millis(500);
        scheduler.round(t).await.unwrap();
    }
    let bound: Vec<String> = api
        .pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(bound.len(), 2, "{bound:?}");
    let status = api.group("ml", "train").unwrap().status.unwrap();
    eprintln!("{status:?}");
    assert_eq!(status.scheduled, 2, "{status:?}");
    let waiting = api
        .pods()
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .expect("one member waits");
    let name = waiting.metadata.name.clone().unwrap_or_default();
    let condition = waiting
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .cloned()
        .expect("a PodScheduled condition");
    assert_eq!(condition.status, "False");
    let last = api
        .events()
        .into_iter()
        .rfind(|e| e.reason == "FailedScheduling" && e.pod.name == name)
        .expect("an Event");
    eprintln!(
        "condition: {:?}\nevent: {}",
        condition.message, last.message
    );
    assert_eq!(condition.message.as_deref(), Some(last.message.as_str()));
    assert!(!last.message.contains("only 2 of 3"), "{}", last.message);
}

#[tokio::test]
async fn a_round_stops_at_its_decision_cap_and_the_next_takes_the_rest_in_order() {
    let api = MemoryApi::new();
    api.put_node(node("n", 8, json!({})));
    for i in 0..8 {
        api.put_pod(pod(&format!("p{i}"), 1, json!({})));
    }
    let config = SchedulerConfig {
        max_round_decisions: 3,
        ..config()
    };
    let mut scheduler = Scheduler::new(api.clone(), config);
    let now = Instant::now();
    let mut rounds = Vec::new();
    loop {
        let report = scheduler.round(now).await.unwrap();
        rounds.push((report.assumed, report.more));
        if !report.more {
            break;
        }
        // What the capped round decided is bound; the pods it did not reach are not.
        let decided: usize = rounds.iter().map(|r| r.0).sum();
        for i in 0..8 {
            let bound = bound_node(&api, &format!("p{i}")).is_some();
            assert_eq!(bound, i < decided, "p{i} after {rounds:?}");
        }
    }
    assert_eq!(rounds, [(3, true), (3, true), (2, false)]);
}
