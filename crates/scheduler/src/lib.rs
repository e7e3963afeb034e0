//! gpuplace's Kubernetes scheduler: the node and the exact GPUs for every pending pod,
//! recorded on the pod before it is bound, with failures explained in kube-scheduler's words.
//!
//! - [`framework`]: the stages a pod goes through (filters, preferences, the profile that
//!   strings them for every driver) and where the others live;
//! - [`scheduler`]: the standalone scheduler's state, its rounds, gangs, preemption,
//!   reservations and Bindings, and the loop that drives it ([`scheduler::run`]);
//! - [`extender`]: the same state and profile behind kube-scheduler's extender verbs;
//! - [`k8s`]: Kubernetes adapters and the reading of pods, PodGroups and budgets;
//! - [`snapshot`]: the cluster as the stages see it; [`api`]: the one boundary trait;
//! - [`access`]: who may read the metrics and the map (TLS, TokenReview, SubjectAccessReview);
//! - [`status`]: the fleet at a glance (`gpuplace status`), [`ui`]: the live GPU map.

pub mod access;
pub mod api;
pub mod app;
pub mod clock;
pub mod defrag_plan;
pub mod extender;
pub mod framework;
pub mod k8s;
pub mod metrics;
pub mod scheduler;
pub mod shared;
pub mod snapshot;
pub mod status;
pub mod ui;

pub use api::{ApiError, ClusterApi, ClusterView, EventRecord, PodKey};
pub use k8s::pod_info::{PodInfo, SchedulingTerms};
pub use scheduler::{RoundReport, RoundTimings, Scheduler, SchedulerConfig};
