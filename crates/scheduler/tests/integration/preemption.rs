//! Preemption through the scheduler's rounds on the in-memory API (no kubelet: the test
//! deletes terminating victims for good when it wants them gone): `preemptionPolicy:
//! Never`, disruption budgets, gangs as victims only whole, the freed devices held for the
//! preemptor while other victims terminate, and the nomination cleared when the pod is
//! bound elsewhere.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use gpuplace_scheduler::{ClusterApi, Scheduler};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

fn prio(
    name: &str,
    gpus: u32,
    priority: i32,
    extra: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    let mut p = pod(name, gpus, extra);
    p.spec.as_mut().unwrap().priority = Some(priority);
    p
}

/// Rounds until nothing changes (each a little later, past any backoff).
async fn settle(scheduler: &mut Scheduler<MemoryApi>, t: &mut Instant) {
    for _ in 0..6 {
        *t += Duration::from_secs(5);
        scheduler.round(*t).await.unwrap();
    }
}

/// A node `name` of 2 GPUs that pod `low` (priority 0) fills; the scheduler that bound it.
async fn low_fills(name: &str) -> (MemoryApi, Scheduler<MemoryApi>, Instant) {
    let api = MemoryApi::new();
    api.put_node(node(name, 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    api.put_pod(prio("low", 2, 0, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "low").as_deref(), Some(name));
    (api, scheduler, t)
}

fn deleting(api: &MemoryApi, name: &str) -> bool {
    api.pod("ml", name)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
}

fn nominated(api: &MemoryApi, name: &str) -> Option<String> {
    api.pod("ml", name)?.status?.nominated_node_name
}

#[tokio::test]
async fn never_and_equal_priority_pods_do_not_preempt() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    api.put_pod(prio("low", 2, 0, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "low").as_deref(), Some("n"));
    api.put_pod(prio(
        "never",
        2,
        100,
        json!({"spec": {"preemptionPolicy": "Never"}}),
    ));
    api.put_pod(prio("equal", 2, 0, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(!deleting(&api, "low"));
    assert!(
        kube_part(&last_message(&api, "never"))
            .ends_with("preemption: not eligible due to preemptionPolicy=Never."),
        "{}",
        last_message(&api, "never")
    );
    assert!(
        kube_part(&last_message(&api, "equal")).ends_with(
            "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
        ),
        "{}",
        last_message(&api, "equal")
    );
}

#[tokio::test]
async fn freed_devices_wait_for_the_preemptor_while_other_victims_terminate() {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("n"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for (name, gpus, priority) in [("a", 1, 0), ("b", 1, 0), ("c", 2, 5), ("d", 4, 5)] {
        api.put_pod(prio(name, gpus, priority, json!({})));
        settle(&mut scheduler, &mut t).await;
    }
    let held = |name: &str| -> BTreeSet<String> {
        assignment(&api, name)
            .map(|a| a.devices().map(|d| d.id.clone()).collect())
            .unwrap_or_default()
    };
    let freed: BTreeSet<String> = held("a").union(&held("b")).cloned().collect();
    // hi (2 GPUs) evicts a and b (priority 0), not c or d (priority 5).
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "a") && deleting(&api, "b"));
    assert!(!deleting(&api, "c") && !deleting(&api, "d"));
    assert_eq!(nominated(&api, "hi").as_deref(), Some("n"));
    assert!(last_message(&api, "hi").contains("preemption: nominated node n; preempting 2 pod(s)"));
    let preempted: Vec<String> = api
        .events()
        .into_iter()
        .filter(|e| e.reason == "Preempted")
        .map(|e| format!("{}: {}", e.pod.name, e.message))
        .collect();
    assert_eq!(
        preempted,
        vec![
            "a: Preempted by ml/hi on node n".to_string(),
            "b: Preempted by ml/hi on node n".to_string()
        ]
    );
    // a is gone, b still terminating: a's GPU is free but held for hi. A lower-priority
    // pod arriving now does not get it, and does not evict b again.
    api.delete_pod("ml", "a");
    api.put_pod(prio("mid", 1, 1, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "mid"), None, "a's GPU is held for hi");
    assert_eq!(bound_node(&api, "hi"), None, "b still holds its GPU");
    assert_eq!(scheduler.nominations().len(), 1);
    // b is gone: hi runs on exactly the GPUs a and b held.
    api.delete_pod("ml", "b");
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "hi").as_deref(), Some("n"));
    assert_eq!(held("hi"), freed);
    assert_eq!(bound_node(&api, "mid"), None);
    assert!(scheduler.nominations().is_empty());
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_nominee_is_told_it_starts_when_its_victims_grace_ends() {
    let (api, mut scheduler, mut t) = low_fills("n").await;
    let mut low = api.pod("ml", "low").unwrap();
    low.spec.as_mut().unwrap().termination_grace_period_seconds = Some(120);
    api.put_pod(low);
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "low"));
    let said = last_message(&api, "hi");
    assert!(said.contains("preemption: nominated node n"), "{said}");
    // Told when its victim's 120-s grace ends (a round or two of the test has passed),
    // the range from now.
    let start = gpuplace_core::waiting::Waiting::parse(&said).expected_start;
    let start = start.unwrap_or_else(|| panic!("no expected start: {said}"));
    assert!(start.contains("(in 2m; now to 2m"), "{said}");
}

