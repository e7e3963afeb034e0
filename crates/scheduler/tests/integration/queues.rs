//! Queues through the scheduler's rounds on the in-memory API (no kubelet: the test deletes
//! terminating victims when it wants them gone): borrowing idle GPUs, reclaim to a
//! guarantee (exactly enough, never below the lender's guarantee, never back), limits,
//! fair order between queues, missing and rejected queues, namespaces' default queue, the
//! queues' status and metrics.

use std::time::{Duration, Instant};

use gpuplace_scheduler::k8s::queue::QueueSpec;
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

async fn settle(scheduler: &mut Scheduler<MemoryApi>, t: &mut Instant) {
    for _ in 0..6 {
        *t += Duration::from_secs(5);
        scheduler.round(*t).await.unwrap();
    }
}

fn queue(spec: serde_json::Value) -> QueueSpec {
    serde_json::from_value(spec).unwrap()
}

/// A one-GPU pod of queue `q`.
fn in_queue(name: &str, q: &str, gpus: u32) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        gpus,
        json!({"metadata": {"labels": {"gpuplace.io/queue": q}}}),
    )
}

fn deleting(api: &MemoryApi) -> Vec<String> {
    api.pods()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// Deletes for good every pod that is terminating (as its kubelet would).
fn finish_terminating(api: &MemoryApi) {
    for name in deleting(api) {
        api.delete_pod("ml", &name);
    }
}

fn two_halves(api: &MemoryApi) {
    api.put_node(node("n1", 4, json!({})));
    api.put_node(node("n2", 4, json!({})));
    for q in ["a", "b"] {
        api.put_queue(
            q,
            queue(json!({"guaranteed": {"nvidia.com/gpu": "4"}, "reclaimable": true})),
        );
    }
}

/// Queues a and b guaranteed half of the GPUs each, and a running 8 one-GPU pods
/// (borrowing b's half).
async fn a_borrows_everything() -> (MemoryApi, Scheduler<MemoryApi>, Instant) {
    let api = MemoryApi::new();
    two_halves(&api);
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for i in 0..8 {
        api.put_pod(in_queue(&format!("a{i}"), "a", 1));
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "a"), 8, "a borrows b's idle half");
    (api, scheduler, t)
}

#[tokio::test]
async fn a_queue_borrows_idle_gpus_and_gives_exactly_enough_back() {
    let (api, mut scheduler, mut t) = a_borrows_everything().await;
    // b asks for its half: exactly four of a's pods go, b's pods are nominated.
    for i in 0..4 {
        api.put_pod(in_queue(&format!("b{i}"), "b", 1));
    }
    settle(&mut scheduler, &mut t).await;
    let gone = deleting(&api);
    assert_eq!(gone.len(), 4, "{gone:?}");
    assert!(gone.iter().all(|n| n.starts_with('a')));
    let why: Vec<String> = api
        .events()
        .into_iter()
        .filter(|e| e.reason == "Preempted")
        .map(|e| e.message)
        .collect();
    assert_eq!(why.len(), 4);
    assert!(
        why[0].ends_with("to give queue b its guarantee"),
        "{}",
        why[0]
    );
    assert!(last_message(&api, "b0").contains("reclaim: nominated node"));
    finish_terminating(&api);
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "b"), 4);
    assert_eq!(bound_count(&api, "a"), 4, "a stays at its guarantee");
    assert_no_double_booking(&api);
    // a asks for more: it is at its guarantee, b too: nothing is reclaimed back.
    api.put_pod(in_queue("a-more", "a", 1));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api).is_empty(), "no reclaim back");
    assert_eq!(bound_count(&api, "b"), 4);
    // The statuses say it.
    let status = api.queue("b").unwrap().status.unwrap();
    assert_eq!(status.allocated_gpus, "4");
    assert_eq!(status.fair_share_gpus, "4");
    assert_eq!(status.conditions[0].status, "True");
    let a = api.queue("a").unwrap().status.unwrap();
    assert_eq!(a.pending_pods, 1);
    assert_eq!(
        a.pending.get("nvidia.com/gpu").map(String::as_str),
        Some("1")
    );
}

