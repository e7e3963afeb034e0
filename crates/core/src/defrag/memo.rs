//! Make-room searches that found nothing, remembered for [`ROOM_RETRY`]: one rule for the
//! scheduler and the timeline replay.
//!
//! A make-room search tries every node with every movable unit and places the moved pods
//! again; at thousands of nodes it is the dearest step of a cycle. Pods of one shape (the
//! same request on the same nodes) that wait together would each repeat a search that has
//! just failed, and pods leave every few seconds on a busy cluster, so "until something
//! changes" bounds nothing. A search that ran and found no plan is therefore not made again
//! for the same shape until [`ROOM_RETRY`] has passed; a pod of that shape waits for its
//! turn (or is placed as soon as it simply fits). A shape with no movable pod at all is not
//! remembered: nothing was searched, and pods become movable as they age. Nor is one that
//! only a disruption budget stands in the way of (the pod waits for the budget), and the
//! scheduler forgets every shape when nodes or budgets change (the timeline has neither).
//!
//! Time is the driver's (the scheduler's round clock, the simulator's milliseconds): the
//! memo only compares the instants it is given.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// How long a failed make-room search for a shape is not made again.
pub const ROOM_RETRY: Duration = Duration::from_secs(60);

/// Per shape `K`, until when its make-room is not searched again (instants `T`).
#[derive(Clone, Debug)]
pub struct RoomMemo<K, T> {
    until: HashMap<K, T>,
}

impl<K, T> Default for RoomMemo<K, T> {
    fn default() -> Self {
        RoomMemo {
            until: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, T: Copy + Ord> RoomMemo<K, T> {
    /// Until when make-room does not search for `shape` again, if that is after `now`.
    pub fn waiting_until(&self, shape: &K, now: T) -> Option<T> {
        self.until.get(shape).copied().filter(|&until| now < until)
    }

    /// A search for `shape` found nothing; `retry_at` is `now` plus [`ROOM_RETRY`] on the
    /// driver's clock.
    pub fn found_nothing(&mut self, shape: K, retry_at: T) {
        self.until.insert(shape, retry_at);
    }

    /// Forgets the shapes whose wait is over at `now` (bounds the memo's size).
    pub fn forget_before(&mut self, now: T) {
        self.until.retain(|_, until| *until > now);
    }

    /// Shapes remembered.
    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_waits_until_its_retry_and_others_do_not() {
        let mut memo: RoomMemo<u32, u64> = RoomMemo::default();
        assert_eq!(memo.waiting_until(&1, 0), None);
        memo.found_nothing(1, 60_000);
        assert_eq!(memo.waiting_until(&1, 59_999), Some(60_000));
        assert_eq!(memo.waiting_until(&2, 59_999), None);
        assert_eq!(memo.waiting_until(&1, 60_000), None);
        memo.forget_before(60_000);
        assert!(memo.is_empty());
    }
}
