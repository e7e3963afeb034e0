//! The event sink: the scheduler's Events (`Scheduled`, `FailedScheduling`, `Preempted`)
//! go out on their own slots and never hold up a Binding. While the Bindings are busy (more
//! than half their slots taken: the server paces them) Events yield: only
//! [`TRICKLE_SLOTS`] of them are in flight, the rest wait in a queue and go when the
//! Bindings ease off; each says when it happened, not when it was sent. When too many are
//! queued, new ones are dropped (and counted), as kube's event broadcaster does.
//!
//! Found on the real API server at 5,000 nodes / 40,000 pods: each pod's `Scheduled` Event
//! is a second write beside its Binding, and with both at full concurrency the server
//! spent on Events what the Bindings waited for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::{ClusterApi, EventRecord, PodKey};
use crate::clock::WallClock;
use crate::shared::bind::BindLoad;
use crate::status::PendingReasons;

/// Events queued beyond which new ones are dropped (a few hundred bytes each: a burst of
/// 40,000 Bindings that holds Events back keeps them all).
const MAX_QUEUED_EVENTS: usize = 65_536;

/// Events in flight while the Bindings are busy.
pub const TRICKLE_SLOTS: usize = 2;

/// How long a waiting pod's `FailedScheduling` of an unchanged meaning is not sent again:
/// under the API server's Event time-to-live (1 h), so the pod always has one.
pub const SAME_MEANING_FOR: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// One Event to write, and the `PodScheduled` condition to write after it.
struct Queued {
    event: EventRecord,
    condition: Option<String>,
}

/// What the sink and its senders share.
struct Outbox {
    queue: VecDeque<Queued>,
    /// Senders running (each exits when it finds the queue empty).
    senders: usize,
}

/// Events queued or in flight.
pub struct EventSink<A> {
    api: A,
    concurrency: usize,
    outbox: Arc<Mutex<Outbox>>,
    senders: JoinSet<()>,
    load: BindLoad,
    trickle: Arc<Semaphore>,
    wall: WallClock,
    dropped: Arc<AtomicU64>,
    /// The latest `FailedScheduling` message per waiting pod, sent or dropped.
    reasons: PendingReasons,
    /// The message last put in each waiting pod's `PodScheduled` condition (a write that
    /// fails is forgotten by its sender, so the same message is written again next time).
    conditions: Conditions,
    /// The meaning ([`Waiting::meaning`]) of each waiting pod's last `FailedScheduling`
    /// sent, and when: a message of the same meaning within [`SAME_MEANING_FOR`] is kept
    /// for the on-demand views and not written (write on change). Shared with the
    /// senders: an Event or condition write that fails is forgotten, so it is made again.
    sent: Sent,
}

/// Each waiting pod's last `FailedScheduling` meaning sent and when, by UID.
type Sent = Arc<Mutex<std::collections::HashMap<String, (String, tokio::time::Instant)>>>;

