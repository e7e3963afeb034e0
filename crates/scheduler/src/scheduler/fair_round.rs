//! A round with queues: units served in the queues' fair order, each checked against its
//! queue's limits (per GPU model too) before it is decided, what it takes counted at once
//! so the next unit is ordered by the allocations as they now stand; the queues' figures
//! (allocated, fair share, pending, reclaimed) handed to the round's report.

use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::fairshare::{DIMS, Picker, QueueTree, Res};
use gpuplace_core::waiting::{Blocker, Waiting};
use tracing::{debug, info};

use super::queue_status::{QueueFigures, WRITE_EVERY, WRITE_EVERY_BUSY, Yield};
use super::round_state::RoundState;
use super::units::{Order, Unit};
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::k8s::pod_info::PodInfo;
use crate::k8s::queue::QueueStatus;
use crate::shared::queues::{Standing, asked};
use crate::snapshot::Snapshot;

/// A unit's queue limits: it was refused, or it may go to these nodes (`None`: any).
pub(super) enum Limits {
    Refused,
    Within(Option<Vec<bool>>),
}

impl<A: ClusterApi> Scheduler<A> {
    /// Decides the round's units in the queues' fair order; units whose queue is missing or
    /// cannot take pods are told why and wait.
    pub(super) async fn decide_fairly<'a>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        waiting: &[&'a Arc<PodInfo>],
        units: Vec<Unit<'a>>,
        round: &mut RoundState,
        report: &mut RoundReport,
    ) {
        let now = round.now;
        let started = Instant::now();
        let tree = self.queues.tree();
        let nominations = self.cluster.nominations();
        let built = self.cluster.builds;
        let mut standing = Standing::measure(&mut self.queues, snapshot, built, waiting, &|uid| {
            nominations.get(uid).is_some()
        });
        self.count_steers(&mut standing, waiting);
        let (fair, mut picker) = standing.picker::<Unit<'a>>(&tree);
        self.usage.advance(&tree, view, picker.allocations(), now);
        if self.usage.decays() {
            picker = picker.with_usage(&self.usage.means());
        }
        self.usage.refresh_shown(now);
        let mut refused = Vec::new();
        for unit in units {
            // A gang belongs to its first member's queue.
            let first = unit.pods()[0];
            match self.queues.of(first) {
                Ok(q) => picker.push(q, unit),
                Err(e) => refused.push((unit.pods(), e)),
            }
        }
        report.timings.queues += started.elapsed();
        for (pods, why) in refused {
            let none: Option<(&Picker<'_, ()>, usize)> = None;
            let mut waiting = self.told(snapshot, round, pods[0], Blocker::Queue, none);
            waiting.gang = super::waiting::gang_standing(view, &pods, None);
            waiting.unblock = Some("its queue made, or fixed".into());
            let message = super::waiting::render(
                &waiting,
                &format!("{why}; the pod waits until it can be served."),
                self.wall_ms(),
            );
            self.refuse(&pods, message, waiting, now, report);
        }
        self.decide_units(snapshot, view, Order::Fair(&mut picker), round, report)
            .await;
        let started = Instant::now();
        self.usage.hold(picker.allocations());
        report.queues = figures(&tree, &standing, &fair, picker.allocations(), &self.queues);
        let half_life_problems = self.queues.half_life_problems();
        for (q, f) in report.queues.iter_mut().enumerate() {
            f.usage = self.usage.shown(q + 1, &f.name);
            f.half_life_problem = half_life_problems.get(&f.name).cloned();
        }
        report.timings.queues += started.elapsed();
    }

    /// Whether `pods` fit under their queue's limits; if not they are told so and wait.
    /// With per-model limits, the nodes whose model has room left (core's
    /// `Picker::model_mask`, as the timeline narrows).
    pub(super) fn within_limit(
        &mut self,
        (snapshot, view): (&Snapshot, &ClusterView),
        order: &mut Order<'_, '_, '_>,
        q: usize,
        pods: &[&Arc<PodInfo>],
        round: &mut RoundState,
        report: &mut RoundReport,
    ) -> Limits {
        let Order::Fair(picker) = order else {
            return Limits::Within(None);
        };
        // A moved pod's replacement takes back the place its queue held before the move
        // (counted as held meanwhile): the move was the scheduler's, and the workload was
        // admitted under the limit when it first ran, so the limit does not strand it, as
        // the timeline binds a replacement to its planned place without asking (seed 842:
        // others of its queue, nominated since, had taken the queue to its limit).
        if pods.iter().all(|p| self.steers.find_for(p).is_some()) {
            return Limits::Within(None);
        }
        let want = asked(pods);
        if let Some(hit) = picker.limit_hit(q, &want) {
            let fair = Some((&**picker, q));
            let mut waiting = self.told(snapshot, round, pods[0], Blocker::QueueLimit, fair);
            waiting.gang = super::waiting::gang_standing(view, pods, None);
            waiting.unblock = Some(format!(
                "pods of queue {} ending, or its limit raised",
                hit.queue
            ));
            let message = format!("0/{} nodes are available: {hit}.", snapshot.nodes.len());
            let message = super::waiting::render(&waiting, &message, self.wall_ms());
            self.refuse(pods, message, waiting, round.now, report);
            return Limits::Refused;
        }
        Limits::Within(picker.model_mask(q, want.dims[0], &snapshot.state))
    }

    /// Moved pods' replacements keep their queue's share while their controllers make
    /// them: each place planned for one (a steer) counts as held in the moved pod's queue,
    /// as a nominee's request does, and a waiting replacement not as demand again. The
    /// timeline starts a replacement the moment its pod moves; without this another pod of
    /// the queue took the share the move gave back, and the replacement waited at its
    /// queue's limit until its planned place was dropped (differential seed 584).
    fn count_steers(&self, standing: &mut Standing, waiting: &[&Arc<PodInfo>]) {
        if self.steers.is_empty() {
            return;
        }
        for s in self.steers.iter() {
            if let Ok(q) = (self.queues).of_key(&s.moved.namespace, s.queue_label.as_deref()) {
                standing.held[q].add(&Res::of(&s.request, None));
            }
        }
        let mut claimed: Vec<&str> = Vec::new();
        for pod in waiting {
            let Ok(q) = self.queues.of(pod) else {
                continue;
            };
            let steer = (self.steers.matching(pod)).find(|s| !claimed.contains(&&*s.moved.uid));
            if let Some(s) = steer {
                claimed.push(&s.moved.uid);
                standing.pending[q].sub(&Res::of(&s.request, None));
            }
        }
    }

    /// Counts what `pods` now hold in their queue: those reserved this round, those
    /// nominated (by preemption or reclaim, this round or before), and replacements whose
    /// planned places are still theirs.
    pub(super) fn account(
        &self,
        snapshot: &Snapshot,
        picker: &mut Picker<'_, Unit<'_>>,
        q: usize,
        pods: &[&Arc<PodInfo>],
    ) {
        for p in pods {
            if self.cluster.is_reserved(&p.key.uid) {
                if let Some(h) = snapshot.held.get(&p.key.uid) {
                    let model = snapshot.state.inventory(h.node).gpu_model();
                    picker.placed(q, &Res::of(&h.request, Some(model)));
                }
            } else if let Some(n) = self.cluster.nomination(&p.key.uid) {
                picker.placed(q, &Res::of(&n.request, None));
            } else if let Some(s) = self.steers.find_for(p) {
                picker.placed(q, &Res::of(&s.request, None));
            }
        }
    }

    /// Takes `pods`' nominations and planned places out of their queue's allocation (as
    /// the round's standing counted them) while they are decided again.
    pub(super) fn unaccount(
        &self,
        picker: &mut Picker<'_, Unit<'_>>,
        q: usize,
        pods: &[&Arc<PodInfo>],
    ) {
        for p in pods {
            if let Some(n) = self.cluster.nomination(&p.key.uid) {
                picker.removed(q, &Res::of(&n.request, None));
            } else if let Some(s) = self.steers.find_for(p) {
                picker.removed(q, &Res::of(&s.request, None));
            }
        }
    }

    /// `pods` wait: a FailedScheduling Event with `message`, parked until the cluster
    /// changes.
    pub(super) fn refuse(
        &mut self,
        pods: &[&Arc<PodInfo>],
        message: String,
        record: Waiting,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let record = Arc::new(record);
        for p in pods {
            debug!(pod = %p.key, %message, "refused by its queue");
            report.unschedulable += 1;
            self.queue.unschedulable(&p.key.uid, now);
            self.events
                .failed(&p.key, message.clone(), Some(Arc::clone(&record)));
        }
    }
}

