//! The one boundary between the scheduler and the Kubernetes API server.
//!
//! Production implements it with kube-rs (reflector stores for the view, PATCH with a
//! resourceVersion precondition, the Binding subresource, events.k8s.io Events); tests use
//! the in-memory API of `gpuplace-testkit`, which keeps the same resourceVersion and
//! conflict rules.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::pod_info::PodInfo;

/// Identity of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub fn of(pod: &Pod) -> PodKey {
        PodKey {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What an API call can answer besides success.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    /// 409: the object changed (stale resourceVersion) or the pod is already bound.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 404: the object is gone.
    #[error("not found: {0}")]
    NotFound(String),
    #[error("api server: {0}")]
    Other(String),
}

/// The objects the scheduler reads, shared with the caches they come from (a view costs
/// a pointer per object, not a copy). Pods are kept as [`PodInfo`], a few hundred bytes
/// each instead of a decoded Pod's ~6 KB.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub nodes: Vec<Arc<Node>>,
    pub pods: Vec<Arc<PodInfo>>,
    pub groups: Vec<Arc<crate::gang::PodGroup>>,
}

/// An Event about a pod, in kube-scheduler's reasons (`Scheduled`, `FailedScheduling`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    pub pod: PodKey,
    /// `Normal` or `Warning`.
    pub kind: String,
    pub reason: String,
    pub message: String,
}

/// Reads and writes the scheduler needs.
pub trait ClusterApi: Send + Sync {
    /// Current nodes, pods and pod groups (from watch-fed caches in production).
    fn view(&self) -> impl Future<Output = Result<ClusterView, ApiError>> + Send;

    /// Sets (or with `None` removes) the assignment annotation, only if the pod still has
    /// `resource_version`.
    fn patch_assignment(
        &self,
        pod: &PodKey,
        resource_version: &str,
        assignment: Option<&str>,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Creates the pod's Binding to `node`.
    fn bind(&self, pod: &PodKey, node: &str) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Records an Event.
    fn event(&self, event: EventRecord) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Writes a pod group's status.
    fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: crate::gang::PodGroupStatus,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}
