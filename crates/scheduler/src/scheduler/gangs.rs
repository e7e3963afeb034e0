//! What the scheduler keeps about gangs between rounds, with one owner: when each started
//! waiting (for its timeout), its Bindings in flight, each member's gang while its Binding
//! is in flight, and the PodGroup status last written.

use std::collections::HashMap;
use std::time::Instant;

use crate::k8s::gang::PodGroupStatus;

/// A gang whose Bindings are in flight.
#[derive(Debug, Default)]
pub(super) struct GangWrites {
    pub namespace: String,
    pub name: String,
    pub waiting: u32,
    pub bound: u32,
    pub failed: u32,
}

/// The last of a gang's Bindings ended.
pub(super) struct GangWritten {
    pub namespace: String,
    pub name: String,
    pub bound: u32,
    pub failed: u32,
}

#[derive(Debug, Default)]
pub(super) struct Gangs {
    /// Pod groups first seen waiting, for their timeout (`namespace/name`).
    since: HashMap<String, Instant>,
    writes: HashMap<String, GangWrites>,
    /// The gang of each member whose Binding is in flight (its reservation may be gone by
    /// the time the outcome is taken: the watch can confirm the pod bound first).
    of_member: HashMap<String, String>,
    /// The status last written per pod group: written again only when it changes.
    status: HashMap<String, PodGroupStatus>,
    /// The reason each waiting gang's members were last told.
    told: HashMap<String, String>,
}

impl Gangs {
    /// When the gang started waiting (now, if it was not).
    pub fn waiting_since(&mut self, id: &str, now: Instant) -> Instant {
        *self.since.entry(id.to_string()).or_insert(now)
    }

    /// The gang waits afresh from `now` (after it was refused at its timeout).
    pub fn restart_wait(&mut self, id: &str, now: Instant) {
        self.since.insert(id.to_string(), now);
    }

    pub fn stop_waiting(&mut self, id: &str) {
        self.since.remove(id);
        self.told.remove(id);
    }

    /// Records that the gang's members are told `reason`; whether it is news to them.
    pub fn told(&mut self, id: &str, reason: &str) -> bool {
        if self.told.get(id).is_some_and(|r| r == reason) {
            return false;
        }
        self.told.insert(id.to_string(), reason.to_string());
        true
    }

    /// The gang's members (`uids`) were reserved and their Bindings go out; `bound`
    /// members were bound before.
    pub fn permitted<'u>(
        &mut self,
        id: &str,
        namespace: &str,
        name: &str,
        bound: u32,
        uids: impl Iterator<Item = &'u str>,
    ) {
        self.since.remove(id);
        self.told.remove(id);
        let writes = self.writes.entry(id.to_string()).or_default();
        writes.namespace = namespace.to_string();
        writes.name = name.to_string();
        writes.bound = writes.bound.max(bound);
        for uid in uids {
            writes.waiting += 1;
            self.of_member.insert(uid.to_string(), id.to_string());
        }
    }

    /// The gang of the member whose Binding ended, if it is one's.
    pub fn member_written(&mut self, uid: &str) -> Option<String> {
        self.of_member.remove(uid)
    }

    /// Counts one member's Binding outcome; the gang's last one returns the totals.
    pub fn count_written(&mut self, id: &str, ok: bool) -> Option<GangWritten> {
        let writes = self.writes.get_mut(id)?;
        writes.waiting = writes.waiting.saturating_sub(1);
        if ok {
            writes.bound += 1;
        } else {
            writes.failed += 1;
        }
        if writes.waiting > 0 {
            return None;
        }
        let GangWrites {
            namespace,
            name,
            bound,
            failed,
            ..
        } = self.writes.remove(id)?;
        Some(GangWritten {
            namespace,
            name,
            bound,
            failed,
        })
    }

    /// Whether `status` is what was last written for the gang.
    pub fn status_unchanged(&self, id: &str, status: &PodGroupStatus) -> bool {
        self.status.get(id) == Some(status)
    }

    pub fn status_written(&mut self, id: String, status: PodGroupStatus) {
        self.status.insert(id, status);
    }
}
