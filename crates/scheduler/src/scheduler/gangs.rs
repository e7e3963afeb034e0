//! What the scheduler keeps about gangs between rounds, with one owner: when each started
//! waiting (for its timeout), its Bindings in flight, each member's gang while its Binding
//! is in flight, and the PodGroup status last written.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::k8s::gang::PodGroupStatus;

/// A gang whose Bindings are in flight. Members are kept by UID, so a member counts once
/// however many permits it was seen in (a second permit while the first members' Bindings
/// fly sees them reserved: counted as bound there and again when their Bindings landed,
/// a gang of 3 once read "5 scheduled").
#[derive(Debug, Default)]
pub(super) struct GangWrites {
    pub namespace: String,
    pub name: String,
    /// Members whose Binding is in flight.
    pub waiting: HashSet<String>,
    /// Members bound: before the permits (seen bound, or reserved with their Binding
    /// done) and by these Bindings.
    pub bound: HashSet<String>,
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

    /// The gang's members (`uids`) were reserved and their Bindings go out; `held` are
    /// the members bound or reserved before (those whose Binding is still in flight are
    /// counted when it ends, not here).
    pub fn permitted<'u>(
        &mut self,
        id: &str,
        namespace: &str,
        name: &str,
        held: impl Iterator<Item = &'u str>,
        uids: impl Iterator<Item = &'u str>,
    ) {
        self.since.remove(id);
        self.told.remove(id);
        let writes = self.writes.entry(id.to_string()).or_default();
        writes.namespace = namespace.to_string();
        writes.name = name.to_string();
        for uid in held {
            if !writes.waiting.contains(uid) {
                writes.bound.insert(uid.to_string());
            }
        }
        for uid in uids {
            writes.bound.remove(uid);
            writes.waiting.insert(uid.to_string());
            self.of_member.insert(uid.to_string(), id.to_string());
        }
    }

    /// The gang of the member whose Binding ended, if it is one's.
    pub fn member_written(&mut self, uid: &str) -> Option<String> {
        self.of_member.remove(uid)
    }

    /// Counts member `uid`'s Binding outcome; the gang's last one returns the totals.
    pub fn count_written(&mut self, id: &str, uid: &str, ok: bool) -> Option<GangWritten> {
        let writes = self.writes.get_mut(id)?;
        if !writes.waiting.remove(uid) {
            return None;
        }
        if ok {
            writes.bound.insert(uid.to_string());
        } else {
            writes.failed += 1;
        }
        if !writes.waiting.is_empty() {
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
            bound: bound.len() as u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_counts_once_however_many_permits_saw_it() {
        let mut gangs = Gangs::default();
        // Members a and b go out; before they land, c is permitted, seeing a and b
        // reserved (held).
        gangs.permitted("ml/g", "ml", "g", [].into_iter(), ["a", "b"].into_iter());
        gangs.permitted("ml/g", "ml", "g", ["a", "b"].into_iter(), ["c"].into_iter());
        assert!(gangs.count_written("ml/g", "a", true).is_none());
        assert!(gangs.count_written("ml/g", "b", true).is_none());
        let done = gangs
            .count_written("ml/g", "c", true)
            .expect("the last one");
        assert_eq!((done.bound, done.failed), (3, 0), "3 members, not 5");
    }

    #[test]
    fn members_bound_before_count_and_failures_do_not() {
        let mut gangs = Gangs::default();
        gangs.permitted("ml/g", "ml", "g", ["a"].into_iter(), ["b", "c"].into_iter());
        assert!(gangs.count_written("ml/g", "b", false).is_none());
        // An outcome for a member not in flight changes nothing.
        assert!(gangs.count_written("ml/g", "zz", true).is_none());
        let done = gangs
            .count_written("ml/g", "c", true)
            .expect("the last one");
        assert_eq!((done.bound, done.failed), (2, 1));
    }
}
