//! The bind stage: writes run off the decision path, at most `max_in_flight` Bindings at
//! once, each one write (the Binding carries the assignment annotation). Events go through
//! their own sink (`scheduler::events`) and never hold up a Binding: while more than half the
//! slots are taken they yield to Bindings ([`BindLoad`]).
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

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Duration;

use crate::api::{ApiError, BindRequest, ClaimMade, ClusterApi};
use crate::k8s::leader::Gate;
use crate::k8s::pod_info::PodKey;

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

/// How busy the Bindings are, for writes that should yield to them (Events): busy while
/// more than half the slots are taken, as when the server, not the decisions, paces them.
#[derive(Clone, Debug)]
pub struct BindLoad {
    slots: Arc<Semaphore>,
    max: usize,
    freed: Arc<Notify>,
}

impl BindLoad {
    /// `max` slots, none taken yet.
    pub fn new(max: usize) -> Self {
        BindLoad {
            slots: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            freed: Arc::default(),
        }
    }

    pub fn is_busy(&self) -> bool {
        let taken = self.max.saturating_sub(self.slots.available_permits());
        taken > self.max / 2
    }

    /// Gives way to busy Bindings: returns once they are quiet (`None`), or with one of
    /// `trickle`'s permits while they are busy, whichever comes first. For writes that
    /// should yield (Events, queue statuses) without ever stopping.
    pub async fn give_way(&self, trickle: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        tokio::select! {
            biased;
            () = self.quiet() => None,
            permit = Arc::clone(trickle).acquire_owned() => permit.ok(),
        }
    }

    /// Returns once the Bindings are not busy.
    pub async fn quiet(&self) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if !self.is_busy() {
                return;
            }
            freed.await;
        }
    }
}

/// Bindings in flight, and the outcomes of those that ended and were not yet taken.
pub struct Binder<A> {
    api: A,
    gate: Gate,
    load: BindLoad,
    writes: JoinSet<WriteOutcome>,
    /// Outcomes joined and not yet taken. A finished task keeps its whole future's memory
    /// (3.5 KB a Binding) until joined: a round that decides 40,000 pods held 138 MB of
    /// them (heaptrack, real API server); each dispatch now joins what ended.
    ended: std::collections::VecDeque<WriteOutcome>,
}

impl<A: ClusterApi> Binder<A> {
    pub fn new(api: A, gate: Gate, max_in_flight: usize) -> Self {
        Binder {
            api,
            gate,
            load: BindLoad::new(max_in_flight),
            writes: JoinSet::new(),
            ended: std::collections::VecDeque::new(),
        }
    }

    /// How busy its slots are (for the Event sink).
    pub fn load(&self) -> BindLoad {
        self.load.clone()
    }

    /// Sends `request` once a slot is free (waiting here is the loop's backpressure).
    /// `retries` bounds the attempts; `refresh` lets a 409 on an unbound pod be retried
    /// with its new resourceVersion even when its labels, annotations or spec changed.
    pub async fn dispatch(&mut self, request: BindRequest, retries: u32, refresh: bool) {
        let Ok(permit) = Arc::clone(&self.load.slots).acquire_owned().await else {
            return;
        };
        self.join_ended();
        let api = self.api.clone();
        let gate = self.gate.clone();
        let freed = Arc::clone(&self.load.freed);
        self.writes.spawn(async move {
            let result = write_with_claims(&api, &gate, request.clone(), retries, refresh).await;
            drop(permit);
            freed.notify_waiters();
            WriteOutcome { request, result }
        });
    }

    /// Joins the writes that ended, keeping their outcomes.
    fn join_ended(&mut self) {
        while let Some(done) = self.writes.try_join_next() {
            if let Ok(outcome) = done {
                self.ended.push_back(outcome);
            }
        }
    }

    /// Outcomes already finished, without waiting.
    pub fn finished(&mut self) -> Vec<WriteOutcome> {
        self.join_ended();
        std::mem::take(&mut self.ended).into()
    }

    /// Waits for the next outcome; `None` when nothing is in flight.
    pub async fn next(&mut self) -> Option<WriteOutcome> {
        if let Some(outcome) = self.ended.pop_front() {
            return Some(outcome);
        }
        loop {
            match self.writes.join_next().await? {
                Ok(outcome) => return Some(outcome),
                Err(_) => continue,
            }
        }
    }

    /// Bindings sent and not yet taken (in flight, or ended with the outcome not taken).
    pub fn in_flight(&self) -> usize {
        self.writes.len() + self.ended.len()
    }
}

