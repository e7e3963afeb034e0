//! The API server's answers as the scheduler's [`ApiError`]s.

use crate::api::ApiError;

/// `e` as an [`ApiError`]: 409 a conflict, 404 gone, 400 and 422 invalid, 429 blocked.
pub(crate) fn api_error(e: kube::Error) -> ApiError {
    match &e {
        kube::Error::Api(status) if status.code == 409 => {
            ApiError::Conflict(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 404 => {
            ApiError::NotFound(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 422 || status.code == 400 => {
            ApiError::Invalid(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 429 => ApiError::Blocked(status.message.clone()),
        _ => ApiError::Other(e.to_string()),
    }
}