fn figures(
    tree: &QueueTree,
    standing: &Standing,
    fair: &[[u64; DIMS]],
    alloc: &[Res],
    queues: &crate::shared::queues::Queues,
) -> Vec<QueueFigures> {
    let problems = queues.problems();
    let mut pending = vec![[0u64; DIMS]; tree.len()];
    let mut pending_pods = vec![0u32; tree.len()];
    for q in 1..tree.len() {
        for a in tree.path(q) {
            for (sum, asked) in pending[a].iter_mut().zip(standing.pending[q].dims) {
                *sum += asked;
            }
            pending_pods[a] += standing.pending_pods[q];
        }
    }
    (1..tree.len())
        .map(|q| {
            let spec = &tree.nodes[q].spec;
            QueueFigures {
                name: spec.name.clone(),
                allocated: alloc[q].dims,
                guaranteed: std::array::from_fn(|d| spec.guaranteed.floor(d)),
                fair_share: fair[q],
                pending: pending[q],
                pending_pods: pending_pods[q],
                problem: problems.get(&spec.name).cloned(),
                limit: spec.limit.dims,
                usage: None,
                half_life_problem: None,
            }
        })
        .collect()
}

impl<A: ClusterApi> Scheduler<A> {
    /// Sends the statuses that changed, and tells new problems, if it is time: every
    /// [`WRITE_EVERY`], or every [`WRITE_EVERY_BUSY`] while Bindings are in flight (they
    /// go first; counted from when they got busy too, so a burst starts with no status
    /// write). The writes go out together off the round, not one after another; the
    /// next flush takes their outcome (a write that failed is sent again then).
    pub(super) async fn flush_queue_statuses(&mut self, now: Instant) {
        self.send_queue_statuses(now, false).await;
    }

