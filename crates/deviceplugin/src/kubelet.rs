//! Everything the kubelet talks to: [`registration`] serves on the plugin socket and
//! registers (again after every kubelet restart), [`service`] answers the device plugin
//! API's gRPC calls, [`podresources`] reads the kubelet's PodResources API.

pub mod podresources;
pub mod registration;
pub mod service;
