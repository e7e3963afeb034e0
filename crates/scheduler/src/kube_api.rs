//! [`ClusterApi`] over a real API server with kube-rs: watch-fed caches for the view (a
//! [`PodCache`] of compact pods; reflector stores of Nodes, stripped of what the scheduler
//! never reads, and PodGroups); one `binding` subresource write per pod carrying the
//! assignment annotation, with the pod's UID and resourceVersion as preconditions (a stale
//! resourceVersion is a 409; the API server merges the Binding's annotations into the pod
//! in the update that sets `spec.nodeName`); events.k8s.io/v1 Events;
//! the PodGroup status subresource. Only stable APIs are used (core/v1, events.k8s.io/v1,
//! coordination.k8s.io/v1 for the lease, and our CRD), so any cluster from 1.26 on works.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tracing::{info, warn};

use crate::api::{ApiError, BindRequest, ClusterApi, ClusterView, EventRecord, PodKey, PodState};
use crate::cache::PodCache;

use crate::gang::{PodGroup, PodGroupStatus};

/// The API server, seen through reflector caches.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    nodes: Store<Node>,
    pods: Arc<Mutex<PodCache>>,
    groups: Store<PodGroup>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    recorder: Recorder,
    /// Counts watch events of all three caches: the view's generation.
    changes: Changes,
    /// The client's own request rate limit (`--kube-api-qps`, `--kube-api-burst`).
    limit: Option<Arc<crate::rate::TokenBucket>>,
}

/// A counter of watch events that waiters can wait on.
pub type Changes = Arc<tokio::sync::watch::Sender<u64>>;

fn bump(changes: &Changes) {
    changes.send_modify(|g| *g += 1);
}

/// The API server refuses an Event whose note is longer than 1 KiB.
const MAX_NOTE_BYTES: usize = 1024;

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn truncate_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn api_error(e: kube::Error) -> ApiError {
    match &e {
        kube::Error::Api(status) if status.code == 409 => {
            ApiError::Conflict(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 404 => {
            ApiError::NotFound(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 422 || status.code == 400 => {
            ApiError::Invalid(status.message.clone())
        }
        _ => ApiError::Other(e.to_string()),
    }
}

/// Drops what node filters and inventories never read (images, volumes, managed fields,
/// other tools' annotations): real Node objects carry kilobytes of it.
fn strip_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with("gpuplace.io/"));
    }
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.config = None;
    }
}

fn run_pod_cache(
    api: Api<Pod>,
    gpu_resource: &str,
    changes: Changes,
) -> (Arc<Mutex<PodCache>>, tokio::sync::watch::Receiver<bool>) {
    let cache = Arc::new(Mutex::new(PodCache::new(gpu_resource)));
    let (listed, ready) = tokio::sync::watch::channel(false);
    let writer = Arc::clone(&cache);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let mut cache = writer.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(
                event,
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
            ) {
                bump(&changes);
            }
            match event {
                Ok(watcher::Event::Init) => cache.begin_relist(),
                Ok(watcher::Event::InitApply(pod)) => cache.relisted(&pod),
                Ok(watcher::Event::InitDone) => {
                    cache.relist_done();
                    let _ = listed.send(true);
                }
                Ok(watcher::Event::Apply(pod)) => cache.apply(&pod),
                Ok(watcher::Event::Delete(pod)) => cache.delete(&pod),
                Err(e) => warn!(error = %e, "pod watch error (retrying with backoff)"),
            }
        }
    });
    (cache, ready)
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
struct PatientBackoff(watcher::DefaultBackoff);

