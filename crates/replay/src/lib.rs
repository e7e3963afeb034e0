//! `gpuplace replay`: a GPU trace replayed against a live cluster, in real time scaled by a
//! speed, with whatever scheduler the pods name (gpuplace, kube-scheduler with gpuplace as
//! its extender, the stock kube-scheduler), and reported as `gpuplace simulate --timeline`
//! reports, by the simulator's own measurement.
//!
//! - [`plan`]: what to create when (pure): the timeline's arrivals for one seed, each pod's
//!   name, run time, queue and gang;
//! - [`objects`]: the Kubernetes objects of a plan (fake Nodes, Pods, Queues, PodGroups),
//!   every one labelled [`MANAGED_BY`]; [`pod_base`] the cluster's own pod template
//!   (`--pod-template`) they are made from; [`claims`] the same GPUs through DRA
//!   (`--dra`): ResourceSlices for the fake nodes, a ResourceClaimTemplate per pod shape;
//! - [`api`]: the one boundary to the API server ([`ReplayApi`]), [`kube_api`] its kube-rs
//!   adapter (the in-memory one is the test kit's);
//! - [`driver`]: the clock: creates pods at their arrivals, deletes them when their run ends,
//!   plays the kubelet and the controller on fake nodes, and records each pod's life;
//! - [`clean`]: deletes what one replay made (its run label: after it ends, Ctrl-C or an
//!   error), or what any replay left (`--clean`).

pub mod api;
pub mod claimed;
pub mod claims;
pub mod clean;
pub mod driver;
mod error;
mod flights;
pub mod kube_api;
pub mod labels;
pub mod objects;
pub mod plan;
pub mod pod_base;
mod prepare;

pub use api::{ApiError, Kind, Object, PodSeen, PodState, ReplayApi};
pub use driver::{DriverConfig, Progress, ReplayError, ReplayOutcome};
pub use labels::{MANAGED_BY, MANAGED_BY_VALUE, MANAGED_SELECTOR, RUN_LABEL, run_selector};
pub use plan::{Plan, PlanError, PlannedPod};
