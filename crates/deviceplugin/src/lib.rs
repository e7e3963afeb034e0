//! gpuplace's kubelet device plugin (API v1beta1).
//!
//! [`backend`] finds GPUs (NVML or an inventory file) and keeps their health; [`devices`]
//! turns an inventory into advertised device IDs (with time-slicing replicas) and back;
//! [`service`] answers the kubelet's gRPC calls; [`plugin`] serves on the plugin socket and
//! registers, again after every kubelet restart; [`publish`] writes the node's GPUs and
//! links on its Node object for the scheduler; [`node_pods`], [`handshake`],
//! [`podresources`] and [`node_agent`] make the kubelet honour the scheduler's exact devices
//! (found by pod identity) and write the node's truth back; [`kube_node`] is their
//! Kubernetes adapter.

pub mod backend;
pub mod config;
pub mod devices;
pub mod handshake;
pub mod kube_node;
pub mod metrics;
pub mod node_agent;
pub mod node_pods;
pub mod plugin;
pub mod podresources;
pub mod publish;
pub mod service;

pub use config::{Config, Settings};
