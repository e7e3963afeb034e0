//! Time-sliced GPUs (NVIDIA's `replicas`): what a request takes on such a node.

use std::borrow::Cow;

use gpuplace_model::{NodeInventory, Request};

/// [`ClusterState::effective`](crate::ClusterState::effective) for a node's inventory.
pub fn effective_on<'r>(node: &NodeInventory, request: &'r Request) -> Cow<'r, Request> {
    if node.replicas > 1
        && request.gpu_count == 1
        && request.gpu_milli == gpuplace_model::MILLI_PER_GPU
    {
        let mut replica = request.clone();
        replica.gpu_milli = gpuplace_model::MILLI_PER_GPU / node.replicas;
        Cow::Owned(replica)
    } else {
        Cow::Borrowed(request)
    }
}
