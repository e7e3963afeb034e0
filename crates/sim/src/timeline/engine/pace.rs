//! The scheduler's time at work (`--attempt-cost`): attempts run one after another, each
//! keeping the scheduler busy for the cost, as kube-scheduler's single scheduling loop
//! does. A round's attempts go on until the next thing happens (an arrival, a departure,
//! a backoff queue's flush); the units not yet tried stay in the active queue, where what
//! comes meanwhile joins them in queue order, and the scheduler takes up the queue again
//! once its attempt in flight has ended. Each attempt decides on the cluster as it stands
//! when the attempt starts and is timed (its Binding, a failure's backoff) when it ends.
//!
//! With no cost every attempt of a round happens at the round's instant, as before.

use super::Engine;
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// When the next thing happens after `now` that a round's attempts must not run past
    /// (`next_arrival`: the next unit to arrive, which the engine does not hold).
    pub(super) fn horizon(&mut self, now: Ms, next_arrival: Option<Ms>) -> Option<Ms> {
        [
            next_arrival,
            self.departures.peek().map(|d| d.0.0),
            self.next_wake(),
            self.later.peek().map(|r| r.0.0),
            self.give_ups.peek().map(|g| g.0.0),
            self.leaving.next(),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min()
    }

    /// When the loop must come back for the scheduler: the end of its attempt in flight
    /// when units wait in its active queue or arrived while it worked.
    pub(super) fn resume_at(&self) -> Option<Ms> {
        (!self.active.is_empty() || !self.fresh.is_empty()).then_some(self.busy_until)
    }
}