    /// The same whatever the time since the last write (a leader's last usage record,
    /// shutdown once the Bindings are drained).
    pub(super) async fn flush_queue_statuses_now(&mut self, now: Instant) {
        self.send_queue_statuses(now, true).await;
    }

    async fn send_queue_statuses(&mut self, now: Instant, force: bool) {
        self.queue_status.take_written();
        let busy = self.binder.in_flight() > 0;
        let w = &mut self.queue_status;
        w.busy_since = if busy {
            Some(w.busy_since.unwrap_or(now))
        } else {
            None
        };
        let (every, since) = if busy {
            (WRITE_EVERY_BUSY, w.last_write.max(w.busy_since))
        } else {
            (WRITE_EVERY, w.last_write)
        };
        let due = force || since.is_none_or(|t| now >= t + every);
        if !self.gate.is_open() || w.sending() || !due {
            return;
        }
        let changed: Vec<(String, QueueStatus)> = if force {
            w.wanted
                .iter()
                .filter(|(name, s)| w.written.get(*name) != Some(*s))
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect()
        } else {
            w.worth_writing(now)
        };
        if changed.is_empty() {
            return;
        }
        w.last_write = Some(now);
        for (name, _) in &changed {
            w.written_at.insert(name.clone(), now);
        }
        self.tell_problems(&changed).await;
        let to = Yield {
            load: self.binder.load(),
            gate: self.gate.clone(),
        };
        self.queue_status.send(self.api.clone(), to, changed);
    }

    /// A Warning Event `Rejected` on each queue whose problem is new.
    async fn tell_problems(&mut self, changed: &[(String, QueueStatus)]) {
        for (name, status) in changed {
            let problem = status
                .conditions
                .first()
                .filter(|c| c.status == "False")
                .map(|c| c.message.clone());
            let Some(p) = problem else {
                self.queue_status.told.remove(name);
                continue;
            };
            if self.queue_status.told.get(name) == Some(&p) {
                continue;
            }
            let message = format!("queue {name} serves no pod: {p}");
            match self
                .api
                .queue_event(name, "Warning", "Rejected", &message)
                .await
            {
                Ok(()) => {
                    self.queue_status.told.insert(name.clone(), p);
                }
                Err(e) => info!(queue = %name, error = %e, "queue Event not recorded"),
            }
        }
    }
}
