//! Queues' status on the server: what each queue holds, waits for, its fair share and
//! what it borrows, and whether it is valid (`Valid` `False` with why, and one Warning
//! Event `Rejected` on the queue each time its problem changes). Written by the leader, at
//! most once every [`WRITE_EVERY`] ([`WRITE_EVERY_BUSY`] while Bindings are in flight,
//! counted from the last write or from when the Bindings got busy, whichever is later) and
//! only for queues whose status changed; the last figures are written by an idle round once
//! that time has passed, and on shutdown once the Bindings are drained, so the status ends
//! true. A status is written when it means something new: a condition changed or a figure
//! moved by more than [`MOVED_SHARE`], else at most every [`REFRESH_EVERY`]. A burst of Bindings shorter than [`WRITE_EVERY_BUSY`] thus sends no status write
//! while it lasts: measured on the real API server at 1,000 nodes and 5,000 pods, the 100
//! queues' first statuses, sent as the burst began, competed with its Bindings.
//!
//! A batch of writes runs off the round (a round never waits for it; one batch at a time,
//! its outcomes taken by the next flush): found on the real API server at 5,000 nodes and
//! 100 queues, a round that awaited its 100 status writes left the Binding slots idle
//! meanwhile. While the Bindings are busy the batch yields to them as Events do, at most
//! [`WRITES_WHILE_BUSY`] at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpuplace_core::fairshare::{DIM_NAMES, DIMS, show_amount};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::info;

use crate::api::{ApiError, ClusterApi, ClusterView};
use crate::k8s::leader::Gate;
use crate::k8s::queue::{QueueCondition, QueueStatus, QueueUsage};
use crate::shared::bind::BindLoad;

/// The shortest time between two batches of status writes.
pub const WRITE_EVERY: Duration = Duration::from_secs(2);

/// The same while Bindings are in flight: status writes give way to them.
pub const WRITE_EVERY_BUSY: Duration = Duration::from_secs(10);

/// A status whose figures all moved by at most this share (and whose conditions did not
/// change) is not written again before [`REFRESH_EVERY`]: decayed usage, pending counts and
/// shares drift a little every round, and every write is paid by the whole cluster.
pub const MOVED_SHARE: f64 = 0.01;

/// A status is written again at least this often while its figures drift.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5 * 60);

/// Status writes in flight at once while the Bindings are quiet.
const WRITES_AT_ONCE: usize = 16;

/// The same while the Bindings are busy.
pub const WRITES_WHILE_BUSY: usize = 2;

/// One queue's status write, ended.
pub(crate) struct Written {
    name: String,
    status: QueueStatus,
    result: Result<(), ApiError>,
}

/// One queue's figures after a round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueFigures {
    pub name: String,
    /// Held by its pods and its children's (GPU milli, CPU milli, memory MiB).
    pub allocated: [u64; DIMS],
    pub guaranteed: [u64; DIMS],
    pub fair_share: [u64; DIMS],
    /// Asked for by its waiting pods.
    pub pending: [u64; DIMS],
    pub pending_pods: u32,
    /// `None` when it serves pods; else why not.
    pub problem: Option<String>,
    pub limit: [Option<u64>; DIMS],
    /// Its usage over time as shown (none without a half-life).
    pub usage: Option<QueueUsage>,
    /// Why the half-life its spec sets was refused.
    pub half_life_problem: Option<String>,
}

/// Statuses as last written and as the latest round would have them.
#[derive(Default)]
pub struct StatusWriter {
    pub(crate) written: HashMap<String, QueueStatus>,
    /// When each status was last sent (on the rounds' clock).
    pub(crate) written_at: HashMap<String, Instant>,
    pub(crate) wanted: BTreeMap<String, QueueStatus>,
    pub(crate) last_write: Option<Instant>,
    /// Since when Bindings have been in flight without a pause (`None` while none are).
    pub(crate) busy_since: Option<Instant>,
    /// The problem last told in an Event, per queue.
    pub(crate) told: HashMap<String, String>,
    /// The batch of writes in flight (at most one), owned here: dropped, it is aborted.
    batch: JoinSet<Vec<Option<Written>>>,
    /// The figures each wanted status was made from: a queue whose figures did not change
    /// keeps its status (a round changes a few queues' figures; making every status anew,
    /// each amount written out, cost more than the round's decisions with 100 queues).
    figures: HashMap<String, QueueFigures>,
}

fn amounts(values: &[u64; DIMS], skip_zero: bool) -> BTreeMap<String, String> {
    (0..DIMS)
        .filter(|&d| !(skip_zero && values[d] == 0))
        .map(|d| (DIM_NAMES[d].to_string(), show_amount(d, values[d])))
        .collect()
}

