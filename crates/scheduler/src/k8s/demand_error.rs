//! Why a pod's demand cannot be read: a malformed quantity, annotation or request. Shared by
//! the demand ([`crate::k8s::demand`]) and the GPU requirements ([`crate::k8s::need`]).

use gpuplace_model::{NeedOfContainerError, SHARE_RESOURCE};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A malformed quantity, annotation or request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DemandError {
    #[error("quantity {0:?} is not a valid Kubernetes quantity")]
    Quantity(String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("annotation {annotation}: {message}")]
    Annotation {
        annotation: &'static str,
        message: String,
    },
    #[error(
        "container {container:?} asks for both {resource} and {SHARE_RESOURCE}; a container asks for whole GPUs or a share of one"
    )]
    MixedShare { container: String, resource: String },
    #[error(
        "the pod asks for whole GPUs ({resource}) in one container and a share ({SHARE_RESOURCE}) in another; a pod asks for one or the other"
    )]
    MixedPod { resource: String },
    #[error(
        "the pod's {SHARE_RESOURCE} totals {0} (counted as Kubernetes counts requests); a share is of one GPU, at most 1000"
    )]
    ShareTooLarge(i128),
}

/// A quantity in thousandths of its unit (`500m` CPU is 500; `1Gi` memory is 1073741824000),
/// read as [`gpuplace_model::quantity_milli`] reads it (the device plugin reads the same way).
pub fn milli_value(q: &Quantity) -> Result<i128, DemandError> {
    gpuplace_model::quantity_milli(&q.0).map_err(DemandError::from)
}

impl From<NeedOfContainerError> for DemandError {
    fn from(e: NeedOfContainerError) -> Self {
        match e {
            NeedOfContainerError::Quantity(q) => DemandError::Quantity(q),
            NeedOfContainerError::Negative(q) => DemandError::Negative(q),
            NeedOfContainerError::MixedShare {
                container,
                resource,
            } => DemandError::MixedShare {
                container,
                resource,
            },
            NeedOfContainerError::ShareTooLarge(milli) => DemandError::ShareTooLarge(milli),
        }
    }
}
