//! One round: take the view if something changed, wake parked pods on the changes that
//! could help them, build the state with every reservation applied, and decide each due
//! unit (a pod, or a gang at its highest member's priority) in queue order.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::Decision;
use gpuplace_core::cycle::{self, Chained, Cycled};
use tracing::{debug, info, warn};

use super::chain::{PodSteps, Spent};
use super::fair_round::Limits;
use super::make_room::Made;
use super::reclaim::Fair;
use super::round_state::{Deciding, RoundState};
use super::units::{Order, Unit};
use super::{RoundReport, Scheduler};
use crate::api::{ApiError, BindRequest, ClusterApi, ClusterView, PodFeed, PodKey};
use crate::framework::filter::{VerdictCache, Verdicts};
use crate::k8s::demand::{ASSIGNMENT_ANNOTATION, Assignment, PodDemand};
use crate::k8s::pod_info::PodInfo;
use crate::shared::bind::{WriteFailure, WriteOutcome};
use crate::shared::cluster_cache::Brought;
use crate::shared::members::Steered;
use crate::snapshot::Snapshot;

impl<A: ClusterApi> Scheduler<A> {
    /// The clock of the round in progress (`schedule`'s `now`), so that holds and refusals
    /// age with the driver's clock (a simulated one in stresses), never the wall's.
    pub(super) fn round_clock(&self) -> Instant {
        self.last_round.unwrap_or_else(Instant::now)
    }

    /// The wall time of the round in progress, ms since the epoch.
    pub(super) fn wall_ms(&self) -> i64 {
        self.wall.ms(self.round_clock())
    }

    /// Whether nothing changed since the last round: no watch event, no write outcome,
    /// no backoff ended, and the gate as it was; and rebalancing, while pods wait, is not
    /// due to look (its pace changes with time alone: a quiet cluster is still looked at
    /// each interval, as the timeline replay looks at each of its rounds).
    fn is_idle(&self, now: Instant) -> bool {
        let look = !self.queue.is_empty()
            && self.gate.is_open()
            && (self.rebalancing).may_look(&self.config.defrag.settings, now);
        !look
            && !self.dirty
            && self.seen.generation == Some(self.api.generation())
            && self
                .last_round
                .is_some_and(|last| !self.queue.became_due(last, now))
            && !self.usage.show_due(now)
    }

    /// Decides every due unit; writes go to the bind stage (not waited for).
    pub async fn schedule(&mut self, now: Instant) -> Result<RoundReport, ApiError> {
        let mut report = self.take_finished_writes(now).await;
        if self.is_idle(now) {
            report.idle = true;
            self.flush_queue_statuses(now).await;
            return Ok(report);
        }
        debug!(
            dirty = self.dirty,
            seen = ?self.seen.generation,
            generation = self.api.generation(),
            due = self.last_round.is_none_or(|last| self.queue.became_due(last, now)),
            "round"
        );
        let started = Instant::now();
        let crate::api::FedView { view, feed } =
            self.api.view_since(self.cluster.cursor(), true).await?;
        report.timings.view = started.elapsed();
        let started = Instant::now();
        self.dirty = false;
        self.last_round = Some(now);
        self.observe(&view, &feed, now);
        self.queue.flush(now);
        self.room_memo.forget_before(now);
        let mut snapshot = self.state_for_round(&view, feed, now).await;
        let waiting: Vec<&Arc<PodInfo>> = view
            .pods
            .iter()
            .filter(|p| {
                p.is_pending_for(&self.config.scheduler_name)
                    && !self.cluster.is_reserved(&p.key.uid)
            })
            .collect();
        let waiting_uids: HashSet<&str> = waiting.iter().map(|p| p.key.uid.as_str()).collect();
        let volumes = if waiting.iter().any(|p| !p.claims.is_empty()) {
            crate::framework::volumes::VolumeIndex::new(&view.claims, &view.volumes)
        } else {
            Default::default()
        };
        let mut round = RoundState::new(now, volumes);
        round.order.waiting = waiting.iter().map(|p| Arc::clone(p)).collect();
        self.queue.retain(|uid| waiting_uids.contains(uid.as_str()));
        self.unfinished
            .retain(|uid| waiting_uids.contains(uid.as_str()));
        self.queues.refresh(&view);
        round.queues_in_use = self.queues.in_use(&view, &waiting);
        self.wake_parked(&snapshot, &view, round.queues_in_use, now);
        let units = self.units(&waiting, now);
        report.timings.snapshot = started.elapsed();
        let queues_in_use = round.queues_in_use;
        if queues_in_use {
            self.decide_fairly(
                &mut snapshot,
                &view,
                &waiting,
                units,
                &mut round,
                &mut report,
            )
            .await;
        } else {
            let order = Order::Plain(units.into_iter());
            self.decide_units(&mut snapshot, &view, order, &mut round, &mut report)
                .await;
        }
        report.pending = waiting.len().saturating_sub(report.assumed);
        self.rebalance(&snapshot, &view, &round, now, &mut report)
            .await;
        report.preemption_searches = std::mem::take(&mut round.preemption_times);
        self.finish_round(snapshot, &mut report);
        if queues_in_use {
            let started = Instant::now();
            let stamp = crate::clock::rfc3339(self.wall.at(now));
            self.queue_status.want(&report.queues, &view, &stamp);
            self.flush_queue_statuses(now).await;
            report.timings.queues += started.elapsed();
        }
        Ok(report)
    }