#[tokio::test]
async fn reclaim_never_takes_a_queue_below_its_guarantee() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 8, json!({})));
    api.put_queue("a", queue(json!({"guaranteed": {"nvidia.com/gpu": "6"}})));
    api.put_queue("b", queue(json!({"guaranteed": {"nvidia.com/gpu": "4"}})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for i in 0..8 {
        api.put_pod(in_queue(&format!("a{i}"), "a", 1));
    }
    settle(&mut scheduler, &mut t).await;
    for i in 0..4 {
        api.put_pod(in_queue(&format!("b{i}"), "b", 1));
    }
    // Guarantees (10) exceed the 8 GPUs: a keeps its 6; b gets the 2 above them.
    for _ in 0..3 {
        settle(&mut scheduler, &mut t).await;
        finish_terminating(&api);
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "a"), 6);
    assert_eq!(bound_count(&api, "b"), 2);
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn limits_hold_and_name_the_queue() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 8, json!({})));
    api.put_queue("team-c", queue(json!({"limit": {"nvidia.com/gpu": 2}})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for i in 0..3 {
        api.put_pod(in_queue(&format!("c{i}"), "team-c", 1));
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "c"), 2);
    // Told the limit, where it stands and what would unblock it.
    assert_eq!(
        last_message(&api, "c2"),
        "blocked by: queue limit | 0/1 nodes are available: queue team-c is at its limit of 2 GPUs. | position: 3 of 3 in the cluster, 3 of 3 in queue team-c | queue team-c: allocated 2, fair share 2, guarantee 0, limit 2 GPUs | unblocked by: pods of queue team-c ending, or its limit raised"
    );
    assert_eq!(
        kube_part(&last_message(&api, "c2")),
        "0/1 nodes are available: queue team-c is at its limit of 2 GPUs."
    );
    // The limit raised: the pod is woken and bound.
    api.put_queue("team-c", queue(json!({"limit": {"nvidia.com/gpu": 3}})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "c"), 3);
}

#[tokio::test]
async fn queues_are_served_by_turns_not_by_arrival() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 4, json!({})));
    api.put_queue("x", queue(json!({})));
    api.put_queue("y", queue(json!({"weight": 1})));
    for i in 0..4 {
        api.put_pod(in_queue(&format!("x{i}"), "x", 1));
    }
    for i in 0..4 {
        api.put_pod(in_queue(&format!("y{i}"), "y", 1));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "x"), 2);
    assert_eq!(bound_count(&api, "y"), 2);
}

#[tokio::test]
async fn missing_rejected_and_namespace_default_queues() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 8, json!({})));
    api.put_queue("org", queue(json!({"guaranteed": {"nvidia.com/gpu": "4"}})));
    api.put_queue(
        "greedy",
        queue(json!({"parent": "org", "guaranteed": {"nvidia.com/gpu": "6"}})),
    );
    api.put_queue("small", queue(json!({"limit": {"nvidia.com/gpu": "1"}})));
    api.put_namespace("ml", Some("small"));
    api.put_pod(in_queue("lost", "nope", 1));
    api.put_pod(in_queue("g", "greedy", 1));
    api.put_pod(pod("ns1", 1, json!({})));
    api.put_pod(pod("ns2", 1, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    settle(&mut scheduler, &mut t).await;
    assert_eq!(
        kube_part(&last_message(&api, "lost")),
        "queue nope does not exist; the pod waits until it can be served."
    );
    assert!(
        kube_part(&last_message(&api, "g")).starts_with(
            "queue greedy cannot take pods: the guarantees of the children of org add up to 6"
        ),
        "{}",
        last_message(&api, "g")
    );
    // The namespace's default queue (limit 1) holds its pods.
    assert_eq!(bound_count(&api, "ns"), 1);
    let greedy = api.queue("greedy").unwrap().status.unwrap();
    assert_eq!(greedy.conditions[0].status, "False");
    assert_eq!(greedy.conditions[0].reason, "Rejected");
    let told: Vec<_> = api
        .queue_events()
        .into_iter()
        .filter(|e| e.0 == "greedy" && e.2 == "Rejected")
        .collect();
    assert_eq!(told.len(), 1, "told once: {told:?}");
}

#[tokio::test]
async fn no_queues_no_change() {
    // Without queues the order is priority then arrival, as before.
    let api = MemoryApi::new();
    api.put_node(node("n1", 2, json!({})));
    for i in 0..3 {
        api.put_pod(pod(&format!("p{i}"), 1, json!({})));
    }
    let mut scheduler = Scheduler::new(api.clone(), SchedulerConfig { ..config() });
    let mut t = Instant::now();
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "p"), 2);
    assert!(api.queue_events().is_empty());
}

