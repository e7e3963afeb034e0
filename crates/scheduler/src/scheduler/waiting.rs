//! Why each pod that waits does, in one structured record (core's [`Waiting`]) computed
//! here for single pods and gangs alike: what blocks it (its queue's limit, others ahead
//! in fair order, capacity of GPUs, CPU or memory, fragmentation, its own constraints, its
//! gang), its gang (members waiting, needed, fitting at once), its true place in the line
//! of every waiting unit and in its queue's, its queue's standing, what would unblock it
//! and when it is expected to start (the line projected: [`super::line`]). Rendered with
//! the blocker and the start first; the Event and the condition carry it when its meaning
//! changed, the scheduler's memory always (`gpuplace status --scheduler`, the live map).

use std::sync::Arc;
use std::time::SystemTime;

use gpuplace_core::fairshare::{Picker, show_amount, show_half_life};
use gpuplace_core::shortage::Shortage;
use gpuplace_core::waiting::history::wait_class;
use gpuplace_core::waiting::told::{self, tell};
use gpuplace_core::waiting::{Blocker, GangStanding, QueueStanding, Resource, Start, Waiting};

use super::Scheduler;
use super::line::Line;
use super::round_state::RoundState;
use crate::api::{ClusterApi, ClusterView};
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::UnfitFound;
use crate::snapshot::Snapshot;

fn time_text(ms: i64) -> String {
    crate::clock::rfc3339(
        SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64),
    )
}

/// `waiting` with kube-scheduler's `message`, as written, at `now_ms` (the scheduler's
/// wall clock).
pub(super) fn render(waiting: &Waiting, message: &str, now_ms: i64) -> String {
    waiting.render(message, now_ms, &time_text)
}

/// The blocker of a unit that fits nowhere, from what its trial found it short of
/// (`None`: not tried); `placed_by_others` is what other queues placed this round (a GPU
/// shortage they would have covered is "others ahead"), `asked` its milli-GPU.
pub(super) fn blocker_of(
    found: Option<&UnfitFound>,
    fair_placed_by_others: Option<u64>,
    asked: u64,
) -> Blocker {
    if found.is_some_and(|f| f.planned_node.is_some()) {
        return Blocker::PlannedPlace;
    }
    match found.and_then(|f| f.shortage.as_ref()) {
        Some(Shortage::Capacity { free, .. })
            if fair_placed_by_others.is_some_and(|o| u64::from(*free) * 1000 + o >= asked) =>
        {
            Blocker::Ahead
        }
        Some(Shortage::Capacity { .. }) => Blocker::Capacity(Resource::Gpu),
        Some(Shortage::Fragmentation { .. }) => Blocker::Fragmentation,
        None => match found.and_then(|f| f.short_of) {
            Some(r) => Blocker::Capacity(r),
            None if found.is_some_and(|f| f.by_claim_selectors) => Blocker::ClaimSelectors,
            None => Blocker::Constraints,
        },
    }
}

/// Milli-GPU `pods` ask.
fn asked(pods: &[&Arc<PodInfo>]) -> u64 {
    pods.iter()
        .filter_map(|p| p.demand.as_ref().ok())
        .map(|d| u64::from(d.request.gpu_count) * u64::from(d.request.gpu_milli))
        .sum()
}

