//! Why a replay stopped early.

use std::time::Duration;

use crate::api::ApiError;
use crate::objects::ObjectError;

/// Why a replay stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{doing}: {source}")]
    Api {
        doing: String,
        #[source]
        source: ApiError,
    },
    #[error("interrupted")]
    Interrupted,
    #[error("the pod watch failed for {0:?} without a break: {1}")]
    Watch(Duration, ApiError),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("--speed must be above 0 and at most 100000, got {0}")]
    Speed(f64),
}