#[tokio::test]
async fn a_disruption_budget_steers_the_victim_choice() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 2, json!({})));
    api.put_node(node("n2", 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    api.put_pod(prio(
        "guarded",
        2,
        0,
        json!({"metadata": {"labels": {"app": "serve"}}}),
    ));
    api.put_pod(prio("plain", 2, 1, json!({})));
    settle(&mut scheduler, &mut t).await;
    api.put_budget(
        serde_json::from_value(json!({
            "metadata": {"name": "serve", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "serve"}}, "minAvailable": 1},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                "expectedPods": 1}
        }))
        .unwrap(),
    );
    // The guarded pod has the lower priority, but its budget allows no disruption.
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "plain"));
    assert!(!deleting(&api, "guarded"));
}

#[tokio::test]
async fn a_gang_is_evicted_whole_or_not_at_all() {
    let api = MemoryApi::new();
    api.put_node(node("g", 2, json!({})));
    api.put_node(node("s", 2, json!({})));
    api.put_group(group("pair", 2, 60));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    let member = json!({"metadata": {"labels": {"gpuplace.io/pod-group": "pair"}}});
    api.put_pod(prio("pair-0", 1, 0, member.clone()));
    api.put_pod(prio("pair-1", 1, 0, member));
    settle(&mut scheduler, &mut t).await;
    api.put_pod(prio("single", 2, 0, json!({})));
    settle(&mut scheduler, &mut t).await;
    let gang_node = bound_node(&api, "pair-0").unwrap();
    assert_eq!(bound_node(&api, "pair-1"), Some(gang_node.clone()));
    // One GPU would do, but a member goes only with its gang (two victims): the single
    // pod is the cheaper victim.
    api.put_pod(prio("hi", 1, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "single"));
    assert!(!deleting(&api, "pair-0") && !deleting(&api, "pair-1"));
    api.delete_pod("ml", "single");
    settle(&mut scheduler, &mut t).await;
    assert!(bound_node(&api, "hi").is_some());
    // Now a 2-GPU pod can only evict the gang, both members at once.
    api.put_pod(prio("hi2", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "pair-0") && deleting(&api, "pair-1"));
}

#[tokio::test]
async fn the_nomination_is_cleared_when_the_pod_is_bound_elsewhere() {
    let (api, mut scheduler, mut t) = low_fills("n1").await;
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(nominated(&api, "hi").as_deref(), Some("n1"));
    // Another node comes before the victim is gone: hi goes there, the nomination ends.
    // Its Binding lands the first time: the nomination is cleared on the API after it,
    // not before (that write would change hi's resourceVersion under the Binding's
    // precondition, and the Binding would be refused).
    api.put_node(node("n2", 2, json!({})));
    t += Duration::from_secs(5);
    let report = scheduler.round(t).await.unwrap();
    assert_eq!((report.bound, report.conflicts), (1, 0));
    assert_eq!(bound_node(&api, "hi").as_deref(), Some("n2"));
    assert_eq!(nominated(&api, "hi"), None);
    settle(&mut scheduler, &mut t).await;
    assert!(scheduler.nominations().is_empty());
    // The view agrees (nothing left reserved for hi on n1).
    let view = api.view().await.unwrap();
    scheduler.verify_state(&view).unwrap();
}

#[tokio::test]
async fn a_refused_eviction_is_tried_again_without_waiting_for_a_cluster_event() {
    let (api, mut scheduler, mut t) = low_fills("n").await;
    api.fail_next_evictions(1);
    api.put_pod(prio("hi", 2, 10, json!({})));
    t += Duration::from_secs(5);
    scheduler.round(t).await.unwrap();
    assert!(!deleting(&api, "low"), "the first eviction was refused");
    // Nothing in the cluster changes (the refused victim stays as it was): hi backs off
    // and evicts again, well before the 5 minutes after which parked pods are retried.
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "low"));
    assert_eq!(nominated(&api, "hi").as_deref(), Some("n"));
}

