//! gpuplace's node agent: the kubelet device plugin (API v1beta1) or a DRA driver, by role:
//!
//! - [`backend`] finds GPUs (NVML or an inventory file) and keeps their health;
//! - [`devices`] turns an inventory into advertised device IDs (time-slicing replicas,
//!   shares) and back;
//! - [`kubelet`]: registration with the kubelet, the gRPC service it calls, PodResources;
//! - [`plan`]: the handshake that makes the kubelet honour the scheduler's exact devices
//!   (found by pod identity) and writes the node's truth back;
//! - [`publish`] writes the node's GPUs and links on its Node object for the scheduler;
//! - [`dra`]: the same node agent as a DRA driver (ResourceSlices, the DRA kubelet plugin).

pub mod app;
pub mod backend;
pub mod config;
pub mod devices;
pub mod dra;
pub mod kubelet;
pub mod metrics;
pub mod plan;
pub mod publish;

pub use config::{Config, Settings};
