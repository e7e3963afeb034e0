//! The event sink: the scheduler's Events (`Scheduled`, `FailedScheduling`, `Preempted`)
//! go out on their own slots and never hold up a Binding; when too many are queued, new ones
//! are dropped (and counted), as kube's event broadcaster does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::{ClusterApi, EventRecord, PodKey};
use crate::status::PendingReasons;

/// Events waiting or in flight beyond which new ones are dropped (a few hundred bytes
/// each: a burst of 10,000 bindings keeps all its Events).
const MAX_QUEUED_EVENTS: usize = 16_384;

/// Events queued or in flight.
pub struct EventSink<A> {
    api: A,
    events: JoinSet<()>,
    slots: Arc<Semaphore>,
    dropped: Arc<AtomicU64>,
    /// The latest `FailedScheduling` message per waiting pod, sent or dropped.
    reasons: PendingReasons,
    /// The message last put in each waiting pod's `PodScheduled` condition.
    conditions: std::collections::HashMap<String, String>,
}

impl<A: ClusterApi> EventSink<A> {
    /// At most `concurrency` Events are sent at once.
    pub fn new(api: A, concurrency: usize) -> Self {
        EventSink {
            api,
            events: JoinSet::new(),
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            dropped: Arc::default(),
            reasons: PendingReasons::default(),
            conditions: std::collections::HashMap::new(),
        }
    }

    /// The reasons of the pods told `FailedScheduling` and not scheduled since.
    pub fn reasons(&self) -> PendingReasons {
        self.reasons.clone()
    }

    /// Queues an Event; dropped when too many are waiting.
    pub fn emit(&mut self, pod: &PodKey, kind: &str, reason: &str, message: String) {
        // A pod that fits nowhere also gets its PodScheduled=False condition with the same
        // message when it changed, written after its Event (so the Event never lags it).
        let condition = match reason {
            "FailedScheduling" => {
                self.reasons.failed(&pod.uid, &message);
                let changed = self.conditions.get(&pod.uid) != Some(&message);
                if changed {
                    if self.conditions.len() >= MAX_QUEUED_EVENTS {
                        self.conditions.clear();
                    }
                    self.conditions.insert(pod.uid.clone(), message.clone());
                }
                changed.then(|| message.clone())
            }
            "Scheduled" => {
                self.reasons.clear(&pod.uid);
                self.conditions.remove(&pod.uid);
                None
            }
            _ => None,
        };
        while self.events.try_join_next().is_some() {}
        if self.events.len() >= MAX_QUEUED_EVENTS {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if condition.is_some() {
                self.conditions.remove(&pod.uid);
            }
            return;
        }
        let event = EventRecord {
            pod: pod.clone(),
            kind: kind.to_string(),
            reason: reason.to_string(),
            message,
        };
        let api = self.api.clone();
        let slots = Arc::clone(&self.slots);
        self.events.spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return;
            };
            if let Err(e) = api.event(event.clone()).await {
                tracing::warn!(pod = %event.pod, error = %e, "cannot record event");
            }
            if let Some(message) = condition
                && let Err(e) = api.unschedulable(&event.pod, &message).await
            {
                tracing::debug!(pod = %event.pod, error = %e, "PodScheduled condition not written");
            }
        });
    }

    /// Waits until every queued Event is sent.
    pub async fn flush(&mut self) {
        while self.events.join_next().await.is_some() {}
    }

    /// Events dropped because too many were queued.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
