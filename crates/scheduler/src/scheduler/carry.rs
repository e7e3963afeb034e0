//! Carrying PostFilter's evictions out through the API: each victim evicted with its
//! Event, the preemptors nominated (`status.nominatedNodeName`), a gang's plan whole or
//! not further; a pod that fits nowhere waits or backs off; nominations cleared.

use std::collections::HashMap;
use std::time::Instant;

use super::Scheduler;
use crate::api::{ApiError, ClusterApi, PodKey};
use crate::k8s::leader::Gate;

/// Why nothing more is evicted once the lease is lost.
const NOT_LEADER: &str = "this scheduler is not the leader";

/// Evicts `victim` unless this replica lost the lease (checked right before the request);
/// a victim already gone counts as evicted.
async fn evict_if_leader<A: ClusterApi>(
    api: &A,
    gate: &Gate,
    victim: &PodKey,
    message: &str,
) -> Result<(), ApiError> {
    if !gate.is_open() {
        return Err(ApiError::Other(NOT_LEADER.into()));
    }
    match api.evict(victim, message, false).await {
        Ok(()) | Err(ApiError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// "evicting VICTIM was refused (why)", naming the victim only for its own namespace.
fn refusal(by: &PodKey, victim: &PodKey, e: &ApiError) -> String {
    format!(
        "evicting {} was refused ({e})",
        victim.shown_to(&by.namespace)
    )
}

/// What carrying out evictions did.
#[derive(Default)]
pub(super) struct Carried {
    /// Whether each victim (in the order given) was evicted or was gone already.
    pub gone: Vec<bool>,
    /// The first refusal, if any.
    pub refused: Option<String>,
}

impl Carried {
    /// How many victims were evicted (or were gone already).
    pub fn evicted(&self) -> usize {
        self.gone.iter().filter(|g| **g).count()
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// Evicts `victims` (each with its Event) and nominates `pods` (pod, node): at once,
    /// or with `whole` one by one, the nominations written first and the evictions stopped
    /// at the first refusal (a gang's plan goes no further this round; once a victim is
    /// evicted the nominations stay, for a later round, or the next leader, to finish it).
    ///
    /// Every eviction is first sent as a dry run (the server checks the UID precondition,
    /// its admission and the scheduler's rights and deletes nothing): a refusal there
    /// evicts no one. Leadership is checked before each eviction, so a replica whose lease
    /// lapsed mid-plan evicts no more.
    pub(super) async fn carry_out(
        &mut self,
        by: &PodKey,
        node_of_victims: &HashMap<String, String>,
        victims: &[PodKey],
        nominate: &[(PodKey, String)],
        why: Option<&str>,
        whole: bool,
    ) -> Carried {
        let mut carried = Carried {
            gone: vec![false; victims.len()],
            ..Carried::default()
        };
        if !self.gate.is_open() {
            carried.refused = Some(NOT_LEADER.into());
            return carried;
        }
        if let Some(refused) = self.dry_run_evictions(by, victims).await {
            carried.refused = Some(refused);
            for (pod, _) in nominate {
                self.unfinished.insert(pod.uid.clone());
            }
            return carried;
        }
        let message_for = |v: &PodKey| {
            let node = node_of_victims.get(&v.uid).cloned().unwrap_or_default();
            let by = by.shown_to(&v.namespace);
            match why {
                Some(why) => format!("Preempted by {by} on node {node} {why}"),
                None => format!("Preempted by {by} on node {node}"),
            }
        };
        if whole {
            // The nominations first: while the plan is carried out the API records whom
            // the room is for, so a leader killed midway leaves the next one holds to adopt.
            self.write_nominations(nominate).await;
            for (i, v) in victims.iter().enumerate() {
                let message = message_for(v);
                match evict_if_leader(&self.api, &self.gate, v, &message).await {
                    Ok(()) => {
                        carried.gone[i] = true;
                        self.events.emit(v, "Normal", "Preempted", message);
                    }
                    Err(e) => {
                        carried.refused = Some(refusal(by, v, &e));
                        // Nothing evicted: nothing to finish, no room to hold.
                        if carried.evicted() == 0 {
                            self.clear_nominations(
                                nominate.iter().map(|(p, _)| p.clone()).collect(),
                            )
                            .await;
                        }
                        return carried;
                    }
                }
            }
            return carried;
        }
        let evictions = victims.iter().map(|v| {
            let message = message_for(v);
            let (api, gate) = (self.api.clone(), self.gate.clone());
            async move {
                let result = evict_if_leader(&api, &gate, v, &message).await;
                (v, result, message)
            }
        });
        let results = futures::future::join_all(evictions).await;
        for (i, (victim, result, message)) in results.into_iter().enumerate() {
            match result {
                Ok(()) => {
                    carried.gone[i] = true;
                    self.events.emit(victim, "Normal", "Preempted", message);
                }
                Err(e) => {
                    tracing::warn!(victim = %victim, preemptor = %by, error = %e, "victim not evicted; preemption is tried again later");
                    carried.refused = Some(refusal(by, victim, &e));
                    for (pod, _) in nominate {
                        self.unfinished.insert(pod.uid.clone());
                    }
                }
            }
        }
        self.write_nominations(nominate).await;
        carried
    }

    /// Every eviction of the plan as a dry run: the first refusal, said as the preemptor
    /// may read it, or `None` when the server would take them all.
    async fn dry_run_evictions(&self, by: &PodKey, victims: &[PodKey]) -> Option<String> {
        let checks = victims.iter().map(|v| {
            let api = self.api.clone();
            async move { (v, api.evict(v, "", true).await) }
        });
        for (v, result) in futures::future::join_all(checks).await {
            match result {
                Ok(()) | Err(ApiError::NotFound(_)) => {}
                Err(e) => {
                    tracing::info!(victim = %v, preemptor = %by, error = %e, "the plan's dry run was refused; nothing evicted");
                    return Some(format!("{}; nothing was evicted", refusal(by, v, &e)));
                }
            }
        }
        None
    }

    /// Writes `status.nominatedNodeName` of each (pod, node).
    async fn write_nominations(&self, nominate: &[(PodKey, String)]) {
        let writes = nominate.iter().map(|(pod, node)| {
            let api = self.api.clone();
            async move { (pod, api.nominate(pod, Some(node)).await) }
        });
        for (pod, result) in futures::future::join_all(writes).await {
            if let Err(e) = result {
                tracing::info!(pod = %pod, error = %e, "nominatedNodeName not written");
            }
        }
    }

    /// Pod `uid` fits nowhere this round: it waits for a cluster event, or backs off and
    /// tries again if the server refused some of its evictions or moves, or looks again
    /// at `at` (make-room searched for its shape lately).
    pub(super) fn wait(&mut self, uid: &str, now: Instant, at: Option<Instant>) {
        let unfinished = self.unfinished.remove(uid);
        match at {
            Some(at) => self.queue.retry_at(uid, now, at),
            None if unfinished => self.queue.retry_later(uid, now),
            None => self.queue.unschedulable(uid, now),
        }
    }

    /// Clears `status.nominatedNodeName` of pods bound elsewhere.
    pub(super) async fn clear_nominations(&self, pods: Vec<PodKey>) {
        if !self.gate.is_open() {
            return;
        }
        for pod in pods {
            if let Err(e) = self.api.nominate(&pod, None).await {
                tracing::info!(pod = %pod, error = %e, "nominatedNodeName not cleared");
            }
        }
    }
}
