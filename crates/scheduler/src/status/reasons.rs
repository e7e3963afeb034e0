//! The latest scheduling failure of each pending pod: kept by the scheduler as it emits
//! its `FailedScheduling` Events (for the live map), or read back from the Events by
//! `gpuplace status`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::events::v1::Event;

/// Pods remembered at most; past it the oldest half is forgotten (pods deleted while
/// pending are never told apart from waiting ones otherwise).
const MAX_PODS: usize = 50_000;

/// Why a pod waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    pub message: String,
    /// Order of arrival (larger is later).
    pub seq: u64,
    /// The structured record the message was rendered from (the scheduler's own; `None`
    /// when read back from an Event).
    pub record: Option<Arc<gpuplace_core::waiting::Waiting>>,
}

/// Reasons by pod UID, shared between the scheduler (writer) and the map (reader).
#[derive(Clone, Debug, Default)]
pub struct PendingReasons {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    by_uid: HashMap<String, Reason>,
    seq: u64,
    /// Bumped on every change.
    version: u64,
}

impl PendingReasons {
    /// The pod `uid` failed to schedule because of `message` (rendered from `record`).
    pub fn failed(
        &self,
        uid: &str,
        message: &str,
        record: Option<Arc<gpuplace_core::waiting::Waiting>>,
    ) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.seq += 1;
        inner.version += 1;
        let seq = inner.seq;
        inner.by_uid.insert(
            uid.to_string(),
            Reason {
                message: message.to_string(),
                seq,
                record,
            },
        );
        if inner.by_uid.len() > MAX_PODS {
            let mut seqs: Vec<u64> = inner.by_uid.values().map(|r| r.seq).collect();
            seqs.sort_unstable();
            let cut = seqs[seqs.len() / 2];
            inner.by_uid.retain(|_, r| r.seq >= cut);
        }
    }

    /// The pod `uid` was scheduled (or is gone): it no longer waits.
    pub fn clear(&self, uid: &str) {
        if let Ok(mut inner) = self.inner.lock()
            && inner.by_uid.remove(uid).is_some()
        {
            inner.version += 1;
        }
    }

    /// Changes whenever a reason is added or cleared.
    pub fn version(&self) -> u64 {
        self.inner.lock().map(|i| i.version).unwrap_or(0)
    }

    /// A copy of every reason known.
    pub fn snapshot(&self) -> HashMap<String, Reason> {
        self.inner
            .lock()
            .map(|i| i.by_uid.clone())
            .unwrap_or_default()
    }
}

/// The latest `FailedScheduling` note per pod UID among `events` (events.k8s.io/v1), from
/// any scheduler; a later `Scheduled` Event clears it.
pub fn from_events(events: &[Event]) -> HashMap<String, Reason> {
    let mut latest: HashMap<String, (String, String, bool)> = HashMap::new();
    for e in events {
        let Some(regarding) = &e.regarding else {
            continue;
        };
        if regarding.kind.as_deref() != Some("Pod") {
            continue;
        }
        let Some(uid) = regarding.uid.as_deref().filter(|u| !u.is_empty()) else {
            continue;
        };
        let failed = match e.reason.as_deref() {
            Some("FailedScheduling") => true,
            Some("Scheduled") => false,
            _ => continue,
        };
        let when = event_time(e);
        let newer = latest.get(uid).is_none_or(|(t, _, _)| when >= *t);
        if newer {
            let note = e.note.clone().unwrap_or_default();
            latest.insert(uid.to_string(), (when, note, failed));
        }
    }
    latest
        .into_iter()
        .filter(|(_, (_, _, failed))| *failed)
        .enumerate()
        .map(|(i, (uid, (_, message, _)))| {
            let reason = Reason {
                message,
                seq: i as u64,
                record: None,
            };
            (uid, reason)
        })
        .collect()
}

/// When the Event last happened (series first, then its time fields), as RFC 3339 text
/// (which sorts by time).
fn event_time(e: &Event) -> String {
    if let Some(series) = &e.series {
        return series.last_observed_time.0.to_string();
    }
    if let Some(t) = &e.event_time {
        return t.0.to_string();
    }
    if let Some(t) = &e.deprecated_last_timestamp {
        return t.0.to_string();
    }
    e.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(uid: &str, reason: &str, note: &str, time: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{uid}.{time}"), "namespace": "ns"},
            "eventTime": time,
            "reason": reason,
            "note": note,
            "regarding": {"kind": "Pod", "name": "p", "namespace": "ns", "uid": uid}
        }))
        .unwrap()
    }

    #[test]
    fn the_latest_failure_wins_and_scheduled_clears() {
        let events = vec![
            event(
                "a",
                "FailedScheduling",
                "old",
                "2026-01-01T00:00:00.000000Z",
            ),
            event(
                "a",
                "FailedScheduling",
                "new",
                "2026-01-01T00:00:05.000000Z",
            ),
            event(
                "b",
                "FailedScheduling",
                "waits",
                "2026-01-01T00:00:00.000000Z",
            ),
            event("b", "Scheduled", "bound", "2026-01-01T00:00:09.000000Z"),
        ];
        let reasons = from_events(&events);
        assert_eq!(reasons.len(), 1);
        assert_eq!(reasons["a"].message, "new");
    }

    #[test]
    fn the_store_is_bounded() {
        let store = PendingReasons::default();
        for i in 0..(MAX_PODS + 10) {
            store.failed(&format!("u{i}"), "no", None);
        }
        let kept = store.snapshot();
        assert!(kept.len() <= MAX_PODS);
        assert!(kept.contains_key(&format!("u{}", MAX_PODS + 9)));
        store.clear(&format!("u{}", MAX_PODS + 9));
        assert!(!store.snapshot().contains_key(&format!("u{}", MAX_PODS + 9)));
    }
}
