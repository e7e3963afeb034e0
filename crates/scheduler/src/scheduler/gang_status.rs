//! What a gang is told: its PodGroup's status (phase, members scheduled, the
//! `Unschedulable` condition with why) and its members' `FailedScheduling` Events, at once
//! and again at its timeout; the gang stage (`gang_permit.rs`) decides, this says so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::waiting::Waiting;

use super::gangs::GangWritten;
use super::{RoundReport, Scheduler};
use crate::api::ClusterApi;
use crate::framework::filter::Verdicts;
use crate::k8s::gang::{PodGroupCondition, PodGroupSpec, PodGroupStatus};
use crate::k8s::pod_info::PodInfo;

/// A gang as this round sees it.
pub(super) struct Gang {
    /// `namespace/name` of its PodGroup.
    pub id: String,
    pub namespace: String,
    pub group: String,
    pub spec: PodGroupSpec,
    /// Members bound or reserved already (they count towards `minMember`).
    pub bound: u32,
    /// Their UIDs.
    pub held: Vec<String>,
}

/// Why a gang waits: the condition's reason and the message its members are told.
#[derive(Clone, Copy)]
pub(super) struct Why<'m> {
    pub reason: &'static str,
    pub message: &'m str,
}

/// `text` ending in exactly one period (reasons are joined into sentences).
pub(super) fn sentence(text: &str) -> String {
    format!("{}.", text.trim_end().trim_end_matches('.'))
}

impl<A: ClusterApi> Scheduler<A> {
    /// Waits (members short of their number retried after a backoff; members that do
    /// not fit at once on an event that frees room) until the gang's
    /// `scheduleTimeoutSeconds` (default 60) passes, then refuses it with `why`. The
    /// reason is said at once all the same: on the PodGroup (its `Unschedulable`
    /// condition) and in one Event per member whenever it changes.
    pub(super) async fn wait_or_time_out(
        &mut self,
        gang: &Gang,
        members: &[(&Arc<PodInfo>, Verdicts)],
        why: Why<'_>,
        record: &Waiting,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let since = self.gangs.waiting_since(&gang.id, now);
        let timeout = Duration::from_secs(gang.spec.schedule_timeout_seconds.unwrap_or(60));
        if now.duration_since(since) >= timeout {
            self.refuse_gang(members, why.message.to_string(), record, now, report)
                .await;
            self.gangs.restart_wait(&gang.id, now);
            self.gangs.told(&gang.id, why.message);
            let phase = "Unschedulable";
            self.set_phase(&gang.namespace, &gang.group, phase, gang.bound, Some(why))
                .await;
        } else {
            if self.gangs.told(&gang.id, why.message) {
                let message = format!(
                    "{} The gang waits up to {}s for its members to fit at once.",
                    why.message,
                    timeout.as_secs(),
                );
                let message = super::waiting::render(record, &message, self.wall_ms());
                let record = Arc::new(record.clone());
                for (pod, _) in members {
                    let record = Some(Arc::clone(&record));
                    self.events.failed(&pod.key, message.clone(), record);
                }
            }
            self.set_phase(
                &gang.namespace,
                &gang.group,
                "Pending",
                gang.bound,
                Some(why),
            )
            .await;
            // A gang short of members backs off only (its members' arrival is no cluster
            // event); one whose members are all there but do not fit at once waits for an
            // event that frees room, as a single pod that fits nowhere does (and as the
            // timeline replay's gang does); past its timeout, the next attempt refuses it.
            let missing = why.reason == "MembersMissing";
            for (pod, _) in members {
                if missing {
                    self.queue.retry_later(&pod.key.uid, now);
                } else {
                    self.queue.unschedulable(&pod.key.uid, now);
                }
            }
        }
    }

    /// One member's Binding ended; when the gang's last one does, its status says so.
    pub(super) async fn gang_member_written(&mut self, gang_id: &str, uid: &str, ok: bool) {
        let Some(GangWritten {
            namespace,
            name,
            bound,
            failed,
        }) = self.gangs.count_written(gang_id, uid, ok)
        else {
            return;
        };
        if failed > 0 {
            tracing::warn!(gang = %gang_id, bound, failed, "gang members not bound after retries; they go back to the queue");
            self.set_phase(&namespace, &name, "Pending", bound, None)
                .await;
        } else {
            self.set_phase(&namespace, &name, "Scheduled", bound, None)
                .await;
        }
    }

    /// Writes the PodGroup's status (with an `Unschedulable` condition saying `why`, when
    /// it waits) when it differs from the one last written.
    pub(super) async fn set_phase(
        &mut self,
        namespace: &str,
        group: &str,
        phase: &str,
        scheduled: u32,
        why: Option<Why<'_>>,
    ) {
        let status = PodGroupStatus {
            phase: phase.into(),
            scheduled,
            conditions: why
                .map(|w| PodGroupCondition {
                    type_: "Unschedulable".into(),
                    status: "True".into(),
                    reason: w.reason.into(),
                    message: w.message.into(),
                    last_transition_time: None,
                })
                .into_iter()
                .collect(),
        };
        let id = format!("{namespace}/{group}");
        if self.gangs.status_unchanged(&id, &status) || !self.gate.is_open() {
            return;
        }
        let mut stamped = status.clone();
        let now = crate::clock::rfc3339(self.wall.at(self.round_clock()));
        for c in &mut stamped.conditions {
            c.last_transition_time = Some(now.clone());
        }
        match self.api.group_status(namespace, group, stamped).await {
            Ok(()) => {
                self.gangs.status_written(id, status);
            }
            Err(e) => {
                tracing::info!(gang = %id, error = %e, "pod group status not written; retried later")
            }
        }
    }

    /// Every member is told `reason` and backs off.
    pub(super) async fn refuse_gang(
        &mut self,
        members: &[(&Arc<PodInfo>, Verdicts)],
        reason: String,
        record: &Waiting,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let reason = super::waiting::render(record, &reason, self.wall_ms());
        let record = Arc::new(record.clone());
        for (pod, _) in members {
            self.queue.unschedulable(&pod.key.uid, now);
            let record = Some(Arc::clone(&record));
            self.events.failed(&pod.key, reason.clone(), record);
        }
        report.unschedulable += members.len();
    }
}
