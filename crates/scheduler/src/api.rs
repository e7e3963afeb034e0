//! The one boundary between the scheduler and the Kubernetes API server.
//!
//! Production implements it with kube-rs (reflector stores for the view, PATCH with a
//! resourceVersion precondition, the Binding subresource, events.k8s.io Events); tests use
//! the in-memory API of `gpuplace-testkit`, which keeps the same resourceVersion and
//! conflict rules.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::k8s::pod_info::PodInfo;
pub use crate::k8s::pod_info::PodKey;

/// What an API call can answer besides success.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum ApiError {
    /// 409: the object changed (stale resourceVersion) or the pod is already bound.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 404: the object is gone.
    #[error("not found: {0}")]
    NotFound(String),
    /// 422 and 400: the server refused the object as invalid; sending it again cannot help.
    #[error("invalid: {0}")]
    Invalid(String),
    /// 429 from the Eviction API: a PodDisruptionBudget allows no disruption now.
    #[error("blocked: {0}")]
    Blocked(String),
    /// Anything else (500, a time-out, a reset connection): the write may or may not have
    /// happened.
    #[error("api server: {0}")]
    Other(String),
}

/// One kind's objects as a cache lists them, shared: while the kind has not changed, the
/// cache hands out the same list again (a view costs a pointer per kind, and a reader sees
/// "unchanged" by comparing pointers).
pub type Listed<T> = Arc<Vec<Arc<T>>>;

/// The objects the scheduler reads, shared with the caches they come from (a view costs
/// a pointer per object, not a copy). Pods are kept as [`PodInfo`], a few hundred bytes
/// each instead of a decoded Pod's ~6 KB, sorted by namespace and name.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub nodes: Listed<Node>,
    pub pods: Listed<PodInfo>,
    pub groups: Listed<crate::k8s::gang::PodGroup>,
    /// PersistentVolumeClaims and PersistentVolumes (stripped to what volume checks read).
    pub claims: Listed<PersistentVolumeClaim>,
    pub volumes: Listed<PersistentVolume>,
    /// PodDisruptionBudgets (policy/v1), which preemption tries not to break.
    pub budgets: Listed<PodDisruptionBudget>,
    /// Queues (`queues.gpuplace.io`; none when the CRD is not installed).
    pub queues: Listed<crate::k8s::queue::Queue>,
    /// Namespaces (stripped to their name and the default-queue annotation).
    pub namespaces: Listed<Namespace>,
    /// The Jobs, looked up by name (their deadlines).
    pub jobs: crate::k8s::job::Jobs,
    /// Allocated DRA claims no pod holds, whose devices stay taken until deallocated.
    pub claim_holds: Arc<[crate::k8s::dra::store::ClaimHold]>,
    /// gpuplace's DeviceClass that serves the device plugin's GPU resource on nodes
    /// without the device plugin (its `extendedResourceName`; DRAExtendedResource), if one.
    pub gpu_class: Option<Arc<crate::k8s::dra::extended::GpuClass>>,
    /// Grows with every watch event the view reflects: equal generations, equal views.
    pub generation: u64,
}

impl ClusterView {
    /// The PodGroup `namespace/name`, if the view has it.
    pub fn group(&self, namespace: &str, name: &str) -> Option<&crate::k8s::gang::PodGroup> {
        self.groups.iter().map(|g| &**g).find(|g| {
            g.metadata.namespace.as_deref() == Some(namespace)
                && g.metadata.name.as_deref() == Some(name)
        })
    }

    /// The pod `namespace/name`, found by binary search (pods are sorted).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodInfo>> {
        self.pods
            .binary_search_by(|p| {
                (p.key.namespace.as_str(), p.key.name.as_str()).cmp(&(namespace, name))
            })
            .ok()
            .map(|i| &self.pods[i])
    }
}

/// Finds a pod by namespace and name: in a view, or in the pods a cache follows.
pub trait PodLookup {
    fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodInfo>>;
}

