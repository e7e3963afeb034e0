//! Make-room through the scheduler's rounds on the in-memory API (no kubelet or
//! controllers: the test deletes moved pods for good and makes their replacements): the
//! fewest pods move, only pods that opted in and whose controller makes them again, old
//! enough, within their disruption budgets; the replacement lands on its planned place and
//! the pod that waited on the freed devices.

use std::time::{Duration, Instant};

use gpuplace_scheduler::scheduler::defrag::{DefragConfig, DefragMode, Settings};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

pub(crate) async fn settle(scheduler: &mut Scheduler<MemoryApi>, t: &mut Instant) {
    for _ in 0..6 {
        *t += Duration::from_secs(5);
        scheduler.round(*t).await.unwrap();
    }
}

pub(crate) fn defrag_config(min_age: Duration) -> SchedulerConfig {
    SchedulerConfig {
        defrag: DefragConfig {
            settings: Settings {
                mode: DefragMode::MakeRoom,
                min_age,
                ..Settings::default()
            },
            ..DefragConfig::default()
        },
        ..config()
    }
}

/// A pod of ReplicaSet `rs` (labels `app: rs`), movable or not.
pub(crate) fn replica(
    name: &str,
    rs: &str,
    gpus: u32,
    movable: bool,
    extra: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    let mut labels = json!({"app": rs});
    if movable {
        labels["gpuplace.io/movable"] = json!("true");
    }
    let mut p = pod(
        name,
        gpus,
        json!({"metadata": {"labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
            "uid": format!("{rs}-uid"), "controller": true}]}}),
    );
    let mut v = serde_json::to_value(&p).unwrap();
    merge(&mut v, extra);
    p = serde_json::from_value(v).unwrap();
    p
}

pub(crate) fn on(node: &str) -> serde_json::Value {
    json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": node}}})
}

pub(crate) fn deleting(api: &MemoryApi, name: &str) -> bool {
    api.pod("ml", name)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
}

pub(crate) fn messages(api: &MemoryApi, name: &str, reason: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.pod.name == name && e.reason == reason)
        .map(|e| e.message)
        .collect()
}

/// The in-memory API and a make-room scheduler (no minimum age) with `a` (1 GPU, movable,
/// of ReplicaSet rs-a) bound on node n1 of `gpus` GPUs.
async fn a_on_n1(gpus: u32) -> (MemoryApi, Scheduler<MemoryApi>, Instant) {
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    api.put_node(node("n1", gpus, json!({})));
    api.put_pod(replica("a", "rs-a", 1, true, json!({})));
    settle(&mut scheduler, &mut t).await;
    (api, scheduler, t)
}

/// n1 holds `a` (1 GPU, may go anywhere), n2 holds `b` (1 GPU, only n2): an 8-GPU pod
/// fits nowhere until `a` moves to n2.
async fn fragmented(
    api: &MemoryApi,
    scheduler: &mut Scheduler<MemoryApi>,
    t: &mut Instant,
    movable: bool,
) {
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(replica("a", "rs-a", 1, movable, json!({})));
    settle(scheduler, t).await;
    assert_eq!(bound_node(api, "a").as_deref(), Some("n1"));
    api.put_node(node("n2", 8, json!({})));
    api.put_pod(replica("b", "rs-b", 1, movable, on("n2")));
    settle(scheduler, t).await;
    assert_eq!(bound_node(api, "b").as_deref(), Some("n2"));
    api.put_pod(pod("big", 8, json!({})));
    settle(scheduler, t).await;
}

