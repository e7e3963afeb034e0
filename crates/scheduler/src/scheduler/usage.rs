//! The queues' usage over time on the scheduler: core's [`Ledger`] advanced every round by
//! what the queues held since the last, and its one record on the server, each Queue's
//! `status.usage` (decayed resource-seconds as of a time), written with the queue's status
//! at most every [`SHOW_EVERY`].
//!
//! A standby replica counts from its own watch (`Scheduler::observe_usage`), so a
//! leader change hands over a count that saw everything; a leader leaving on shutdown
//! writes a last record. A scheduler that starts reads every Queue's record back and
//! carries it from its time to now, the allocation taken to have gone evenly from what the
//! record says the queue held to what it holds now (no scheduler saw the gap): a restart
//! counts nothing twice, the record being a value at a time, not a sum of increments, and
//! what it cannot know is bounded by the gap (at most [`SHOW_EVERY`] plus the time without
//! a leader) against the half-life. The tree changing (a queue added, a
//! half-life changed) keeps each queue's usage by name, its decayed mean kept across a new
//! half-life.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::fairshare::{
    DIMS, Ledger, QueueTree, Res, Usage, parse_half_life, show_amount, show_half_life,
};

use crate::api::ClusterView;
use crate::clock::WallClock;
use crate::k8s::queue::QueueUsage;

/// How often the usage shown in the queues' status is brought up to date (each time is a
/// status write per queue that keeps usage).
pub const SHOW_EVERY: Duration = Duration::from_secs(10);

/// The usage of the queues of one tree, by queue index, and when it was last advanced.
pub struct UsageBook {
    default_ms: u64,
    tree: Option<Arc<QueueTree>>,
    ledger: Ledger,
    /// Wall time (ms since the epoch) the ledger stands at.
    at_ms: Option<i64>,
    /// Whether the records on the server have been read (once, at the first round or
    /// standby tick; from then on this replica's own count goes on).
    loaded: bool,
    /// The usage as last shown (by queue name), and when it was taken.
    shown: HashMap<String, QueueUsage>,
    shown_at: Option<Instant>,
    /// Wall times follow the rounds' `now` (tests drive them).
    wall: WallClock,
}

impl UsageBook {
    /// `default_ms`: the half-life of queues that set none, nor their parents.
    pub fn new(default_ms: u64, wall: WallClock) -> UsageBook {
        UsageBook {
            default_ms,
            tree: None,
            ledger: Ledger::default(),
            at_ms: None,
            loaded: false,
            shown: HashMap::new(),
            shown_at: None,
            wall,
        }
    }

    /// Wall time of the round clock's `now`, ms since the epoch.
    fn wall_ms(&self, now: Instant) -> i64 {
        self.wall.ms(now)
    }

    /// Brings the ledger to `now` for `tree` at a round's start: what each queue held since
    /// the last round counted, then `alloc` (each queue with everything under it, as the
    /// round finds it) held until [`UsageBook::hold`] says otherwise.
    pub fn advance(
        &mut self,
        tree: &Arc<QueueTree>,
        view: &ClusterView,
        alloc: &[Res],
        now: Instant,
    ) {
        let now_ms = self.wall_ms(now);
        if self.tree.as_ref().is_none_or(|t| !Arc::ptr_eq(t, tree)) {
            self.retree(tree);
        }
        if !self.loaded {
            self.load(tree, view, alloc, now_ms);
        } else if let Some(at) = self.at_ms {
            self.ledger.advance(now_ms.saturating_sub(at).max(0) as u64);
        }
        self.hold(alloc);
        self.at_ms = Some(now_ms);
    }

    /// From now on each queue holds `alloc` (a round's decisions taken).
    pub fn hold(&mut self, alloc: &[Res]) {
        self.ledger.hold(alloc.iter().map(|r| r.dims));
    }

    /// Carries the ledger to `now`, the allocation unchanged since the last round, and
    /// takes the figures to show at once (a leader about to stop leaves its last record).
    pub fn carry_and_show(&mut self, now: Instant) {
        let now_ms = self.wall_ms(now);
        if let Some(at) = self.at_ms.filter(|_| self.loaded) {
            self.ledger.advance(now_ms.saturating_sub(at).max(0) as u64);
            self.at_ms = Some(now_ms);
        }
        self.shown_at = None;
        self.refresh_shown(now);
    }

    /// The usage to show for queue `name`, by name.
    pub fn shown_named(&self, name: &str) -> Option<QueueUsage> {
        let q = self.tree.as_ref()?.index(name)?;
        self.shown(q, name)
    }

    /// Whether the usage shown is due to be brought up to date (a round is then run even
    /// when nothing changed, so that the status stays true while the cluster is quiet).
    pub fn show_due(&self, now: Instant) -> bool {
        self.decays() && self.shown_at.is_none_or(|t| now >= t + SHOW_EVERY)
    }

