//! Queues' usage over time through the scheduler's rounds on the in-memory API: a queue
//! that ran the cluster for half an hour waits behind an idle one of equal weight (and
//! without usage they take turns); the usage on the Queue's status is read back by a new
//! scheduler (a restart, or a new leader) and carried on within 1% of the closed form; a
//! half-life that cannot be used is refused in the status and the last valid one kept.

use std::time::{Duration, Instant};

use gpuplace_scheduler::k8s::queue::{QueueSpec, QueueUsage};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;

fn queue(spec: serde_json::Value) -> QueueSpec {
    serde_json::from_value(spec).unwrap()
}

fn in_queue(name: &str, q: &str) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        1,
        json!({"metadata": {"labels": {"gpuplace.io/queue": q}}}),
    )
}

/// Rounds every 10 s for `span`.
async fn run_for(scheduler: &mut Scheduler<MemoryApi>, t: &mut Instant, span: Duration) {
    let end = *t + span;
    while *t < end {
        *t += Duration::from_secs(10);
        scheduler.round(*t).await.unwrap();
    }
}

fn usage(api: &MemoryApi, q: &str) -> QueueUsage {
    api.queue(q)
        .and_then(|q| q.status)
        .and_then(|s| s.usage)
        .unwrap_or_else(|| panic!("queue {q} shows no usage"))
}

/// GPU-seconds of a queue that held `gpus` for `secs` from nothing, half-life `h` s.
fn closed_form(gpus: f64, secs: f64, h: f64) -> f64 {
    gpus * h / std::f64::consts::LN_2 * (1.0 - (-secs / h).exp2())
}

/// The wall time (ms since the epoch) of the round clock's `t`, as a scheduler made now
/// reads it.
fn wall_ms(t: Instant) -> f64 {
    let wall = std::time::SystemTime::now() + t.saturating_duration_since(Instant::now());
    wall.duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64
}

/// One 4-GPU node; queues a and b of equal weight; a runs 4 pods for 30 minutes (from the
/// first round, at `t + 10 s`).
async fn a_ran_half_an_hour(spec: serde_json::Value) -> (MemoryApi, Scheduler<MemoryApi>, Instant) {
    let api = MemoryApi::new();
    api.put_node(node("n1", 4, json!({})));
    api.put_queue("a", queue(spec.clone()));
    api.put_queue("b", queue(spec));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    for i in 0..4 {
        api.put_pod(in_queue(&format!("a-run{i}"), "a"));
    }
    run_for(&mut scheduler, &mut t, Duration::from_secs(1800)).await;
    assert_eq!(bound_count(&api, "a-run"), 4);
    (api, scheduler, t)
}

/// a's pods end; a and b (a's first) ask for 4 GPUs each at once: who gets them.
async fn both_ask(
    api: &MemoryApi,
    scheduler: &mut Scheduler<MemoryApi>,
    t: &mut Instant,
) -> (usize, usize) {
    for i in 0..4 {
        api.delete_pod("ml", &format!("a-run{i}"));
    }
    for i in 0..4 {
        api.put_pod(in_queue(&format!("a-new{i}"), "a"));
    }
    for i in 0..4 {
        api.put_pod(in_queue(&format!("b-new{i}"), "b"));
    }
    run_for(scheduler, t, Duration::from_secs(30)).await;
    (bound_count(api, "a-new"), bound_count(api, "b-new"))
}

#[tokio::test]
async fn a_queue_that_ran_the_cluster_waits_behind_an_idle_one_and_without_usage_they_share() {
    let (api, mut scheduler, mut t) = a_ran_half_an_hour(json!({"usageHalfLife": "10m"})).await;
    let a = usage(&api, "a");
    assert_eq!(a.half_life, "10m");
    // Half an hour at 4 GPUs, half-life 10 minutes: 3.5 GPUs on average (shown every 30 s).
    let expected = closed_form(4.0, 1800.0, 600.0);
    assert!(
        (a.gpu_seconds - expected).abs() / expected < 0.02,
        "{a:?} vs {expected}"
    );
    let mean: f64 = a.decayed_gpus.parse().unwrap();
    assert!((mean - 3.5).abs() < 0.05, "{a:?}");
    assert_eq!(usage(&api, "b").decayed_gpus, "0");
    let (a_got, b_got) = both_ask(&api, &mut scheduler, &mut t).await;
    assert_eq!((a_got, b_got), (0, 4), "b, idle, is served first");

    let (api, mut scheduler, mut t) = a_ran_half_an_hour(json!({})).await;
    assert!(api.queue("a").unwrap().status.unwrap().usage.is_none());
    let (a_got, b_got) = both_ask(&api, &mut scheduler, &mut t).await;
    assert_eq!((a_got, b_got), (2, 2), "by the allocation now they share");
}