/// An 8-GPU node whose inventory names `model`.
fn model_node(name: &str, model: &str) -> k8s_openapi::api::core::v1::Node {
    let mut inv = gpuplace_model::NodeInventory::uniform(name, 0, 0, 8, model);
    for g in &mut inv.gpus {
        g.id = format!("GPU-{name}-{}", g.index);
        g.uuid = g.id.clone();
    }
    node(
        name,
        8,
        json!({"metadata": {"annotations": {"gpuplace.io/inventory": inv.to_json()}}}),
    )
}

fn on_node(api: &MemoryApi, prefix: &str, node: &str) -> usize {
    api.pods()
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .count()
}

#[tokio::test]
async fn per_model_limits_hold_for_pods_and_gangs() {
    let api = MemoryApi::new();
    api.put_node(model_node("fast", "A100"));
    api.put_node(model_node("slow", "V100"));
    api.put_queue("m", queue(json!({"limit": {"nvidia.com/gpu.A100": "2"}})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    // Three pods that only the A100 node takes: two run, the third waits.
    for i in 0..3 {
        let mut p = in_queue(&format!("s{i}"), "m", 1);
        p.spec.as_mut().unwrap().node_selector =
            Some([("kubernetes.io/hostname".to_string(), "fast".to_string())].into());
        api.put_pod(p);
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(on_node(&api, "s", "fast"), 2, "at most 2 A100 GPUs");
    assert_eq!(bound_count(&api, "s"), 2);
    // A gang goes only to models with room for all of it: one that only the A100 node
    // takes waits; one that may go anywhere runs on the V100 node.
    for (g, only_fast) in [("g", true), ("h", false)] {
        api.put_group(group(g, 3, 30));
        for i in 0..3 {
            let mut p = in_queue(&format!("{g}{i}"), "m", 1);
            p.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("gpuplace.io/pod-group".into(), g.into());
            if only_fast {
                p.spec.as_mut().unwrap().node_selector =
                    Some([("kubernetes.io/hostname".to_string(), "fast".to_string())].into());
            }
            api.put_pod(p);
        }
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "g"), 0);
    assert_eq!(on_node(&api, "h", "slow"), 3);
    assert_eq!(on_node(&api, "", "fast"), 2);
    assert_no_double_booking(&api);
}

/// A gang of `members` pods of `gpus` GPUs each, in queue `q`.
fn gang_in_queue(api: &MemoryApi, g: &str, q: &str, members: u32, gpus: u32) {
    api.put_group(group(g, members, 300));
    for i in 0..members {
        let mut p = in_queue(&format!("{g}{i}"), q, gpus);
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("gpuplace.io/pod-group".into(), g.into());
        api.put_pod(p);
    }
}

#[tokio::test]
async fn a_gang_reclaims_its_guarantee_all_at_once_and_never_past_it() {
    let (api, mut scheduler, mut t) = a_borrows_everything().await;
    // A gang past b's guarantee (3 x 2 GPUs of 4) reclaims nothing.
    gang_in_queue(&api, "big", "b", 3, 2);
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api).is_empty(), "{:?}", deleting(&api));
    api.delete_pod("ml", "big0");
    api.delete_pod("ml", "big1");
    api.delete_pod("ml", "big2");
    // A gang within it (2 x 2 GPUs) takes exactly four of a's pods, whole or not at all.
    gang_in_queue(&api, "g", "b", 2, 2);
    settle(&mut scheduler, &mut t).await;
    let gone = deleting(&api);
    assert_eq!(gone.len(), 4, "{gone:?}");
    assert!(gone.iter().all(|n| n.starts_with('a')));
    let preempted = api
        .events()
        .into_iter()
        .filter(|e| e.reason == "Preempted")
        .map(|e| e.message)
        .collect::<Vec<_>>();
    assert_eq!(preempted.len(), 4);
    assert!(
        preempted
            .iter()
            .all(|m| m.ends_with("to give queue b its guarantee")),
        "{preempted:?}"
    );
    assert!(
        last_message(&api, "g0").contains("reclaim: nominated node"),
        "{}",
        last_message(&api, "g0")
    );
    finish_terminating(&api);
    settle(&mut scheduler, &mut t).await;
    assert_eq!(
        bound_count(&api, "g"),
        2,
        "the gang runs on the freed devices"
    );
    assert_eq!(bound_count(&api, "a"), 4, "a stays at its guarantee");
    assert_no_double_booking(&api);
}

