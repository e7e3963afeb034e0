//! Queues' status on the server: what each queue holds, waits for, its fair share and
//! what it borrows, and whether it is valid (`Valid` `False` with why, and one Warning
//! Event `Rejected` on the queue each time its problem changes). Written by the leader, at
//! most once every [`WRITE_EVERY`] ([`WRITE_EVERY_BUSY`] while Bindings are in flight) and
//! only for queues whose status changed; the last figures are written by an idle round once
//! that time has passed, so the status ends true.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuplace_core::fairshare::{DIM_NAMES, DIMS, show_amount};

use crate::api::ClusterView;
use crate::k8s::queue::{QueueCondition, QueueStatus, QueueUsage};

/// The shortest time between two batches of status writes.
pub const WRITE_EVERY: Duration = Duration::from_secs(2);

/// The same while Bindings are in flight: status writes give way to them.
pub const WRITE_EVERY_BUSY: Duration = Duration::from_secs(10);

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
    pub(crate) wanted: BTreeMap<String, QueueStatus>,
    pub(crate) last_write: Option<Instant>,
    /// The problem last told in an Event, per queue.
    pub(crate) told: HashMap<String, String>,
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
}
