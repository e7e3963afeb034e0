//! What the in-memory API server charges and refuses: latency, a limit of requests at
//! once, injected faults, and kube-apiserver's validation of what the scheduler writes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuplace_scheduler::ApiError;

/// Faults injected into the scheduler's requests, as probabilities per request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// 409 Conflict (another writer won).
    pub conflict: f64,
    /// 500 Internal Server Error (nothing written).
    pub error: f64,
    /// A time-out: the write is applied or not (even odds), the caller cannot tell.
    pub timeout: f64,
}

/// What the server charges the scheduler's requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerCosts {
    /// Time each request takes.
    pub latency: Duration,
    /// Requests served at once (0: no limit).
    pub max_in_flight: usize,
    /// Each watch event arrives after a delay drawn from this range (events stay in
    /// order: one never overtakes an earlier one).
    pub watch_delay: (Duration, Duration),
    pub faults: Faults,
    pub seed: u64,
}
/// What counts the requests being served (the fake server's store).
pub(super) trait Counts: Send + 'static {
    /// A request came in.
    fn enter(&mut self);
    /// A request was answered.
    fn leave(&mut self);
}

/// One request being served; counted while it lives.
pub(super) struct InFlight<S: Counts> {
    store: Arc<Mutex<S>>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S: Counts> InFlight<S> {
    pub(super) fn enter(
        store: &Arc<Mutex<S>>,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Self {
        store.lock().unwrap_or_else(|p| p.into_inner()).enter();
        InFlight {
            store: Arc::clone(store),
            _permit: permit,
        }
    }
}

impl<S: Counts> Drop for InFlight<S> {
    fn drop(&mut self) {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).leave();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    Conflict,
    Error,
    TimeoutApplied,
    TimeoutLost,
}

/// A qualified name as kube-apiserver requires of annotation keys: an optional DNS
/// subdomain prefix and `/`, then 1-63 alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

/// kube-apiserver's limit on a pod's annotations, keys and values together.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

pub(super) fn validate_annotations(annotations: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if let Some(bad) = annotations.keys().find(|k| !is_qualified_name(k)) {
        return Err(ApiError::Invalid(format!(
            "metadata.annotations: Invalid value: {bad:?}: name part must consist of alphanumeric characters, '-', '_' or '.'"
        )));
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_ANNOTATIONS_BYTES {
        return Err(ApiError::Invalid(format!(
            "metadata.annotations: Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"
        )));
    }
    Ok(())
}