impl<A: ClusterApi> Scheduler<A> {
    /// What runs are expected from: the history and the Jobs of the last view.
    pub(super) fn runs(&self) -> super::line::Runs<'_> {
        super::line::Runs {
            history: &self.runs,
            jobs: &self.jobs,
        }
    }

    /// What nominees `uids` (a pod, or a gang's members) are told: when the last of their
    /// victims (the pods they preempted, reclaimed or moved) is gone (core's
    /// [`told::nominee`]); nothing where one's victims are not known (an adopted
    /// nomination) or are gone already.
    pub(super) fn nominees_start<'u>(
        &self,
        uids: impl Iterator<Item = &'u str>,
        view: &ClusterView,
    ) -> Option<Start> {
        let now_ms = self.wall_ms();
        let mut gone_by = now_ms;
        for uid in uids {
            let n = self.cluster.nomination(uid)?;
            gone_by = gone_by.max(super::preempt::victims_gone_by(n, view, now_ms)?);
        }
        told::nominee(gone_by, now_ms).map(Start::At)
    }

    /// Why `pods` (a pod, or a gang's members) wait, taken as the round finds them (before
    /// PostFilter's plan is carried out, which holds places that would read as taken), from
    /// what their trial found them short of (`found`). The caller adds its gang and what
    /// would unblock them.
    pub(super) fn why_waiting<U>(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        pods: &[&Arc<PodInfo>],
        found: Option<&UnfitFound>,
        fair: Option<(&Picker<'_, U>, usize)>,
    ) -> Waiting {
        let others = fair.map(|(_, q)| round.order.placed_by_others(q));
        let blocker = blocker_of(found, others, asked(pods));
        let mask = found.and_then(|f| f.mask.as_deref());
        let mut waiting = self.told_within(snapshot, round, pods[0], blocker, mask, fair);
        if let Some(node) = found.and_then(|f| f.planned_node) {
            // Its planned place comes free as the pods leaving its node go: it is told
            // when they are gone, as a nominee is.
            let now_ms = self.wall_ms();
            let on_node = snapshot.placed.get(node).into_iter().flatten();
            let gone_by = super::preempt::leaving_gone_by(on_node.map(|p| &**p));
            waiting.start = gone_by
                .and_then(|t| told::nominee(t, now_ms))
                .map(Start::At);
            waiting.unblock = Some(format!(
                "its planned place on node {} comes free as the pods there leave",
                snapshot.state.inventory(node).name
            ));
        }
        waiting
    }

    /// Why `pod` waits when the caller knows what blocks it (a limit, a queue), or once
    /// found: with its place in the line, its queue's standing and, when room is what it
    /// waits for, its expected start.
    pub(super) fn told<U>(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        pod: &PodInfo,
        blocker: Blocker,
        fair: Option<(&Picker<'_, U>, usize)>,
    ) -> Waiting {
        self.told_within(snapshot, round, pod, blocker, None, fair)
    }

    /// [`Self::told`] for a pod its filters keep to the nodes of `mask`.
    fn told_within<U>(
        &self,
        snapshot: &Snapshot,
        round: &mut RoundState,
        pod: &PodInfo,
        blocker: Blocker,
        mask: Option<&[bool]>,
        fair: Option<(&Picker<'_, U>, usize)>,
    ) -> Waiting {
        let now_ms = self.wall_ms();
        let queues_in_use = round.queues_in_use;
        let line = round.order.line.get_or_insert_with(|| {
            let queue_of = |p: &PodInfo| queues_in_use.then(|| self.queues.of(p).ok()).flatten();
            let nominee = |uid: &str| crate::shared::nominations::holds(snapshot, uid);
            Line::new(
                &round.order.waiting,
                &queue_of,
                &nominee,
                &self.runs(),
                now_ms,
            )
        });
        let start = if blocker.waits_for_room() {
            let start = self.starts.get(&pod.key.uid, round.now, || {
                line.start(&pod.key.uid, mask, snapshot, &self.runs(), now_ms)
            });
            let class = pod
                .demand
                .as_ref()
                .map_or(0, |d| wait_class(d.request.gpu_count, d.request.gpu_milli));
            // Nothing where it cannot beat "unknown", or where room is not what it waits
            // for after all.
            let ahead = line.ahead_of_class(&pod.key.uid);
            tell(&self.runs, class, &start, ahead, now_ms).and_then(|told| {
                self.starts.remember(&pod.key.uid, told.first);
                told.span.map(Start::At)
            })
        } else {
            None
        };
        Waiting {
            blocker,
            gang: None,
            position: line.position(&pod.key.uid),
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
}

/// The gang `pods` belong to, as the record shows it: its `namespace/name`, the members
/// waiting, its minMember from `view` (the members waiting when its PodGroup is not
/// there), and how many fit at once when a trial said.
pub(super) fn gang_standing(
    view: &ClusterView,
    pods: &[&Arc<PodInfo>],
    fit: Option<u32>,
) -> Option<GangStanding> {
    let first = pods.first()?;
    let group = first.group.as_deref()?;
    let namespace = first.key.namespace.as_str();
    let min_member = view
        .group(namespace, group)
        .map_or(pods.len() as u32, |g| g.spec.min_member);
    Some(GangStanding {
        name: format!("{namespace}/{group}"),
        waiting: pods.len() as u32,
        min_member,
        fit,
    })
}
