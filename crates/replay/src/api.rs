//! The replay's one boundary to the API server: create, force-delete and list what it made,
//! read the cluster's Nodes, and watch its pods.

use std::future::Future;

use futures::stream::BoxStream;
use gpuplace_scheduler::k8s::gang::PodGroup;
use gpuplace_scheduler::k8s::queue::Queue;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};

/// The kinds of object a replay makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Pod,
    Queue,
    PodGroup,
    /// A fake node's heartbeat (`kube-node-lease/<node>`).
    Lease,
    /// A fake node's GPUs as gpuplace's DRA driver publishes them (`--dra`).
    ResourceSlice,
    /// What the pods of one shape claim (`--dra`): one template per GPU request.
    ClaimTemplate,
}

impl Kind {
    /// Every kind, in the order a clean-up deletes them (pods before what they use).
    pub const CLEAN_ORDER: [Kind; 7] = [
        Kind::Pod,
        Kind::ClaimTemplate,
        Kind::PodGroup,
        Kind::Queue,
        Kind::Lease,
        Kind::ResourceSlice,
        Kind::Node,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Queue => "Queue",
            Kind::PodGroup => "PodGroup",
            Kind::Lease => "Lease",
            Kind::ResourceSlice => "ResourceSlice",
            Kind::ClaimTemplate => "ResourceClaimTemplate",
        }
    }
}

/// One object to create.
#[derive(Clone, Debug)]
pub enum Object {
    /// A fake node: created, then its status (capacity, allocatable, Ready) written and the
    /// not-ready taint admission adds taken off, as a kubelet would.
    Node(Box<Node>),
    Pod(Box<Pod>),
    Queue(Box<Queue>),
    PodGroup(Box<PodGroup>),
    ResourceSlice(Box<ResourceSlice>),
    ClaimTemplate(Box<ResourceClaimTemplate>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Queue(_) => Kind::Queue,
            Object::PodGroup(_) => Kind::PodGroup,
            Object::ResourceSlice(_) => Kind::ResourceSlice,
            Object::ClaimTemplate(_) => Kind::ClaimTemplate,
        }
    }

    pub fn name(&self) -> &str {
        let meta = match self {
            Object::Node(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Queue(o) => &o.metadata,
            Object::PodGroup(o) => &o.metadata,
            Object::ResourceSlice(o) => &o.metadata,
            Object::ClaimTemplate(o) => &o.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }
}

/// What the server answered when it refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("the server refused it as invalid: {0}")]
    Invalid(String),
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The server could not be reached or did not answer in time (worth a retry).
    #[error("the API server is unavailable: {0}")]
    Unavailable(String),
    /// 429: the server is busy (API Priority and Fairness, max in flight) and says when to
    /// try again (its `Retry-After`, when given).
    #[error("the API server asked to slow down: {what}")]
    Throttled {
        what: String,
        retry_after: Option<std::time::Duration>,
    },
    #[error("{0}")]
    Other(String),
}

impl ApiError {
    /// Whether the same request may succeed a moment later.
    pub fn is_transient(&self) -> bool {
        matches!(self, ApiError::Unavailable(_) | ApiError::Throttled { .. })
    }

    /// How long the server asked to wait before the next try, if it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ApiError::Throttled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A replay pod as the watch shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodState {
    pub name: String,
    /// Its node, once bound.
    pub node: Option<String>,
    /// gpuplace's record of its exact GPUs (`gpuplace.io/assignment`), if any.
    pub assignment: Option<String>,
    /// It has a deletion time (evicted gracefully, or being deleted).
    pub terminating: bool,
}

/// What the watch of the replay's pods says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSeen {
    Changed(PodState),
    Gone(String),
    /// The watch started over: these are all the replay's pods there are now (any other
    /// it thought alive is gone).
    Listed(Vec<String>),
}

/// The API server, as the replay uses it. Every call is namespaced to the replay's
/// namespace where the kind is namespaced.
pub trait ReplayApi: Send + Sync {
    fn create(&self, object: &Object) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Deletes at once (grace period 0): `Ok(false)` when it was not there.
    fn delete(&self, kind: Kind, name: &str)
    -> impl Future<Output = Result<bool, ApiError>> + Send;
    /// Names of the objects of `kind` that `selector` (one `key=value`) selects.
    fn list_labelled(
        &self,
        kind: Kind,
        selector: &str,
    ) -> impl Future<Output = Result<Vec<String>, ApiError>> + Send;
    /// Renews fake node `node`'s heartbeat (its Lease in `kube-node-lease`, made on the
    /// first call), as a kubelet does every 10 s: without it a cluster's node lifecycle
    /// controller marks the node unreachable after 40 s and evicts its pods.
    /// The Lease carries run `run`'s labels.
    fn heartbeat(&self, run: &str, node: &str)
    -> impl Future<Output = Result<(), ApiError>> + Send;
    /// The cluster's Nodes.
    fn nodes(&self) -> impl Future<Output = Result<Vec<Node>, ApiError>> + Send;
    /// The replay's pods as they change (starting with a [`PodSeen::Listed`]).
    fn watch_pods(&self) -> BoxStream<'static, Result<PodSeen, ApiError>>;
}
