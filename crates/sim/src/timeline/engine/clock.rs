//! The scheduler's clock through a round with an attempt cost ([`super::pace`]): when each
//! attempt decides and ends, and when the round must stop.

use std::time::Duration;

use super::units::Tried;
use crate::timeline::options::Ms;

/// The scheduler's clock through one round.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttemptClock {
    /// When the scheduler is next free (the end of the last attempt).
    at: Ms,
    /// When the next thing happens: no attempt starts then or later in this round.
    horizon: Option<Ms>,
    costs: AttemptCosts,
}

/// What an attempt costs by how it ends: kube-scheduler's failed attempts filter every
/// node, run PostFilter and wait for the pod's status PATCH (14.7 ms on the real server
/// here); one that places a pod stops at the nodes it needs and binds in the background
/// (4.9 ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct AttemptCosts {
    pub(super) failed: Duration,
    pub(super) placed: Duration,
}

impl AttemptCosts {
    /// Every attempt free: a round decides at one instant.
    pub(super) fn is_free(&self) -> bool {
        self.failed.is_zero() && self.placed.is_zero()
    }
}

impl AttemptClock {
    pub(super) fn new(now: Ms, horizon: Option<Ms>, costs: AttemptCosts) -> Self {
        AttemptClock {
            at: now,
            horizon,
            costs,
        }
    }

    /// The next attempt begins: the time it decides at if it places its unit (its end),
    /// or `None` when it would start at or after the next event (the round stops there).
    pub(super) fn begin(&self) -> Option<Ms> {
        if !self.costs.is_free() && self.horizon.is_some_and(|h| self.at >= h) {
            return None;
        }
        Some(self.at + self.costs.placed)
    }

    /// The attempt begun last ended (`placed`: it placed its unit): when.
    pub(super) fn end(&mut self, placed: bool) -> Ms {
        self.at = self.at
            + if placed {
                self.costs.placed
            } else {
                self.costs.failed
            };
        self.at
    }

    /// When the scheduler is free again.
    pub(super) fn free_at(&self) -> Ms {
        self.at
    }
}

/// One attempt of a round: the unit, how it ended, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Attempt {
    pub(super) unit: u32,
    pub(super) tried: Tried,
    pub(super) at: Ms,
}

/// A round's attempts, and the due units it had no time for (still active, in order).
#[derive(Debug, Default)]
pub(super) struct Attempts {
    pub(super) done: Vec<Attempt>,
    pub(super) left: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_run_one_after_another_until_the_next_event() {
        let costs = AttemptCosts {
            failed: Duration::from_millis(100),
            placed: Duration::from_millis(40),
        };
        let mut clock = AttemptClock::new(Ms(1_000), Some(Ms(1_250)), costs);
        assert_eq!(clock.begin(), Some(Ms(1_040)));
        assert_eq!(clock.end(true), Ms(1_040));
        assert_eq!(clock.begin(), Some(Ms(1_080)));
        assert_eq!(clock.end(false), Ms(1_140));
        assert_eq!(clock.end_of_next(false), Some(Ms(1_240)));
        // Starts at 1,240, before the event: it runs, past it.
        assert_eq!(clock.end_of_next(false), Some(Ms(1_340)));
        assert_eq!(clock.begin(), None);
        assert_eq!(clock.free_at(), Ms(1_340));
    }

    #[test]
    fn without_a_cost_a_round_happens_at_one_instant() {
        let mut clock = AttemptClock::new(Ms(1_000), Some(Ms(1_001)), AttemptCosts::default());
        for placed in [true, false, true, false, false] {
            assert_eq!(clock.end_of_next(placed), Some(Ms(1_000)));
        }
        assert_eq!(clock.free_at(), Ms(1_000));
        let second = Duration::from_secs(1);
        let costs = AttemptCosts {
            failed: second,
            placed: second,
        };
        let mut alone = AttemptClock::new(Ms(0), None, costs);
        assert_eq!(alone.end_of_next(true), Some(Ms(1_000)));
        assert_eq!(alone.end_of_next(false), Some(Ms(2_000)));
    }

    impl AttemptClock {
        fn end_of_next(&mut self, placed: bool) -> Option<Ms> {
            self.begin().map(|_| self.end(placed))
        }
    }
}
