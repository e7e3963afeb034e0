//! The victim search's candidates as the replay groups them: running pods by unit (a
//! gang is evicted whole), and reclaim's kept while nothing they read changed.

use std::rc::Rc;

use super::evictable::SearchedAt;

/// Running pods grouped by unit, the victim search's candidates in its order: every group's
/// members in one buffer (a search lists hundreds of groups; one vector each was a
/// tenth of a preempting replay's time in allocations).
#[derive(Debug, Default)]
pub(super) struct Groups {
    members: Vec<u32>,
    /// Where each group ends in `members`.
    ends: Vec<u32>,
    /// Nodes whose answer reads more than their own changes: they hold a member of a unit
    /// with members on other nodes, or a pod whose Binding has not landed (kept or not as
    /// a group). A search's plan there is not kept ([`super::node_plans`]).
    pub(super) unsure: Vec<u32>,
}

impl Groups {
    /// With room for `members` pods in `groups` groups.
    pub(super) fn with_capacity(members: usize, groups: usize) -> Groups {
        Groups {
            members: Vec::with_capacity(members),
            ends: Vec::with_capacity(groups),
            unsure: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Pods in every group together.
    pub(super) fn pods(&self) -> usize {
        self.members.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Group `i`'s members.
    pub(super) fn get(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.members[start..self.ends[i] as usize]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.len()).map(|i| self.get(i))
    }

    pub(super) fn push(&mut self, group: &[u32]) {
        self.members.extend_from_slice(group);
        self.ends.push(self.members.len() as u32);
    }
}

/// Reclaim's candidates: every unit of the queues a reclaim may take from, and each
/// one's queue (a gang's from its first member). The same while nothing they read
/// changed (the running pods, the time, whom the queue may take from), so a round's
/// reclaims for pods of many shapes group the running pods once.
pub(super) struct ReclaimPool {
    pub(super) at: SearchedAt,
    pub(super) takeable: Vec<bool>,
    pub(super) groups: Rc<Groups>,
    pub(super) unit_queue: Vec<usize>,
    /// The leaving pods' places of those queues it may count on (slots).
    pub(super) freeing: Vec<u32>,
}
