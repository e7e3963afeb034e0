//! GPU health from critical XID events, with recovery.
//!
//! A critical XID that is not on the ignore list marks the GPU unhealthy. Unlike NVIDIA's
//! plugin, which keeps such a GPU unhealthy until restart, a GPU that raises no critical
//! error for the recovery period and passes a probe becomes healthy again. A zero recovery
//! period keeps NVIDIA's behaviour. Time is passed in, so the rules are tested without
//! waiting.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Health of every GPU, by UUID.
#[derive(Debug)]
pub struct HealthTracker {
    ignored: BTreeSet<u64>,
    recovery: Duration,
    /// Unhealthy GPUs and when they last raised a critical error.
    last_fault: HashMap<String, Instant>,
}

/// The GPUs an XID event applies to: the one it names, or every GPU when the driver could
/// not say which device raised it (an empty or unknown UUID), as NVIDIA's plugin does,
/// rather than dropping a possibly critical error.
pub fn xid_targets<'a>(uuid: &str, known: &'a [String]) -> Vec<&'a str> {
    match known.iter().find(|k| *k == uuid) {
        Some(k) => vec![k.as_str()],
        None => known.iter().map(String::as_str).collect(),
    }
}

impl HealthTracker {
    pub fn new(ignored: BTreeSet<u64>, recovery: Duration) -> Self {
        HealthTracker {
            ignored,
            recovery,
            last_fault: HashMap::new(),
        }
    }

    pub fn is_healthy(&self, uuid: &str) -> bool {
        !self.last_fault.contains_key(uuid)
    }

    /// A critical XID on `uuid` (`None` when the driver could not tell which XID).
    /// Returns true when the GPU's health changed.
    pub fn on_xid(&mut self, uuid: &str, xid: Option<u64>, now: Instant) -> bool {
        if xid.is_some_and(|x| self.ignored.contains(&x)) {
            return false;
        }
        self.fault(uuid, now)
    }

    /// The GPU stopped answering (fell off the bus, NVML errors).
    pub fn on_lost(&mut self, uuid: &str, now: Instant) -> bool {
        self.fault(uuid, now)
    }

    fn fault(&mut self, uuid: &str, now: Instant) -> bool {
        self.last_fault.insert(uuid.to_string(), now).is_none()
    }

    /// GPUs quiet for the recovery period whose `probe` passes become healthy again.
    /// Returns the recovered UUIDs.
    pub fn recover(&mut self, now: Instant, mut probe: impl FnMut(&str) -> bool) -> Vec<String> {
        if self.recovery.is_zero() {
            return Vec::new();
        }
        let due: Vec<String> = self
            .last_fault
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= self.recovery)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        let mut recovered = Vec::new();
        for uuid in due {
            if probe(&uuid) {
                self.last_fault.remove(&uuid);
                recovered.push(uuid);
            } else {
                // A failing probe restarts the wait.
                self.last_fault.insert(uuid, now);
            }
        }
        recovered.sort();
        recovered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_XID_IGNORE;

    fn tracker(recovery: u64) -> HealthTracker {
        HealthTracker::new(
            DEFAULT_XID_IGNORE.into_iter().collect(),
            Duration::from_secs(recovery),
        )
    }

    #[test]
    fn ignored_xids_leave_the_gpu_healthy() {
        let mut t = tracker(60);
        let now = Instant::now();
        assert!(!t.on_xid("g", Some(13), now));
        assert!(!t.on_xid("g", Some(43), now));
        assert!(t.is_healthy("g"));
        assert!(t.on_xid("g", Some(79), now));
        assert!(!t.is_healthy("g"));
        // Unknown XIDs count as critical.
        assert!(t.on_xid("h", None, now));
    }

    #[test]
    fn quiet_gpus_recover_and_new_faults_restart_the_wait() {
        let mut t = tracker(60);
        let start = Instant::now();
        t.on_xid("g", Some(48), start);
        assert!(
            t.recover(start + Duration::from_secs(59), |_| true)
                .is_empty()
        );
        // Another fault at 30 s pushes recovery to 90 s.
        t.on_xid("g", Some(48), start + Duration::from_secs(30));
        assert!(
            t.recover(start + Duration::from_secs(61), |_| true)
                .is_empty()
        );
        // A failed probe keeps it down and restarts the wait.
        assert!(
            t.recover(start + Duration::from_secs(91), |_| false)
                .is_empty()
        );
        assert!(!t.is_healthy("g"));
        assert_eq!(
            t.recover(start + Duration::from_secs(152), |_| true),
            vec!["g"]
        );
        assert!(t.is_healthy("g"));
    }

    #[test]
    fn zero_recovery_never_recovers() {
        let mut t = tracker(0);
        let start = Instant::now();
        t.on_lost("g", start);
        assert!(
            t.recover(start + Duration::from_secs(86_400), |_| true)
                .is_empty()
        );
        assert!(!t.is_healthy("g"));
    }

    #[test]
    fn xids_of_unidentified_devices_apply_to_every_gpu() {
        let known = vec!["GPU-a".to_string(), "GPU-b".to_string()];
        assert_eq!(xid_targets("GPU-b", &known), ["GPU-b"]);
        assert_eq!(xid_targets("", &known), ["GPU-a", "GPU-b"]);
        assert_eq!(xid_targets("GPU-gone", &known), ["GPU-a", "GPU-b"]);
    }
}
