//! Which waiting units can be due: an index over the queue, so that a round asks the
//! queue about the units whose backoff or parking has ended instead of every waiting one
//! (which are due is still the queue's answer).
//!
//! A failed unit is due again when an event wakes it (one initial backoff after its last
//! attempt: [`Soon`]), when it was told when to look again (a heap: few units), or when its
//! parking is flushed, the flush interval after its last attempt: attempts come in time
//! order, so their flushes do too and a queue holds them (a heap of flush entries put back
//! each time a unit failed again was 45 million pops in one share-heavy replay).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{Engine, Unit};
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

/// Whether a wake-up entry made at failure count `fails` still speaks for `u`.
fn is_live(u: &Unit, fails: u32) -> bool {
    u.waiting && u.fails == fails
}

impl Engine<'_> {
    /// The earliest time a failed unit may become due (stale entries dropped).
    pub(super) fn next_wake(&mut self) -> Option<Ms> {
        let units = &self.units;
        let live = |unit: u32, fails: u32| is_live(&units[unit as usize], fails);
        let soon = self.soon.next(live);
        while let Some(&Reverse((_, unit, fails))) = self.wakes.peek() {
            if live(unit, fails) {
                break;
            }
            self.wakes.pop();
        }
        while let Some(&(_, unit, fails)) = self.flushes.front() {
            if live(unit, fails) {
                break;
            }
            self.flushes.pop_front();
        }
        let told = self.wakes.peek().map(|w| w.0.0);
        let flush = self.flushes.front().map(|f| f.0);
        [soon, told, flush].into_iter().flatten().min()
    }

    /// The units due at `now`, in queue order (the queue decides; the index only narrows
    /// whom it is asked about).
    pub(super) fn due(&mut self, now: Ms) -> Vec<u32> {
        let mut woken: Vec<(u32, u32)> = self.soon.take_due(now);
        while let Some(&Reverse((at, unit, fails))) = self.wakes.peek()
            && at <= now
        {
            self.wakes.pop();
            woken.push((unit, fails));
        }
        let mut flush = false;
        while let Some(&(at, unit, fails)) = self.flushes.front()
            && at <= now
        {
            self.flushes.pop_front();
            if is_live(&self.units[unit as usize], fails) {
                flush = true;
                woken.push((unit, fails));
            }
        }
        for (unit, fails) in woken {
            let u = &mut self.units[unit as usize];
            if is_live(u, fails) && !u.ready {
                u.ready = true;
                self.ready.push(unit);
            }
        }
        if flush {
            self.queue.flush(now);
        }
        let mut due: Vec<u32> = std::mem::take(&mut self.fresh);
        due.retain(|u| self.units[*u as usize].waiting);
        let mut parked = Vec::new();
        for unit in std::mem::take(&mut self.ready) {
            if !self.units[unit as usize].waiting {
                continue;
            }
            if self.queue.is_due(&unit, now) {
                self.units[unit as usize].ready = false;
                due.push(unit);
            } else {
                parked.push(unit);
            }
        }
        self.ready = parked;
        due.sort_unstable_by_key(|u| self.units[*u as usize].key);
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
