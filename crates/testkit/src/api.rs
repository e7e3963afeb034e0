//! An in-memory Kubernetes API for the scheduler's tests, as strict and as slow as the
//! real one where the scheduler can tell:
//!
//! - the rules: every write bumps a cluster-wide resourceVersion; a Binding whose
//!   resourceVersion precondition is stale, or for a pod already bound, is a 409; a deleted
//!   pod is a 404; the Binding's annotations are merged into the pod in the same write, and
//!   are validated as kube-apiserver validates them (qualified-name keys, 256 KiB in all);
//!   like kube-apiserver (measured), the Binding's UID is not checked;
//! - the costs ([`ServerCosts`]): a latency per request, a limit of requests in flight,
//!   watch events delivered late (in order, each after a random delay), and injected
//!   409s, 500s and time-outs (a time-out may or may not have applied the write).
//!
//! Its view goes through the scheduler's own [`PodStore`] fed the way a watch feeds it: a
//! full list first, then the pods changed since the resourceVersion it last saw (each at its
//! latest version, deletions by key), and a fresh list when that resourceVersion has been
//! compacted away (the API server's 410 Gone).

mod cluster_api;
mod costs;
mod extended_claims;
mod jobs;
mod listing;
mod objects;
mod queues;
mod rbac;
mod resource_claims;
mod watches;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use costs::{Counts, Fault, InFlight};
pub use costs::{Faults, MAX_ANNOTATIONS_BYTES, ServerCosts, is_qualified_name};
use gpuplace_scheduler::k8s::gang::PodGroup;
use gpuplace_scheduler::k8s::pod_store::PodStore;
use gpuplace_scheduler::{ApiError, EventRecord, PodKey};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;

pub(super) struct Store {
    version: u64,
    nodes: listing::Listing<String, Node>,
    pods: BTreeMap<(String, String), Arc<Pod>>,
    groups: listing::Listing<(String, String), PodGroup>,
    claims: listing::Listing<(String, String), PersistentVolumeClaim>,
    volumes: listing::Listing<String, PersistentVolume>,
    budgets: listing::Listing<(String, String), PodDisruptionBudget>,
    queues: listing::Listing<String, gpuplace_scheduler::k8s::queue::Queue>,
    namespaces: listing::Listing<String, k8s_openapi::api::core::v1::Namespace>,
    /// Events about queues: (queue, type, reason, note).
    queue_events: Vec<(String, String, String, String)>,
    events: Vec<EventRecord>,
    bindings: Vec<(PodKey, String)>,
    /// Faults to inject: the next N binds fail with a conflict.
    fail_binds: usize,
    /// The next N evictions fail with a 500 (nothing written).
    fail_evictions: usize,
    /// Pods whose deletion the server refuses, dry runs too (an admission webhook that
    /// protects them, or rights the scheduler lacks).
    refuse_deletes: std::collections::HashSet<(String, String)>,
    /// Preemption deletes sent as dry runs and accepted.
    dry_run_deletes: usize,
    /// Pods whose move evictions (dry runs too) are refused, as by a budget the scheduler's
    /// view does not show: each pod with this chance, by the hash of (seed, its UID).
    refuse_moves: Option<(u64, f64)>,
    /// Move evictions (not dry runs) refused by their number, counted from 0: a budget that
    /// tightened between the plan's dry run and the eviction.
    refuse_moves_at: Vec<u64>,
    /// The move eviction (not a dry run) of this number never answers.
    stall_move_at: Option<u64>,
    /// Whether the stalled move eviction has been sent.
    stall_reached: bool,
    /// Move evictions carried out or refused (not dry runs).
    move_evictions: u64,
    /// PodGroup status writes accepted.
    status_writes: usize,
    in_flight: usize,
    peak_in_flight: usize,
    requests: usize,
    /// The scheduler's side: pods as its watch cache holds them.
    cache: PodStore,
    /// Pods changed at each resourceVersion (the watch history), oldest first, with the
    /// time the watch delivers each.
    pod_log: std::collections::VecDeque<(u64, (String, String), Instant)>,
    /// Delivery time of the latest change (later ones are never delivered before it).
    last_delivery: Option<Instant>,
    /// Watch events delivered to the cache, node and group changes: the view's generation.
    generation: u64,
    /// Each undelivered change's pod as it was written (`None`: deleted), so a late watch
    /// event shows that version, not a later one.
    history: std::collections::HashMap<u64, Option<Arc<Pod>>>,
    costs: ServerCosts,
    rng: ChaCha8Rng,
    /// History at or below this resourceVersion is compacted: a watch from there is Gone.
    compacted: u64,
    /// The resourceVersion the cache has caught up to (0: never listed).
    cache_rv: u64,
    relists: usize,
    /// Every pod change ever (resourceVersion, key), for node-side watches.
    changes: ChangeLog,
    /// The same per node (the node a pod is bound to, or was when deleted).
    node_changes: HashMap<String, ChangeLog>,
    /// The node each bound pod is on, to tell its node of its deletion.
    pod_node: HashMap<(String, String), String>,
    /// Per node, the resourceVersion of its pods' last change, for watchers to wait on.
    node_watchers: HashMap<String, tokio::sync::watch::Sender<u64>>,
    /// DRA ResourceClaims (`api/resource_claims.rs`).
    resource_claims: BTreeMap<(String, String), k8s_openapi::api::resource::v1::ResourceClaim>,
    /// DRA DeviceClasses (`api/extended_claims.rs`).
    device_classes: Vec<k8s_openapi::api::resource::v1::DeviceClass>,
    /// The resource claim controller held back: the UIDs of deleted pods whose claims it
    /// has not released yet (`None`: it releases them as the pod goes).
    claim_releases: Option<Vec<String>>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            version: 0,
            nodes: Default::default(),
            pods: BTreeMap::new(),
            groups: Default::default(),
            claims: Default::default(),
            volumes: Default::default(),
            budgets: Default::default(),
            queues: Default::default(),
            namespaces: Default::default(),
            queue_events: Vec::new(),
            events: Vec::new(),
            bindings: Vec::new(),
            fail_binds: 0,
            fail_evictions: 0,
            refuse_deletes: Default::default(),
            dry_run_deletes: 0,
            refuse_moves: None,
            refuse_moves_at: Vec::new(),
            stall_move_at: None,
            stall_reached: false,
            move_evictions: 0,
            status_writes: 0,
            in_flight: 0,
            peak_in_flight: 0,
            requests: 0,
            cache: PodStore::new("nvidia.com/gpu"),
            pod_log: std::collections::VecDeque::new(),
            last_delivery: None,
            history: std::collections::HashMap::new(),
            generation: 0,
            costs: ServerCosts::default(),
            rng: ChaCha8Rng::seed_from_u64(0),
            compacted: 0,
            cache_rv: 0,
            relists: 0,
            changes: Vec::new(),
            node_changes: HashMap::new(),
            pod_node: HashMap::new(),
            node_watchers: HashMap::new(),
            resource_claims: BTreeMap::new(),
            device_classes: Vec::new(),
            claim_releases: None,
        }
    }
}

