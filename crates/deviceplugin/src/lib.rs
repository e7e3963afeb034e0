//! gpuplace's kubelet device plugin (API v1beta1).
//!
//! [`backend`] finds GPUs (NVML or an inventory file) and keeps their health; [`devices`]
//! turns an inventory into advertised device IDs (with time-slicing replicas) and back;
//! [`service`] answers the kubelet's gRPC calls; [`plugin`] serves on the plugin socket and
//! registers, again after every kubelet restart; [`publish`] writes the node's GPUs and
//! links on its Node object for the scheduler.

pub mod backend;
pub mod config;
pub mod devices;
pub mod metrics;
pub mod plugin;
pub mod publish;
pub mod service;

pub use config::{Config, Settings};