#[tokio::test]
async fn the_fewest_pods_move_and_their_replacements_land_where_planned() {
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    fragmented(&api, &mut scheduler, &mut t, true).await;
    assert!(deleting(&api, "a"), "a moves to make room");
    assert!(!deleting(&api, "b"), "b may only run on n2");
    assert_eq!(
        messages(&api, "a", "Moved"),
        vec!["Moved to make room for ml/big (from node n1 to node n2)".to_string()]
    );
    assert_eq!(
        messages(&api, "big", "MakingRoom"),
        vec!["Moving 1 pod(s) to make room on node n1: ml/a".to_string()]
    );
    let failed = messages(&api, "big", "FailedScheduling");
    assert!(
        kube_part(&failed[0])
            .ends_with("defragmentation: moving 1 pod(s) to make room on node n1: ml/a.")
            && failed[0].starts_with("blocked by: fragmentation | ")
            && failed[0]
                .contains(" | position: 1 of 1 in the cluster | unblocked by: make-room under way: 1 pod(s) moving off node n1"),
        "{failed:?}"
    );
    assert_eq!(
        api.pod("ml", "big")
            .and_then(|p| p.status?.nominated_node_name)
            .as_deref(),
        Some("n1")
    );
    // A second round plans no further move while a terminates.
    settle(&mut scheduler, &mut t).await;
    assert_eq!(messages(&api, "a", "Moved").len(), 1);
    assert!(!deleting(&api, "b"));
    // a is gone; its ReplicaSet makes a2, which goes where the plan put it, and big runs.
    api.delete_pod("ml", "a");
    api.put_pod(replica("a2", "rs-a", 1, true, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "big").as_deref(), Some("n1"));
    assert_eq!(bound_node(&api, "a2").as_deref(), Some("n2"));
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn pods_that_did_not_opt_in_are_too_young_or_have_no_controller_stay() {
    // Not opted in.
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    fragmented(&api, &mut scheduler, &mut t, false).await;
    assert!(!deleting(&api, "a") && !deleting(&api, "b"));
    assert!(bound_node(&api, "big").is_none());
    // Too young (the kubelet has not even started them: no startTime).
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::from_secs(300)));
    fragmented(&api, &mut scheduler, &mut t, true).await;
    assert!(!deleting(&api, "a"));
    // Off.
    let api = MemoryApi::new();
    let mut off = defrag_config(Duration::ZERO);
    off.defrag.settings.mode = DefragMode::Off;
    let mut scheduler = Scheduler::new(api.clone(), off);
    fragmented(&api, &mut scheduler, &mut t, true).await;
    assert!(!deleting(&api, "a"));
    // A bare pod (no controller to make it again) never moves.
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(pod(
        "bare",
        1,
        json!({"metadata": {"labels": {"gpuplace.io/movable": "true"}}}),
    ));
    settle(&mut scheduler, &mut t).await;
    api.put_node(node("n2", 8, json!({})));
    api.put_pod(replica("b", "rs-b", 1, true, on("n2")));
    api.put_pod(pod("big", 8, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(!deleting(&api, "bare"));
    assert!(bound_node(&api, "big").is_none());
}

#[tokio::test]
async fn a_budget_that_allows_no_disruption_keeps_every_pod_in_place() {
    let api = MemoryApi::new();
    api.put_budget(
        serde_json::from_value(json!({
            "metadata": {"name": "keep-a", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "rs-a"}}, "maxUnavailable": 0},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                "expectedPods": 1}
        }))
        .unwrap(),
    );
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    fragmented(&api, &mut scheduler, &mut t, true).await;
    assert!(!deleting(&api, "a") && !deleting(&api, "b"));
    assert!(bound_node(&api, "big").is_none());
    assert!(messages(&api, "a", "Moved").is_empty());
    let failed = messages(&api, "big", "FailedScheduling");
    assert!(
        kube_part(failed.last().unwrap()).ends_with(
            "defragmentation: the pods in the way are covered by a PodDisruptionBudget that allows no disruption now."
        ),
        "{failed:?}"
    );
}

#[tokio::test]
async fn the_eviction_api_refuses_what_a_budget_forbids() {
    use gpuplace_scheduler::{ApiError, ClusterApi, PodKey};
    let api = MemoryApi::new();
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(replica("a", "rs-a", 1, true, json!({})));
    api.put_budget(
        serde_json::from_value(json!({
            "metadata": {"name": "keep-a", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "rs-a"}}, "minAvailable": 1},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                "expectedPods": 1}
        }))
        .unwrap(),
    );
    let p = api.pod("ml", "a").unwrap();
    let key = PodKey::of(&p);
    for dry_run in [true, false] {
        assert!(matches!(
            api.evict_to_move(&key, dry_run).await,
            Err(ApiError::Blocked(_))
        ));
    }
    assert!(!deleting(&api, "a"));
    let wrong = PodKey {
        uid: "other".into(),
        ..key.clone()
    };
    assert!(matches!(
        api.evict_to_move(&wrong, true).await,
        Err(ApiError::Conflict(_))
    ));
    // A dry run that would pass evicts nothing and spends no disruption.
    api.put_pod(replica("free", "rs-free", 1, true, json!({})));
    let free = PodKey::of(&api.pod("ml", "free").unwrap());
    api.evict_to_move(&free, true).await.unwrap();
    assert!(!deleting(&api, "free"));
    assert!(api.pod("ml", "free").is_some());
    api.evict_to_move(&free, false).await.unwrap();
    // Not bound, so gone at once.
    assert!(api.pod("ml", "free").is_none() || deleting(&api, "free"));
}