impl Store {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Bumps the resourceVersion for a change of pod `key` and records it in the history.
    fn bump_pod(&mut self, key: &(String, String)) -> String {
        let rv = self.bump();
        let (low, high) = self.costs.watch_delay;
        let delay = if high > low {
            low + Duration::from_nanos(self.rng.random_range(0..(high - low).as_nanos() as u64))
        } else {
            low
        };
        let at = (Instant::now() + delay).max(self.last_delivery.unwrap_or_else(Instant::now));
        self.last_delivery = Some(at);
        self.pod_log.push_back((self.version, key.clone(), at));
        self.changes.push((self.version, key.clone()));
        rv
    }

    /// Applies `change` to the stored pod `key` as one write: a new resourceVersion, recorded
    /// in the history and on the pod (copy on write: views keep the version they saw).
    fn write_pod(&mut self, key: &(String, String), change: impl FnOnce(&mut Pod)) {
        let rv = self.bump_pod(key);
        if let Some(pod) = self.pods.get_mut(key).map(Arc::make_mut) {
            change(pod);
            pod.metadata.resource_version = Some(rv);
        }
        self.remember(key);
    }

    /// Keeps pod `key` as it is now as the version of the latest change, and tells the
    /// watchers of its node (the node it is bound to, or was before it was deleted).
    fn remember(&mut self, key: &(String, String)) {
        let pod = self.pods.get(key).cloned();
        let node = pod
            .as_ref()
            .and_then(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()));
        let node = match node {
            Some(node) => {
                self.pod_node.insert(key.clone(), node.clone());
                Some(node)
            }
            None => self.pod_node.remove(key),
        };
        if let Some(node) = node {
            let version = self.version;
            self.node_changes
                .entry(node.clone())
                .or_default()
                .push((version, key.clone()));
            if let Some(tx) = self.node_watchers.get(&node) {
                tx.send_replace(version);
            }
        }
        self.history.insert(self.version, pod);
    }

    /// Brings the pod cache up to date: a watch from its resourceVersion, or a relist when
    /// that part of the history is gone. History the cache has seen is then compacted.
    /// Watch events are delivered once their time has come, in order; a delivered event
    /// carries the pod's state at that point of the history, as a watch does.
    fn sync_cache(&mut self) {
        let now = Instant::now();
        if self.cache_rv == 0 || self.cache_rv < self.compacted {
            self.cache.begin_relist();
            for pod in self.pods.values() {
                self.cache.relisted(pod);
            }
            self.cache.relist_done();
            self.relists += 1;
            self.generation += 1;
            self.cache_rv = self.version;
            self.history.clear();
        } else {
            while let Some((rv, key, at)) = self.pod_log.front().cloned() {
                if at > now {
                    break;
                }
                self.pod_log.pop_front();
                if rv <= self.cache_rv {
                    continue;
                }
                match self.history.remove(&rv) {
                    Some(Some(pod)) => self.cache.apply(&pod),
                    Some(None) | None => self.cache.delete_key(&key.0, &key.1),
                }
                self.cache_rv = rv;
                self.generation += 1;
            }
        }
        while self
            .pod_log
            .front()
            .is_some_and(|(rv, _, _)| *rv <= self.cache_rv)
        {
            self.pod_log.pop_front();
        }
        if self.pod_log.is_empty() {
            self.cache_rv = self.cache_rv.max(self.version);
        }
        self.history.retain(|rv, _| *rv > self.cache_rv);
        self.compacted = self.compacted.max(self.cache_rv);
    }

    /// When the next undelivered watch event arrives.
    fn next_delivery(&self) -> Option<Instant> {
        self.pod_log.front().map(|(_, _, at)| *at)
    }

    /// Draws the fault for one request.
    fn fault(&mut self) -> Option<Fault> {
        let f = self.costs.faults;
        if f.conflict + f.error + f.timeout <= 0.0 {
            return None;
        }
        let x: f64 = self.rng.random();
        if x < f.conflict {
            Some(Fault::Conflict)
        } else if x < f.conflict + f.error {
            Some(Fault::Error)
        } else if x < f.conflict + f.error + f.timeout {
            Some(if self.rng.random::<bool>() {
                Fault::TimeoutApplied
            } else {
                Fault::TimeoutLost
            })
        } else {
            None
        }
    }
}