/// Each waiting pod's `PodScheduled` message, by UID, shared with the senders.
type Conditions = Arc<Mutex<std::collections::HashMap<String, String>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<A: ClusterApi> EventSink<A> {
    /// At most `concurrency` Events are sent at once, [`TRICKLE_SLOTS`] while `load` is
    /// busy; times come from `wall`.
    pub fn new(api: A, concurrency: usize, load: BindLoad, wall: WallClock) -> Self {
        EventSink {
            api,
            concurrency: concurrency.max(1),
            outbox: Arc::new(Mutex::new(Outbox {
                queue: VecDeque::new(),
                senders: 0,
            })),
            senders: JoinSet::new(),
            load,
            trickle: Arc::new(Semaphore::new(TRICKLE_SLOTS)),
            wall,
            dropped: Arc::default(),
            reasons: PendingReasons::default(),
            conditions: Arc::default(),
            sent: Arc::default(),
        }
    }

    /// The reasons of the pods told `FailedScheduling` and not scheduled since.
    pub fn reasons(&self) -> PendingReasons {
        self.reasons.clone()
    }

    /// Pod `pod` waits: `message` (its rendered `record`) is kept for the on-demand views,
    /// and goes out as a `FailedScheduling` Event (and condition) when its meaning changed.
    pub fn failed(
        &mut self,
        pod: &PodKey,
        message: String,
        record: Option<Arc<gpuplace_core::waiting::Waiting>>,
    ) {
        self.reasons.failed(&pod.uid, &message, record);
        self.emit(pod, "Warning", "FailedScheduling", message);
    }

    /// Queues an Event; dropped when too many are waiting.
    pub fn emit(&mut self, pod: &PodKey, kind: &str, reason: &str, message: String) {
        // A pod that fits nowhere also gets its PodScheduled=False condition with the same
        // message when it changed, written after its Event (so the Event never lags it).
        let condition = match reason {
            "FailedScheduling" => {
                if !self.meaning_changed(&pod.uid, &message) {
                    return;
                }
                let mut conditions = lock(&self.conditions);
                let changed = conditions.get(&pod.uid) != Some(&message);
                if changed {
                    if conditions.len() >= MAX_QUEUED_EVENTS {
                        conditions.clear();
                    }
                    conditions.insert(pod.uid.clone(), message.clone());
                }
                changed.then(|| message.clone())
            }
            "Scheduled" => {
                self.reasons.clear(&pod.uid);
                lock(&self.conditions).remove(&pod.uid);
                lock(&self.sent).remove(&pod.uid);
                None
            }
            _ => None,
        };
        while self.senders.try_join_next().is_some() {}
        let event = EventRecord {
            pod: pod.clone(),
            kind: kind.to_string(),
            reason: reason.to_string(),
            message,
            at: self.wall.timestamp(tokio::time::Instant::now().into_std()),
        };
        let start = {
            let mut outbox = lock(&self.outbox);
            if outbox.queue.len() >= MAX_QUEUED_EVENTS {
                drop(outbox);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if condition.is_some() {
                    lock(&self.conditions).remove(&pod.uid);
                }
                lock(&self.sent).remove(&pod.uid);
                return;
            }
            outbox.queue.push_back(Queued { event, condition });
            // Counted under the lock a sender retires under: a pushed Event always has a
            // sender that will see it.
            let start = outbox.senders < self.concurrency;
            if start {
                outbox.senders += 1;
            }
            start
        };
        if start {
            self.senders.spawn(send_queued(
                self.api.clone(),
                Arc::clone(&self.outbox),
                self.load.clone(),
                Arc::clone(&self.trickle),
                Written {
                    conditions: Arc::clone(&self.conditions),
                    sent: Arc::clone(&self.sent),
                },
            ));
        }
    }

    /// Whether pod `uid`'s `message` means something else than its last one sent (or that
    /// was sent [`SAME_MEANING_FOR`] ago); if so it counts as sent now.
    fn meaning_changed(&mut self, uid: &str, message: &str) -> bool {
        let meaning = gpuplace_core::waiting::Waiting::meaning(message);
        let now = tokio::time::Instant::now();
        let mut sent = lock(&self.sent);
        if let Some((last, at)) = sent.get(uid)
            && *last == meaning
            && now.saturating_duration_since(*at) < SAME_MEANING_FOR
        {
            return false;
        }
        if sent.len() >= MAX_QUEUED_EVENTS {
            sent.clear();
        }
        sent.insert(uid.to_string(), (meaning, now));
        true
    }

    /// Waits until every queued Event is sent.
    pub async fn flush(&mut self) {
        while self.senders.join_next().await.is_some() {}
    }

    /// Events dropped because too many were queued.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events queued and not yet sent.
    pub fn queued(&self) -> usize {
        lock(&self.outbox).queue.len()
    }
}

/// One sender: takes Events off the queue until it is empty, each once the Bindings are
/// quiet or a trickle slot is free.
async fn send_queued<A: ClusterApi>(
    api: A,
    outbox: Arc<Mutex<Outbox>>,
    load: BindLoad,
    trickle: Arc<Semaphore>,
    written: Written,
) {
    loop {
        let permit = load.give_way(&trickle).await;
        let next = {
            let mut outbox = lock(&outbox);
            let next = outbox.queue.pop_front();
            if next.is_none() {
                outbox.senders -= 1;
            }
            next
        };
        let Some(Queued { event, condition }) = next else {
            return;
        };
        if let Err(e) = api.event(event.clone()).await {
            tracing::warn!(pod = %event.pod, error = %e, "cannot record event");
            written.forget_meaning(&event);
        }
        if let Some(message) = condition
            && let Err(e) = api.unschedulable(&event.pod, &message).await
        {
            tracing::debug!(pod = %event.pod, error = %e, "PodScheduled condition not written; written again at the next attempt");
            let mut conditions = lock(&written.conditions);
            if conditions.get(&event.pod.uid) == Some(&message) {
                conditions.remove(&event.pod.uid);
            }
            drop(conditions);
            written.forget_meaning(&event);
        }
        drop(permit);
    }
}

/// What the senders forget when a write fails, so the next attempt makes it again.
struct Written {
    conditions: Conditions,
    sent: Sent,
}

impl Written {
    /// Forgets the meaning `event` carried for its pod (unless a newer one was sent since).
    fn forget_meaning(&self, event: &EventRecord) {
        if event.reason != "FailedScheduling" {
            return;
        }
        let meaning = gpuplace_core::waiting::Waiting::meaning(&event.message);
        let mut sent = lock(&self.sent);
        if sent.get(&event.pod.uid).is_some_and(|(m, _)| *m == meaning) {
            sent.remove(&event.pod.uid);
        }
    }
}
