//! What the event-driven scheduler guarantees, each against a fake that behaves as a
//! server does where it matters (late watch events, latency, limited concurrency, faults).
//! Every test here fails on the old round-based loop.

use std::time::{Duration, Instant};

use gpuplace_scheduler::k8s::leader::Gate;
use gpuplace_scheduler::{ClusterApi, Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::api::{Faults, ServerCosts};
use serde_json::json;

use crate::common::*;

fn lagging(delay_ms: u64) -> MemoryApi {
    MemoryApi::new().with_costs(ServerCosts {
        watch_delay: (
            Duration::from_millis(delay_ms),
            Duration::from_millis(delay_ms),
        ),
        ..Default::default()
    })
}

async fn advance(ms: u64) {
    tokio::time::advance(Duration::from_millis(ms)).await;
}

#[tokio::test(start_paused = true)]
async fn a_lagging_watch_never_gets_one_gpu_given_twice() {
    let api = lagging(2000);
    api.put_node(node("n", 1, json!({})));
    api.put_pod(pod("a", 1, json!({})));
    advance(2100).await;
    // The client's first list (a, pending); b is created now: the watch shows it 2 s later.
    api.view().await.unwrap();
    api.put_pod(pod(
        "b",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    advance(1000).await;
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.bound, 1, "a is bound; its binding shows 2 s later");
    advance(1500).await;
    // b is visible now, and a still looks pending: the reservation holds its GPU.
    let view = api.view().await.unwrap();
    assert!(
        view.pod("ml", "a").unwrap().node_name.is_none(),
        "watch lag"
    );
    assert!(view.pod("ml", "b").is_some());
    let report = scheduler.round(t0 + Duration::from_secs(3)).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (0, 1), "{report:?}");
    assert_eq!(scheduler.reservations().len(), 1);
    assert_no_double_booking(&api);
    // The watch catches up: the binding replaces the reservation.
    advance(1000).await;
    scheduler.round(t0 + Duration::from_secs(4)).await.unwrap();
    assert!(scheduler.reservations().is_empty());
    assert_eq!(api.bindings().len(), 1);
}

#[tokio::test]
async fn backoff_is_per_pod_and_unrelated_events_do_not_reset_it() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    // Room on n is not what it lacks (its selector matches no node), so a departure
    // from n wakes it and it fails again.
    api.put_pod(pod(
        "picky",
        1,
        json!({"spec": {"nodeSelector": {"zone": "elsewhere"}}}),
    ));
    api.put_pod(pod("other", 1, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod("pending-other", 8, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.unschedulable, 2);
    let events = api.events().len();
    // Deleting a pending pod frees nothing: picky stays parked, however often rounds run.
    api.delete_pod("ml", "pending-other");
    for s in 1..=5 {
        let report = scheduler.round(t0 + Duration::from_secs(s)).await.unwrap();
        assert_eq!(report.unschedulable, 0, "round {s}: {report:?}");
    }
    assert_eq!(api.events().len(), events, "no Event without an attempt");
    // A bound pod leaving could help: picky is tried again, once, and backs off longer.
    api.delete_pod("ml", "other");
    let report = scheduler.round(t0 + Duration::from_secs(6)).await.unwrap();
    assert_eq!(report.unschedulable, 1);
    let report = scheduler.round(t0 + Duration::from_secs(7)).await.unwrap();
    assert_eq!(report.unschedulable, 0);
}

#[tokio::test]
async fn a_departure_that_cannot_make_room_wakes_nobody() {
    // core's wake rule: a pod alone wakes only where a node pods left could take it once
    // what pods of its priority or higher keep there is counted.
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    api.put_pod(pod("a", 1, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod("cpu-only", 0, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod("big", 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.unschedulable, 1, "{report:?}");
    // a keeps one of n's two GPUs: big cannot start there, so it is not tried.
    api.delete_pod("ml", "cpu-only");
    for s in 2..=4 {
        let report = scheduler.round(t0 + Duration::from_secs(s)).await.unwrap();
        assert_eq!(
            (report.bound, report.unschedulable),
            (0, 0),
            "round {s}: {report:?}"
        );
    }
    api.delete_pod("ml", "a");
    let report = scheduler.round(t0 + Duration::from_secs(5)).await.unwrap();
    assert_eq!(report.bound, 1, "big is woken by a leaving: {report:?}");
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn one_slot_opened_wakes_one_pod_of_a_shape_the_first_in_queue_order() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    api.put_pod(pod("a", 1, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod("b", 1, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod(
        "first",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"}}),
    ));
    api.put_pod(pod(
        "second",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:01Z"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.unschedulable, 2, "{report:?}");
    // One GPU comes free: the first waiting pod is tried and bound, the second is not
    // tried (it would fail).
    api.delete_pod("ml", "a");
    let report = scheduler.round(t0 + Duration::from_secs(2)).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (1, 0), "{report:?}");
    assert!(
        api.pod("ml", "first")
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_some()
    );
    api.delete_pod("ml", "b");
    let report = scheduler.round(t0 + Duration::from_secs(4)).await.unwrap();
    assert_eq!(report.bound, 1, "{report:?}");
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_pod_bound_and_deleted_between_two_views_wakes_parked_pods() {
    // Found by the timeline replay through the stack: a short pod bound in one round and
    // gone before the next view never showed it bound, so its departure woke nobody and
    // parked pods waited for the 5-minute flush.
    let api = MemoryApi::new();
    api.put_node(node("n", 1, json!({})));
    api.put_pod(pod("a", 1, json!({})));
    api.put_pod(pod(
        "b",
        1,
        json!({"metadata": {"creationTimestamp": "2030-01-01T00:00:00Z"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (1, 1), "{report:?}");
    api.delete_pod("ml", "a");
    let report = scheduler.round(t0 + Duration::from_secs(2)).await.unwrap();
    assert_eq!(report.bound, 1, "b is woken by a leaving: {report:?}");
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn gated_pods_wait_for_their_gates() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    let gated = pod(
        "gated",
        1,
        json!({"spec": {"schedulingGates": [{"name": "example.com/quota"}]}}),
    );
    api.put_pod(gated.clone());
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(
        (report.bound, report.unschedulable, report.pending),
        (0, 0, 0)
    );
    assert!(api.events().is_empty() && api.bindings().is_empty());
    // The gate is removed: the pod is scheduled.
    let mut open = api.pod("ml", "gated").unwrap();
    open.spec.as_mut().unwrap().scheduling_gates = None;
    api.put_pod(open);
    assert_eq!(scheduler.round(Instant::now()).await.unwrap().bound, 1);
}

#[tokio::test]
async fn a_gang_goes_at_its_highest_members_priority() {
    let api = MemoryApi::new();
    api.put_node(node("n", 4, json!({})));
    api.put_group(group("train", 2, 30));
    // An older single pod of priority 0 and a gang whose one member has priority 100.
    api.put_pod(pod(
        "single",
        4,
        json!({"metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"}}),
    ));
    for (i, priority) in [(0, 0), (1, 100)] {
        api.put_pod(pod(
            &format!("w{i}"),
            2,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"},
                "creationTimestamp": "2030-01-01T00:00:00Z"},
                "spec": {"priority": priority}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 2, "{report:?}");
    assert!(bound_node(&api, "w0").is_some() && bound_node(&api, "w1").is_some());
    assert!(bound_node(&api, "single").is_none());
}

#[tokio::test]
async fn pods_ephemeral_storage_and_hugepages_are_counted() {
    let api = MemoryApi::new();
    api.put_node(node(
        "n",
        0,
        json!({"status": {"allocatable": {"pods": "2", "ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"}}}),
    ));
    api.put_pod(pod("running", 0, json!({"spec": {"nodeName": "n"}})));
    for i in 0..2 {
        api.put_pod(pod(&format!("p{i}"), 0, json!({})));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (1, 1));
    let failed = api
        .events()
        .into_iter()
        .find(|e| e.reason == "FailedScheduling");
    assert!(failed.unwrap().message.contains("1 Too many pods"));

    let api = MemoryApi::new();
    api.put_node(node(
        "n",
        0,
        json!({"status": {"allocatable": {"ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"}}}),
    ));
    let asks = |name: &str, resource: &str, amount: &str| {
        pod(
            name,
            0,
            json!({"spec": {"containers": [{"name": "c", "resources": {
                "requests": {resource: amount}, "limits": {resource: amount}}}]}}),
        )
    };
    api.put_pod(asks("disk-a", "ephemeral-storage", "6Gi"));
    api.put_pod(asks("disk-b", "ephemeral-storage", "6Gi"));
    api.put_pod(asks("huge", "hugepages-2Mi", "2Gi"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (1, 2), "{report:?}");
    let messages: Vec<String> = api.events().into_iter().map(|e| e.message).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("Insufficient ephemeral-storage"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("Insufficient hugepages-2Mi"))
    );
}

#[tokio::test]
async fn a_gang_binds_whole_through_conflicts_and_its_status_is_written_on_change() {
    let api = MemoryApi::new();
    api.put_node(node("a", 4, json!({})));
    api.put_node(node("b", 4, json!({})));
    api.put_group(group("train", 3, 30));
    for i in 0..3 {
        api.put_pod(pod(
            &format!("w{i}"),
            2,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"}}}),
        ));
    }
    // The second member's first Binding is refused: it is retried, the gang ends whole.
    api.fail_next_binds(2);
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.bound, 3, "{report:?}");
    let status = api.group("ml", "train").unwrap().status.unwrap();
    assert_eq!((status.phase.as_str(), status.scheduled), ("Scheduled", 3));
    let writes = api.status_writes();
    assert_eq!(writes, 1, "one status write: Scheduled");
    for s in 1..5 {
        scheduler.round(t0 + Duration::from_secs(s)).await.unwrap();
    }
    assert_eq!(
        api.status_writes(),
        writes,
        "nothing changed, nothing written"
    );
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn an_idle_scheduler_builds_nothing() {
    let api = MemoryApi::new();
    for i in 0..50 {
        api.put_node(nvlink_node(&format!("n{i}")));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    assert!(!scheduler.round(t0).await.unwrap().idle);
    for s in 1..100 {
        let report = scheduler.round(t0 + Duration::from_secs(s)).await.unwrap();
        assert!(report.idle, "round {s}");
    }
    api.put_pod(pod("p", 1, json!({})));
    let report = scheduler
        .round(t0 + Duration::from_secs(100))
        .await
        .unwrap();
    assert!(!report.idle && report.bound == 1);
}

#[tokio::test]
async fn a_closed_gate_decides_and_writes_nothing() {
    let api = MemoryApi::new();
    api.put_node(node("n", 8, json!({})));
    for i in 0..4 {
        api.put_pod(pod(&format!("p{i}"), 1, json!({})));
    }
    let gate = Gate::closed();
    let mut scheduler = Scheduler::with_gate(api.clone(), config(), gate.clone());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.assumed + report.bound, 0);
    assert_eq!(api.requests(), 0);
    gate.extend(tokio::time::Instant::now(), Duration::from_secs(10));
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 4);
}

#[tokio::test(start_paused = true)]
async fn writes_overlap_up_to_the_limit_and_one_write_per_pod() {
    let api = MemoryApi::new().with_costs(ServerCosts {
        latency: Duration::from_millis(10),
        ..Default::default()
    });
    for i in 0..8 {
        api.put_node(nvlink_node(&format!("n{i}")));
    }
    for i in 0..64 {
        api.put_pod(pod(&format!("p{i:02}"), 1, json!({})));
    }
    let mut scheduler = Scheduler::new(
        api.clone(),
        SchedulerConfig {
            max_in_flight: 8,
            ..config()
        },
    );
    let started = tokio::time::Instant::now();
    let report = scheduler.settle_round().await;
    assert_eq!(report.bound, 64);
    // 64 Bindings of 10 ms, 8 at a time: 80 ms of writes (Events on slots of their own).
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "{took:?}");
    assert!(api.peak_in_flight() <= 8 + 8, "{}", api.peak_in_flight());
    let bindings_and_events = api.requests();
    assert_eq!(
        bindings_and_events,
        64 * 2,
        "one Binding and one Event per pod"
    );
    assert_no_double_booking(&api);
}

/// A round and its settling, as tests of timing want it.
trait SettleRound {
    async fn settle_round(&mut self) -> gpuplace_scheduler::RoundReport;
}

impl<A: ClusterApi> SettleRound for Scheduler<A> {
    async fn settle_round(&mut self) -> gpuplace_scheduler::RoundReport {
        self.round(Instant::now()).await.unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn ambiguous_failures_are_settled_by_reading_the_pod() {
    // Every request times out half the time (applied or not): each pod still ends bound
    // exactly once, with its assignment.
    let api = MemoryApi::new().with_costs(ServerCosts {
        faults: Faults {
            timeout: 0.5,
            ..Default::default()
        },
        seed: 3,
        ..Default::default()
    });
    api.put_node(nvlink_node("n"));
    for i in 0..8 {
        api.put_pod(pod(&format!("p{i}"), 1, json!({})));
    }
    let mut scheduler = Scheduler::new(
        api.clone(),
        SchedulerConfig {
            bind_attempts: 10,
            ..config()
        },
    );
    let t0 = Instant::now();
    for s in 0..60 {
        scheduler.round(t0 + Duration::from_secs(s)).await.unwrap();
    }
    assert_eq!(api.bindings().len(), 8);
    for i in 0..8 {
        assert!(assignment(&api, &format!("p{i}")).is_some());
    }
    assert_no_double_booking(&api);
}

/// Pod `b` waits on node `n`'s one GPU, taken by `a`; `a` leaves, and just before the round
/// that places `b`, `change` rewrites `b` (the view still holds `b`'s earlier
/// resourceVersion, the watch being late). Returns the Bindings written by that round.
async fn bind_after_a_late_rewrite(change: impl Fn(&MemoryApi)) -> usize {
    let api = lagging(500);
    api.put_node(node("n", 1, json!({})));
    api.put_pod(pod("a", 1, json!({"spec": {"nodeName": "n"}})));
    api.put_pod(pod("b", 1, json!({})));
    advance(600).await;
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t0 = Instant::now();
    let report = scheduler.round(t0).await.unwrap();
    assert_eq!(report.unschedulable, 1, "{report:?}");
    api.delete_pod("ml", "a");
    advance(600).await;
    change(&api);
    let report = scheduler.round(t0 + Duration::from_secs(2)).await.unwrap();
    assert_eq!(report.unschedulable, 0, "{report:?}");
    advance(10).await;
    scheduler.round(t0 + Duration::from_secs(3)).await.unwrap();
    assert_no_double_booking(&api);
    api.bindings().len()
}

#[tokio::test(start_paused = true)]
async fn a_binding_refused_for_a_status_write_is_sent_again_with_the_fresh_version() {
    // Found on the real API server: the scheduler's own condition on a pod's last failed
    // attempt moved its resourceVersion, the Binding that followed was refused (409) and the
    // pod backed off, though nothing it asks or allows had changed.
    let bound = bind_after_a_late_rewrite(|api| api.set_phase("ml", "b", "Pending")).await;
    assert_eq!(
        bound, 1,
        "sent again at once with the fresh resourceVersion"
    );
}

#[tokio::test(start_paused = true)]
async fn a_binding_refused_for_a_changed_pod_is_not_sent_again() {
    // Someone changed what the pod asks (its model): the decision was made on the old one.
    let bound = bind_after_a_late_rewrite(|api| {
        let uid = api.pod("ml", "b").unwrap().metadata.uid.unwrap();
        api.set_annotation("ml", "b", &uid, "gpuplace.io/gpu-model", "H100")
            .unwrap();
    })
    .await;
    assert_eq!(
        bound, 0,
        "the pod goes back to the queue, to be decided anew"
    );
}
