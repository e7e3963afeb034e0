//! The labels that mark what replays make.

/// The label every object a replay makes carries, and its value.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "gpuplace-replay";
/// The label selector of what replays made.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=gpuplace-replay";
