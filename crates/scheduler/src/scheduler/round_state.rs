//! One round's own state (kube-scheduler's CycleState), and what deciding one unit reads
//! beyond the snapshot. Made when the round starts, dropped when it ends: nothing in them
//! outlives the round.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuplace_core::waiting::{Ending, Position, Start};
use gpuplace_model::Request;

use crate::framework::volumes::VolumeIndex;
use crate::snapshot::Snapshot;

/// One round's own state.
pub(super) struct RoundState {
    /// The round's time.
    pub now: Instant,
    /// Claims and volumes (built only when a waiting pod has claims).
    pub volumes: VolumeIndex,
    /// Whether this round orders units by queue (some queue is defined or named).
    pub queues_in_use: bool,
    /// How long each preemption search took (handed to the round's report).
    pub preemption_times: Vec<Duration>,
    /// The round's order, for the pods that wait in it.
    pub order: RoundOrder,
}

impl RoundState {
    /// A round at `now` with `volumes`.
    pub fn new(now: Instant, volumes: VolumeIndex) -> Self {
        RoundState {
            now,
            volumes,
            queues_in_use: false,
            preemption_times: Vec::new(),
            order: RoundOrder::default(),
        }
    }
}

/// What deciding one unit reads beyond the snapshot: the round's own state and the nodes
/// its queue's per-model limits leave (`None`: any).
pub(super) struct Deciding<'r> {
    pub round: &'r mut RoundState,
    pub narrow: Option<&'r [bool]>,
}

/// The round's order and what it placed, for the pods that wait in it.
#[derive(Default)]
pub(super) struct RoundOrder {
    /// Units taken from the order so far, and in all.
    pub popped: usize,
    pub total: usize,
    /// By queue: units taken so far, and in all.
    pub queue_popped: HashMap<usize, usize>,
    pub queue_total: HashMap<usize, usize>,
    /// By queue: milli-GPU placed this round.
    pub placed: HashMap<usize, u64>,
    /// The running pods that declare their end (taken once a round, when a pod waits).
    endings: Option<Vec<Owned>>,
    /// Expected starts by request, for pods that may use every node.
    pub starts: HashMap<String, Start>,
}

/// A running pod's place and declared end.
struct Owned {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    end_ms: i64,
}

impl RoundOrder {
    /// A unit of queue `q` (`None` without queues) is taken from the order.
    pub fn take(&mut self, q: Option<usize>) {
        self.popped += 1;
        if let Some(q) = q {
            *self.queue_popped.entry(q).or_default() += 1;
        }
    }

    /// Queue `q`'s unit placed `milli` GPU.
    pub fn placed(&mut self, q: usize, milli: u64) {
        *self.placed.entry(q).or_default() += milli;
    }

    pub fn position(&self, q: Option<usize>) -> Position {
        Position {
            in_cluster: self.popped.max(1),
            of_cluster: self.total.max(self.popped),
            in_queue: q.map(|q| {
                let i = self.queue_popped.get(&q).copied().unwrap_or(1).max(1);
                (i, self.queue_total.get(&q).copied().unwrap_or(i).max(i))
            }),
        }
    }

    /// The running pods that declare their end, as core's expected start reads them
    /// (taken from `snapshot` once a round).
    pub fn endings(&mut self, snapshot: &Snapshot) -> Vec<Ending<'_>> {
        self.endings
            .get_or_insert_with(|| owned_endings(snapshot))
            .iter()
            .map(|o| Ending {
                node: o.node,
                request: &o.request,
                gpus: &o.gpus,
                end_ms: o.end_ms,
            })
            .collect()
    }

    /// Milli-GPU placed this round by queues other than `q`.
    pub fn placed_by_others(&self, q: usize) -> u64 {
        self.placed
            .iter()
            .filter(|(k, _)| **k != q)
            .map(|(_, m)| m)
            .sum()
    }
}

/// The running pods of `snapshot` that declare their end.
fn owned_endings(snapshot: &Snapshot) -> Vec<Owned> {
    let mut out = Vec::new();
    for pod in snapshot.placed.iter().flatten() {
        let (Ok(Some(end)), Some(held)) = (&pod.expected_end, snapshot.held.get(&pod.key.uid))
        else {
            continue;
        };
        out.push(Owned {
            node: held.node,
            request: held.request.clone(),
            gpus: held.gpus.clone(),
            end_ms: end.as_millisecond(),
        });
    }
    out
}
