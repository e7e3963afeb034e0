//! Every key gpuplace reads or writes on Kubernetes objects: the scheduler-node contract
//! (the node's inventory, the scheduler's assignment, the node's record of what the kubelet
//! gave), the resources pods ask for, and the annotations and labels users and GPU Feature
//! Discovery set. One place, so that the scheduler, the device plugin, the extender and the
//! tools agree on every name.

/// Prefix of gpuplace's own annotations (the only ones the scheduler keeps of a Node).
pub const ANNOTATION_PREFIX: &str = "gpuplace.io/";

// --- Resources ---------------------------------------------------------------------------

/// The whole-GPU extended resource gpuplace serves by default (`--resource` may rename it).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The share resource: slices of one GPU in milli-GPU (1000 per GPU), counted by the kubelet.
pub const SHARE_RESOURCE: &str = "gpuplace.io/gpu-milli";

// --- The scheduler-node contract ---------------------------------------------------------

/// Node annotation: the node's GPUs, links and health (JSON [`crate::NodeInventory`]),
/// written by the device plugin.
pub const INVENTORY_ANNOTATION: &str = "gpuplace.io/inventory";
/// Pod annotation: the exact devices per container the scheduler chose (JSON
/// [`crate::Assignment`]), written in the same write as the Binding.
pub const ASSIGNMENT_ANNOTATION: &str = "gpuplace.io/assignment";
/// Pod annotation: the devices the kubelet really gave each container (JSON
/// [`crate::Allocated`]), written by the node when its record and the plan differ or once
/// the pod runs; the scheduler's accounting prefers it to the assignment.
pub const ALLOCATED_ANNOTATION: &str = "gpuplace.io/allocated";
/// Pod annotation the device plugin's `Allocate` answer carries: the device IDs a container
/// got (for tools; the kubelet copies it onto the container).
pub const DEVICE_IDS_ANNOTATION: &str = "gpuplace.io/device-ids";

// --- Pods: gangs and GPU requirements ----------------------------------------------------

/// Pod label naming the pod's gang (a PodGroup in the same namespace).
pub const POD_GROUP_LABEL: &str = "gpuplace.io/pod-group";
/// Members' annotation naming the gang's topology key when the PodGroup has none.
/// `"true"` on a pod (from its template) lets defragmentation move it (label or annotation).
pub const MOVABLE_KEY: &str = "gpuplace.io/movable";
pub const TOPOLOGY_KEY_ANNOTATION: &str = "gpuplace.io/topology-key";
/// Required topology of a container's GPUs: `nvlink`, `pcie-switch`, `numa` or `any`.
pub const TOPOLOGY_ANNOTATION: &str = "gpuplace.io/topology";
/// Preferred topology (same values).
pub const TOPOLOGY_PREFERENCE_ANNOTATION: &str = "gpuplace.io/topology-preference";
/// NVIDIA's topology hint, read as a preference.
pub const NVIDIA_TOPOLOGY_ANNOTATION: &str = "nvidia.com/gpu-topology";
/// Comma list of allowed GPU models.
pub const MODEL_ANNOTATION: &str = "gpuplace.io/gpu-model";
/// Comma list of refused GPU models.
pub const MODEL_EXCLUDE_ANNOTATION: &str = "gpuplace.io/gpu-model-exclude";
/// HAMi's allowed-models annotation, read as [`MODEL_ANNOTATION`].
pub const HAMI_USE_ANNOTATION: &str = "nvidia.com/use-gputype";
/// HAMi's refused-models annotation, read as [`MODEL_EXCLUDE_ANNOTATION`].
pub const HAMI_NOUSE_ANNOTATION: &str = "nvidia.com/nouse-gputype";
/// A quantity (`40Gi`) every GPU of the pod must have.
pub const MEMORY_MIN_ANNOTATION: &str = "gpuplace.io/gpu-memory-min";
/// The former way to ask for a share, refused with a message saying what to write instead.
pub const GPU_MILLI_ANNOTATION: &str = "gpuplace.io/gpu-milli";

/// Node label naming the DRA driver that serves the node's GPUs (set by gpuplace's node
/// agent in DRA mode): pods get them through ResourceClaims there, not the device plugin.
pub const DRA_DRIVER_LABEL: &str = "gpuplace.io/dra-driver";

// --- Node labels (GPU Feature Discovery's names) -----------------------------------------

/// The GPU model.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Memory per GPU in MiB.
pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// GPUs on the node.
pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// Time-slicing replicas per GPU the device plugin advertises.
pub const GPU_REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// Set by GFD itself: while it is there gpuplace leaves GFD's labels to GFD.
pub const GFD_TIMESTAMP_LABEL: &str = "nvidia.com/gfd.timestamp";

/// A DNS-1123 label (a request name, a namespace): 1-63 lower-case letters, digits and
/// '-', starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (most object names, a DRA driver's name): labels joined by dots,
/// at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod dns_tests {
    use super::*;

    #[test]
    fn dns_names_are_checked_as_the_api_server_does() {
        assert!(is_dns_label("container-0-gpus"));
        assert!(!is_dns_label("Container"));
        assert!(!is_dns_label("-a") && !is_dns_label("a-") && !is_dns_label(""));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("gpu.gpuplace.io"));
        assert!(!is_dns_subdomain("gpu..io") && !is_dns_subdomain(""));
    }
}
