//! gpuplace's Kubernetes scheduler: the node and the exact GPUs for every pending pod,
//! recorded on the pod before it is bound, with failures explained in kube-scheduler's words.

pub mod api;
pub mod budgets;
pub mod cache;
pub mod clock;
pub mod demand;
pub mod demand_error;
pub mod extender;
pub mod filters;
pub mod framework;
pub mod gang;
pub mod interpod;
pub mod kube_api;
pub mod leader;
pub mod metrics;
pub mod need;
pub mod pod_info;
pub mod pod_terms;
pub mod preference;
pub mod rate;
pub mod scheduler;
pub mod snapshot;
pub mod volumes;

pub use api::{ApiError, ClusterApi, ClusterView, EventRecord, PodKey};
pub use pod_info::{PodInfo, SchedulingTerms};
pub use scheduler::{RoundReport, RoundTimings, Scheduler, SchedulerConfig};
