//! Quiet retries: a parked pod's flush attempt that is known to fail is counted, not made.
//!
//! The scheduler's queue tries every parked pod again the flush interval after its last
//! attempt (five minutes), whatever happened. Under a backlog most of a replay's attempts
//! are these flushes of pods that wait for hours, and nearly all of them fail the way the
//! last one did: the pod fits on no node (the failure memo says so at once) and no
//! eviction could make room for it (no node passes core's room check). Such an attempt
//! changes nothing but the pod's attempt count and when it next flushes.
//!
//! So a single pod parked by its shape (gpuplace's queue, no queues serving, no
//! make-room, every attempt free, no wait estimates) keeps its flush entries as before,
//! each carrying what its turn needs (its queue order, request id and priority), and at
//! its turn, in queue order among the round's other attempts, the same two checks the
//! attempt would make are asked of the state as it is then. When both say it fails, the
//! attempt is counted (the run's attempts and the unit's quiet count) and its next flush
//! entered, without reading the unit, its queue entry or its jobs. Otherwise, and whenever
//! anything else is about to read the unit's attempt state (a departure wakes it, it is
//! tried, the run ends), its quiet attempts are first written as the queue would have
//! written them (`speak_up`, in [`super::quieting`]). The decisions are the same; so are the attempt
//! counts, each pod's included.

use gpuplace_core::queue::Discipline;

use super::units::Turn;
use crate::timeline::options::{Ms, TimelineOptions};

/// A flush entry: when unit `unit`'s parking ends, at its failure count `fails`, and
/// when it may be quiet, what its turn needs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Flush {
    pub at: Ms,
    pub unit: u32,
    pub fails: u32,
    pub quiet: Option<Turn>,
}

/// A quiet turn due in this round.
#[derive(Clone, Copy, Debug)]
pub(super) struct Due {
    pub unit: u32,
    pub fails: u32,
    pub turn: Turn,
}

/// Per unit, whether its flushes may be quiet and how many were.
#[derive(Debug, Default)]
pub(super) struct Quiet {
    /// Whether quiet turns serve at all (see the module's text).
    enabled: bool,
    /// Per unit, its failure count while it is parked by its shape and may be quiet
    /// (`u32::MAX` otherwise): a flush entry of that count is live and may be quiet.
    may: Vec<u32>,
    /// Per unit, the quiet attempts not yet written to it.
    unsaid: Vec<u32>,
    /// The quiet turns due in the round being made, in no order.
    pub due: Vec<Due>,
}

impl Quiet {
    /// Quiet turns take no time and tell no estimate: they serve only where attempts are
    /// free and no wait is estimated, under gpuplace's queue.
    pub(super) fn for_run(discipline: Discipline, options: &TimelineOptions) -> Quiet {
        Quiet {
            enabled: discipline == Discipline::Gpuplace
                && options.costs.attempt.is_zero()
                && options.costs.placed_attempt.is_zero()
                && options.declared_share <= 0.0,
            ..Quiet::default()
        }
    }

    /// Whether a flush entry of `unit` at failure count `fails` is live and may be quiet.
    pub(super) fn may(&self, unit: u32, fails: u32) -> bool {
        self.may.get(unit as usize) == Some(&fails)
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(super) fn set(&mut self, unit: u32, fails: u32) {
        let u = unit as usize;
        if self.may.len() <= u {
            if fails == u32::MAX {
                return;
            }
            self.may.resize(u + 1, u32::MAX);
        }
        self.may[u] = fails;
    }

    pub(super) fn unsaid(&self, unit: u32) -> u32 {
        self.unsaid.get(unit as usize).copied().unwrap_or(0)
    }

    /// `unit`'s quiet attempts, now written to it.
    pub(super) fn said(&mut self, unit: u32) {
        if let Some(n) = self.unsaid.get_mut(unit as usize) {
            *n = 0;
        }
        self.set(unit, u32::MAX);
    }

    /// One more quiet attempt of `unit`.
    pub(super) fn one_more(&mut self, unit: u32) {
        let u = unit as usize;
        if self.unsaid.len() <= u {
            self.unsaid.resize(u + 1, 0);
        }
        self.unsaid[u] += 1;
    }

    /// How many units may have quiet attempts not yet written.
    pub(super) fn units(&self) -> u32 {
        self.unsaid.len() as u32
    }
}

#[cfg(test)]
thread_local! {
    /// Quiet turns counted (for the test that they change nothing).
    pub(crate) static QUIET_TURNS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Instants passed without a round.
    pub(crate) static QUIET_INSTANTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