/// `gpuplace defrag --plan` on `view`: FGD placing, ties broken by `seed`.
fn dry_run(
    view: &gpuplace_scheduler::api::ClusterView,
    seed: u64,
    config: &DefragConfig,
) -> gpuplace_scheduler::defrag_plan::DefragPlan {
    gpuplace_scheduler::defrag_plan::plan(
        view,
        "nvidia.com/gpu",
        gpuplace_core::Policy::Fgd,
        seed,
        config,
        k8s_openapi::jiff::Timestamp::now(),
    )
}

/// The fragmented cluster, placed by a scheduler that moves nothing.
async fn fragmented_without_moves() -> (MemoryApi, Scheduler<MemoryApi>, Instant) {
    let api = MemoryApi::new();
    let mut off = defrag_config(Duration::ZERO);
    off.defrag.settings.mode = DefragMode::Off;
    let mut scheduler = Scheduler::new(api.clone(), off);
    let mut t = Instant::now();
    fragmented(&api, &mut scheduler, &mut t, true).await;
    (api, scheduler, t)
}

#[tokio::test]
async fn the_dry_run_plans_what_the_scheduler_would_do_and_touches_nothing() {
    use gpuplace_scheduler::ClusterApi;
    let (api, _scheduler, _t) = fragmented_without_moves().await;
    let view = api.view().await.unwrap();
    let mut config = DefragConfig::default();
    config.settings.min_age = Duration::ZERO;
    let plan = dry_run(&view, 42, &config);
    assert_eq!(plan.blocked, vec!["ml/big".to_string()]);
    assert_eq!(plan.make_room.len(), 1);
    let room = &plan.make_room[0];
    assert_eq!((room.pod.as_str(), room.node.as_str()), ("ml/big", "n1"));
    assert_eq!(room.moves.len(), 1);
    assert_eq!(
        (
            room.moves[0].name.as_str(),
            room.moves[0].from.as_str(),
            room.moves[0].to.as_str()
        ),
        ("a", "n1", "n2")
    );
    assert!(plan.frag_after_room <= plan.frag_before);
    // Every move is listed, once, and the fragmentation after is that of the listed moves.
    let mut listed: Vec<&str> = plan
        .make_room
        .iter()
        .flat_map(|r| r.moves.iter().map(|m| m.name.as_str()))
        .collect();
    listed.extend(plan.rebalance.iter().map(|m| m.name.as_str()));
    let unique: std::collections::HashSet<&&str> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "a pod moves twice: {plan:?}");
    if plan.rebalance.is_empty() {
        assert_eq!(plan.frag_after, plan.frag_after_room, "{plan:?}");
    }
    let text = gpuplace_scheduler::defrag_plan::text(&plan);
    assert!(text.contains("make room for ml/big on n1"), "{text}");
    assert!(text.contains("ml/a: n1 -> n2"), "{text}");
    assert!(!deleting(&api, "a"));
    // With a budget that allows nothing, no plan.
    let mut view = view;
    view.budgets = std::sync::Arc::new(vec![std::sync::Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "keep-a", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "rs-a"}}, "maxUnavailable": 0},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                "expectedPods": 1}
        }))
        .unwrap(),
    )]);
    let plan = dry_run(&view, 42, &config);
    assert!(plan.make_room.is_empty());
    assert_eq!(plan.unhelped, vec!["ml/big".to_string()]);
}

#[tokio::test]
async fn the_dry_run_plans_in_the_schedulers_order_priority_first() {
    use gpuplace_scheduler::ClusterApi;
    let (api, mut scheduler, mut t) = fragmented_without_moves().await;
    // Made after `big` (and after it by name): only its priority puts it first (it does
    // not preempt, so that `a` stays to be moved).
    api.put_pod(pod(
        "urgent",
        8,
        json!({"spec": {"priority": 1000, "preemptionPolicy": "Never"}}),
    ));
    settle(&mut scheduler, &mut t).await;
    let view = api.view().await.unwrap();
    let mut config = DefragConfig::default();
    config.settings.min_age = Duration::ZERO;
    let plan = dry_run(&view, 7, &config);
    assert_eq!(
        plan.blocked,
        vec!["ml/urgent".to_string(), "ml/big".to_string()]
    );
    // The one node that can be emptied goes to the pod the scheduler would try first.
    assert_eq!(plan.make_room.len(), 1, "{plan:?}");
    assert_eq!(plan.make_room[0].pod, "ml/urgent");
    assert_eq!(plan.unhelped, vec!["ml/big".to_string()]);
}