impl PodLookup for ClusterView {
    fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodInfo>> {
        ClusterView::pod(self, namespace, name)
    }
}

/// What changed among the pods since a reader's cursor (the pod store's change feed).
#[derive(Debug, Default)]
pub struct PodFeed {
    /// Where the reader stands once it has taken these changes.
    pub cursor: gpuplace_model::Cursor,
    /// The pods changed, each once (its value before and now), or `None` when the feed
    /// cannot say (a first read, a relist since, a reader further behind than the store
    /// remembers): then the view's pods are every pod.
    pub changes: Option<Vec<gpuplace_model::Change<PodInfo>>>,
}

/// A view taken with the pods' change feed, both at one moment of the pod store.
#[derive(Debug, Default)]
pub struct FedView {
    /// Nodes, groups, volumes and budgets; the pods only when asked for or when
    /// `feed.changes` is `None`.
    pub view: ClusterView,
    pub feed: PodFeed,
}

/// An Event about a pod, in kube-scheduler's reasons (`Scheduled`, `FailedScheduling`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    pub pod: PodKey,
    /// `Normal` or `Warning`.
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// When it happened (the scheduler's wall clock when it was queued): an Event sent
    /// late, behind Bindings, still says when.
    pub at: k8s_openapi::jiff::Timestamp,
}

/// One Binding: the pod (its UID and the resourceVersion the decision saw, both sent as
/// preconditions), the node, and the annotations the API server merges into the pod in
/// the same update that sets `spec.nodeName` (kube-apiserver's BindingREST), so the
/// assignment and the bind are one atomic write.
#[derive(Clone, Debug, PartialEq)]
pub struct BindRequest {
    pub pod: PodKey,
    pub resource_version: String,
    /// [`scheduling_inputs`](crate::k8s::pod_info::scheduling_inputs) of the pod as it was
    /// decided.
    pub inputs: u64,
    pub node: String,
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The pod's DRA claims to allocate or join, written before the Binding (and undone
    /// when it fails).
    pub claims: Vec<crate::k8s::dra::write::ClaimWrite>,
    /// For a pod asking the GPU resource placed on a node served through DRA: the claim
    /// made for it, allocated, and its status written before the Binding (the claim
    /// deleted when the Binding fails).
    pub extended: Option<Box<crate::k8s::dra::extended::ExtendedWrite>>,
}

/// A claim the server made ([`ClusterApi::create_claim`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimMade {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

/// What a fresh read of a pod says (to settle a write whose outcome is unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodState {
    pub uid: String,
    pub resource_version: String,
    /// [`scheduling_inputs`](crate::k8s::pod_info::scheduling_inputs) of this version.
    pub inputs: u64,
    pub node_name: Option<String>,
    /// The assignment annotation, to tell our Binding from another writer's.
    pub assignment: Option<String>,
}

impl PodState {
    /// What a read of `pod` says.
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> PodState {
        PodState {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
            inputs: crate::k8s::pod_info::scheduling_inputs(pod),
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            assignment: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::k8s::demand::ASSIGNMENT_ANNOTATION))
                .cloned(),
        }
    }
}

