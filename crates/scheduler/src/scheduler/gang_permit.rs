//! The gang stage (kube-scheduler's Permit, done as one trial): every waiting member is
//! placed on a copy of the state; nothing binds unless `minMember` members fit at once.
//! With a topology key (`spec.topologyKey`, or the members' annotation
//! `gpuplace.io/topology-key`), every member lands on nodes sharing one value of that node
//! label, chosen among the values where the gang fits as the one leaving the least
//! fragmentation.

use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::Decision;
use gpuplace_core::cycle::place::Trial;
use gpuplace_core::cycle::{self, Chained, Cycled};

use gpuplace_core::waiting::{Blocker, Waiting};

use super::chain::{GangPlanned, GangSteps, Why as ChainWhy};
use super::gang_status::{Gang, Why, sentence};
use super::post_filter::Outcome;
use super::reclaim::Fair;
use super::round_state::Deciding;
use super::waiting::gang_standing;
use super::{RoundReport, Scheduler};
use crate::api::{ClusterApi, ClusterView};
use crate::framework::filter::Verdicts;
use crate::k8s::demand::PodDemand;
use crate::k8s::gang::PodGroupSpec;
use crate::k8s::pod_info::PodInfo;
use crate::shared::members::{Steered, Trialled};
use crate::snapshot::Snapshot;

pub use gpuplace_model::keys::TOPOLOGY_KEY_ANNOTATION;

/// A gang round where too few members fit.
struct GangAttempt<'g, 'a> {
    gang: &'g Gang,
    members: &'g [(&'a Arc<PodInfo>, Verdicts)],
    /// Members the best trial placed.
    placed: u32,
    failure: Option<String>,
    /// Why it waits, as the round found it.
    record: Waiting,
    /// When the attempt began telling (what a nominating attempt told is not learnt).
    told_from_ms: i64,
    /// The round's view (a nominee's victims are read there).
    view: &'g ClusterView,
}

