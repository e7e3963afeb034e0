//! The bind stage: writes run off the decision path, at most `max_in_flight` Bindings at
//! once, each one write (the Binding carries the assignment annotation). Events go through
//! their own sink ([`super::events`]) and never hold up a Binding.
//!
//! A write whose outcome is unknown (a 500, a time-out, a reset) or refused with a 409 is
//! settled by reading the pod again: bound to our node with our assignment is success;
//! bound elsewhere, gone or recreated is a refusal; still unbound is retried with the pod's
//! fresh resourceVersion when the pod asks and allows what it did when it was decided (its
//! labels, annotations and spec unchanged: what moved its resourceVersion was a status
//! write, most often the scheduler's own condition from the pod's last failed attempt), and
//! for gang members, whose gang is already reserved, in any case. Found on the real API
//! server: 71 of a replay's Bindings were refused so, each pod sent back to back off.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Duration;

use crate::api::{ApiError, BindRequest, ClusterApi};
use crate::k8s::leader::Gate;

/// Why a Binding did not land.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteFailure {
    /// The server said no for good (the pod is gone, bound elsewhere, or invalid).
    #[error("refused: {0}")]
    Refused(ApiError),
    /// Still failing after the retries.
    #[error("failed after {attempts} attempts: {last}")]
    Failed { attempts: u32, last: ApiError },
    /// Leadership was lost before the write was sent.
    #[error("not the leader any more")]
    NotLeader,
}

/// The end of one Binding.
#[derive(Debug)]
pub struct WriteOutcome {
    pub request: BindRequest,
    pub result: Result<(), WriteFailure>,
}

/// Bindings in flight.
pub struct Binder<A> {
    api: A,
    gate: Gate,
    slots: Arc<Semaphore>,
    writes: JoinSet<WriteOutcome>,
}

impl<A: ClusterApi> Binder<A> {
    pub fn new(api: A, gate: Gate, max_in_flight: usize) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Binder {
            api,
            gate,
            slots: Arc::new(Semaphore::new(max_in_flight)),
            writes: JoinSet::new(),
        }
    }

    /// Sends `request` once a slot is free (waiting here is the loop's backpressure).
    /// `retries` bounds the attempts; `refresh` lets a 409 on an unbound pod be retried
    /// with its new resourceVersion even when its labels, annotations or spec changed.
    pub async fn dispatch(&mut self, request: BindRequest, retries: u32, refresh: bool) {
        let Ok(permit) = Arc::clone(&self.slots).acquire_owned().await else {
            return;
        };
        let api = self.api.clone();
        let gate = self.gate.clone();
        self.writes.spawn(async move {
            let result = write(&api, &gate, request.clone(), retries, refresh).await;
            drop(permit);
            WriteOutcome { request, result }
        });
    }

    /// Outcomes already finished, without waiting.
    pub fn finished(&mut self) -> Vec<WriteOutcome> {
        let mut out = Vec::new();
        while let Some(done) = self.writes.try_join_next() {
            if let Ok(outcome) = done {
                out.push(outcome);
            }
        }
        out
    }

    /// Waits for the next outcome; `None` when nothing is in flight.
    pub async fn next(&mut self) -> Option<WriteOutcome> {
        loop {
            match self.writes.join_next().await? {
                Ok(outcome) => return Some(outcome),
                Err(_) => continue,
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.writes.len()
    }
}

pub(crate) async fn write<A: ClusterApi>(
    api: &A,
    gate: &Gate,
    mut request: BindRequest,
    retries: u32,
    refresh: bool,
) -> Result<(), WriteFailure> {
    let mut last = ApiError::Other("not sent".into());
    let attempts = retries.max(1);
    for attempt in 0..attempts {
        if attempt > 0 {
            let wait = Duration::from_millis(10u64 << attempt.min(7)).min(Duration::from_secs(1));
            tokio::time::sleep(wait).await;
        }
        if !gate.is_open() {
            return Err(WriteFailure::NotLeader);
        }
        let error = match api.bind(&request).await {
            Ok(()) => return Ok(()),
            Err(e @ ApiError::Invalid(_)) => return Err(WriteFailure::Refused(e)),
            Err(e) => e,
        };
        // Where does the pod stand?
        let state = match api.get_pod(&request.pod).await {
            Ok(state) => state,
            Err(e) => {
                last = e;
                continue;
            }
        };
        match stands(state, &request) {
            Stands::Done(result) => return result,
            Stands::Unbound(fresh) => {
                if matches!(error, ApiError::Conflict(_)) {
                    if !refresh && fresh.inputs != request.inputs {
                        return Err(WriteFailure::Refused(error));
                    }
                    request.resource_version = fresh.resource_version;
                }
                last = error;
            }
        }
    }
    if matches!(last, ApiError::Other(_)) {
        // The last answer left it open whether the Binding landed: the reservation must
        // not be given back before a read says the pod is unbound.
        return resolve(api, gate, &request, attempts, last).await;
    }
    Err(WriteFailure::Failed { attempts, last })
}

/// Where a pod stands after a Binding that may or may not have landed.
enum Stands {
    /// Bound by our write, or beyond our reach (gone, recreated, bound elsewhere).
    Done(Result<(), WriteFailure>),
    /// Still unbound, as read.
    Unbound(crate::api::PodState),
}

fn stands(state: Option<crate::api::PodState>, request: &BindRequest) -> Stands {
    let pod = &request.pod;
    let refused = |e| Stands::Done(Err(WriteFailure::Refused(e)));
    match state {
        None => refused(ApiError::NotFound(pod.to_string())),
        Some(s) if s.uid != pod.uid => refused(ApiError::NotFound(format!("{pod} (recreated)"))),
        Some(s)
            if s.node_name.as_deref() == Some(request.node.as_str())
                && s.assignment.as_ref()
                    == request
                        .annotations
                        .get(crate::k8s::demand::ASSIGNMENT_ANNOTATION) =>
        {
            Stands::Done(Ok(()))
        }
        Some(s) if s.node_name.is_some() => refused(ApiError::Conflict(format!(
            "{pod} is already bound to {}",
            s.node_name.unwrap_or_default()
        ))),
        Some(s) => Stands::Unbound(s),
    }
}

/// Reads the pod until it says where it stands (backing off to 5 s between reads; the
/// reservation stays while this runs).
async fn resolve<A: ClusterApi>(
    api: &A,
    gate: &Gate,
    request: &BindRequest,
    attempts: u32,
    last: ApiError,
) -> Result<(), WriteFailure> {
    let mut wait = Duration::from_millis(50);
    loop {
        if !gate.is_open() {
            return Err(WriteFailure::NotLeader);
        }
        match api.get_pod(&request.pod).await {
            Ok(state) => {
                return match stands(state, request) {
                    Stands::Done(result) => result,
                    Stands::Unbound(_) => Err(WriteFailure::Failed { attempts, last }),
                };
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}