/// Reads and writes the scheduler needs. Clones share one connection and one cache.
pub trait ClusterApi: Clone + Send + Sync + 'static {
    /// Current nodes, pods and pod groups (from watch-fed caches in production).
    fn view(&self) -> impl Future<Output = Result<ClusterView, ApiError>> + Send;

    /// The view with the pods changed since `since` (`None`: never read) instead of every
    /// pod, unless `with_pods` (the loop reads every pod too; the feed still spares the
    /// state's update a walk over them). Readers that keep their own state follow the feed
    /// and do work in proportion to the changes.
    fn view_since(
        &self,
        since: Option<gpuplace_model::Cursor>,
        with_pods: bool,
    ) -> impl Future<Output = Result<FedView, ApiError>> + Send;

    /// The generation the next view would have (cheap: no view is taken).
    fn generation(&self) -> u64;

    /// Resolves once the view's generation is past `since` (a watch event arrived).
    fn changed(&self, since: u64) -> impl Future<Output = ()> + Send;

    /// Creates the pod's Binding (with the assignment annotation) in one write.
    fn bind(&self, request: &BindRequest) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Writes one claim for a pod about to be bound: the delete-protection finalizer when
    /// missing, then the allocation and `reservedFor`, each with the claim's
    /// resourceVersion as the precondition (a claim changed since the decision is a
    /// `Conflict`). Refused (`Conflict`) when a device it allocates is held by another
    /// claim the scheduler knows.
    fn write_claim(
        &self,
        write: &crate::k8s::dra::write::ClaimWrite,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Undoes a claim write whose Binding failed: the pod out of `reservedFor`, and the
    /// allocation cleared when the write made it and no user is left.
    fn undo_claim(
        &self,
        write: &crate::k8s::dra::write::ClaimWrite,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Creates `claim` (a name generated from its `generateName`) and says what the
    /// server made: its name, UID and resourceVersion.
    fn create_claim(
        &self,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> impl Future<Output = Result<ClaimMade, ApiError>> + Send;

    /// Deletes a claim the scheduler made (its UID the precondition): its delete
    /// protection taken off first, so it goes at once. A claim already gone is `Ok`.
    fn delete_claim(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// The claims made for the pod's extended resources that the scheduler's cache knows: once its Binding with one of them landed, the others are left from
    /// attempts whose Binding never came (a restart between the writes), to delete.
    fn extended_claims_of(&self, pod: &PodKey) -> Vec<std::sync::Arc<crate::k8s::dra::ClaimInfo>>;

    /// Sets (or with `None` clears) the pod's `status.extendedResourceClaimStatus` (its UID
    /// the precondition); the pod as written (the Binding then names its new version).
    fn extended_status(
        &self,
        pod: &PodKey,
        status: Option<&k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus>,
    ) -> impl Future<Output = Result<PodState, ApiError>> + Send;

    /// Reads the pod from the server (not the cache); `None` when it does not exist.
    fn get_pod(
        &self,
        pod: &PodKey,
    ) -> impl Future<Output = Result<Option<PodState>, ApiError>> + Send;

    /// Records an Event.
    fn event(&self, event: EventRecord) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Sets the pod's `PodScheduled` condition to `False`, reason `Unschedulable`, with
    /// `message`, as kube-scheduler writes it for a pod that fits nowhere.
    fn unschedulable(
        &self,
        pod: &PodKey,
        message: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Evicts a preemption victim: marks it with the `DisruptionTarget` condition (where
    /// the server supports it) and deletes it with its own grace period, the UID as a
    /// precondition (a pod recreated under the name is not touched). With `dry_run` the
    /// server checks the delete (`dryRun: [All]`: precondition, admission, rights) and
    /// changes nothing: a plan's evictions are checked whole before any is made.
    fn evict(
        &self,
        victim: &PodKey,
        message: &str,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Evicts a pod that defragmentation moves, through the Eviction API (policy/v1), so
    /// that the server checks its PodDisruptionBudgets (`Blocked` when one allows no
    /// disruption), with the UID as a precondition. With `dry_run` the server checks all of
    /// it (`dryRun: [All]`) and evicts nothing: a plan is checked whole before any move.
    fn evict_to_move(
        &self,
        pod: &PodKey,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Sets (or with `None` clears) the pod's `status.nominatedNodeName`.
    fn nominate(
        &self,
        pod: &PodKey,
        node: Option<&str>,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Writes a queue's status.
    fn queue_status(
        &self,
        name: &str,
        status: crate::k8s::queue::QueueStatus,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Records an Event about a queue (a cluster-scoped object: the Event goes to the
    /// `default` namespace, as kube does for Nodes).
    fn queue_event(
        &self,
        queue: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Writes a pod group's status.
    fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: crate::k8s::gang::PodGroupStatus,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}