    /// A new tree: each queue's usage kept by name (rescaled to a changed half-life).
    fn retree(&mut self, tree: &Arc<QueueTree>) {
        let mut next = Ledger::new(tree, self.default_ms);
        if let Some(old) = &self.tree {
            for q in 1..tree.len() {
                let Some(o) = old.index(tree.name(q)) else {
                    continue;
                };
                let (from, to) = (self.ledger.half_life_ms[o], next.half_life_ms[q]);
                next.usage[q] = self.ledger.usage[o].rescaled(from, to);
                next.held[q] = self.ledger.held[o];
            }
        }
        self.ledger = next;
        self.tree = Some(Arc::clone(tree));
    }

    /// Reads each queue's record and carries it to `now_ms` holding `alloc`.
    fn load(&mut self, tree: &QueueTree, view: &ClusterView, alloc: &[Res], now_ms: i64) {
        for q in view.queues.iter() {
            let (Some(name), Some(usage)) = (
                q.metadata.name.as_deref(),
                q.status.as_ref().and_then(|s| s.usage.as_ref()),
            ) else {
                continue;
            };
            let (Some(i), Ok(from), Some(at)) = (
                tree.index(name),
                parse_half_life(&usage.half_life),
                parse_time_ms(&usage.updated),
            ) else {
                continue;
            };
            let h = self.ledger.half_life_ms[i];
            let record = Usage {
                dims: [
                    usage.gpu_seconds * 1e3,
                    usage.cpu_seconds * 1e3,
                    usage.memory_mib_seconds,
                ],
            };
            let held = alloc.get(i).map_or([0; DIMS], |r| r.dims);
            let then = [
                (usage.held_gpus * 1e3).max(0.0) as u64,
                (usage.held_cpus * 1e3).max(0.0) as u64,
                usage.held_memory_mib.max(0.0) as u64,
            ];
            let gap = now_ms.saturating_sub(at).max(0) as u64;
            self.ledger.usage[i] = record.rescaled(from, h).after_ramp(&then, &held, gap, h);
            self.shown.insert(name.to_string(), usage.clone());
        }
        self.loaded = true;
    }

    /// Each queue's decayed mean (`None` without a half-life), for fair order.
    pub fn means(&self) -> Vec<Option<[f64; DIMS]>> {
        self.ledger.means()
    }

    /// Queue `q`'s decayed mean (milli-GPU) and half-life (ms), when it keeps usage.
    pub fn mean_of(&self, q: usize) -> Option<(f64, u64)> {
        let h = *self.ledger.half_life_ms.get(q)?;
        (h > 0).then(|| (self.ledger.usage[q].mean(h, &self.ledger.held[q])[0], h))
    }

    /// Whether some queue keeps usage.
    pub fn decays(&self) -> bool {
        self.ledger.decays()
    }

    /// The usage to show for queue `name` (index `q`): brought up to date every
    /// [`SHOW_EVERY`] (else as last shown, so that statuses are not written each round).
    pub fn shown(&self, q: usize, name: &str) -> Option<QueueUsage> {
        let h = *self.ledger.half_life_ms.get(q)?;
        if h == 0 {
            return None;
        }
        if let Some(old) = self.shown.get(name)
            && old.half_life == show_half_life(h)
        {
            return Some(old.clone());
        }
        Some(self.take(q, h))
    }

    /// Takes the figures of every queue that keeps usage, if [`SHOW_EVERY`] has passed.
    pub fn refresh_shown(&mut self, now: Instant) {
        if self.shown_at.is_some_and(|t| now < t + SHOW_EVERY) || self.at_ms.is_none() {
            return;
        }
        self.shown_at = Some(now);
        let Some(tree) = self.tree.clone() else {
            return;
        };
        self.shown.clear();
        for q in 1..tree.len() {
            let h = self.ledger.half_life_ms[q];
            if h > 0 {
                self.shown.insert(tree.name(q).to_string(), self.take(q, h));
            }
        }
    }

    fn take(&self, q: usize, h: u64) -> QueueUsage {
        let u = &self.ledger.usage[q];
        let held = self.ledger.held[q];
        let mean = u.mean(h, &held);
        QueueUsage {
            held_gpus: held[0] as f64 / 1e3,
            held_cpus: held[1] as f64 / 1e3,
            held_memory_mib: held[2] as f64,
            half_life: show_half_life(h),
            updated: format_time_ms(self.at_ms.unwrap_or(0)),
            gpu_seconds: round3(u.dims[0] / 1e3),
            cpu_seconds: round3(u.dims[1] / 1e3),
            memory_mib_seconds: round3(u.dims[2]),
            decayed_gpus: show_amount(0, mean[0].round().max(0.0) as u64),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// RFC 3339 UTC with milliseconds.
fn format_time_ms(ms: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00.000Z".into())
}

fn parse_time_ms(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_back_as_written() {
        let ms = 1_795_000_000_123;
        let text = format_time_ms(ms);
        assert_eq!(text, "2026-11-18T11:06:40.123Z");
        assert_eq!(parse_time_ms(&text), Some(ms));
        assert_eq!(
            parse_time_ms("2026-11-18T11:06:40Z"),
            Some(1_795_000_000_000)
        );
        assert_eq!(parse_time_ms("yesterday"), None);
    }
}
