//! The watches behind the caches: reflectors with a patient backoff, change
//! fingerprints (an update that changes nothing scheduling reads does not wake the loop),
//! and logging that says a missing resource type once.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::api::Listed;

/// A counter of watch events that waiters can wait on.
pub type Changes = Arc<tokio::sync::watch::Sender<u64>>;

pub(super) fn bump(changes: &Changes) {
    changes.send_modify(|g| *g += 1);
}

/// Whether a watch error says the resource type does not exist (a CRD not installed).
pub fn is_missing_resource(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    };
    code == 404
}

/// What a watch tells its operator about errors: a missing resource type once, with
/// `missing_hint`, then quietly until it appears (the watch keeps retrying with backoff);
/// other errors each time.
#[derive(Debug, Default)]
pub struct WatchLog {
    missing: bool,
}

/// How to log one watch outcome.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchNote {
    /// Nothing to say.
    Quiet,
    /// The resource is missing (said once).
    Missing,
    /// The resource is back after being missing.
    Found,
    /// Another error.
    Error,
}

impl WatchLog {
    pub fn note(&mut self, missing: Option<bool>) -> WatchNote {
        match missing {
            None if self.missing => {
                self.missing = false;
                WatchNote::Found
            }
            None => WatchNote::Quiet,
            Some(true) if self.missing => WatchNote::Quiet,
            Some(true) => {
                self.missing = true;
                WatchNote::Missing
            }
            Some(false) => WatchNote::Error,
        }
    }
}

/// kube's default watch backoff (800 ms doubling to 30 s, starting over after 120 s
/// without errors), except that no event resets it early: kube resets on every non-error
/// item, and a watch whose list keeps failing yields `Init` before each failure, so a
/// missing CRD would be retried about once a second forever.
pub(super) struct PatientBackoff(watcher::DefaultBackoff);

impl PatientBackoff {
    pub(super) fn new() -> PatientBackoff {
        PatientBackoff(watcher::DefaultBackoff::default())
    }
}

impl Iterator for PatientBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        self.0.next()
    }
}

impl Backoff for PatientBackoff {
    fn reset(&mut self) {}
}

/// What of a Node scheduling reads, hashed: a Node update that changes none of it (a
/// status heartbeat) is not a change the scheduler needs to look at.
pub(super) fn node_fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let spec = node.spec.as_ref();
    serde_json::json!([
        node.metadata.labels,
        node.metadata.annotations,
        spec.map(|s| &s.taints),
        spec.map(|s| s.unschedulable),
        node.status.as_ref().map(|s| &s.allocatable),
    ])
    .to_string()
    .hash(&mut h);
    h.finish()
}

/// What volume checks read of a claim: its volume and whether it is being deleted.
pub(super) fn claim_fingerprint(claim: &PersistentVolumeClaim) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        &claim.metadata.namespace,
        claim.spec.as_ref().map(|s| &s.volume_name),
        claim.metadata.deletion_timestamp.is_some(),
    )
        .hash(&mut h);
    h.finish()
}

/// What volume checks read of a volume: its node affinity.
pub(super) fn volume_fingerprint(volume: &PersistentVolume) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&volume.spec.as_ref().map(|s| &s.node_affinity))
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// `namespace/name` (`/name` for cluster-wide objects).
fn object_key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

pub(super) fn run_reflector<K>(
    api: Api<K>,
    strip: fn(&mut K),
    missing_hint: &'static str,
    changes: Changes,
    fingerprint: Option<fn(&K) -> u64>,
) -> Watched<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let events = watcher(api, watcher::Config::default())
        .backoff(PatientBackoff::new())
        .modify(strip);
    run_events(events, missing_hint, changes, fingerprint)
}