#[tokio::test]
async fn rebalancing_gathers_scattered_shares_so_that_a_whole_node_frees() {
    let api = MemoryApi::new();
    let mut config = defrag_config(Duration::ZERO);
    config.defrag.settings.mode = DefragMode::Rebalance;
    let mut scheduler = Scheduler::new(api.clone(), config);
    let mut t = Instant::now();
    // p2 (half a GPU, may go anywhere) on n2, p1 (half a GPU, only n1) on n1.
    api.put_node(node("n2", 8, json!({})));
    api.put_pod(replica("p2", "rs-2", 1, true, share("500")));
    settle(&mut scheduler, &mut t).await;
    api.put_node(node("n1", 8, json!({})));
    let mut pinned = share("500");
    merge(&mut pinned, on("n1"));
    api.put_pod(replica("p1", "rs-1", 1, true, pinned));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "p2").as_deref(), Some("n2"));
    assert_eq!(bound_node(&api, "p1").as_deref(), Some("n1"));
    api.put_pod(pod("big", 8, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "p2"), "p2 joins p1's GPU");
    assert!(!deleting(&api, "p1"));
    assert_eq!(
        messages(&api, "p2", "Moved"),
        vec!["Moved to lower fragmentation (from node n2 to node n1)".to_string()]
    );
    api.delete_pod("ml", "p2");
    api.put_pod(replica("p2b", "rs-2", 1, true, share("500")));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "p2b").as_deref(), Some("n1"));
    assert_eq!(bound_node(&api, "big").as_deref(), Some("n2"));
    // p1 and p2b share one GPU.
    let gpu = |name: &str| -> Vec<String> {
        assignment(&api, name)
            .map(|a| a.devices().map(|d| d.id.clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(gpu("p1"), gpu("p2b"));
    // No move is undone within the hour, and nothing else moves.
    for _ in 0..5 {
        t += Duration::from_secs(120);
        scheduler.round(t).await.unwrap();
    }
    assert!(!deleting(&api, "p2b") && !deleting(&api, "p1"));
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_gang_that_fits_nowhere_gets_room_for_every_member_at_once() {
    let (api, mut scheduler, mut t) = a_on_n1(8).await;
    api.put_node(node("n2", 8, json!({})));
    api.put_pod(replica("b", "rs-b", 1, true, on("n2")));
    settle(&mut scheduler, &mut t).await;
    // An 8-GPU and a 6-GPU member: n1 must be emptied, and a fits beside b on n2 with six
    // GPUs still free there.
    api.put_group(group("g", 2, 60));
    let member = json!({"metadata": {"labels": {"gpuplace.io/pod-group": "g"}}});
    api.put_pod(pod("g-0", 8, member.clone()));
    api.put_pod(pod("g-1", 6, member));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "a") && !deleting(&api, "b"));
    assert_eq!(
        messages(&api, "a", "Moved"),
        vec!["Moved to make room for the gang of ml/g-0 (from node n1 to node n2)".to_string()]
    );
    let failed = messages(&api, "g-1", "FailedScheduling");
    assert!(
        failed
            .iter()
            .any(|m| m
                .contains("defragmentation: moving 1 pod(s) to make room on node(s) n1,n2: ml/a.")),
        "{failed:?}"
    );
    api.delete_pod("ml", "a");
    api.put_pod(replica("a2", "rs-a", 1, true, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "g-0").as_deref(), Some("n1"));
    assert_eq!(bound_node(&api, "g-1").as_deref(), Some("n2"));
    assert_eq!(bound_node(&api, "a2").as_deref(), Some("n2"));
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_pod_decided_after_a_move_in_the_same_round_leaves_the_moved_pods_place() {
    let (api, mut scheduler, mut t) = a_on_n1(2).await;
    api.put_node(node("n2", 2, json!({})));
    api.put_pod(replica("c", "rs-c", 1, false, on("n2")));
    settle(&mut scheduler, &mut t).await;
    // `big` fits nowhere (one GPU free on each node) unless `a` moves to n2; `late`, queued
    // after it, fits on n2's free GPU, the moved pod's planned place.
    api.put_pod(pod("big", 2, json!({})));
    api.put_pod(pod("late", 1, json!({})));
    t += Duration::from_secs(5);
    scheduler.round(t).await.unwrap();
    assert!(deleting(&api, "a"), "a moves to make room for big");
    assert_eq!(
        bound_node(&api, "late"),
        None,
        "late must not take the place planned for a's replacement in the round that moved a"
    );
}

/// The make-room of `fragmented` with a and b in queue `team` (limit 2 GPUs): a moves for
/// big, and c of the same queue waits at the limit meanwhile. When a is gone, the share
/// its move gave back stays its replacement's: c keeps waiting, a2 lands where it was
/// planned (before, c took the share and a2 waited at the limit until its planned place
/// was dropped; the timeline starts a replacement the moment its pod moves).
#[tokio::test]
async fn a_moved_pods_replacement_keeps_its_queues_share_while_it_is_made() {
    let api = MemoryApi::new();
    let team: gpuplace_scheduler::k8s::queue::QueueSpec =
        serde_json::from_value(json!({"limit": {"nvidia.com/gpu": 2}})).unwrap();
    api.put_queue("team", team);
    let in_team = json!({"metadata": {"labels": {"gpuplace.io/queue": "team"}}});
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(replica("a", "rs-a", 1, true, in_team.clone()));
    settle(&mut scheduler, &mut t).await;
    api.put_node(node("n2", 8, json!({})));
    let mut b_on_n2 = on("n2");
    merge(&mut b_on_n2, in_team.clone());
    api.put_pod(replica("b", "rs-b", 1, false, b_on_n2));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "b").as_deref(), Some("n2"));
    api.put_pod(pod("big", 8, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "a"), "a moves to make room");
    api.put_pod(replica("c", "rs-c", 1, false, in_team.clone()));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "c"), None, "team is at its limit");
    api.delete_pod("ml", "a");
    settle(&mut scheduler, &mut t).await;
    assert_eq!(
        bound_node(&api, "c"),
        None,
        "a's share is its replacement's"
    );
    api.put_pod(replica("a2", "rs-a", 1, true, in_team));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "a2").as_deref(), Some("n2"));
    assert_eq!(bound_node(&api, "big").as_deref(), Some("n1"));
    assert_eq!(bound_node(&api, "c"), None);
    assert_no_double_booking(&api);
}