    /// The kept cluster state brought up to the view: reservations reconciled, the
    /// workload FGD measures against, and the devices held for preemptors.
    async fn state_for_round(
        &mut self,
        view: &ClusterView,
        feed: PodFeed,
        now: Instant,
    ) -> Snapshot {
        let Brought {
            mut snapshot,
            lost,
            rebuilt,
        } = self.cluster.update(view, feed, &self.config.gpu_resource);
        if rebuilt {
            self.warned.clear();
        }
        for w in snapshot.warnings.drain(..) {
            if self.warned.insert(w.clone()) {
                warn!("{w}");
            }
        }
        for lost in lost {
            info!(pod = %lost.key, node = %lost.node, "node gone under a reservation; deciding again");
        }
        // FGD measures fragmentation against the declared workload, else the shapes of the
        // pods the cluster runs and is asked to run.
        // Bound again only when it changed: binding measures every node afresh.
        let workload = self.cluster.workload(self.config.workload.as_ref());
        if snapshot.state.workload() != Some(&*workload) {
            snapshot.state.set_workload(workload);
        }
        // Preemptors' devices, as far as their victims have freed them, are theirs.
        let clear = self
            .cluster
            .hold_nominations(view, &mut snapshot, &self.config.scheduler_name);
        if !clear.is_empty() {
            self.clear_nominations(clear).await;
        }
        // So are the places planned for moved pods' replacements.
        let ttl = self.config.defrag.steer_ttl;
        self.steers.hold(&mut snapshot, now, ttl);
        snapshot
    }

