//! Kubernetes adapters and the reading of its objects: the kube-rs client and its watches
//! ([`kube_api`]), the watch-fed pod store ([`pod_store`]), a pod read once into what the
//! stages need ([`pod_info`]: its [`demand`], GPU requirements ([`need`]) and terms about
//! other pods ([`pod_terms`])), PodGroups ([`gang`]), disruption budgets ([`budgets`]),
//! leader election ([`leader`]), the client's rate limit ([`rate`]) and the one read
//! behind `gpuplace status` ([`status_read`]).

pub mod budgets;
pub mod claims;
pub mod demand;
pub mod demand_error;
pub mod dra;
pub mod gang;
pub mod job;
pub mod kube_api;
pub mod leader;
pub mod need;
pub mod pod_info;
pub mod pod_store;
pub mod pod_terms;
pub mod queue;
pub mod rate;
pub mod selector;
pub mod status_read;
pub mod workload;