/// The status `f` says (`since`: the Valid condition's transition time, kept while the
/// condition holds).
fn status_of(f: &QueueFigures, previous: Option<&QueueStatus>, now: &str) -> QueueStatus {
    let borrowed: [u64; DIMS] =
        std::array::from_fn(|d| f.allocated[d].saturating_sub(f.guaranteed[d]));
    let (status, reason, message) = match &f.problem {
        None => ("True", "Accepted", String::new()),
        Some(p) => ("False", "Rejected", p.clone()),
    };
    let since = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Valid"))
        .filter(|c| c.status == status && c.message == message)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    QueueStatus {
        allocated: amounts(&f.allocated, false),
        pending: amounts(&f.pending, true),
        fair_share: amounts(&f.fair_share, false),
        borrowed: amounts(&borrowed, true),
        pending_pods: f.pending_pods,
        guaranteed_gpus: show_amount(0, f.guaranteed[0]),
        limit_gpus: f.limit[0].map_or_else(|| "none".to_string(), |l| show_amount(0, l)),
        allocated_gpus: show_amount(0, f.allocated[0]),
        fair_share_gpus: show_amount(0, f.fair_share[0]),
        usage: f.usage.clone(),
        conditions: std::iter::once(QueueCondition {
            type_: "Valid".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: Some(since),
        })
        .chain(half_life_condition(f, previous, now))
        .collect(),
    }
}

/// `UsageHalfLife` `False` while the half-life the spec sets is refused (kept since the
/// refusal).
fn half_life_condition(
    f: &QueueFigures,
    previous: Option<&QueueStatus>,
    now: &str,
) -> Option<QueueCondition> {
    let message = f.half_life_problem.clone()?;
    let since = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "UsageHalfLife"))
        .filter(|c| c.message == message)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    Some(QueueCondition {
        type_: "UsageHalfLife".into(),
        status: "False".into(),
        reason: "Refused".into(),
        message,
        last_transition_time: Some(since),
    })
}

impl StatusWriter {
    /// Takes the round's figures for the queues that exist as objects.
    pub fn want(&mut self, figures: &[QueueFigures], view: &ClusterView, now: &str) {
        let objects: HashSet<&str> = view
            .queues
            .iter()
            .filter_map(|q| q.metadata.name.as_deref())
            .collect();
        let mut wanted = BTreeMap::new();
        for f in figures.iter().filter(|f| objects.contains(f.name.as_str())) {
            let unchanged = self.figures.get(&f.name) == Some(f);
            let status = match self.wanted.remove(&f.name) {
                Some(kept) if unchanged => kept,
                earlier => {
                    let previous = self.written.get(&f.name).or(earlier.as_ref());
                    let status = status_of(f, previous, now);
                    self.figures.insert(f.name.clone(), f.clone());
                    status
                }
            };
            wanted.insert(f.name.clone(), status);
        }
        self.figures.retain(|name, _| wanted.contains_key(name));
        self.wanted = wanted;
    }

    /// Whether a batch of writes is still in flight.
    pub(crate) fn sending(&self) -> bool {
        !self.batch.is_empty()
    }

    /// Takes the outcome of a batch that ended, without waiting.
    pub(crate) fn take_written(&mut self) {
        while let Some(ended) = self.batch.try_join_next() {
            self.record(ended);
        }
    }

    /// Waits for the batch in flight and takes its outcome.
    pub(crate) async fn finish(&mut self) {
        while let Some(ended) = self.batch.join_next().await {
            self.record(ended);
        }
    }

    /// The wanted statuses worth a write at `now`: new, a condition changed, a figure
    /// moved by more than [`MOVED_SHARE`], or drifted for [`REFRESH_EVERY`].
    pub(crate) fn worth_writing(&self, now: Instant) -> Vec<(String, QueueStatus)> {
        self.wanted
            .iter()
            .filter(|(name, wanted)| match self.written.get(*name) {
                None => true,
                Some(written) if written == *wanted => false,
                Some(written) => {
                    let stale = self
                        .written_at
                        .get(*name)
                        .is_none_or(|at| now >= *at + REFRESH_EVERY);
                    stale || moved(written, wanted)
                }
            })
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect()
    }

    fn record(&mut self, ended: Result<Vec<Option<Written>>, tokio::task::JoinError>) {
        let writes = match ended {
            Ok(writes) => writes,
            Err(e) => {
                info!(error = %e, "queue status writes stopped");
                return;
            }
        };
        for Written {
            name,
            status,
            result,
        } in writes.into_iter().flatten()
        {
            match result {
                Ok(()) => {
                    self.written.insert(name, status);
                }
                Err(e) => info!(queue = %name, error = %e, "queue status not written"),
            }
        }
    }

    /// Sends `changed` as one batch off the round (none may be in flight); a write not yet
    /// sent when `gate` closes is not sent (a leader that lost the lease writes nothing).
    pub(crate) fn send<A: ClusterApi>(
        &mut self,
        api: A,
        to: Yield,
        changed: Vec<(String, QueueStatus)>,
    ) {
        debug_assert!(!self.sending(), "one batch of status writes at a time");
        self.batch.spawn(write_batch(api, to, changed));
    }
}

/// Whether `new` says something else than `old`: any text but a number changed, or a
/// number (of a figure such as `2.5`, `8Gi`, a count) moved by more than [`MOVED_SHARE`].
fn moved(old: &QueueStatus, new: &QueueStatus) -> bool {
    match (serde_json::to_value(old), serde_json::to_value(new)) {
        (Ok(a), Ok(b)) => value_moved(&a, &b),
        _ => true,
    }
}