/// The API server, shared by clones.
#[derive(Clone)]
pub struct MemoryApi {
    /// Requests served at once, when limited.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    store: Arc<Mutex<Store>>,
    /// The resourceVersion of the last pod change, for watchers to wait on.
    pod_version: tokio::sync::watch::Sender<u64>,
    /// Likewise for Nodes.
    node_version: tokio::sync::watch::Sender<u64>,
    /// Tokens and RBAC objects, for TokenReview and SubjectAccessReview.
    rbac: Arc<Mutex<Rbac>>,
    jobs: Arc<MemoryJobs>,
}

/// The Jobs by (namespace, name) (`api/jobs.rs`).
#[derive(Default)]
struct MemoryJobs(Mutex<HashMap<(String, String), Arc<k8s_openapi::api::batch::v1::Job>>>);

impl Default for MemoryApi {
    fn default() -> Self {
        MemoryApi {
            slots: None,
            store: Arc::default(),
            pod_version: tokio::sync::watch::channel(0).0,
            node_version: tokio::sync::watch::channel(0).0,
            rbac: Arc::default(),
            jobs: Arc::default(),
        }
    }
}

/// A pod change as a watch on some pods delivers it: the pod at its latest version, or
/// `None` once it is deleted.
pub type PodChange = ((String, String), Option<Arc<Pod>>);

/// Pod changes in order: (resourceVersion, namespace and name).
type ChangeLog = Vec<(u64, (String, String))>;

/// Tokens and RBAC objects (`api/rbac.rs` answers the reviews from them).
#[derive(Default)]
struct Rbac {
    tokens: HashMap<String, gpuplace_scheduler::access::User>,
    cluster_roles: Vec<k8s_openapi::api::rbac::v1::ClusterRole>,
    cluster_bindings: Vec<k8s_openapi::api::rbac::v1::ClusterRoleBinding>,
    roles: Vec<k8s_openapi::api::rbac::v1::Role>,
    bindings: Vec<k8s_openapi::api::rbac::v1::RoleBinding>,
    reviews: usize,
}

impl Counts for Store {
    fn enter(&mut self) {
        self.in_flight += 1;
        self.requests += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
    }

    fn leave(&mut self) {
        self.in_flight -= 1;
    }
}

