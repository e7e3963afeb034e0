//! Watches of gpuplace's own kinds (PodGroup, Queue), read object by object: the API server
//! does not enforce every bound their schemas state (`format: uint32` is not checked), so a
//! typed list would fail whole on one bad object and every gang or queue would vanish with
//! it. Here each object is decoded alone; one that does not decode is skipped (a version
//! of it seen before is dropped, as if deleted) with a warning in the log and a Warning
//! Event on the object naming the problem, once per version of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::warn;

use super::events::{Publisher, Record};
use super::watch::{Changes, PatientBackoff, Watched, run_events};

/// Bad objects waiting for their Event; past it more are only logged.
const EVENTS_QUEUED: usize = 64;

/// An object that did not decode, for its Event.
struct Bad {
    regarding: ObjectReference,
    note: String,
}

/// Decodes each event's object; remembers the good version of each to drop it when a bad
/// version replaces it.
struct Decoder<K> {
    strip: fn(&mut K),
    resource: ApiResource,
    good: HashMap<String, K>,
    relisted: HashSet<String>,
    /// The version of each bad object already told about.
    told: HashMap<String, String>,
    bad: mpsc::Sender<Bad>,
}

fn key_of(d: &DynamicObject) -> String {
    format!(
        "{}/{}",
        d.metadata.namespace.as_deref().unwrap_or_default(),
        d.metadata.name.as_deref().unwrap_or_default()
    )
}

impl<K: serde::de::DeserializeOwned + Clone> Decoder<K> {
    fn decode(
        &mut self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Option<Result<watcher::Event<K>, watcher::Error>> {
        use watcher::Event;
        let event = match event {
            Err(e) => return Some(Err(e)),
            Ok(event) => event,
        };
        Some(Ok(match event {
            Event::Init => {
                self.relisted.clear();
                Event::Init
            }
            Event::InitApply(d) => {
                let key = key_of(&d);
                let k = self.typed(&d)?;
                self.relisted.insert(key.clone());
                self.good.insert(key, k.clone());
                Event::InitApply(k)
            }
            Event::InitDone => {
                let relisted = &self.relisted;
                self.good.retain(|key, _| relisted.contains(key));
                Event::InitDone
            }
            Event::Apply(d) => match self.typed(&d) {
                Some(k) => {
                    self.good.insert(key_of(&d), k.clone());
                    Event::Apply(k)
                }
                // The good version the store holds goes: the object is not what it was.
                None => Event::Delete(self.good.remove(&key_of(&d))?),
            },
            Event::Delete(d) => {
                // Gone: nothing to tell about it any more.
                self.told.remove(&key_of(&d));
                let good = self.good.remove(&key_of(&d));
                match self.decoded(&d) {
                    Ok(k) => Event::Delete(k),
                    Err(_) => Event::Delete(good?),
                }
            }
        }))
    }

    fn decoded(&self, d: &DynamicObject) -> Result<K, serde_json::Error> {
        let mut k = serde_json::to_value(d).and_then(serde_json::from_value::<K>)?;
        (self.strip)(&mut k);
        Ok(k)
    }

    /// The object as `K`, or `None` with the problem told once per version.
    fn typed(&mut self, d: &DynamicObject) -> Option<K> {
        match self.decoded(d) {
            Ok(k) => Some(k),
            Err(e) => {
                let key = key_of(d);
                let version = d.metadata.resource_version.clone().unwrap_or_default();
                if self.told.get(&key) != Some(&version) {
                    self.tell(d, &key, &e);
                    self.told.insert(key, version);
                }
                None
            }
        }
    }

    fn tell(&self, d: &DynamicObject, key: &str, e: &serde_json::Error) {
        let kind = &self.resource.kind;
        warn!(kind = %kind, object = %key, error = %e, "object skipped: it does not decode");
        let note = format!(
            "gpuplace skips this {kind} until it is fixed: {e} (the bounds are in its CRD: `gpuplace crd`)"
        );
        let regarding = ObjectReference {
            api_version: Some(self.resource.api_version.clone()),
            kind: Some(kind.clone()),
            namespace: d.metadata.namespace.clone(),
            name: d.metadata.name.clone(),
            uid: d.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        // Full: logged only (the Events are a courtesy; the log line is written).
        let _ = self.bad.try_send(Bad { regarding, note });
    }
}

/// Watches every `K` object by object (see the module), publishing the bad objects' Events
/// through `events`; the publishing task ends with the watch.
pub(super) fn run_checked<K>(
    client: Client,
    events: Arc<Publisher>,
    strip: fn(&mut K),
    missing_hint: &'static str,
    changes: Changes,
    fingerprint: Option<fn(&K) -> u64>,
) -> Watched<K>
where
    K: kube::Resource<DynamicType = ()>
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let (bad, mut told) = mpsc::channel::<Bad>(EVENTS_QUEUED);
    let mut decoder = Decoder {
        strip,
        resource,
        good: HashMap::new(),
        relisted: HashSet::new(),
        told: HashMap::new(),
        bad,
    };
    // Ends when the decoder (in the watch stream) is dropped with the watch.
    tokio::spawn(async move {
        while let Some(b) = told.recv().await {
            let record = Record {
                type_: "Warning",
                reason: "Invalid",
                action: "Validating",
                note: &b.note,
                regarding: &b.regarding,
                at: k8s_openapi::jiff::Timestamp::now(),
            };
            if let Err(e) = events.publish(record).await {
                warn!(error = %e, "Event about a skipped object not recorded");
            }
        }
    });
    let stream = watcher(api, watcher::Config::default())
        .backoff(PatientBackoff::new())
        .filter_map(move |event| futures::future::ready(decoder.decode(event)));
    run_events(stream, missing_hint, changes, fingerprint)
}

#[cfg(test)]
#[path = "checked_tests.rs"]
mod tests;