/// A reclaim whose eviction the server refuses takes nothing off its victim's queue: later
/// in the same round that queue's own pods still count the victim against their limit.
/// Found by the queue stress (a capped team 3 GPUs past its limit for 600 ms): the round
/// took the planned losses off before the evictions were sent, and kept them when one
/// failed.
#[tokio::test]
async fn a_refused_reclaim_eviction_leaves_the_victims_queue_at_its_limit() {
    let api = MemoryApi::new();
    // n1 (pool one) is full of a's pods; n2 has one GPU free that b cannot use.
    api.put_node(node(
        "n1",
        6,
        json!({"metadata": {"labels": {"pool": "one"}}}),
    ));
    api.put_node(node("n2", 1, json!({})));
    api.put_queue(
        "a",
        queue(json!({"limit": {"nvidia.com/gpu": "6"}, "reclaimable": true})),
    );
    api.put_queue("b", queue(json!({"guaranteed": {"nvidia.com/gpu": "2"}})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for i in 0..6 {
        api.put_pod(pod(
            &format!("a{i}"),
            1,
            json!({"metadata": {"labels": {"gpuplace.io/queue": "a"}},
                "spec": {"nodeSelector": {"pool": "one"}}}),
        ));
    }
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_count(&api, "a"), 6);
    // b (owed 2) reclaims one of a's on n1; a asks for a seventh GPU in the same round.
    api.put_pod(pod(
        "b0",
        1,
        json!({"metadata": {"labels": {"gpuplace.io/queue": "b"}},
            "spec": {"nodeSelector": {"pool": "one"}}}),
    ));
    api.put_pod(in_queue("a6", "a", 1));
    api.fail_next_evictions(1);
    t += Duration::from_secs(5);
    let report = scheduler.round(t).await.unwrap();
    assert!(
        deleting(&api).is_empty(),
        "the eviction was refused: {report:?}"
    );
    assert_eq!(
        bound_count(&api, "a"),
        6,
        "a stays at its limit while its victim runs"
    );
    assert!(
        last_message(&api, "a6").contains("queue limit"),
        "{}",
        last_message(&api, "a6")
    );
    // Tried again, the reclaim goes through and a stays within its limit throughout.
    for _ in 0..6 {
        t += Duration::from_secs(5);
        scheduler.round(t).await.unwrap();
        finish_terminating(&api);
        assert!(bound_count(&api, "a") <= 6);
    }
    assert_eq!(bound_count(&api, "b"), 1, "b runs");
    assert_no_double_booking(&api);
}

/// The leader killed right after the first eviction of a gang's reclaim (its round dropped
/// while the next eviction waits on the server, 2-6 ms a request): the members are
/// nominated (written before the first eviction), and the next leader, from what the API
/// shows (the nominations adopted as holds), reclaims what is still missing, and only
/// that (a keeps its guarantee), runs the gang, and no device is booked twice.
#[tokio::test]
async fn a_leader_killed_after_a_reclaims_first_eviction_leaves_nothing_the_next_cannot_finish() {
    for run in 0..6u64 {
        let latency = Duration::from_millis(2 + run % 5);
        let api = MemoryApi::new().with_costs(gpuplace_testkit::api::ServerCosts {
            latency,
            ..Default::default()
        });
        two_halves(&api);
        let mut first = Scheduler::new(api.clone(), config());
        let mut t = Instant::now();
        for i in 0..8 {
            api.put_pod(in_queue(&format!("a{i}"), "a", 1));
        }
        settle(&mut first, &mut t).await;
        assert_eq!(bound_count(&api, "a"), 8, "run {run}: a borrows b's half");
        gang_in_queue(&api, "g", "b", 2, 2);
        t += Duration::from_secs(5);
        let killed = tokio::select! {
            _ = first.round(t) => false,
            _ = async {
                while deleting(&api).is_empty() {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            } => true,
        };
        drop(first);
        let evicted = deleting(&api).len();
        assert!(
            killed && (1..4).contains(&evicted),
            "run {run}: {evicted} evicted"
        );
        for member in ["g0", "g1"] {
            let nominated = api
                .pod("ml", member)
                .and_then(|p| p.status?.nominated_node_name);
            assert!(
                nominated.is_some(),
                "run {run}: {member} nominated before the first eviction"
            );
        }
        assert_no_double_booking(&api);

        let mut next = Scheduler::new(api.clone(), config());
        let mut rounds = 0;
        while bound_count(&api, "g") < 2 && rounds < 20 {
            rounds += 1;
            t += Duration::from_secs(5);
            next.round(t).await.unwrap();
            finish_terminating(&api);
            assert_no_double_booking(&api);
        }
        assert_eq!(bound_count(&api, "g"), 2, "run {run}: the gang runs");
        assert_eq!(
            bound_count(&api, "a"),
            4,
            "run {run}: exactly enough reclaimed in all"
        );
        eprintln!(
            "run {run} (latency {latency:?}): killed after {evicted} of 4 evictions; the next leader ran the gang in {rounds} rounds"
        );
    }
}

/// A round never waits for its queues' status writes (found on the real API server: a
/// round that awaited 100 of them left the Binding slots idle meanwhile); they end true once
/// the writes in flight are drained.
#[tokio::test(start_paused = true)]
async fn a_round_sends_the_statuses_without_waiting_for_them() {
    let api = MemoryApi::new().with_costs(gpuplace_testkit::api::ServerCosts {
        latency: Duration::from_millis(50),
        ..Default::default()
    });
    two_halves(&api);
    for i in 0..3 {
        api.put_pod(in_queue(&format!("a{i}"), "a", 1));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let t = Instant::now();
    let report = scheduler.schedule(t).await.unwrap();
    assert_eq!(report.assumed, 3);
    assert!(
        api.queue("a").unwrap().status.is_none(),
        "the round waited for the status write"
    );
    // The Bindings are in flight: a burst sends no status until WRITE_EVERY_BUSY has
    // passed since it began (nor did this round send one that lands later).
    scheduler
        .schedule(t + Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        api.queue("a").unwrap().status.is_none(),
        "a status was written while the Bindings were busy"
    );
    // Drained (as on shutdown), the statuses the Bindings changed go out.
    scheduler.drain_writes(t + Duration::from_secs(2)).await;
    let status = api.queue("a").unwrap().status.unwrap();
    assert_eq!(status.allocated_gpus, "3");
}
