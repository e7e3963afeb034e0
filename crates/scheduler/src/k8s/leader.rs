//! Leader election as its own task, as client-go's leaderelection does it, over a
//! coordination.k8s.io/v1 Lease.
//!
//! - A candidate takes the lease only when it is free, or when the record it holds has not
//!   changed for a whole lease duration of the candidate's own monotonic clock (never by
//!   comparing the holder's `renewTime` with the local wall clock).
//! - The holder renews every retry period; each success opens the [`Gate`] until the renew
//!   deadline after the moment the renewal was sent. Every decision and every write checks
//!   the gate, so a replica that cannot renew stops before anyone else can take over.
//! - Losing the lease ends [`Elector::run`] with [`Ended::Lost`]: the binary exits non-zero
//!   and restarts as a standby, as kube-scheduler does. On shutdown the lease is released
//!   (holder emptied) so a standby takes over at once.

mod gate;

use std::future::Future;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tokio::time::{Duration, Instant};
use tracing::{info, warn};

pub use gate::Gate;

use crate::api::ApiError;

/// The Lease the election reads and writes.
pub trait LeaseStore: Send + Sync + 'static {
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, ApiError>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ApiError>> + Send;
    /// Replaces the lease if its resourceVersion is still the one in `lease` (else 409).
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ApiError>> + Send;
}

/// Timings, client-go's and kube-scheduler's defaults.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectionConfig {
    pub fn new(name: &str, identity: &str) -> ElectionConfig {
        ElectionConfig {
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// How the election ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Shut down (the lease released if it was held).
    Stopped,
    /// The lease was held and then lost.
    Lost,
}

/// What of the record a candidate watches for change.
fn record(
    lease: &Lease,
) -> (
    Option<String>,
    Option<MicroTime>,
    Option<i32>,
    Option<String>,
) {
    let spec = lease.spec.clone().unwrap_or_default();
    (
        spec.holder_identity,
        spec.renew_time,
        spec.lease_transitions,
        lease.metadata.resource_version.clone(),
    )
}

type Record = (
    Option<String>,
    Option<MicroTime>,
    Option<i32>,
    Option<String>,
);

/// One candidate.
pub struct Elector<S> {
    store: S,
    config: ElectionConfig,
    gate: Gate,
    observed: Option<(Record, Instant)>,
    leading: bool,
}

impl<S: LeaseStore> Elector<S> {
    pub fn new(store: S, config: ElectionConfig, gate: Gate) -> Self {
        Elector {
            store,
            config,
            gate,
            observed: None,
            leading: false,
        }
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: acquired.or_else(|| Some(now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew; whether we hold the lease now.
    pub async fn try_acquire_or_renew(&mut self) -> bool {
        let now = Instant::now();
        let current = match self.store.get().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "cannot read the scheduler lease");
                return false;
            }
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.store.create(&lease).await {
                Ok(created) => {
                    self.observed = Some((record(&created), now));
                    true
                }
                Err(_) => false,
            };
        };
        let seen = record(&lease);
        if self.observed.as_ref().is_none_or(|(r, _)| *r != seen) {
            self.observed = Some((seen.clone(), now));
        }
        let old = lease.spec.clone().unwrap_or_default();
        let holder = old.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        let observed_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
        let duration = old
            .lease_duration_seconds
            .filter(|s| *s > 0)
            .map_or(self.config.lease_duration, |s| {
                Duration::from_secs(s as u64)
            });
        if !holder.is_empty() && !ours && now.saturating_duration_since(observed_at) < duration {
            return false;
        }
        let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours { old.acquire_time.clone() } else { None };
        lease.spec = Some(self.spec(transitions, acquired));
        match self.store.replace(&lease).await {
            Ok(written) => {
                if !ours {
                    info!(previous = %holder, "took the scheduler lease");
                }
                self.observed = Some((record(&written), now));
                true
            }
            Err(_) => false,
        }
    }

    /// Campaigns and renews until `shutdown` resolves (then releases the lease if held) or
    /// until the lease, once held, could not be renewed within the renew deadline.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Ended {
        tokio::pin!(shutdown);
        loop {
            let sent = Instant::now();
            let attempt =
                tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew());
            let held = tokio::select! {
                held = attempt => held.unwrap_or(false),
                _ = &mut shutdown => return self.release().await,
            };
            if held {
                self.gate.extend(sent, self.config.renew_deadline);
                if !self.leading {
                    info!(identity = %self.config.identity, "leading");
                }
                self.leading = true;
            } else if self.leading && !self.gate.is_open() {
                warn!("lost the scheduler lease (not renewed within the renew deadline)");
                self.gate.close();
                return Ended::Lost;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period) => {}
                _ = &mut shutdown => return self.release().await,
            }
        }
    }

    /// Empties the holder so a standby takes over without waiting for expiry.
    async fn release(mut self) -> Ended {
        self.gate.close();
        if !self.leading {
            return Ended::Stopped;
        }
        if let Ok(Some(mut lease)) = self.store.get().await {
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() == Some(self.config.identity.as_str()) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                match self.store.replace(&lease).await {
                    Ok(_) => info!("released the scheduler lease"),
                    Err(e) => warn!(error = %e, "cannot release the scheduler lease"),
                }
            }
        }
        self.leading = false;
        Ended::Stopped
    }
}

/// [`LeaseStore`] over the API server.
pub struct KubeLeases {
    api: kube::Api<Lease>,
    name: String,
}

impl KubeLeases {
    pub fn new(api: kube::Api<Lease>, name: &str) -> KubeLeases {
        KubeLeases {
            api,
            name: name.to_string(),
        }
    }
}

fn lease_error(e: kube::Error) -> ApiError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => ApiError::Conflict(s.message.clone()),
        kube::Error::Api(s) if s.code == 404 => ApiError::NotFound(s.message.clone()),
        _ => ApiError::Other(e.to_string()),
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, ApiError> {
        self.api.get_opt(&self.name).await.map_err(lease_error)
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, ApiError> {
        self.api
            .create(&kube::api::PostParams::default(), lease)
            .await
            .map_err(lease_error)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ApiError> {
        // replace() sends the resourceVersion we read: a concurrent writer makes it 409.
        self.api
            .replace(&self.name, &kube::api::PostParams::default(), lease)
            .await
            .map_err(lease_error)
    }
}

#[cfg(test)]
mod tests;