fn value_moved(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        // When the usage figures were taken moves with every round: the figures say it.
        (Value::Object(x), Value::Object(y)) => {
            x.len() != y.len()
                || x.iter()
                    .filter(|(k, _)| *k != "updated")
                    .any(|(k, v)| y.get(k).is_none_or(|w| value_moved(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() != y.len() || x.iter().zip(y).any(|(v, w)| value_moved(v, w))
        }
        (Value::Number(x), Value::Number(y)) => {
            number_moved(x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0))
        }
        (Value::String(x), Value::String(y)) => match (amount(x), amount(y)) {
            (Some((v, unit)), Some((w, unit2))) if unit == unit2 => number_moved(v, w),
            _ => x != y,
        },
        _ => a != b,
    }
}

fn number_moved(a: f64, b: f64) -> bool {
    (a - b).abs() > MOVED_SHARE * a.abs().max(b.abs())
}

/// `2.5` -> (2.5, ""), `8Gi` -> (8, "Gi"); `None` for other text.
fn amount(text: &str) -> Option<(f64, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    if unit.contains(|c: char| !c.is_ascii_alphabetic()) {
        return None;
    }
    number.parse().ok().map(|v| (v, unit))
}

/// What a batch of status writes gives way to: the Bindings' load, and the leadership.
pub(crate) struct Yield {
    pub load: BindLoad,
    pub gate: Gate,
}

/// Writes each status, [`WRITES_AT_ONCE`] at a time, each one waiting while the Bindings
/// are busy unless one of [`WRITES_WHILE_BUSY`] slots is free (`None`: not sent, the gate
/// closed).
async fn write_batch<A: ClusterApi>(
    api: A,
    Yield { load, gate }: Yield,
    changed: Vec<(String, QueueStatus)>,
) -> Vec<Option<Written>> {
    let trickle = Arc::new(Semaphore::new(WRITES_WHILE_BUSY));
    futures::stream::iter(changed)
        .map(|(name, status)| {
            let api = api.clone();
            let load = load.clone();
            let gate = gate.clone();
            let trickle = Arc::clone(&trickle);
            async move {
                let permit = load.give_way(&trickle).await;
                if !gate.is_open() {
                    return None;
                }
                let result = api.queue_status(&name, status.clone()).await;
                drop(permit);
                Some(Written {
                    name,
                    status,
                    result,
                })
            }
        })
        .buffer_unordered(WRITES_AT_ONCE)
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(allocated: &str, pending_pods: u32, message: &str) -> QueueStatus {
        QueueStatus {
            allocated_gpus: allocated.into(),
            pending_pods,
            conditions: vec![QueueCondition {
                type_: "Valid".into(),
                status: "True".into(),
                reason: "Accepted".into(),
                message: message.into(),
                last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            }],
            ..QueueStatus::default()
        }
    }

    #[test]
    fn a_status_is_written_when_it_moved_by_more_than_one_percent_or_aged() {
        let mut w = StatusWriter::default();
        let t0 = Instant::now();
        w.written.insert("a".into(), status("100", 200, ""));
        w.written_at.insert("a".into(), t0);
        // 0.5% more allocated, one pod fewer of 200: not worth a write.
        w.wanted.insert("a".into(), status("100.5", 199, ""));
        assert!(w.worth_writing(t0 + Duration::from_secs(60)).is_empty());
        // ...until five minutes passed.
        assert_eq!(w.worth_writing(t0 + REFRESH_EVERY).len(), 1);
        // 2% more: at once; another condition: at once.
        w.wanted.insert("a".into(), status("102", 200, ""));
        assert_eq!(w.worth_writing(t0).len(), 1);
        w.wanted.insert("a".into(), status("100", 200, "broken"));
        assert_eq!(w.worth_writing(t0).len(), 1);
        // The same: never.
        w.wanted.insert("a".into(), status("100", 200, ""));
        assert!(w.worth_writing(t0 + REFRESH_EVERY * 3).is_empty());
        // The usage record's time alone is no change; its figures are.
        let usage = |seconds: f64, updated: &str| QueueUsage {
            half_life: "1h".into(),
            updated: updated.into(),
            gpu_seconds: seconds,
            ..QueueUsage::default()
        };
        let mut with_usage = status("100", 200, "");
        with_usage.usage = Some(usage(1000.0, "2026-01-01T00:00:00.000Z"));
        w.written.insert("a".into(), with_usage.clone());
        with_usage.usage = Some(usage(1005.0, "2026-01-01T00:00:10.000Z"));
        w.wanted.insert("a".into(), with_usage.clone());
        assert!(w.worth_writing(t0 + Duration::from_secs(60)).is_empty());
        with_usage.usage = Some(usage(1020.0, "2026-01-01T00:00:20.000Z"));
        w.wanted.insert("a".into(), with_usage);
        assert_eq!(w.worth_writing(t0 + Duration::from_secs(60)).len(), 1);
        // Units are compared as such.
        assert!(value_moved(&"8Gi".into(), &"8Mi".into()));
        assert!(!value_moved(&"8Gi".into(), &"8.01Gi".into()));
    }
}
