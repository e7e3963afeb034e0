//! Quiet turns carried out (see [`super::quiet`]): which flushes may be quiet, the check
//! that a turn fails as its attempt would, the round that interleaves quiet turns with the
//! due units in queue order, and the quiet attempts written to a unit before anything reads
//! its attempt state.

use super::Engine;
use super::clock::{Attempt, AttemptClock, Attempts};
use super::evictable::{Room, SearchAsk};
use super::quiet::{Due, Flush};
use super::soon::is_live;
use super::units::{Slot, Tried, Turn};
use crate::timeline::metrics::Recorder;
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// Makes every flush's attempt (the reference quiet turns are checked against).
    #[cfg(test)]
    pub fn without_quiet(mut self) -> Self {
        self.quiet = super::quiet::Quiet::default();
        self
    }

    /// After `unit`'s failed attempt, at its failure count `fails`, parked in `slot`:
    /// whether its next flush may be quiet, and what that turn reads.
    pub(super) fn quiet_after_failure(
        &mut self,
        unit: u32,
        fails: u32,
        slot: Slot,
    ) -> Option<Turn> {
        let single = self.units[unit as usize].single;
        let turn = match (self.quiet.enabled(), slot, single) {
            (true, Slot::Shape { rid, priority }, Some(_)) => Some(Turn {
                key: self.units[unit as usize].key,
                rid,
                priority,
            }),
            _ => None,
        };
        self.quiet
            .set(unit, if turn.is_some() { fails } else { u32::MAX });
        turn
    }

    /// `unit` is woken, started or gone: its quiet attempts are written to it, and its
    /// flushes are no longer quiet.
    pub(super) fn quiet_ends(&mut self, unit: u32) {
        self.speak_up(unit);
        self.quiet.set(unit, u32::MAX);
    }

    /// Writes `unit`'s quiet attempts as the queue would have: each a failure, parked, at
    /// one flush interval after the one before.
    pub(super) fn speak_up(&mut self, unit: u32) {
        let unsaid = self.quiet.unsaid(unit);
        if unsaid == 0 {
            return;
        }
        self.quiet.said(unit);
        let flush = self.queue.config().unschedulable_flush;
        let u = &mut self.units[unit as usize];
        u.fails += unsaid;
        for _ in 0..unsaid {
            u.failed_at = u.failed_at + flush;
            self.queue.unschedulable(&unit, u.failed_at);
        }
    }

    /// Every unit's quiet attempts written (the run is over).
    pub(super) fn speak_up_all(&mut self) {
        for unit in 0..self.quiet.units() {
            self.speak_up(unit);
        }
    }

    /// Whether an attempt of a single pod of request `rid` and `priority`, parked by its
    /// shape, fails now as the attempt would find: no node fits it (the failure memo) and
    /// preemption plans nothing (off, nothing of lower priority runs, no node passes the
    /// room check, or every node that does is known to have no plan and none is kept:
    /// the node memo the attempt would read, [`super::node_plans`]).
    fn fails_quietly(&mut self, rid: u32, priority: i32) -> bool {
        if !self.still_fails(rid as usize) {
            return false;
        }
        if !self.preempt || self.by_priority.none_below(priority) {
            return true;
        }
        let request = self.request_of(rid);
        match self.by_priority.room(&self.state, priority, request) {
            Room::Nowhere => true,
            Room::On(nodes) if self.memo => {
                // No queues serve where turns are quiet: the ask of no queue.
                let ask = SearchAsk {
                    request: rid,
                    priority,
                    queue: None,
                };
                let looked = (self.node_plans).look(ask, &nodes, &self.state, &self.by_priority);
                !looked.any_unknown && looked.best_kept.is_none()
            }
            _ => false,
        }
    }

    /// The round's due units (in queue order) and its quiet turns, tried one after another
    /// in queue order: a quiet turn that fails quietly is counted, any other is tried as
    /// the flush would have tried it.
    pub(super) fn round_with_quiet(
        &mut self,
        due: Vec<u32>,
        clock: &mut AttemptClock,
        out: &mut Attempts,
    ) {
        let mut quiet = std::mem::take(&mut self.quiet.due);
        quiet.sort_unstable_by_key(|q| q.turn.key);
        let mut next_quiet = 0;
        let mut due = due.into_iter().peekable();
        loop {
            let next_key = due.peek().map(|&u| self.units[u as usize].key);
            let q = quiet.get(next_quiet).copied();
            let quiet_first = match (q, next_key) {
                (Some(q), Some(key)) => q.turn.key < key,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let Some(decided) = clock.begin() else {
                // Only with an attempt cost, when no turn is quiet.
                out.left.extend(due);
                out.left.extend(quiet[next_quiet..].iter().map(|q| q.unit));
                break;
            };
            let (unit, tried) = match q.filter(|_| quiet_first) {
                Some(q) => {
                    next_quiet += 1;
                    (q.unit, self.quiet_turn(q, decided))
                }
                None => {
                    let Some(unit) = due.next() else { break };
                    (unit, self.cycle(unit, None, None, decided))
                }
            };
            let at = clock.end(tried == Tried::Started);
            out.done.push(Attempt { unit, tried, at });
        }
        // The buffer kept for the next round.
        quiet.clear();
        self.quiet.due = quiet;
    }

    /// Quiet turn `q` at `now`: counted when it fails quietly, else tried as the flush
    /// would have tried it (its quiet attempts written first).
    fn quiet_turn(&mut self, q: Due, now: Ms) -> Tried {
        if self.fails_quietly(q.turn.rid, q.turn.priority) {
            self.outcome_counts.attempts += 1;
            #[cfg(test)]
            super::quiet::QUIET_TURNS.with(|c| c.set(c.get() + 1));
            return Tried::Quiet(q.fails, q.turn);
        }
        self.speak_up(q.unit);
        self.queue.flush_one(&q.unit, now);
        self.cycle(q.unit, None, None, now)
    }

    /// The bookkeeping of a quiet turn of `unit` at `now` (failure count `fails`): counted,
    /// and its next flush entered.
    pub(super) fn quiet_attempted(&mut self, unit: u32, fails: u32, turn: Turn, now: Ms) {
        self.outcome_counts.failed_attempts += 1;
        self.quiet.one_more(unit);
        let at = now + self.queue.config().unschedulable_flush;
        self.flushes.push_back(Flush {
            at,
            unit,
            fails,
            quiet: Some(turn),
        });
    }

    /// The instants before `other` (the next thing due that is no flush) and up to `end`
    /// at which only flushes are due, each of them live and quiet: each is a round that
    /// only counts its quiet turns, so it passes here without one (the recorder and the
    /// tenants' clocks advanced to it, the round counted, each turn counted and its next
    /// flush entered, in queue order). Stops at the first instant with a flush that is
    /// not quiet or a turn that would not fail quietly: the loop makes that round.
    /// Only where nothing else may be due meanwhile (no unit fresh, active, ready or woken)
    /// and no rebalancing looks at round times.
    pub(super) fn quiet_instants_before(
        &mut self,
        other: Option<Ms>,
        end: Ms,
        recorder: &mut Recorder,
    ) {
        if !self.quiet.enabled()
            || self.defrag.config.settings.mode.rebalances()
            || !self.fresh.is_empty()
            || !self.active.is_empty()
            || !self.ready.is_empty()
            || !self.left.is_empty()
        {
            return;
        }
        // An instant the loop would make a round at, before anything else is due.
        let alone = |at: Ms| at <= end && other.is_none_or(|o| at < o);
        let mut group: Vec<Due> = Vec::new();
        while let Some(at) = self.next_flush().filter(|&at| alone(at)) {
            if !self.quiet_instant(at, &mut group) {
                return;
            }
            group.sort_unstable_by_key(|q| q.turn.key);
            recorder.advance(at, self.values());
            if let Some(t) = &mut self.tenants {
                t.advance(at, self.measure_from);
            }
            self.outcome_counts.rounds += 1;
            #[cfg(test)]
            super::quiet::QUIET_INSTANTS.with(|c| c.set(c.get() + 1));
            for q in group.drain(..) {
                self.outcome_counts.attempts += 1;
                #[cfg(test)]
                super::quiet::QUIET_TURNS.with(|c| c.set(c.get() + 1));
                self.quiet_attempted(q.unit, q.fails, q.turn, at);
            }
        }
    }

    /// Whether every live flush at `at` (the front of the flushes) is quiet and fails
    /// quietly; if so they are taken off the front into `group`.
    fn quiet_instant(&mut self, at: Ms, group: &mut Vec<Due>) -> bool {
        group.clear();
        let mut count = 0;
        for f in self.flushes.iter().take_while(|f| f.at == at) {
            count += 1;
            match f.quiet {
                Some(turn) if self.quiet.may(f.unit, f.fails) => group.push(Due {
                    unit: f.unit,
                    fails: f.fails,
                    turn,
                }),
                _ if is_live(&self.units[f.unit as usize], f.fails) => return false,
                _ => {}
            }
        }
        let quiet = group
            .iter()
            .all(|q| self.fails_quietly(q.turn.rid, q.turn.priority));
        if quiet {
            self.flushes.drain(..count);
        }
        quiet
    }
}
