//! The labels that mark what replays make.

/// The label every object a replay makes carries, and its value.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "gpuplace-replay";
/// The label selector of what replays made.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=gpuplace-replay";
/// The label that names one replay's run: its clean-up deletes exactly what carries it, so
/// a name that someone else (or an earlier replay) already had is never deleted.
pub const RUN_LABEL: &str = "gpuplace.io/replay-run";
/// The pod label of a replay pod's planned name (a controller's new pod keeps it).
pub const PLANNED_LABEL: &str = "gpuplace.io/replay-pod";

/// The label selector of what run `run` made.
pub fn run_selector(run: &str) -> String {
    format!("{RUN_LABEL}={run}")
}
