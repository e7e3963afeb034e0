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

use gpuplace_core::queue::Discipline;
use gpuplace_core::wake;

use super::Engine;
use super::quiet::Due;
use super::soon::{is_live, next_tick};
use super::units::{Slot, Tried};
use crate::timeline::options::Ms;

impl<'a> Engine<'a> {
    /// The request of request id `rid` (the same for every pod of it), read from one pod
    /// of it: the few such pods stay in cache where a waiting pod's own record would not.
    pub(super) fn request_of(&self, rid: u32) -> &'a gpuplace_model::Request {
        &self.pods[self.shape_requests[rid as usize] as usize].request
    }

    /// The earliest time a failed unit may become due (stale entries dropped).
    pub(super) fn next_wake(&mut self) -> Option<Ms> {
        let soon = self.next_wake_but_flushes();
        soon.into_iter().chain(self.next_flush()).min()
    }

    /// The earliest time a unit woken by an event or told when to look again may become
    /// due (stale entries dropped).
    pub(super) fn next_wake_but_flushes(&mut self) -> Option<Ms> {
        let units = &self.units;
        let live = |unit: u32, fails: u32| is_live(&units[unit as usize], fails);
        let soon = self.soon.next(live);
        while let Some(&Reverse((_, unit, fails))) = self.wakes.peek() {
            if live(unit, fails) {
                break;
            }
            self.wakes.pop();
        }
        let told = self.wakes.peek().map(|w| w.0.0);
        soon.into_iter().chain(told).min()
    }

    /// When the next parking is flushed (stale entries dropped).
    pub(super) fn next_flush(&mut self) -> Option<Ms> {
        let units = &self.units;
        let quiet = &self.quiet;
        while let Some(f) = self.flushes.front() {
            // A quiet one's liveness is read from the quiet index, not the unit.
            if quiet.may(f.unit, f.fails) || is_live(&units[f.unit as usize], f.fails) {
                break;
            }
            self.flushes.pop_front();
        }
        self.flushes.front().map(|f| f.at)
    }

    /// Pods left nodes since the last round: the parked units they could help wake (core's
    /// [`wake`]: under gpuplace's discipline, a single pod only where a node it left could
    /// take it; every one under kube-scheduler's), each due as its queue says (gpuplace's:
    /// one initial backoff after its last attempt; kube-scheduler's: at the first flush of
    /// its backoff queue after its whole backoff, at once if that passed).
    pub(super) fn wake_parked(&mut self, now: Ms) {
        let mut left: Vec<usize> = self.left.drain(..).map(|n| n as usize).collect();
        left.sort_unstable();
        left.dedup();
        let narrow = self.queue.discipline() == Discipline::Gpuplace;
        let woken = if narrow {
            let (state, tallies, levels) = (&self.state, &self.by_priority, &self.gpu_levels);
            let (pods, requests) = (self.pods, &self.shape_requests);
            let units = &self.units;
            self.parked.take_helped(
                |rid, priority| {
                    let request = &pods[requests[rid as usize] as usize].request;
                    wake::slots(
                        state,
                        &left,
                        |n| levels.below(tallies, n, priority),
                        request,
                    )
                },
                |unit, slot| units[unit as usize].parked == Some(slot),
            )
        } else {
            self.queue.wake_all(now);
            self.parked.take_all()
        };
        let soonest = self.queue.config().initial_backoff;
        for (unit, slot) in woken {
            if self.units[unit as usize].parked != Some(slot) {
                continue;
            }
            // Its quiet attempts written before its last failure's time is read.
            self.quiet_ends(unit);
            let u = &mut self.units[unit as usize];
            u.parked = None;
            if !u.waiting {
                continue;
            }
            let at = match self.queue.discipline() {
                Discipline::Gpuplace => {
                    self.queue.wake(&unit, now);
                    u.failed_at + soonest
                }
                // In the backoff queue until its backoff has passed and the queue is
                // flushed; at once if it has passed.
                Discipline::KubeScheduler => match self.queue.due_at(&unit) {
                    Some(due) if due > now => next_tick(due, self.queue_tick_ms),
                    _ => now,
                },
            };
            // Taken by this round's `due` when already due.
            self.soon.push(at, unit, u.fails);
        }
    }

    /// Where failed `unit` waits to be woken (core's [`wake::Reach`]): a single pod that
    /// found no place, under gpuplace's discipline, by its shape; anything else at every
    /// departure.
    pub(super) fn park_slot(&self, unit: u32, tried: Tried) -> Slot {
        let u = &self.units[unit as usize];
        let reach = wake::Reach {
            gang: u.jobs.len() > 1,
            nominated: !u.held.is_empty(),
            queued: self.tenants.is_some() && self.queues_serve,
            moves: self.defrag.config.settings.mode.makes_room(),
            inter_pod: false,
            claims: false,
        };
        let narrow = self.queue.discipline() == Discipline::Gpuplace;
        match (tried, u.single) {
            (Tried::Parked, Some(one)) if narrow && !reach.anywhere() => Slot::Shape {
                rid: one.rid,
                priority: one.priority,
            },
            _ => Slot::Anywhere,
        }
    }

    /// Whether request `rid` is known to fit nowhere: it failed before and no node
    /// released since then fits it now. Remembers the answer.
    pub(super) fn still_fails(&mut self, rid: usize) -> bool {
        let since = self.failed_at[rid];
        if since == u32::MAX || !self.memo {
            return false;
        }
        let request = self.request_of(rid as u32);
        let mut seen = std::mem::take(&mut self.seen_nodes);
        seen.begin(self.state.len());
        // Each node released since is asked once.
        let fits = self.released[since as usize..]
            .iter()
            .any(|&n| seen.first(n as usize) && self.state.fit(n as usize, request).is_ok());
        self.seen_nodes = seen;
        if !fits {
            self.failed_at[rid] = self.released.len() as u32;
        }
        !fits
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
        let kube = self.queue.discipline() == Discipline::KubeScheduler;
        let mut flush = false;
        while let Some(&f) = self.flushes.front()
            && f.at <= now
        {
            self.flushes.pop_front();
            let (unit, fails) = (f.unit, f.fails);
            if let Some(turn) = f.quiet
                && self.quiet.may(unit, fails)
            {
                self.quiet.due.push(Due { unit, fails, turn });
                continue;
            }
            if is_live(&self.units[unit as usize], fails) {
                flush = true;
                woken.push((unit, fails));
                // gpuplace's queue: each parked unit's flush is at its own time, so the
                // units whose time came are all the flush would unpark.
                if !kube {
                    self.queue.flush_one(&unit, now);
                }
            }
        }
        for (unit, fails) in woken {
            let u = &mut self.units[unit as usize];
            if !is_live(u, fails) {
                continue;
            }
            // Entries are due at the backoff queue's ticks: this is its flush.
            if kube {
                self.queue.end_backoff(&unit, now);
            }
            if !u.ready {
                u.ready = true;
                self.ready.push(unit);
            }
        }
        // kube-scheduler's flush is a loop over every parked pod at its ticks.
        if flush && kube {
            self.queue.flush(now);
        }
        let mut due: Vec<u32> = std::mem::take(&mut self.fresh);
        // Due before and not yet tried: the scheduler was busy ([`super::pace`]).
        due.append(&mut self.active);
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
        if kube {
            // kube-scheduler's PrioritySort: priority, then when the pod last joined the
            // queue (a failure puts it behind whoever came since).
            due.sort_unstable_by_key(|u| {
                // When it last joined the queue (`QueuedPodInfo.Timestamp`): its last
                // failure, else its arrival.
                let u = &self.units[*u as usize];
                let joined = if u.fails > 0 {
                    u.failed_at
                } else {
                    self.jobs[u.jobs[0] as usize].arrival
                };
                (u.key.0, joined, u.key.1)
            });
        } else {
            due.sort_unstable_by_key(|u| self.units[*u as usize].key);
        }
        due
    }
}