#[tokio::test]
async fn the_scheduler_default_half_life_applies_where_no_queue_sets_one() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 4, json!({})));
    api.put_queue("a", queue(json!({})));
    api.put_queue("b", queue(json!({"usageHalfLife": "0"})));
    let config = SchedulerConfig {
        usage_half_life_ms: 3_600_000,
        ..config()
    };
    let mut scheduler = Scheduler::new(api.clone(), config);
    let mut t = Instant::now();
    api.put_pod(in_queue("a0", "a"));
    run_for(&mut scheduler, &mut t, Duration::from_secs(60)).await;
    assert_eq!(usage(&api, "a").half_life, "1h");
    assert!(
        api.queue("b").unwrap().status.unwrap().usage.is_none(),
        "0: none kept"
    );
}

#[tokio::test]
async fn a_new_scheduler_carries_the_usage_on_within_one_percent() {
    let (api, scheduler, mut t) = a_ran_half_an_hour(json!({"usageHalfLife": "10m"})).await;
    let held_from = wall_ms(t - Duration::from_secs(1800));
    // The scheduler goes away (a restart, or the lease passes); 20 s later another starts
    // and runs for a quarter of an hour, a's four pods running throughout.
    drop(scheduler);
    t += Duration::from_secs(20);
    let mut next = Scheduler::new(api.clone(), config());
    run_for(&mut next, &mut t, Duration::from_secs(900)).await;
    let a = usage(&api, "a");
    // The status shows the usage as of `updated`: four GPUs held since the first round.
    let updated: k8s_openapi::jiff::Timestamp = a.updated.parse().unwrap();
    let held_s = (updated.as_millisecond() as f64 - held_from) / 1e3;
    assert!(held_s > 2600.0, "{held_s}");
    let expected = closed_form(4.0, held_s, 600.0);
    let error = (a.gpu_seconds - expected).abs() / expected;
    println!(
        "usage after a restart: {} GPU-s, closed form {expected:.1}, error {:.3}%",
        a.gpu_seconds,
        error * 100.0
    );
    assert!(error < 0.01, "{a:?} vs {expected}");
}

#[tokio::test]
async fn a_half_life_that_cannot_be_used_is_refused_and_the_last_valid_one_kept() {
    let api = MemoryApi::new();
    api.put_node(node("n1", 4, json!({})));
    api.put_queue("a", queue(json!({"usageHalfLife": "10m"})));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let mut t = Instant::now();
    api.put_pod(in_queue("a0", "a"));
    run_for(&mut scheduler, &mut t, Duration::from_secs(60)).await;
    for (bad, why) in [
        ("-5m", "is negative"),
        ("two hours", "is not a duration"),
        ("9000h", "is more than a year"),
    ] {
        api.put_queue("a", queue(json!({"usageHalfLife": bad})));
        run_for(&mut scheduler, &mut t, Duration::from_secs(40)).await;
        let status = api.queue("a").unwrap().status.unwrap();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "UsageHalfLife")
            .unwrap_or_else(|| panic!("{bad}: {status:?}"));
        assert_eq!(c.status, "False");
        assert_eq!(c.reason, "Refused");
        assert!(
            c.message.contains(why) && c.message.ends_with("keeping 10m"),
            "{}",
            c.message
        );
        assert_eq!(
            status.usage.unwrap().half_life,
            "10m",
            "the last valid one kept"
        );
        let valid = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Valid")
            .unwrap();
        assert_eq!(valid.status, "True", "the queue still serves");
    }
    api.put_queue("a", queue(json!({"usageHalfLife": "20m"})));
    run_for(&mut scheduler, &mut t, Duration::from_secs(40)).await;
    let status = api.queue("a").unwrap().status.unwrap();
    assert!(status.conditions.iter().all(|c| c.type_ != "UsageHalfLife"));
    assert_eq!(status.usage.unwrap().half_life, "20m");
    // Usage turned off: the record leaves the status (merged as the server merges it).
    api.put_queue("a", queue(json!({"usageHalfLife": "0"})));
    run_for(&mut scheduler, &mut t, Duration::from_secs(40)).await;
    assert!(api.queue("a").unwrap().status.unwrap().usage.is_none());
}
