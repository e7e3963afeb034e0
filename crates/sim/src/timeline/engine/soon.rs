//! Wake-ups of units an event woke, by time (see [`super::wakeups`]).

use std::collections::BTreeMap;

use super::units::Unit;
use crate::timeline::options::Ms;

/// Wake-ups of units an event woke, by time: the units that failed in one round share
/// their time, so a backlog of thousands costs a few buckets, not a heap of thousands.
#[derive(Debug, Default)]
pub(super) struct Soon {
    buckets: BTreeMap<Ms, Vec<(u32, u32)>>,
}

impl Soon {
    /// `unit`, at its failure count `fails`, is due at `at`.
    pub(super) fn push(&mut self, at: Ms, unit: u32, fails: u32) {
        self.buckets.entry(at).or_default().push((unit, fails));
    }

    /// The earliest time a live entry is due (`live`: the unit still waits at that failure
    /// count); buckets of stale entries only are dropped.
    pub(super) fn next(&mut self, live: impl Fn(u32, u32) -> bool) -> Option<Ms> {
        while let Some(mut first) = self.buckets.first_entry() {
            first.get_mut().retain(|&(unit, fails)| live(unit, fails));
            if first.get().is_empty() {
                first.remove();
            } else {
                return Some(*first.key());
            }
        }
        None
    }

    /// Takes every entry due at `now`.
    pub(super) fn take_due(&mut self, now: Ms) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        while let Some(first) = self.buckets.first_entry() {
            if *first.key() > now {
                break;
            }
            out.extend(first.remove());
        }
        out
    }
}

/// The first of the ticks every `tick_ms` (from time 0) at or after `at`: when
/// kube-scheduler's loops (its backoff queue's flush) next run.
pub(super) fn next_tick(at: Ms, tick_ms: u64) -> Ms {
    Ms(at.0.div_ceil(tick_ms) * tick_ms)
}

/// Whether a wake-up entry made at failure count `fails` still speaks for `u`.
pub(super) fn is_live(u: &Unit, fails: u32) -> bool {
    u.waiting && u.fails == fails
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up_to_the_next_multiple() {
        assert_eq!(next_tick(Ms(0), 1_000), Ms(0));
        assert_eq!(next_tick(Ms(1), 1_000), Ms(1_000));
        assert_eq!(next_tick(Ms(5_000), 5_000), Ms(5_000));
        assert_eq!(next_tick(Ms(5_001), 5_000), Ms(10_000));
    }

    #[test]
    fn soon_gives_the_earliest_live_time_and_takes_what_is_due() {
        let mut soon = Soon::default();
        soon.push(Ms(2_000), 1, 3);
        soon.push(Ms(1_000), 2, 1);
        soon.push(Ms(1_000), 3, 1);
        // Units 2 and 3 failed again since: their bucket is dropped, not returned.
        assert_eq!(soon.next(|unit, _| unit == 1), Some(Ms(2_000)));
        soon.push(Ms(1_500), 4, 1);
        assert_eq!(soon.next(|_, _| true), Some(Ms(1_500)));
        assert!(soon.take_due(Ms(1_499)).is_empty());
        assert_eq!(soon.take_due(Ms(2_000)), vec![(4, 1), (1, 3)]);
        assert_eq!(soon.next(|_, _| true), None);
    }
}
