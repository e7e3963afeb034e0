//! Leader election with a coordination.k8s.io/v1 Lease: only the holder schedules.
//!
//! The holder renews every `duration / 3`; another instance takes over only after the
//! lease has not been renewed for `duration`. Every write carries the resourceVersion it
//! read, so two candidates can never both win (the loser gets a 409).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// Whether `lease` may be taken by `me` at `now`.
pub fn can_take(lease: &Lease, me: &str, now: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return true;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() || holder == me {
        return true;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    match spec.renew_time.as_ref() {
        Some(MicroTime(renewed)) => now.as_second() - renewed.as_second() > duration,
        None => true,
    }
}

/// Holds and renews the lease; `is_leader` tells the scheduling loop whether to act.
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
}

impl LeaderElection {
    pub fn new(api: Api<Lease>, name: &str, me: &str, duration: Duration) -> Self {
        LeaderElection {
            api,
            name: name.to_string(),
            me: me.to_string(),
            duration,
        }
    }

    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew. Returns whether we hold the lease now.
    pub async fn try_hold(&self) -> bool {
        let now = Timestamp::now();
        match self.api.get_opt(&self.name).await {
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, 0, None)),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .is_ok()
            }
            Ok(Some(mut lease)) => {
                if !can_take(&lease, &self.me, now) {
                    return false;
                }
                let old = lease.spec.clone().unwrap_or_default();
                let ours = old.holder_identity.as_deref() == Some(self.me.as_str());
                let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!ours);
                let acquired = if ours { old.acquire_time.clone() } else { None };
                if !ours {
                    info!(previous = ?old.holder_identity, "taking over the scheduler lease");
                }
                lease.spec = Some(self.spec(now, transitions, acquired));
                // replace() sends the resourceVersion we read: a concurrent writer makes it 409.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                    .is_ok()
            }
            Err(e) => {
                warn!(error = %e, "cannot read the scheduler lease");
                false
            }
        }
    }

    /// How often to call [`try_hold`](Self::try_hold).
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_secs_ago: i64) -> Lease {
        let now = Timestamp::now();
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(now.as_second() - renewed_secs_ago).unwrap(),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_expired_or_own_leases_are_taken() {
        let now = Timestamp::now();
        assert!(!can_take(&lease("other", 5), "me", now));
        assert!(can_take(&lease("other", 20), "me", now));
        assert!(can_take(&lease("me", 5), "me", now));
        assert!(can_take(&lease("", 5), "me", now));
    }
}