    /// Each unit in queue order: a pod through the profile, core and reserve (or
    /// post-filter); a gang through the gang stage. Stops when leadership is lost.
    pub(super) async fn decide_units<'a>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        mut order: Order<'_, '_, 'a>,
        round: &mut RoundState,
        report: &mut RoundReport,
    ) {
        let mut verdicts = VerdictCache::default();
        while let Some((queue, unit)) = order.next() {
            if !self.gate.is_open() {
                // Leadership lost mid-round: stop deciding at once.
                self.dirty = true;
                break;
            }
            if report.assumed >= self.config.max_round_decisions {
                // The rest go in the next round, in their order then.
                self.dirty = true;
                report.more = true;
                break;
            }
            let pods = unit.pods();
            // The unit's own nominations are counted in its queue only once it is decided
            // (else a preemptor deciding again would see itself in its queue's share).
            if let (Order::Fair(picker), Some(q)) = (&mut order, queue) {
                self.unaccount(picker, q, &pods);
            }
            let narrow = match queue {
                None => None,
                Some(q) => {
                    match self.within_limit((snapshot, view), &mut order, q, &pods, round, report) {
                        Limits::Within(narrow) => narrow,
                        Limits::Refused => {
                            if let Order::Fair(picker) = &mut order {
                                self.account(snapshot, picker, q, &pods);
                            }
                            continue;
                        }
                    }
                }
            };
            let deciding = Deciding {
                round: &mut *round,
                narrow: narrow.as_deref(),
            };
            let fair = match (&mut order, queue) {
                (Order::Fair(picker), Some(queue)) => Some(Fair { picker, queue }),
                _ => None,
            };
            match unit {
                Unit::Single(pod) => {
                    let started = Instant::now();
                    let v = verdicts.get(snapshot, pod);
                    let chosen = self.first_available(snapshot, &v, pod, &deciding);
                    report.timings.filter += started.elapsed();
                    let pod = chosen.as_ref().unwrap_or(pod);
                    self.schedule_one(snapshot, view, &v, pod, fair, deciding, report)
                        .await;
                }
                Unit::Gang((namespace, group), members) => {
                    let started = Instant::now();
                    let members: Vec<(&Arc<PodInfo>, Verdicts)> = members
                        .into_iter()
                        .map(|p| (p, verdicts.get(snapshot, p)))
                        .collect();
                    let id = (namespace.as_str(), group.as_str());
                    self.schedule_gang(snapshot, view, id, members, fair, deciding, report)
                        .await;
                    report.timings.gangs += started.elapsed();
                }
            }
            if let (Order::Fair(picker), Some(q)) = (&mut order, queue) {
                let before = picker.alloc(q).dims[0];
                self.account(snapshot, picker, q, &pods);
                let placed = picker.alloc(q).dims[0].saturating_sub(before);
                round.order.placed(q, placed);
            }
        }
    }

    /// Holds released, the round's figures taken, and the state kept for the next round.
    fn finish_round(&mut self, mut snapshot: Snapshot, report: &mut RoundReport) {
        self.cluster.release_nominations(&mut snapshot);
        self.steers.release_all(&mut snapshot);
        report.nominated = self.cluster.nominated_count();
        report.in_flight = self.binder.in_flight();
        report.reservations = self.cluster.reserved_count();
        report.events_dropped = self.events.dropped();
        report.events_queued = self.events.queued();
        report.gpu_capacity_milli = snapshot.state.gpu_capacity_milli();
        report.gpu_allocated_milli = snapshot.state.gpu_allocated_milli();
        report.fragmentation_milli = snapshot.state.total_frag() as u64;
        self.cluster.keep(snapshot);
    }

    /// The due units in queue order. A gang is due when any member is.
    fn units<'a>(&self, waiting: &[&'a Arc<PodInfo>], now: Instant) -> Vec<Unit<'a>> {
        super::units::form(waiting.iter().copied(), |p| {
            self.queue.is_due(&p.key.uid, now)
        })
    }

    /// One pod through core's cycle: placed and handed to the bind stage, else
    /// PostFilter's plan carried out and the pod told why it waits.
    #[allow(clippy::too_many_arguments)]
    async fn schedule_one(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        verdicts: &Verdicts,
        pod: &Arc<PodInfo>,
        fair: Option<Fair<'_, '_, Unit<'_>>>,
        deciding: Deciding<'_>,
        report: &mut RoundReport,
    ) {
        let Deciding { round, narrow } = deciding;
        let mut fair = fair;
        let now = round.now;
        // A preemptor is decided with the devices held for it free; preemption, reclaim and
        // make-room plan so too (a preemptor deciding again may keep its place), its hold
        // applied again after, the new one's if it was nominated anew.
        let nominated = self.cluster.nominated_nodes([&*pod.key.uid], snapshot);
        self.cluster.free_nominee(&pod.key.uid, snapshot);
        // A moved pod's replacement is tried only on its planned node (its place held for
        // it until now); it waits for it, its steer put back, while the pods there leave.
        let steer = self.steers.take_for(pod, snapshot);
        let mut steered = Steered::new();
        if let Some(steer) = &steer {
            steered.insert(pod.key.uid.clone(), steer.planned());
        }
        let cycle_started = Instant::now();
        let (cycled, spent, unfit_found) = {
            let mut steps = PodSteps {
                scheduler: self,
                snapshot,
                view,
                verdicts,
                pod,
                steered: &steered,
                nominated: &nominated,
                fair: fair.as_ref(),
                round: &mut *round,
                narrow,
                spent: Spent::default(),
                unfit: None,
            };
            let cycled = cycle::schedule(&mut steps);
            (cycled, steps.spent, steps.unfit)
        };
        report.timings.filter += spent.filter;
        report.timings.core += spent.core;
        // PostFilter's planning counts with its carrying out, as before the one cycle.
        report.timings.api += cycle_started
            .elapsed()
            .saturating_sub(spent.filter + spent.core);
        if let Some(steer) = &steer {
            let placed = matches!(&cycled, Cycled::Allowed(t) if !t.placed.is_empty());
            debug!(pod = %pod.key, node = %steer.node, placed, "replacement of a moved pod");
        }
        let (trial, chained) = match cycled {
            Cycled::Allowed(mut trial) if !trial.placed.is_empty() => {
                let (_, placed) = trial.placed.swap_remove(0);
                let placement = placed.decision.to_placement(&snapshot.state);
                self.cluster.nominee_decided(&pod.key.uid, &placement);
                let request = self.assume(snapshot, pod, &placed.demand, &placed.decision, None);
                report.assumed += 1;
                let started = Instant::now();
                let attempts = self.config.bind_attempts;
                self.binder.dispatch(request, attempts, false).await;
                report.timings.api += started.elapsed();
                return;
            }
            Cycled::PostFiltered { trial, chained } => (trial, chained),
            // A pod alone is never short of members.
            Cycled::Allowed(trial) | Cycled::MembersMissing(trial) => (
                trial,
                Chained {
                    plan: None,
                    why: Vec::new(),
                },
            ),
        };
        let started = Instant::now();
        let told_from_ms = self.wall_ms();
        // Why it waits, as the round found it (PostFilter's plan holds places next).
        let mut waiting = {
            let fair = fair.as_ref().map(|f| (&*f.picker, f.queue));
            self.why_waiting(snapshot, round, &[pod], unfit_found.as_ref(), fair)
        };
        let reborrowed = fair.as_mut().map(|f| Fair {
            picker: &mut *f.picker,
            queue: f.queue,
        });
        let (outcome, made) = self
            .carry_out_pod(snapshot, view, pod, round, chained, reborrowed, report)
            .await;
        // A shape make-room searched lately looks again when its wait is over (or when a
        // pod leaves): it is told when rather than parked.
        let later = match made {
            Some(Made::Later(wait)) => Some(now + wait),
            _ => None,
        };
        if outcome.under_way() || matches!(made, Some(Made::Moving { .. })) {
            // A nominee starts when its victims have left: it is told when they are gone,
            // and what this attempt's projection told it is not learnt from.
            waiting.start = self.nominees_start(std::iter::once(&*pod.key.uid), view);
            self.starts.forget_told_since(&pod.key.uid, told_from_ms);
        }
        let unfit = trial.failure.unwrap_or_default();
        let message = failure_message(
            &outcome,
            made.as_ref(),
            &unfit,
            snapshot.nodes.len(),
            &pod.key.namespace,
            &mut waiting,
            self.wall_ms(),
        );
        self.cluster.hold_nominee(&pod.key.uid, snapshot);
        report.timings.api += started.elapsed();
        report.unschedulable += 1;
        self.wait(&pod.key.uid, now, later);
        debug!(pod = %pod.key, %message, "unschedulable");
        self.events
            .failed(&pod.key, message, Some(Arc::new(waiting)));
        // A replacement keeps its planned place while it waits for it (the place's pods
        // still leaving), until its steer is dropped.
        drop(steered);
        if let Some(steer) = steer {
            self.steers.restore(steer, snapshot);
        }
    }

    /// Reserves the decision in the state and among the reservations; returns the
    /// Binding that carries it (the assignment annotation, the pod's resourceVersion).
    pub(super) fn assume(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &Arc<PodInfo>,
        demand: &PodDemand,
        decision: &Decision,
        gang: Option<String>,
    ) -> BindRequest {
        let policy = self.config.policy.to_string();
        let (reservation, request) =
            crate::shared::assume::reserve(snapshot, pod, demand, decision, &policy, gang);
        self.cluster.assume(reservation);
        self.queue.forget(&pod.key.uid);
        request
    }

    /// A Binding ended: success keeps the reservation until the watch shows the pod bound
    /// and says so in an Event; failure forgets it and sends the pod back to the queue.
    /// Only a failure calls for a round of its own: a Binding written frees nothing and
    /// wakes nobody (the watch that shows it bound makes the next round), and a round per
    /// Binding was a third of a streamed run's rounds, each walking every pod.
    pub(super) async fn take_write_outcome(
        &mut self,
        outcome: WriteOutcome,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let WriteOutcome { request, result } = outcome;
        let key: &PodKey = &request.pod;
        self.dirty |= result.is_err();
        let gang = self.gangs.member_written(&key.uid);
        match &result {
            Ok(()) => {
                report.bound += 1;
                self.cluster.written(&key.uid);
                // How its first projected start turned out.
                if let Some(first) = self.starts.take_first(&key.uid) {
                    let bound_ms = self.wall_ms();
                    first.learn(&mut self.runs, bound_ms);
                }
                let devices: Vec<String> = request
                    .annotations
                    .get(ASSIGNMENT_ANNOTATION)
                    .and_then(|a| Assignment::from_json(a).ok())
                    .map(|a| a.devices().map(|d| d.id.clone()).collect())
                    .unwrap_or_default();
                let message = format!(
                    "Successfully assigned {key} to {} (GPUs: {})",
                    request.node,
                    if devices.is_empty() {
                        "none".to_string()
                    } else {
                        devices.join(",")
                    }
                );
                self.events.emit(key, "Normal", "Scheduled", message);
            }
            Err(failure) => {
                report.conflicts += 1;
                // Give back what the reservation holds; once the watch confirmed the pod
                // bound (the reservation is gone), what it holds is the bound pod's.
                self.cluster.forget(&key.uid);
                // What it held is free again: parked pods may fit.
                self.queue.wake_all(now);
                if !matches!(failure, WriteFailure::NotLeader) {
                    self.queue.retry_later(&key.uid, now);
                }
                info!(pod = %key, node = %request.node, error = %failure, "binding not written; the pod goes back to the queue");
            }
        }
        // A nomination for another node ends on the API once the Binding is settled
        // (written or not), not before: its resourceVersion is the Binding's precondition.
        if self.cluster.take_stale_nomination(&key.uid) {
            self.clear_nominations(vec![key.clone()]).await;
        }
        if let Some(gang) = gang {
            self.gang_member_written(&gang, &key.uid, result.is_ok())
                .await;
        }
    }
}

/// A pod's FailedScheduling message: kube-scheduler's, with what preemption and make-room
/// came to, then why it waits (`waiting`, with what would unblock it).
fn failure_message(
    outcome: &super::post_filter::Outcome,
    made: Option<&Made>,
    unfit: &str,
    nodes: usize,
    namespace: &str,
    waiting: &mut gpuplace_core::waiting::Waiting,
    now_ms: i64,
) -> String {
    let mut message = outcome.message(unfit, nodes, namespace);
    if let Some(more) = made.and_then(|m| m.message(namespace)) {
        message = format!("{message} {more}");
    }
    waiting.unblock = match (outcome.unblock(), made.and_then(Made::unblock)) {
        // What make-room did says more than preemption's finding nothing.
        (Some(_) | None, Some(room)) if outcome.found_nothing() => Some(room),
        // Else what the record found (a replacement's planned place coming free).
        (found, _) => found.or(waiting.unblock.take()),
    };
    super::waiting::render(waiting, &message, now_ms)
}