/// The pod's claims first (allocated, or joined), then its Binding; when the Binding does
/// not land, the claim writes that did are undone, so no device stays allocated to a pod
/// that is not bound. A claim write that fails is not retried here: the pod goes back to
/// the queue and is decided again on the claims as the watch then shows them.
pub(crate) async fn write_with_claims<A: ClusterApi>(
    api: &A,
    gate: &Gate,
    mut request: BindRequest,
    retries: u32,
    refresh: bool,
) -> Result<(), WriteFailure> {
    let mut done = Vec::new();
    let mut failed = None;
    for claim in &request.claims {
        if !gate.is_open() {
            failed = Some(WriteFailure::NotLeader);
            break;
        }
        match api.write_claim(claim).await {
            Ok(()) => done.push(claim),
            Err(e) => {
                // A time-out or a 500 may have applied: undone with the rest (the undo
                // reads the claim and changes it only where the pod is a user).
                if matches!(e, ApiError::Other(_)) {
                    done.push(claim);
                }
                failed = Some(WriteFailure::Refused(e));
                break;
            }
        }
    }
    let mut made = None;
    if failed.is_none()
        && let Some(extended) = &request.extended
    {
        match write_extended(api, gate, extended, request.inputs).await {
            Ok((m, version)) => {
                made = Some(m);
                // The status write made the pod's version the Binding names.
                request.resource_version = version;
            }
            Err((m, failure)) => {
                made = m;
                failed = Some(failure);
            }
        }
    }
    let result = match failed {
        Some(failure) => Err(failure),
        None => write(api, gate, request.clone(), retries, refresh).await,
    };
    if let Some(m) = &made
        && gate.is_open()
    {
        if result.is_err() {
            undo_extended(api, &request.pod, m).await;
        } else {
            delete_stale_extended(api, &request.pod, m).await;
        }
    }
    // A Binding that may have landed is never undone under the pod: `write` settles an
    // unknown outcome by reading the pod, so an error here means it did not.
    if result.is_err() && gate.is_open() {
        for claim in done {
            if let Err(e) = api.undo_claim(claim).await {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %e,
                    "a claim written for a Binding that failed could not be undone; the resource claim controller releases it once the pod is gone");
            }
        }
    }
    result
}

/// Makes the pod's extended-resource claim, allocates it (checked against the claims the
/// scheduler knows, as every claim write is) and writes the pod's
/// `extendedResourceClaimStatus`: the claim and the pod's version after that write (the
/// pod changed otherwise since the decision, `inputs`, is a conflict). On failure, the
/// claim made so far (to delete) with why.
async fn write_extended<A: ClusterApi>(
    api: &A,
    gate: &Gate,
    write: &crate::k8s::dra::extended::ExtendedWrite,
    inputs: u64,
) -> Result<(ClaimMade, String), (Option<ClaimMade>, WriteFailure)> {
    let made = api
        .create_claim(&write.claim)
        .await
        .map_err(|e| (None, WriteFailure::Refused(e)))?;
    let fail = |e: ApiError| (Some(made.clone()), WriteFailure::Refused(e));
    if !gate.is_open() {
        return Err((Some(made.clone()), WriteFailure::NotLeader));
    }
    let allocate = crate::k8s::dra::write::ClaimWrite {
        namespace: write.pod.namespace.clone(),
        name: made.name.clone(),
        uid: made.uid.clone(),
        resource_version: made.resource_version.clone(),
        finalizers: None,
        allocation: Some(write.allocation.clone()),
        reserved_for: vec![crate::k8s::dra::write::consumer(&write.pod)],
        pod_uid: write.pod.uid.clone(),
    };
    api.write_claim(&allocate).await.map_err(fail)?;
    if !gate.is_open() {
        return Err((Some(made.clone()), WriteFailure::NotLeader));
    }
    let pod = api
        .extended_status(&write.pod, Some(&write.status(&made.name)))
        .await
        .map_err(fail)?;
    if pod.inputs != inputs || pod.node_name.is_some() {
        return Err(fail(ApiError::Conflict(format!(
            "{} changed since it was decided",
            write.pod
        ))));
    }
    Ok((made, pod.resource_version))
}

/// Takes back an extended-resource claim whose Binding failed: the pod's status no longer
/// names it, and it is deleted (its devices free at once).
async fn undo_extended<A: ClusterApi>(api: &A, pod: &PodKey, made: &ClaimMade) {
    if let Err(e) = api.extended_status(pod, None).await {
        tracing::warn!(pod = %pod, error = %e, "the extended-resource claim status of a pod whose Binding failed could not be cleared");
    }
    if let Err(e) = api
        .delete_claim(&pod.namespace, &made.name, &made.uid)
        .await
    {
        tracing::warn!(claim = %format!("{}/{}", pod.namespace, made.name), error = %e,
            "an extended-resource claim made for a Binding that failed could not be deleted; the garbage collector removes it with the pod");
    }
}

/// Deletes the pod's other extended-resource claims once its Binding with `made` landed:
/// its status names `made`, so any other is left from an attempt whose Binding never
/// came (a restart between the writes), holding devices until the pod is gone.
async fn delete_stale_extended<A: ClusterApi>(api: &A, pod: &PodKey, made: &ClaimMade) {
    for claim in api.extended_claims_of(pod) {
        let (name, uid) = (&claim.name, &claim.uid);
        if *uid == made.uid {
            continue;
        }
        tracing::info!(pod = %pod, claim = %name, "deleting an extended-resource claim left by an earlier attempt");
        if let Err(e) = api.delete_claim(&pod.namespace, name, uid).await {
            tracing::warn!(pod = %pod, claim = %name, error = %e, "an extended-resource claim left by an earlier attempt could not be deleted");
        }
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
