//! Events as kube's recorders write them (events.k8s.io/v1: a new Event named
//! `<object>.<hex nanoseconds>`, a repeat within 6 minutes folded into its `series`), with
//! one difference that matters to a waiting pod: the note is part of what makes a repeat.
//! kube-rs 5's recorder (like client-go's) folds a `FailedScheduling` with a new reason into
//! the series of the first one, so the pod's Events kept saying why it waited minutes ago
//! while its PodScheduled condition said why now (seen on the real node). Here a new reason
//! is a new Event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a repeat folds into an Event's series (kube's recorders: 6 minutes).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// Series remembered at most; past it the expired go, then all.
const MAX_SERIES: usize = 4096;

/// What makes an Event a repeat of an earlier one.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    regarding: (String, String, String, String),
    type_: String,
    reason: String,
    action: String,
    note: String,
}

/// An Event written: where, its series' count, when it was last observed.
struct Sent {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

/// One Event to write.
pub struct Record<'a> {
    /// `Warning`; anything else is written `Normal`.
    pub type_: &'a str,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
    pub regarding: &'a ObjectReference,
    /// When it happened (its eventTime, or its series' lastObservedTime).
    pub at: Timestamp,
}

/// Writes Events for one reporting controller and instance.
pub struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    sent: Mutex<HashMap<Key, Sent>>,
}

/// The Event type the API server accepts for `kind`.
fn event_type(kind: &str) -> &'static str {
    if kind == "Warning" {
        "Warning"
    } else {
        "Normal"
    }
}

fn key_of(record: &Record<'_>) -> Key {
    let r = record.regarding;
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    Key {
        regarding: (
            text(&r.namespace),
            text(&r.kind),
            text(&r.name),
            text(&r.uid),
        ),
        type_: event_type(record.type_).to_string(),
        reason: record.reason.to_string(),
        action: record.action.to_string(),
        note: record.note.to_string(),
    }
}

impl Publisher {
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Publisher {
            client,
            controller: controller.to_string(),
            instance: instance.to_string(),
            sent: Mutex::new(HashMap::new()),
        }
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Sent>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The series an Event like `key` continues, if one was written in the last 6 minutes:
    /// its namespace, name and next count.
    fn repeat_of(&self, key: &Key) -> Option<(String, String, i32)> {
        let sent = self.sent();
        let s = sent.get(key).filter(|s| s.last.elapsed() < SERIES_TTL)?;
        Some((s.namespace.clone(), s.name.clone(), s.count + 1))
    }

    fn remember(&self, key: Key, namespace: String, name: String, count: i32) {
        let mut sent = self.sent();
        if sent.len() >= MAX_SERIES {
            sent.retain(|_, s| s.last.elapsed() < SERIES_TTL);
            if sent.len() >= MAX_SERIES {
                sent.clear();
            }
        }
        let last = Instant::now();
        sent.insert(
            key,
            Sent {
                namespace,
                name,
                count,
                last,
            },
        );
    }

    /// Writes `record`: a repeat bumps its Event's series, anything else is a new Event.
    pub async fn publish(&self, record: Record<'_>) -> Result<(), kube::Error> {
        let key = key_of(&record);
        let now = record.at;
        if let Some((namespace, name, count)) = self.repeat_of(&key) {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(now),
            };
            let patch = json!({"series": series});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(key, namespace, name, count);
                    return Ok(());
                }
                // Gone (expired by the server's TTL): write it anew.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let namespace = record
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let object = record.regarding.name.as_deref().unwrap_or(&self.controller);
        // Named by the time it is written (unique), not when it happened.
        let name = format!("{object}.{:x}", Timestamp::now().as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(event_type(record.type_).to_string()),
            reason: Some(record.reason.to_string()),
            action: Some(record.action.to_string()),
            note: Some(record.note.to_string()),
            regarding: Some(record.regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        self.remember(key, namespace, name, 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_note_is_a_new_event_and_the_same_note_a_repeat() {
        let pod = ObjectReference {
            namespace: Some("ml".into()),
            kind: Some("Pod".into()),
            name: Some("w2".into()),
            uid: Some("u".into()),
            ..ObjectReference::default()
        };
        let record = |note| Record {
            type_: "Warning",
            reason: "FailedScheduling",
            action: "Scheduling",
            note,
            regarding: &pod,
            at: Timestamp::now(),
        };
        let first = key_of(&record("only 0 of 3 members fit"));
        assert_eq!(first, key_of(&record("only 0 of 3 members fit")));
        assert_ne!(first, key_of(&record("only 2 of 3 members fit")));
    }
}