#[tokio::test]
async fn a_preemptor_whose_binding_failed_keeps_the_devices_its_victims_freed() {
    let (api, mut scheduler, mut t) = low_fills("n").await;
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "low"));
    api.delete_pod("ml", "low");
    // hi is decided onto n, and its Binding fails: it backs off.
    api.fail_next_binds(1);
    t += Duration::from_secs(5);
    scheduler.round(t).await.unwrap();
    assert_eq!(bound_node(&api, "hi"), None);
    // A pod that comes while hi backs off does not take what hi's victim freed (else
    // hi would evict it in turn).
    api.put_pod(prio("late", 2, 0, json!({})));
    t += Duration::from_millis(100);
    scheduler.round(t).await.unwrap();
    assert_eq!(bound_node(&api, "late"), None);
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "hi").as_deref(), Some("n"));
    assert_eq!(bound_node(&api, "late"), None);
    assert!(!deleting(&api, "late"));
    assert!(scheduler.nominations().is_empty());
}

/// A scheduler that restarts (or a new leader) while a preemptor waits for its victims
/// reads the nomination from the API and holds the room for it: a pod arriving meanwhile
/// does not take the GPU the first victim freed, and the preemptor gets every GPU its
/// victims held.
#[tokio::test]
async fn a_nomination_written_before_a_restart_still_holds_the_room() {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("n"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    // a and b stop within 10 minutes (the grace they are evicted with).
    let grace = json!({"spec": {"terminationGracePeriodSeconds": 600}});
    for (name, gpus, priority) in [("a", 1, 0), ("b", 1, 0), ("c", 2, 5), ("d", 4, 5)] {
        api.put_pod(prio(name, gpus, priority, grace.clone()));
        settle(&mut scheduler, &mut t).await;
    }
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(deleting(&api, "a") && deleting(&api, "b"));
    assert_eq!(nominated(&api, "hi").as_deref(), Some("n"));
    // The scheduler restarts: nothing of the nomination is left in memory.
    drop(scheduler);
    let mut scheduler = Scheduler::new(api.clone(), config());
    api.delete_pod("ml", "a");
    api.put_pod(prio("mid", 1, 1, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(scheduler.nominations().len(), 1, "adopted from the API");
    // Planned again over b, still terminating: it waits for b, and is told when b's
    // grace ends.
    let said = last_message(&api, "hi");
    assert!(
        said.contains("nominated node n; waiting for the pods terminating there."),
        "{said}"
    );
    let start = gpuplace_core::waiting::Waiting::parse(&said).expected_start;
    assert!(start.is_some_and(|s| s.contains("now to")), "{said}");
    assert_eq!(bound_node(&api, "mid"), None, "a's GPU is held for hi");
    assert!(
        !deleting(&api, "c") && !deleting(&api, "d"),
        "no new victims"
    );
    api.delete_pod("ml", "b");
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "hi").as_deref(), Some("n"));
    assert_eq!(bound_node(&api, "mid"), None);
    assert_no_double_booking(&api);
}

/// A gang's preemption sends every eviction as a dry run first: one the server would
/// refuse (a webhook protecting the pod) evicts no one, where one by one the first victims
/// would already be gone.
#[tokio::test]
async fn a_gang_preemption_refused_at_its_dry_run_evicts_no_one() {
    let api = MemoryApi::new();
    api.put_node(node("g", 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    api.put_pod(prio("low-0", 1, 0, json!({})));
    api.put_pod(prio("low-1", 1, 0, json!({})));
    settle(&mut scheduler, &mut t).await;
    api.refuse_deletes_of("ml", "low-1");
    api.put_group(group("pair", 2, 60));
    let member = json!({"metadata": {"labels": {"gpuplace.io/pod-group": "pair"}}});
    api.put_pod(prio("pair-0", 1, 10, member.clone()));
    api.put_pod(prio("pair-1", 1, 10, member));
    settle(&mut scheduler, &mut t).await;
    assert!(
        !deleting(&api, "low-0") && !deleting(&api, "low-1"),
        "no one evicted"
    );
    assert!(api.dry_run_deletes() >= 1);
    assert_eq!(nominated(&api, "pair-0"), None);
    assert_eq!(nominated(&api, "pair-1"), None);
    let said = last_message(&api, "pair-0");
    assert!(said.contains("nothing was evicted"), "{said}");
}

/// A replica that loses its lease in the middle of a preemption evicts no more: the gate
/// is looked at before every eviction, not once per plan; the next leader finishes the
/// plan from the nominations written before the first eviction.
#[tokio::test]
async fn a_replica_that_loses_the_lease_mid_preemption_evicts_no_more() {
    use crate::wrapped::{Hooks, Wrapped};
    use gpuplace_scheduler::k8s::leader::Gate;

    /// Closes the gate once the first real eviction is answered.
    #[derive(Clone)]
    struct LoseLease(Gate);
    impl Hooks for LoseLease {
        fn after_evict(&self, dry_run: bool) {
            if !dry_run {
                self.0.close();
            }
        }
    }

    let api = MemoryApi::new();
    api.put_node(node("g", 2, json!({})));
    let gate = Gate::closed();
    gate.extend(tokio::time::Instant::now(), Duration::from_secs(3600));
    let wrapped = Wrapped {
        inner: api.clone(),
        hooks: LoseLease(Gate::always_open()),
    };
    let mut scheduler = Scheduler::with_gate(wrapped, config(), gate.clone());
    let mut t = Instant::now();
    api.put_pod(prio("low-0", 1, 0, json!({})));
    api.put_pod(prio("low-1", 1, 0, json!({})));
    for _ in 0..3 {
        t += Duration::from_secs(5);
        scheduler.round(t).await.unwrap();
    }
    assert!(bound_node(&api, "low-0").is_some() && bound_node(&api, "low-1").is_some());
    // From here on the first eviction made costs the lease.
    let wrapped = Wrapped {
        inner: api.clone(),
        hooks: LoseLease(gate.clone()),
    };
    let mut scheduler = Scheduler::with_gate(wrapped, config(), gate.clone());
    api.put_group(group("pair", 2, 60));
    let member = json!({"metadata": {"labels": {"gpuplace.io/pod-group": "pair"}}});
    api.put_pod(prio("pair-0", 1, 10, member.clone()));
    api.put_pod(prio("pair-1", 1, 10, member));
    for _ in 0..3 {
        t += Duration::from_secs(5);
        scheduler.round(t).await.unwrap();
    }
    let evicted = ["low-0", "low-1"]
        .iter()
        .filter(|n| deleting(&api, n))
        .count();
    assert_eq!(evicted, 1, "the second eviction was not sent");
    // The nominations were written before the first eviction: the next leader adopts them.
    assert_eq!(nominated(&api, "pair-0").as_deref(), Some("g"));
    assert_eq!(nominated(&api, "pair-1").as_deref(), Some("g"));

    // The next leader plans the adopted nominations again on their node: it evicts the
    // second victim while the first still terminates (not a grace period later), and no
    // other pod; once both are gone the members are bound there.
    let mut next = Scheduler::new(api.clone(), config());
    t += Duration::from_secs(5);
    next.round(t).await.unwrap();
    assert!(
        deleting(&api, "low-0") && deleting(&api, "low-1"),
        "the plan was finished while its first victim terminated: {}",
        last_message(&api, "pair-0")
    );
    for _ in 0..3 {
        t += Duration::from_secs(5);
        next.round(t).await.unwrap();
    }
    assert_eq!(
        bound_node(&api, "pair-0"),
        None,
        "the victims are still there"
    );
    api.delete_pod("ml", "low-0");
    api.delete_pod("ml", "low-1");
    settle(&mut next, &mut t).await;
    assert_eq!(bound_node(&api, "pair-0").as_deref(), Some("g"));
    assert_eq!(bound_node(&api, "pair-1").as_deref(), Some("g"));
    assert_no_double_booking(&api);
}

/// A preemptor's message, its Event and condition name no pod of another namespace, and a
/// victim's Event does not name a preemptor of another namespace: both are counted or said
/// "a pod of another namespace" (the preemptor's message once listed `lab/secret-...`).
#[tokio::test]
async fn preemption_messages_name_no_pod_of_another_namespace() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    let lab = json!({"metadata": {"namespace": "lab"}});
    api.put_pod(prio("secret-victim-0", 1, 0, lab.clone()));
    api.put_pod(prio("secret-victim-1", 1, 0, lab));
    settle(&mut scheduler, &mut t).await;
    api.put_pod(prio("hi", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    let said = last_message(&api, "hi");
    assert!(
        said.contains("preempting 2 pod(s) of lower priority: 2 of other namespaces"),
        "{said}"
    );
    let condition = api
        .pod("ml", "hi")
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .map(|c| serde_json::to_string(&c).unwrap_or_default())
        .unwrap_or_default();
    for text in [&said, &condition] {
        assert!(
            !text.contains("secret-victim") && !text.contains("lab/"),
            "{text}"
        );
    }
    let to_victims: Vec<String> = api
        .events()
        .into_iter()
        .filter(|e| e.pod.namespace == "lab")
        .map(|e| e.message)
        .collect();
    assert!(!to_victims.is_empty());
    for m in &to_victims {
        assert!(!m.contains("ml/hi"), "{m}");
    }
    assert!(
        to_victims
            .iter()
            .any(|m| m.contains("Preempted by a pod of another namespace")),
        "{to_victims:?}"
    );
}

/// A leader killed in the middle of a gang's preemption (one victim evicted, still
/// terminating; nothing nominated): the next leader counts that terminating victim
/// towards the gang's plan and finishes it at once (evicts the second, nominates both),
/// rather than finding "no preemption victims" until the first is gone. Once the victims
/// are gone the members are bound to the two GPUs, none booked twice.
#[tokio::test]
async fn the_next_leader_finishes_a_gang_preemption_its_predecessor_began() {
    let api = MemoryApi::new();
    api.put_node(node("g", 2, json!({})));
    let mut t = Instant::now();
    let mut first = Scheduler::new(api.clone(), config());
    api.put_pod(prio("low-0", 1, 0, json!({})));
    api.put_pod(prio("low-1", 1, 0, json!({})));
    settle(&mut first, &mut t).await;
    // What the killed leader left: one victim evicted (terminating), no nomination.
    api.delete_pod_gracefully("ml", "low-0");
    drop(first);
    api.put_group(group("pair", 2, 60));
    let member = json!({"metadata": {"labels": {"gpuplace.io/pod-group": "pair"}}});
    api.put_pod(prio("pair-0", 1, 10, member.clone()));
    api.put_pod(prio("pair-1", 1, 10, member));
    let mut next = Scheduler::new(api.clone(), config());
    for _ in 0..2 {
        t += Duration::from_secs(5);
        next.round(t).await.unwrap();
    }
    assert!(
        deleting(&api, "low-1"),
        "the plan was finished: {:?}",
        last_message(&api, "pair-0")
    );
    assert_eq!(nominated(&api, "pair-0").as_deref(), Some("g"));
    assert_eq!(nominated(&api, "pair-1").as_deref(), Some("g"));
    api.delete_pod("ml", "low-0");
    api.delete_pod("ml", "low-1");
    settle(&mut next, &mut t).await;
    assert_eq!(bound_node(&api, "pair-0").as_deref(), Some("g"));
    assert_eq!(bound_node(&api, "pair-1").as_deref(), Some("g"));
    assert_no_double_booking(&api);
}

/// A terminating pod promised to no one is room a preemptor waits for instead of evicting;
/// once one preemptor counts on it, it is promised to that one: a second preemptor evicts
/// another pod rather than count on the same room (both nominated to one node's GPUs, the
/// second would have waited for nothing).
#[tokio::test]
async fn a_terminating_pod_counted_on_by_one_preemptor_is_not_counted_on_by_another() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 2, json!({})));
    api.put_node(node("n2", 2, json!({})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    api.put_pod(prio("leaving", 2, 0, json!({})));
    api.put_pod(prio("staying", 2, 0, json!({})));
    settle(&mut scheduler, &mut t).await;
    let leaving_on = bound_node(&api, "leaving").expect("leaving bound");
    let staying_on = bound_node(&api, "staying").expect("staying bound");
    // Its owner deletes it; its grace period has long to run.
    api.delete_pod_gracefully("ml", "leaving");
    assert!(deleting(&api, "leaving"));
    api.put_pod(prio("first", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(nominated(&api, "first"), Some(leaving_on.clone()));
    assert!(
        !deleting(&api, "staying"),
        "first waits for the leaving pod"
    );
    api.put_pod(prio("second", 2, 10, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(
        deleting(&api, "staying"),
        "second evicts, not counts on first's room"
    );
    assert_eq!(nominated(&api, "second"), Some(staying_on));
    // Both gone: each runs where it was nominated.
    api.delete_pod("ml", "leaving");
    api.delete_pod("ml", "staying");
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "first"), Some(leaving_on));
    assert!(bound_node(&api, "second").is_some());
    assert_no_double_booking(&api);
}
