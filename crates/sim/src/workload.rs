//! A cluster and the pods to replay on it.

use gpuplace_model::NodeInventory;

use crate::trace::TracePod;

/// A cluster and the pods to replay on it.
#[derive(Clone, Debug)]
pub struct Workload {
    /// What the workload is (a file name, or `builtin`).
    pub name: String,
    pub nodes: Vec<NodeInventory>,
    pub pods: Vec<TracePod>,
}
