//! Events yield to Bindings: while more than half the Binding slots are taken only the two
//! trickle slots send Events; once the Bindings ease off the rest go at full concurrency;
//! none is lost, and each says when it happened, not when it was sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

use crate::common::*;
use crate::wrapped::{Hooks, Wrapped};

const MAX_IN_FLIGHT: usize = 8;
const BIND_TAKES: Duration = Duration::from_millis(100);
const EVENT_TAKES: Duration = Duration::from_millis(50);

/// Binding and Event calls in flight, and the most Events seen in flight.
#[derive(Default)]
struct Counts {
    binds: AtomicUsize,
    events: AtomicUsize,
    most_events: AtomicUsize,
    /// The most Events in flight when one started while the Bindings were busy.
    most_events_busy: AtomicUsize,
}

/// Slow Bindings and Events, both counted.
#[derive(Clone, Default)]
struct Paced(Arc<Counts>);

impl Hooks for Paced {
    async fn before_bind(&self) {
        self.0.binds.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(BIND_TAKES).await;
    }
    fn after_bind(&self) {
        self.0.binds.fetch_sub(1, Ordering::SeqCst);
    }
    async fn before_event(&self) {
        let c = &self.0;
        let now = c.events.fetch_add(1, Ordering::SeqCst) + 1;
        c.most_events.fetch_max(now, Ordering::SeqCst);
        if c.binds.load(Ordering::SeqCst) > MAX_IN_FLIGHT / 2 {
            c.most_events_busy.fetch_max(now, Ordering::SeqCst);
        }
        tokio::time::sleep(EVENT_TAKES).await;
    }
    fn after_event(&self) {
        self.0.events.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn events_trickle_while_bindings_are_busy_and_all_go_after() {
    let api = MemoryApi::new();
    for i in 0..MAX_IN_FLIGHT {
        api.put_node(node(&format!("n{i}"), 1, json!({})));
    }
    // Eight pods that fit take every Binding slot; twenty that fit nowhere (two GPUs on
    // one-GPU nodes) are told so while those Bindings are out.
    for i in 0..MAX_IN_FLIGHT {
        api.put_pod(pod(&format!("a-{i}"), 1, json!({})));
    }
    for i in 0..20 {
        api.put_pod(pod(&format!("b-{i:02}"), 2, json!({})));
    }
    let hooks = Paced::default();
    let counts = Arc::clone(&hooks.0);
    let paced = Wrapped {
        inner: api.clone(),
        hooks,
    };
    let config = SchedulerConfig {
        max_in_flight: MAX_IN_FLIGHT,
        ..config()
    };
    let mut scheduler = Scheduler::new(paced, config);
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (8, 20), "{report:?}");
    let busy = counts.most_events_busy.load(Ordering::SeqCst);
    let most = counts.most_events.load(Ordering::SeqCst);
    // Events went while the Bindings were busy (trickled, not starved), two at a time.
    assert!(
        (1..=2).contains(&busy),
        "{busy} Events at once beside busy Bindings"
    );
    // And more at once after.
    assert!(most > 2, "at most {most} Events at once");
    let events = api.events();
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "FailedScheduling")
        .collect();
    let scheduled = events.iter().filter(|e| e.reason == "Scheduled").count();
    assert_eq!((failed.len(), scheduled), (20, 8));
    // Sent over a few hundred milliseconds, yet stamped when the round decided them.
    let first = failed.iter().map(|e| e.at).min().unwrap();
    let last = failed.iter().map(|e| e.at).max().unwrap();
    let spread = last.duration_since(first).as_secs_f64();
    assert!(
        spread < 0.05,
        "FailedScheduling stamps spread over {spread} s"
    );
    assert_eq!(scheduler.dropped_events(), 0);
}

/// Fails the first `PodScheduled` condition write.
#[derive(Clone, Default)]
struct FirstConditionFails(Arc<AtomicUsize>);

impl Hooks for FirstConditionFails {
    fn fail_unschedulable(&self) -> bool {
        self.0.fetch_add(1, Ordering::SeqCst) == 0
    }
}

/// A `PodScheduled` condition whose write failed is written again at the pod's next
/// failed attempt, even with the same message (it was once remembered as written).
#[tokio::test]
async fn a_failed_condition_write_is_retried_with_the_same_message() {
    let api = MemoryApi::new();
    api.put_node(node("n", 2, json!({})));
    let hooks = FirstConditionFails::default();
    let wrapped = Wrapped {
        inner: api.clone(),
        hooks: hooks.clone(),
    };
    let mut scheduler = Scheduler::new(wrapped, config());
    let mut t = Instant::now();
    api.put_pod(pod("big", 4, json!({})));
    scheduler.round(t).await.unwrap();
    scheduler.drain_writes(t).await;
    let condition = |api: &MemoryApi| {
        api.pod("ml", "big")
            .and_then(|p| p.status)
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.message)
    };
    assert_eq!(condition(&api), None, "the first write failed");
    let first = last_message(&api, "big");
    // Past the unschedulable flush the pod is tried again and fails the same way.
    t += Duration::from_secs(301);
    scheduler.round(t).await.unwrap();
    scheduler.drain_writes(t).await;
    let second = last_message(&api, "big");
    assert_eq!(first, second, "the same message both times");
    assert!(hooks.0.load(Ordering::SeqCst) >= 2, "written again");
    assert_eq!(condition(&api), Some(second));
}