impl PatientBackoff {
    fn new() -> PatientBackoff {
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
fn node_fingerprint(node: &Node) -> u64 {
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
fn claim_fingerprint(claim: &PersistentVolumeClaim) -> u64 {
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
fn volume_fingerprint(volume: &PersistentVolume) -> u64 {
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

fn run_reflector<K>(
    api: Api<K>,
    strip: fn(&mut K),
    missing_hint: &'static str,
    changes: Changes,
    fingerprint: Option<fn(&K) -> u64>,
) -> Store<K>
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
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .backoff(PatientBackoff::new())
            .modify(strip),
    );
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
                    seen.remove(&object_key(obj.meta()));
                    bump(&changes);
                    None
                }
                Ok(watcher::Event::InitDone) => {
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
    store
}

impl KubeApi {
    /// Starts the watches and waits until nodes and pods are listed.
    pub async fn start(
        client: Client,
        reporting_instance: String,
        gpu_resource: &str,
    ) -> Result<KubeApi, ApiError> {
        let changes: Changes = Arc::new(tokio::sync::watch::channel(0).0);
        let nodes = run_reflector(
            Api::<Node>::all(client.clone()),
            strip_node,
            "nodes cannot be listed (RBAC?)",
            changes.clone(),
            Some(node_fingerprint),
        );
        let (pods, mut pods_listed) = run_pod_cache(
            Api::<Pod>::all(client.clone()),
            gpu_resource,
            changes.clone(),
        );
        // The CRD may be absent; gangs then stay unresolved until it is installed.
        let groups = run_reflector(
            Api::<PodGroup>::all(client.clone()),
            |g| g.metadata.managed_fields = None,
            "gangs disabled until the PodGroup CRD is installed: `gpuplace crd | kubectl apply -f -`",
            changes.clone(),
            None,
        );
        let claims = run_reflector(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            crate::volumes::strip_claim,
            "persistentvolumeclaims cannot be listed (RBAC?)",
            changes.clone(),
            Some(claim_fingerprint),
        );
        let volumes = run_reflector(
            Api::<PersistentVolume>::all(client.clone()),
            crate::volumes::strip_volume,
            "persistentvolumes cannot be listed (RBAC?)",
            changes.clone(),
            Some(volume_fingerprint),
        );
        nodes
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("node watch: {e}")))?;
        // Without them, a pod's claims would look missing.
        claims
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("claim watch: {e}")))?;
        volumes
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("volume watch: {e}")))?;
        pods_listed
            .wait_for(|listed| *listed)
            .await
            .map_err(|e| ApiError::Other(format!("pod watch: {e}")))?;
        let reporter = Reporter {
            controller: "gpuplace.io/scheduler".into(),
            instance: Some(reporting_instance),
        };
        Ok(KubeApi {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            nodes,
            pods,
            groups,
            claims,
            volumes,
            changes,
            limit: None,
        })
    }

    /// Limits the scheduler's writes and reads to `qps` a second after a burst of `burst`
    /// (no limit when `qps` is 0).
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> KubeApi {
        self.limit = crate::rate::TokenBucket::new(qps, burst).map(Arc::new);
        self
    }

    async fn throttle(&self) {
        if let Some(limit) = &self.limit {
            limit.acquire().await;
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl ClusterApi for KubeApi {
    async fn view(&self) -> Result<ClusterView, ApiError> {
        // The generation is read first: a change landing while the view is copied makes
        // the next generation differ, so it is never missed.
        let generation = *self.changes.borrow();
        Ok(ClusterView {
            nodes: self.nodes.state(),
            pods: self.pods.lock().unwrap_or_else(|p| p.into_inner()).view(),
            groups: self.groups.state(),
            claims: self.claims.state(),
            volumes: self.volumes.state(),
            generation,
        })
    }

    fn generation(&self) -> u64 {
        *self.changes.borrow()
    }

    async fn changed(&self, since: u64) {
        let mut rx = self.changes.subscribe();
        let _ = rx.wait_for(|g| *g > since).await;
    }

    async fn bind(&self, request: &BindRequest) -> Result<(), ApiError> {
        self.throttle().await;
        let pod = &request.pod;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                resource_version: Some(request.resource_version.clone())
                    .filter(|rv| !rv.is_empty()),
                annotations: Some(request.annotations.clone()).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(request.node.clone()),
                ..Default::default()
            },
        };
        api.create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }

    async fn get_pod(&self, pod: &PodKey) -> Result<Option<PodState>, ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let found = api.get_opt(&pod.name).await.map_err(api_error)?;
        Ok(found.as_ref().map(PodState::of))
    }

    async fn event(&self, event: EventRecord) -> Result<(), ApiError> {
        self.throttle().await;
        // kube-rs's recorder names the Event `<pod>.<hex time>` (a valid name, where a
        // `generateName` of `<pod>.` is refused by the API server) and folds repeats into
        // an Event series, as kube's own recorders do.
        let action = if event.reason == "Scheduled" {
            "Binding"
        } else {
            "Scheduling"
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(event.pod.name.clone()),
            namespace: Some(event.pod.namespace.clone()),
            uid: Some(event.pod.uid.clone()),
            ..Default::default()
        };
        let record = Event {
            type_: if event.kind == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason,
            note: Some(truncate_bytes(&event.message, MAX_NOTE_BYTES).to_string()),
            action: action.into(),
            secondary: None,
        };
        self.recorder
            .publish(&record, &reference)
            .await
            .map_err(api_error)
    }

    async fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: PodGroupStatus,
    ) -> Result<(), ApiError> {
        self.throttle().await;
        let api = Api::<PodGroup>::namespaced(self.client.clone(), namespace);
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }
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