pub(super) fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// An API whose pod cache counts `gpu_resource` as the GPU resource.
    pub fn with_gpu_resource(gpu_resource: &str) -> Self {
        let api = Self::default();
        lock(&api.store).cache = PodStore::new(gpu_resource);
        api
    }

    /// Charges the scheduler's requests `costs` from now on.
    pub fn with_costs(mut self, costs: ServerCosts) -> Self {
        self.slots = (costs.max_in_flight > 0)
            .then(|| Arc::new(tokio::sync::Semaphore::new(costs.max_in_flight)));
        let mut s = lock(&self.store);
        s.costs = costs;
        s.rng = ChaCha8Rng::seed_from_u64(costs.seed);
        drop(s);
        self
    }

    /// Changes the injected faults (e.g. none after a chaotic phase).
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.store).costs.faults = faults;
    }

    /// Waits for a request slot and the latency; then draws the request's fault.
    async fn charge(&self) -> (InFlight<Store>, Option<Fault>) {
        let permit = match &self.slots {
            Some(slots) => Arc::clone(slots).acquire_owned().await.ok(),
            None => None,
        };
        let in_flight = InFlight::enter(&self.store, permit);
        let latency = lock(&self.store).costs.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let fault = lock(&self.store).fault();
        (in_flight, fault)
    }

    /// The most requests of the scheduler's served at once so far.
    pub fn peak_in_flight(&self) -> usize {
        lock(&self.store).peak_in_flight
    }

    /// Requests of the scheduler's served so far (Bindings, reads, Events, statuses).
    pub fn requests(&self) -> usize {
        lock(&self.store).requests
    }

    /// A new client starts: its first view is a fresh list, not the lagging watch.
    pub fn relist(&self) {
        self.compact_history();
    }

    /// Creates or replaces a pod; a missing UID, namespace or timestamp is filled in.
    pub fn put_pod(&self, mut pod: Pod) {
        let mut s = lock(&self.store);
        let key = (
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let rv = s.bump_pod(&key);
        pod.metadata.resource_version = Some(rv.clone());
        let ns = pod
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = pod.metadata.name.clone().unwrap_or_default();
        pod.metadata
            .uid
            .get_or_insert_with(|| format!("uid-{ns}-{name}-{rv}"));
        // As the API server does on create: the time to the second.
        pod.metadata.creation_timestamp.get_or_insert_with(|| {
            let now = crate::clock::server_time();
            let second = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(second)
        });
        s.pods.insert((ns.clone(), name.clone()), Arc::new(pod));
        s.remember(&(ns, name));
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        if let Some(pod) = s.pods.remove(&key) {
            s.bump_pod(&key);
            s.remember(&key);
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            match s.claim_releases.as_mut() {
                Some(later) => later.push(uid),
                None => s.release_claims_of(&uid),
            }
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// A graceful delete: the pod gets a deletionTimestamp and stays until its kubelet has
    /// stopped it and deletes it for good ([`delete_pod`](Self::delete_pod)). As the real
    /// server does, the deletionTimestamp is when its grace period ends (now plus its
    /// `terminationGracePeriodSeconds`, 30 where unset), and `deletionGracePeriodSeconds`
    /// says the period.
    pub fn delete_pod_gracefully(&self, namespace: &str, name: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        let bound = s
            .pods
            .get(&key)
            .is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
        if !bound {
            drop(s);
            self.delete_pod(namespace, name);
            return;
        }
        s.write_pod(&key, |p| {
            let grace = (p.spec.as_ref())
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
                .max(0);
            let now = crate::clock::server_time();
            let by = (now.checked_add(std::time::Duration::from_secs(grace as u64))).unwrap_or(now);
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(by));
            p.metadata.deletion_grace_period_seconds = Some(grace);
        });
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// Sets one annotation on a pod whose UID is `uid` (a merge patch guarded by the UID).
    pub fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let pod_key = (namespace.to_string(), name.to_string());
        let current = s
            .pods
            .get(&pod_key)
            .ok_or_else(|| ApiError::NotFound(format!("{namespace}/{name}")))?;
        if current.metadata.uid.as_deref() != Some(uid) {
            return Err(ApiError::Conflict(format!(
                "{namespace}/{name}: uid precondition failed"
            )));
        }
        s.write_pod(&pod_key, |p| {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.to_string(), value.to_string());
        });
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    /// Sets a pod's phase (what the kubelet reports), e.g. `Failed` after a refused admission.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        if s.pods.contains_key(&key) {
            s.write_pod(&key, |p| {
                p.status.get_or_insert_with(Default::default).phase = Some(phase.to_string());
            });
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// What a kubelet writes once it runs a pod: phase Running and `status.startTime`.
    pub fn set_running(&self, namespace: &str, name: &str, started: k8s_openapi::jiff::Timestamp) {
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        if s.pods.contains_key(&key) {
            s.write_pod(&key, |p| {
                let status = p.status.get_or_insert_with(Default::default);
                status.phase = Some("Running".to_string());
                status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    started,
                ));
            });
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// Records an Event (the node agent's Warnings land here too).
    pub fn record_event(&self, event: EventRecord) {
        let mut s = lock(&self.store);
        s.bump();
        s.events.push(event);
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        lock(&self.store)
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| (**p).clone())
    }

    /// Every stored pod, shared with the store (the stresses call this every step; a deep
    /// copy of 10,000 pods each time was most of their run time).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        lock(&self.store).pods.values().cloned().collect()
    }

    pub fn group(&self, namespace: &str, name: &str) -> Option<PodGroup> {
        lock(&self.store)
            .groups
            .get(&(namespace.to_string(), name.to_string()))
            .map(|g| (**g).clone())
    }

    pub fn events(&self) -> Vec<EventRecord> {
        lock(&self.store).events.clone()
    }

    /// The events from position `from` on, and how many there are in all.
    pub fn events_since(&self, from: usize) -> (Vec<EventRecord>, usize) {
        let store = lock(&self.store);
        let all = &store.events;
        (
            all.get(from..)
                .map(<[EventRecord]>::to_vec)
                .unwrap_or_default(),
            all.len(),
        )
    }

    pub fn bindings(&self) -> Vec<(PodKey, String)> {
        lock(&self.store).bindings.clone()
    }

    /// How many Bindings were written (without copying them, for a loop that polls).
    pub fn binding_count(&self) -> usize {
        lock(&self.store).bindings.len()
    }

    /// Compacts the watch history up to now, as etcd does: the cache's next view must
    /// relist (unless it has already seen everything).
    pub fn compact_history(&self) {
        let mut s = lock(&self.store);
        s.compacted = s.version;
        s.pod_log.clear();
    }

    /// PodGroup status writes accepted so far.
    pub fn status_writes(&self) -> usize {
        lock(&self.store).status_writes
    }

    /// How many full lists the pod cache has needed.
    pub fn relists(&self) -> usize {
        lock(&self.store).relists
    }

    /// Makes the next `n` Bindings find their pod changed by another writer (a label added
    /// just before): a 409 that a fresh read explains, and that the decision, made on the
    /// pod as it was, must not simply be sent again.
    pub fn fail_next_binds(&self, n: usize) {
        lock(&self.store).fail_binds = n;
    }

    /// Makes the next `n` evictions fail with a 500 (the victim stays as it was).
    pub fn fail_next_evictions(&self, n: usize) {
        lock(&self.store).fail_evictions = n;
    }

    /// Refuses every deletion of pod `namespace/name`, dry runs too, as an admission
    /// webhook protecting it would.
    pub fn refuse_deletes_of(&self, namespace: &str, name: &str) {
        lock(&self.store)
            .refuse_deletes
            .insert((namespace.to_string(), name.to_string()));
    }

    /// Preemption deletes sent as dry runs and accepted so far.
    pub fn dry_run_deletes(&self) -> usize {
        lock(&self.store).dry_run_deletes
    }

    /// Refuses the move evictions (dry runs too) of a share `p` of pods, picked by the
    /// hash of (seed, UID), as a budget the scheduler does not see would.
    pub fn refuse_move_evictions(&self, seed: u64, p: f64) {
        lock(&self.store).refuse_moves = Some((seed, p));
    }

    /// Refuses the move evictions (not dry runs) numbered `at` from now (0 = the next):
    /// a budget that tightens between a plan's dry run and its evictions.
    pub fn refuse_move_evictions_at(&self, at: &[u64]) {
        let mut s = lock(&self.store);
        let base = s.move_evictions;
        s.refuse_moves_at = at.iter().map(|n| base + n).collect();
    }

    /// The move eviction (not a dry run) numbered `at` from now (0 = the next) never
    /// answers and changes nothing: the leader dies while sending it.
    pub fn stall_move_eviction_at(&self, at: u64) {
        let mut s = lock(&self.store);
        s.stall_move_at = Some(s.move_evictions + at);
        s.stall_reached = false;
    }

    /// Whether the eviction set by `stall_move_eviction_at` has been sent (and hangs).
    pub fn stall_reached(&self) -> bool {
        lock(&self.store).stall_reached
    }

    /// Whether every watch event has been delivered to the scheduler's cache.
    pub fn watch_caught_up(&self) -> bool {
        let mut s = lock(&self.store);
        s.sync_cache();
        s.pod_log.is_empty()
    }
}
