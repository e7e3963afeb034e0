//! Why each pod that waits does, in one structured reason (core's [`Waiting`]) written after
//! its `FailedScheduling` message: what blocks it (its queue's limit, others ahead in fair
//! order, capacity, fragmentation, its own constraints, its gang), its place in the round's
//! order and its queue's, its queue's standing (usage over time included), what would
//! unblock it (PostFilter's plan under way, or why there is none) and when it is expected
//! to start (by the declared ends of the pods running: `gpuplace.io/expected-duration` or
//! `activeDeadlineSeconds`). The Event, the pod's condition, `gpuplace status` and the live
//! map carry the same text.

use std::time::SystemTime;

use gpuplace_core::fairshare::{Picker, show_amount, show_half_life};
use gpuplace_core::shortage::Shortage;
use gpuplace_core::waiting::{Blocker, Ending, QueueStanding, Start, Waiting, expected_start};
use gpuplace_model::Request;

use super::Scheduler;
use super::round_state::RoundState;
use crate::api::ClusterApi;
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::UnfitFound;
use crate::snapshot::Snapshot;

fn time_text(ms: i64) -> String {
    crate::clock::rfc3339(
        SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64),
    )
}

/// `waiting` as written after a pod's message, at `now_ms` (the scheduler's wall clock).
pub(super) fn segments(waiting: &Waiting, now_ms: i64) -> String {
    waiting.segments(now_ms, &time_text)
}

impl<A: ClusterApi> Scheduler<A> {
    /// Why `pod` waits, taken as its round finds it (before PostFilter's plan is carried
    /// out, which holds places that would read as taken), from what its trial found it
    /// short of (`found`: its GPU shortage over the nodes its filters left; `None`: GPUs
    /// are not what it lacks). The caller adds what would unblock it and renders it
    /// ([`segments`]).
    pub(super) fn why_waiting<U>(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        pod: &PodInfo,
        found: Option<&UnfitFound>,
        fair: Option<(&Picker<'_, U>, usize)>,
    ) -> Waiting {
        let blocker = match found.and_then(|f| f.shortage.as_ref()) {
            Some(shortage) => self.shortage_blocker(shortage, round, pod, fair.map(|(_, q)| q)),
            None => Blocker::Constraints,
        };
        let mask = found.and_then(|f| f.mask.as_deref());
        self.told(snapshot, round, pod, blocker, mask, fair)
    }

    /// The blocker of a pod short of GPUs: others ahead when what queues before it took
    /// this round would have covered it.
    fn shortage_blocker(
        &self,
        shortage: &Shortage,
        round: &RoundState,
        pod: &PodInfo,
        queue: Option<usize>,
    ) -> Blocker {
        let asked = pod.demand.as_ref().map_or(0, |d| {
            u64::from(d.request.gpu_count) * u64::from(d.request.gpu_milli)
        });
        match shortage {
            Shortage::Capacity { free, .. }
                if queue.is_some_and(|q| {
                    u64::from(*free) * 1000 + round.order.placed_by_others(q) >= asked
                }) =>
            {
                Blocker::Ahead
            }
            Shortage::Capacity { .. } => Blocker::Capacity,
            Shortage::Fragmentation { .. } => Blocker::Fragmentation,
        }
    }

    /// Why `pod` waits when the caller knows what blocks it (a limit, a queue), or once
    /// found: with its position, its queue's standing and its expected start.
    pub(super) fn told<U>(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        pod: &PodInfo,
        blocker: Blocker,
        mask: Option<&[bool]>,
        fair: Option<(&Picker<'_, U>, usize)>,
    ) -> Waiting {
        let request = pod.demand.as_ref().ok().map(|d| &d.request);
        let queue = fair.map(|(_, q)| q);
        let now_ms = self.wall_ms();
        let start = match (&blocker, request) {
            (Blocker::QueueLimit | Blocker::Queue | Blocker::Gang, _) | (_, None) => None,
            (_, Some(request)) => {
                match self.expected(snapshot, round, request, mask, now_ms) {
                    // GPUs are not what it waits for: no start to tell from them.
                    Start::At(ms) if ms <= now_ms => None,
                    Start::Unknown if blocker == Blocker::Constraints => None,
                    start => Some(start),
                }
            }
        };
        Waiting {
            blocker,
            position: Some(round.order.position(queue)),
            queue: fair.map(|(picker, q)| self.standing(picker, q)),
            unblock: None,
            start,
        }
    }

    fn standing<U>(&self, picker: &Picker<'_, U>, q: usize) -> QueueStanding {
        let tree = picker.tree();
        let spec = &tree.nodes[q].spec;
        QueueStanding {
            name: tree.name(q).to_string(),
            allocated: show_amount(0, picker.alloc(q).dims[0]),
            fair_share: show_amount(0, picker.fair_share(q)[0]),
            guaranteed: show_amount(0, spec.guaranteed.floor(0)),
            limit: spec.limit.dims[0].map_or_else(|| "none".into(), |l| show_amount(0, l)),
            decayed: self.usage.mean_of(q).map(|(mean, h)| {
                (
                    show_amount(0, mean.round().max(0.0) as u64),
                    show_half_life(h),
                )
            }),
        }
    }

    /// When a pod asking `request` on the nodes of `mask` is expected to start.
    fn expected(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        request: &Request,
        mask: Option<&[bool]>,
        now_ms: i64,
    ) -> Start {
        let key = format!("{request:?}");
        if mask.is_none()
            && let Some(s) = round.order.starts.get(&key)
        {
            return s.clone();
        }
        let endings: Vec<Ending<'_>> = round.order.endings(snapshot);
        let start = expected_start(&snapshot.state, request, mask, &endings, now_ms);
        if mask.is_none() {
            round.order.starts.insert(key, start.clone());
        }
        start
    }
}

/// The segments of a gang member that waits for its gang (what PostFilter found for the
/// gang, when it ran).
pub(super) fn gang_segments(unblock: Option<String>, now_ms: i64) -> String {
    Waiting {
        blocker: Blocker::Gang,
        position: None,
        queue: None,
        unblock,
        start: None,
    }
    .segments(now_ms, &time_text)
}
