//! When rebalancing looks at the fleet and how much it may move then: one rule for the
//! scheduler and the timeline replay, after a round's decisions.
//!
//! It looks at most every `rebalance_every` (the first time at once), and only while some
//! pod waits and the fleet's fragmentation (FGD's measure) is above the threshold. It may
//! then move what the hour's GPU budget has left (moves of the last hour count) and as many
//! pods as `max_moves` allows beside the moves still in flight. A controller (the driver's
//! key) that had a pod moved within [`REBALANCE_COOLDOWN`] is left alone, so no move is
//! undone.
//!
//! Time is the driver's (the scheduler's round clock, the simulator's milliseconds).

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use super::settings::{Limits, REBALANCE_COOLDOWN, Settings};
use crate::queue::QueueTime;

const HOUR: Duration = Duration::from_secs(3600);

/// The fleet as rebalancing sees it after a round.
#[derive(Clone, Copy, Debug)]
pub struct Fleet {
    /// Pods still waiting.
    pub pending: usize,
    /// Fragmentation (FGD's measure, milli-GPU) and capacity (milli-GPU).
    pub frag_milli: f64,
    pub capacity_milli: u64,
    /// Rebalancing moves whose replacement is not bound yet.
    pub in_flight: usize,
}

/// Rebalancing's memory between rounds, per controller key `K`, instants `T`.
#[derive(Clone, Debug)]
pub struct RebalancePace<K, T> {
    last: Option<T>,
    /// Moves in the last hour: when, and milli-GPU.
    recent: VecDeque<(T, u64)>,
    /// Controllers whose pod moved, and when.
    moved: HashMap<K, T>,
}

impl<K, T> Default for RebalancePace<K, T> {
    fn default() -> Self {
        RebalancePace {
            last: None,
            recent: VecDeque::new(),
            moved: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, T: QueueTime> RebalancePace<K, T> {
    /// Whether the interval allows a look at `now` (the rest of [`Self::limits`] asks the
    /// fleet): a driver that skips rounds in which nothing changed still makes this one,
    /// since the pace's own limits change with time alone.
    pub fn may_look(&self, s: &Settings, now: T) -> bool {
        s.mode.rebalances() && self.last.is_none_or(|last| now >= last + s.rebalance_every)
    }

    /// Whether rebalancing looks at `now`, and within which limits (see the module's
    /// text). A look counts for the interval even when it moves nothing.
    pub fn limits(&mut self, s: &Settings, now: T, fleet: &Fleet) -> Option<Limits> {
        if fleet.pending == 0 || !self.may_look(s, now) {
            return None;
        }
        self.last = Some(now);
        if fleet.frag_milli <= s.rebalance_threshold * fleet.capacity_milli as f64 {
            return None;
        }
        while self.recent.front().is_some_and(|&(t, _)| now >= t + HOUR) {
            self.recent.pop_front();
        }
        self.moved.retain(|_, t| now < *t + REBALANCE_COOLDOWN);
        let spent: u64 = self.recent.iter().map(|&(_, m)| m).sum();
        let limits = Limits {
            max_pods: s.max_moves.saturating_sub(fleet.in_flight),
            max_milli: ((s.budget_gpus_per_hour * 1000.0) as u64).saturating_sub(spent),
        };
        (limits.max_pods > 0 && limits.max_milli > 0).then_some(limits)
    }

    /// Whether `controller` had a pod moved within the cooldown (as of the last look).
    pub fn moved_lately<Q>(&self, controller: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.moved.contains_key(controller)
    }

    /// A pod of `controller` (if it has one) holding `milli` was moved at `now`.
    pub fn moved(&mut self, now: T, controller: Option<K>, milli: u64) {
        self.recent.push_back((now, milli));
        if let Some(c) = controller {
            self.moved.insert(c, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::settings::Mode;
    use super::*;

    fn settings() -> Settings {
        Settings {
            mode: Mode::Rebalance,
            ..Settings::default()
        }
    }

    fn fleet(pending: usize, frag_milli: f64) -> Fleet {
        Fleet {
            pending,
            frag_milli,
            capacity_milli: 100_000,
            in_flight: 0,
        }
    }

    /// Seconds as the driver's instants.
    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn it_looks_at_once_then_every_interval_while_pods_wait_and_fragmentation_is_high() {
        let s = settings();
        let mut pace: RebalancePace<u32, Duration> = RebalancePace::default();
        assert_eq!(
            pace.limits(&s, at(0), &fleet(0, 10_000.0)),
            None,
            "nothing waits"
        );
        let first = pace.limits(&s, at(0), &fleet(1, 10_000.0));
        assert_eq!(first.map(|l| l.max_pods), Some(4));
        assert_eq!(
            pace.limits(&s, at(59), &fleet(1, 10_000.0)),
            None,
            "too soon"
        );
        // 2% of 100 GPUs is 2,000 milli: not above it, and the look still counts.
        assert_eq!(pace.limits(&s, at(60), &fleet(1, 2_000.0)), None);
        assert_eq!(pace.limits(&s, at(100), &fleet(1, 10_000.0)), None);
        assert!(pace.limits(&s, at(120), &fleet(1, 10_000.0)).is_some());
    }

    #[test]
    fn may_look_says_when_the_interval_allows_a_look_whatever_the_fleet() {
        let s = settings();
        let mut pace: RebalancePace<u32, Duration> = RebalancePace::default();
        assert!(pace.may_look(&s, at(0)), "never looked");
        // A look that finds fragmentation low still counts for the interval.
        assert_eq!(pace.limits(&s, at(0), &fleet(1, 0.0)), None);
        assert!(!pace.may_look(&s, at(59)));
        assert!(pace.may_look(&s, at(60)));
        // Nothing waits: no look, so the interval is not spent.
        assert_eq!(pace.limits(&s, at(60), &fleet(0, 10_000.0)), None);
        assert!(pace.may_look(&s, at(61)));
        let off = Settings::default();
        assert!(!off.mode.rebalances());
        assert!(!pace.may_look(&off, at(600)), "rebalancing off");
    }

    #[test]
    fn the_hours_budget_the_moves_in_flight_and_the_cooldown_bound_it() {
        let s = settings();
        let mut pace: RebalancePace<u32, Duration> = RebalancePace::default();
        pace.moved(at(0), Some(7), 15_000);
        let limits = pace.limits(&s, at(10), &fleet(1, 10_000.0)).expect("looks");
        assert_eq!(limits.max_milli, 1_000, "16 GPUs an hour, 15 moved");
        assert!(pace.moved_lately(&7));
        let busy = Fleet {
            in_flight: 4,
            ..fleet(1, 10_000.0)
        };
        assert_eq!(
            pace.limits(&s, at(100), &busy),
            None,
            "four moves in flight"
        );
        let later = pace
            .limits(&s, at(3_600), &fleet(1, 10_000.0))
            .expect("looks");
        assert_eq!(later.max_milli, 16_000, "the hour has passed");
        assert!(!pace.moved_lately(&7), "the cooldown has passed");
    }
}