impl<A: ClusterApi> Scheduler<A> {
    /// All-or-nothing: place every waiting member on a copy; reserve them all only when
    /// at least `minMember` members (bound and reserved ones included) fit, and only then
    /// hand their Bindings to the bind stage. With queues, `fair` is the gang's queue
    /// and the round's allocations (for reclaim).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn schedule_gang<U>(
        &mut self,
        snapshot: &mut Snapshot,
        view: &ClusterView,
        (namespace, group): (&str, &str),
        members: Vec<(&Arc<PodInfo>, Verdicts)>,
        fair: Option<Fair<'_, '_, U>>,
        deciding: Deciding<'_>,
        report: &mut RoundReport,
    ) {
        let Deciding { round, narrow } = deciding;
        let now = round.now;
        let pods: Vec<&Arc<PodInfo>> = members.iter().map(|(p, _)| *p).collect();
        let fair_pair = fair.as_ref().map(|f| (&*f.picker, f.queue));
        let Some(gang) = self.gang_of_view(view, namespace, group) else {
            let reason = format!("pod group {namespace}/{group} does not exist");
            let mut record = self.told(snapshot, round, pods[0], Blocker::Gang, fair_pair);
            record.gang = gang_standing(view, &pods, None);
            record.unblock = Some(format!("its PodGroup {namespace}/{group} made"));
            self.refuse_gang(&members, reason, &record, now, report)
                .await;
            return;
        };
        // Try all members on a copy of the state, in each allowed domain (one value of
        // the gang's topology key, or the whole cluster), and keep the domain where enough
        // fit leaving the least fragmentation.
        let domains = match self.domains(
            snapshot,
            &view.pods,
            (namespace, group),
            &gang.spec,
            &members,
        ) {
            Ok(d) => d,
            Err(reason) => {
                let mut record =
                    self.told(snapshot, round, pods[0], Blocker::Constraints, fair_pair);
                record.gang = gang_standing(view, &pods, None);
                self.refuse_gang(&members, reason, &record, now, report)
                    .await;
                return;
            }
        };
        // Members that preempted are tried with the devices held for them free; moved
        // members' replacements on the places planned for them (held until now), as a
        // single pod's are.
        let nominated = self
            .cluster
            .nominated_nodes(members.iter().map(|(p, _)| &*p.key.uid), snapshot);
        let mut steers = Vec::new();
        for (pod, _) in &members {
            self.cluster.free_nominee(&pod.key.uid, snapshot);
            if let Some(steer) = self.steers.take_for(pod, snapshot) {
                steers.push((pod.key.uid.clone(), steer));
            }
        }
        let steered: Steered = steers
            .iter()
            .map(|(uid, steer)| (uid.clone(), steer.planned()))
            .collect();
        let (cycled, failure, unfit) = {
            let mut steps = GangSteps {
                scheduler: self,
                snapshot,
                view,
                gang: &gang,
                members: &members,
                domains: &domains,
                steered: &steered,
                nominated: &nominated,
                fair: fair.as_ref(),
                round: &mut *round,
                narrow,
                failure: None,
                unfit: None,
            };
            let cycled = cycle::schedule(&mut steps);
            (cycled, steps.failure, steps.unfit)
        };
        // Members not placed keep their planned places while they wait for them.
        drop(steered);
        let kept: Vec<&str> = match &cycled {
            Cycled::Allowed(t) => (t.placed.iter()).map(|(_, p)| &*p.pod.key.uid).collect(),
            _ => Vec::new(),
        };
        for (uid, steer) in steers {
            if !kept.contains(&uid.as_str()) {
                self.steers.restore(steer, snapshot);
            }
        }
        let fit = match &cycled {
            Cycled::Allowed(t)
            | Cycled::MembersMissing(t)
            | Cycled::PostFiltered { trial: t, .. } => t.placed.len() as u32,
        };
        let told_from_ms = self.wall_ms();
        // Why it waits, as the round found it (PostFilter's plan holds places next).
        let mut record = {
            let fair_pair = fair.as_ref().map(|f| (&*f.picker, f.queue));
            if gang.bound + (members.len() as u32) < gang.spec.min_member {
                self.told(snapshot, round, pods[0], Blocker::Gang, fair_pair)
            } else {
                self.why_waiting(snapshot, round, &pods, unfit.as_ref(), fair_pair)
            }
        };
        record.gang = gang_standing(view, &pods, Some(gang.bound + fit));
        let (trial, chained) = match cycled {
            Cycled::Allowed(trial) => {
                self.permit_and_refuse(snapshot, &gang, &members, trial, record, now, report)
                    .await;
                return;
            }
            Cycled::MembersMissing(trial) => (trial, None),
            Cycled::PostFiltered { trial, chained } => (trial, Some(chained)),
        };
        let attempt = GangAttempt {
            gang: &gang,
            members: &members,
            placed: trial.placed.len() as u32,
            failure,
            record,
            told_from_ms,
            view,
        };
        self.gang_does_not_fit(snapshot, attempt, chained, fair, now, report)
            .await;
    }

    /// Permit allowed the gang: its placed members reserved and bound together; the
    /// members that do not fit now (the gang has its minMember) are told so as single pods
    /// are, and wait for an event that may make room.
    #[allow(clippy::too_many_arguments)]
    async fn permit_and_refuse(
        &mut self,
        snapshot: &mut Snapshot,
        gang: &Gang,
        members: &[(&Arc<PodInfo>, Verdicts)],
        trial: Trial<Trialled<'_>, String>,
        record: Waiting,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let placed: std::collections::HashSet<&str> = trial
            .placed
            .iter()
            .map(|(_, t)| t.pod.key.uid.as_str())
            .collect();
        let left: Vec<(&Arc<PodInfo>, Verdicts)> = members
            .iter()
            .filter(|(p, _)| !placed.contains(p.key.uid.as_str()))
            .map(|(p, v)| (*p, v.clone()))
            .collect();
        let count = trial.placed.len() as u32;
        let planned = trial
            .placed
            .into_iter()
            .map(|(_, t)| (t.pod, t.demand, t.decision))
            .collect::<Vec<_>>();
        if count > 0 {
            self.permit_gang(snapshot, gang, planned, report).await;
        }
        if !left.is_empty() {
            let why = trial
                .failure
                .unwrap_or_else(|| "no node fits it".to_string());
            let reason = format!(
                "pod group {}: {} of minMember {} member(s) placed; this member does not fit: {}",
                gang.id,
                gang.bound + count,
                gang.spec.min_member,
                sentence(&why)
            );
            self.refuse_gang(&left, reason, &record, now, report).await;
        }
    }

    /// The gang's spec, identity and members already bound or reserved; `None` when its
    /// PodGroup does not exist.
    fn gang_of_view(&self, view: &ClusterView, namespace: &str, group: &str) -> Option<Gang> {
        let spec = view.group(namespace, group).map(|g| g.spec.clone())?;
        let id = format!("{namespace}/{group}");
        let bound_uids: std::collections::HashSet<&str> = view
            .pods
            .iter()
            .filter(|p| {
                p.key.namespace == namespace
                    && p.group.as_deref() == Some(group)
                    && p.is_active_bound()
            })
            .map(|p| p.key.uid.as_str())
            .collect();
        // A reservation whose pod the view already shows bound counts once.
        let mut held: Vec<String> = bound_uids.iter().map(|u| u.to_string()).collect();
        held.extend(
            self.cluster
                .reservations()
                .of_gang(&id)
                .filter(|r| !bound_uids.contains(r.key.uid.as_str()))
                .map(|r| r.key.uid.clone()),
        );
        Some(Gang {
            id,
            namespace: namespace.to_string(),
            group: group.to_string(),
            spec,
            bound: held.len() as u32,
            held,
        })
    }

    /// Permit: every planned member is reserved before any Binding is sent; nominations
    /// for other nodes end (their `nominatedNodeName` is cleared once the Binding's outcome
    /// is known).
    async fn permit_gang(
        &mut self,
        snapshot: &mut Snapshot,
        gang: &Gang,
        planned: Vec<(&Arc<PodInfo>, PodDemand, Decision)>,
        report: &mut RoundReport,
    ) {
        for (pod, _, decision) in &planned {
            let placement = decision.to_placement(&snapshot.state);
            self.cluster.nominee_decided(&pod.key.uid, &placement);
        }
        let requests: Vec<_> = planned
            .iter()
            .map(|(pod, demand, decision)| {
                self.assume(snapshot, pod, demand, decision, Some(gang.id.clone()))
            })
            .collect();
        report.assumed += requests.len();
        self.gangs.permitted(
            &gang.id,
            &gang.namespace,
            &gang.group,
            gang.held.iter().map(String::as_str),
            requests.iter().map(|r| r.pod.uid.as_str()),
        );
        let attempts = self.config.gang_bind_attempts;
        for request in requests {
            self.binder.dispatch(request, attempts, true).await;
        }
    }

    /// Not enough members fit: preempt for them all if that can help (within the gang's
    /// queue), else reclaim from other queues, else make room; else hold nothing, wait,
    /// and after the gang's timeout say why.
    async fn gang_does_not_fit<U>(
        &mut self,
        snapshot: &mut Snapshot,
        attempt: GangAttempt<'_, '_>,
        chained: Option<Chained<GangPlanned, ChainWhy>>,
        fair: Option<Fair<'_, '_, U>>,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let GangAttempt {
            gang,
            members,
            placed,
            failure,
            mut record,
            told_from_ms,
            view,
        } = attempt;
        let (bound, min_member) = (gang.bound, gang.spec.min_member);
        let present = bound + members.len() as u32;
        let mut preemption = None;
        // PostFilter planned when the members are all there.
        if let Some(chained) = chained {
            let outcome = self
                .carry_out_gang(snapshot, members, chained, fair, report)
                .await;
            for (pod, _) in members {
                self.cluster.hold_nominee(&pod.key.uid, snapshot);
            }
            if outcome.under_way() {
                // Nominated: it starts when its victims or moved pods have left.
                record.start = self.nominees_start(members.iter().map(|(p, _)| &*p.key.uid), view);
                for (pod, _) in members {
                    self.starts.forget_told_since(&pod.key.uid, told_from_ms);
                }
                let reason = format!(
                    "pod group {}: only {} of {min_member} members fit at once",
                    gang.id,
                    bound + placed
                );
                record.unblock = outcome.unblock();
                let message = super::waiting::render(
                    &record,
                    &outcome.message(&sentence(&reason), snapshot.nodes.len(), &gang.namespace),
                    self.wall_ms(),
                );
                report.waiting_gangs += 1;
                if !matches!(outcome, Outcome::Waiting) {
                    let record = Arc::new(record);
                    for (pod, _) in members {
                        let record = Some(Arc::clone(&record));
                        self.events.failed(&pod.key, message.clone(), record);
                    }
                }
                for (pod, _) in members {
                    self.wait(&pod.key.uid, now, None);
                }
                self.gangs.stop_waiting(&gang.id);
                let why = Why {
                    reason: "NotEnoughResources",
                    message: &message,
                };
                self.set_phase(&gang.namespace, &gang.group, "Pending", bound, Some(why))
                    .await;
                return;
            }
            preemption = Some(outcome);
        } else {
            for (pod, _) in members {
                self.cluster.hold_nominee(&pod.key.uid, snapshot);
            }
        }
        report.waiting_gangs += 1;
        let reason = if present < min_member {
            format!(
                "pod group {} has {present} of {min_member} members",
                gang.id
            )
        } else {
            format!(
                "pod group {}: only {} of {min_member} members fit at once{}",
                gang.id,
                bound + placed,
                failure.map(|f| format!("; {f}")).unwrap_or_default()
            )
        };
        let why = if present < min_member {
            "MembersMissing"
        } else {
            "NotEnoughResources"
        };
        let reason = match preemption {
            Some(ref p) => p.message(&sentence(&reason), snapshot.nodes.len(), &gang.namespace),
            None => sentence(&reason),
        };
        let why = Why {
            reason: why,
            message: &reason,
        };
        if let Some(p) = &preemption {
            record.unblock = p.unblock().or(record.unblock.take());
        }
        self.wait_or_time_out(gang, members, why, &record, now, report)
            .await;
    }

    /// The node masks to try: one per value of the topology key (nodes without the label
    /// are in none), or the whole cluster when the gang has no key. Members already bound
    /// fix the value.
    fn domains(
        &self,
        snapshot: &Snapshot,
        pods: &[std::sync::Arc<PodInfo>],
        (namespace, group): (&str, &str),
        spec: &PodGroupSpec,
        members: &[(&Arc<PodInfo>, Verdicts)],
    ) -> Result<Vec<Option<Vec<bool>>>, String> {
        let key = match &spec.topology_key {
            Some(k) if !k.is_empty() => Some(k.clone()),
            _ => {
                let mut keys: Vec<&String> = members
                    .iter()
                    .filter_map(|(p, _)| p.topology_key.as_ref())
                    .collect();
                keys.sort();
                keys.dedup();
                if keys.len() > 1 {
                    return Err(format!(
                        "pod group {namespace}/{group}: members name different {TOPOLOGY_KEY_ANNOTATION} values {keys:?}"
                    ));
                }
                keys.first().map(|k| (*k).clone())
            }
        };
        let Some(key) = key else {
            return Ok(vec![None]);
        };
        let value_of = |n: usize| {
            snapshot.nodes[n]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&key))
                .cloned()
        };
        let bound_values: std::collections::BTreeSet<Option<String>> = pods
            .iter()
            .filter(|p| {
                p.key.namespace == namespace
                    && p.group.as_deref() == Some(group)
                    && p.is_active_bound()
            })
            .map(|p| p.key.uid.as_str())
            .chain(
                self.cluster
                    .reservations()
                    .of_gang(&format!("{namespace}/{group}"))
                    .map(|r| r.key.uid.as_str()),
            )
            .filter_map(|uid| snapshot.held.get(uid).map(|h| value_of(h.node)))
            .collect();
        let mut values: std::collections::BTreeSet<String> =
            (0..snapshot.nodes.len()).filter_map(value_of).collect();
        if let Some(fixed) = bound_values.iter().next() {
            if bound_values.len() > 1 || fixed.is_none() {
                return Err(format!(
                    "pod group {namespace}/{group}: members already bound span more than one {key} value"
                ));
            }
            values.retain(|v| Some(v) == fixed.as_ref());
        }
        Ok(values
            .into_iter()
            .map(|v| {
                Some(
                    (0..snapshot.nodes.len())
                        .map(|n| value_of(n).as_ref() == Some(&v))
                        .collect(),
                )
            })
            .collect())
    }
}