/// The watch events of a kind (from [`run_reflector`] or [`super::checked`]) kept in a
/// store, each change counted and the loop woken when a fingerprint moved.
pub(super) fn run_events<K, S>(
    events: S,
    missing_hint: &'static str,
    changes: Changes,
    fingerprint: Option<fn(&K) -> u64>,
) -> Watched<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, writer) = reflector::store();
    let watched = Watched {
        store,
        changes: Arc::new(AtomicU64::new(0)),
        kept: Arc::new(Mutex::new(None)),
    };
    let kind_changes = Arc::clone(&watched.changes);
    let stream = reflector::reflector(writer, events);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut log = WatchLog::default();
        let mut seen: std::collections::HashMap<String, u64> = Default::default();
        while let Some(event) = stream.next().await {
            let missing = match &event {
                Err(e) => Some(is_missing_resource(e)),
                // A list begins: no evidence yet that the resource exists.
                Ok(watcher::Event::Init) => continue,
                // One object of a list: the list's end counts as the change.
                Ok(watcher::Event::InitApply(obj)) => {
                    if let Some(f) = fingerprint {
                        seen.insert(object_key(obj.meta()), f(obj));
                    }
                    None
                }
                Ok(watcher::Event::Apply(obj)) => {
                    kind_changes.fetch_add(1, Ordering::Release);
                    let name = object_key(obj.meta());
                    let same = fingerprint.is_some_and(|f| {
                        let print = f(obj);
                        seen.insert(name, print) == Some(print)
                    });
                    if !same {
                        bump(&changes);
                    }
                    None
                }
                Ok(watcher::Event::Delete(obj)) => {
                    kind_changes.fetch_add(1, Ordering::Release);
                    seen.remove(&object_key(obj.meta()));
                    bump(&changes);
                    None
                }
                Ok(watcher::Event::InitDone) => {
                    kind_changes.fetch_add(1, Ordering::Release);
                    bump(&changes);
                    None
                }
            };
            match (log.note(missing), event) {
                (WatchNote::Missing, _) => warn!("{missing_hint}"),
                (WatchNote::Found, _) => info!("the resource is there now: watching it"),
                (WatchNote::Error, Err(e)) => {
                    warn!(error = %e, "watch error (retrying with backoff)")
                }
                _ => {}
            }
        }
    });
    watched
}

/// A reflector's store and the list the views share: made anew only after the store
/// changed (any event, even one whose fingerprint wakes nobody), so a view of an unchanged
/// kind costs one pointer and its readers see "unchanged" by comparing pointers.
pub(super) struct Watched<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    /// Events applied to the store (the reflector applies an event before passing it on).
    changes: Arc<AtomicU64>,
    kept: Arc<Mutex<Option<Kept<K>>>>,
}

/// The list made at a count of a store's changes.
struct Kept<K> {
    at: u64,
    list: Listed<K>,
}

impl<K: kube::Resource + Clone + 'static> Clone for Watched<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Watched {
            store: self.store.clone(),
            changes: Arc::clone(&self.changes),
            kept: Arc::clone(&self.kept),
        }
    }
}

impl<K: kube::Resource + Clone + 'static> Watched<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The store's objects: the list kept, unless an event came since it was made. The
    /// count is read first: an event landing while the list is made makes the count move
    /// on, and the next call makes it again.
    pub(super) fn listed(&self) -> Listed<K> {
        let count = self.changes.load(Ordering::Acquire);
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        match &*kept {
            Some(k) if k.at == count => Arc::clone(&k.list),
            _ => {
                let list: Listed<K> = Arc::new(self.store.state());
                *kept = Some(Kept {
                    at: count,
                    list: Arc::clone(&list),
                });
                list
            }
        }
    }

    /// The object `namespace/name`, when the store has it.
    pub(super) fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>>
    where
        K::DynamicType: Default,
    {
        self.store
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
    }

    pub(super) async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.store.wait_until_ready().await
    }
}

/// What preemption reads of a budget: its selector and how many disruptions it allows.
pub(super) fn budget_fingerprint(budget: &PodDisruptionBudget) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::json!([
        budget.spec.as_ref().map(|s| &s.selector),
        budget.status.as_ref().map(|s| s.disruptions_allowed),
        budget.status.as_ref().map(|s| &s.disrupted_pods),
    ])
    .to_string()
    .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod watch_log_tests {
    use super::*;

    #[test]
    fn a_missing_crd_is_said_once_and_its_arrival_once() {
        let mut log = WatchLog::default();
        assert_eq!(log.note(Some(true)), WatchNote::Missing);
        for _ in 0..100 {
            assert_eq!(
                log.note(Some(true)),
                WatchNote::Quiet,
                "backing off quietly"
            );
        }
        assert_eq!(log.note(None), WatchNote::Found);
        assert_eq!(log.note(None), WatchNote::Quiet);
        assert_eq!(log.note(Some(false)), WatchNote::Error);
        assert_eq!(
            log.note(Some(false)),
            WatchNote::Error,
            "other errors each time"
        );
    }

    #[test]
    fn not_found_is_a_missing_resource() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        assert!(is_missing_resource(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(404))
        )));
        assert!(!is_missing_resource(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(403))
        )));
        assert!(is_missing_resource(&watcher::Error::WatchError(status(
            404
        ))));
    }
}