/// A moved pod's replacement whose planned place is still taken (here by a pod another
/// scheduler bound there, leaving) waits for it and is told so: its blocker is its planned
/// place, kube's part counts the other nodes as not its planned node, and it is told when
/// the pod there is gone; then it lands there.
#[tokio::test]
async fn a_replacement_waiting_for_its_planned_place_is_told_so() {
    let (api, mut scheduler, mut t) = a_on_n1(8).await;
    api.put_node(node("n2", 2, json!({})));
    api.put_node(node("n3", 2, json!({})));
    api.put_pod(replica("b", "rs-b", 1, false, on("n2")));
    api.put_pod(replica("c", "rs-c", 2, false, on("n3")));
    settle(&mut scheduler, &mut t).await;
    api.put_pod(pod("big", 8, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "a"), "a moves to n2 to make room");
    // Another scheduler binds f to n2's free GPU, and f is leaving (its grace period long
    // enough to outlast the test's rounds, whose clock runs ahead).
    let f = json!({"spec": {"nodeName": "n2", "terminationGracePeriodSeconds": 3600}});
    api.put_pod(pod("f", 1, f));
    api.delete_pod_gracefully("ml", "f");
    api.delete_pod("ml", "a");
    api.put_pod(replica("a2", "rs-a", 1, true, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "big").as_deref(), Some("n1"));
    assert_eq!(
        bound_node(&api, "a2"),
        None,
        "a2 waits for its planned place"
    );
    let failed = messages(&api, "a2", "FailedScheduling");
    let last = failed.last().expect("a2 is told why it waits");
    assert!(
        last.starts_with("blocked by: its planned place | expected start: "),
        "{last}"
    );
    assert!(
        kube_part(last).contains("node(s) were not its planned node")
            && kube_part(last).contains("waits for the place planned for it on node n2"),
        "{last}"
    );
    assert!(
        last.contains(
            "unblocked by: its planned place on node n2 comes free as the pods there leave"
        ),
        "{last}"
    );
    api.delete_pod("ml", "f");
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "a2").as_deref(), Some("n2"));
    assert_no_double_booking(&api);
}
