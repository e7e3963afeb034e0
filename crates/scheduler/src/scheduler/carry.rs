//! Carrying PostFilter's evictions out through the API: each victim evicted with its
//! Event, the preemptors nominated (`status.nominatedNodeName`), a gang's plan whole or
//! not further; a pod that fits nowhere waits or backs off; nominations cleared.

use std::collections::HashMap;
use std::time::Instant;

use super::Scheduler;
use crate::api::{ClusterApi, PodKey};

/// What carrying out evictions did.
#[derive(Default)]
pub(super) struct Carried {
    pub evicted: usize,
    /// The first refusal, if any.
    pub refused: Option<String>,
}

impl<A: ClusterApi> Scheduler<A> {
    /// Evicts `victims` (each with its Event) and nominates `pods` (pod, node): at once,
    /// or with `whole` one by one, stopping at the first refusal with nothing nominated (a
    /// gang's plan is carried out whole or not further).
    pub(super) async fn carry_out(
        &mut self,
        by: &PodKey,
        node_of_victims: &HashMap<String, String>,
        victims: &[PodKey],
        nominate: &[(PodKey, String)],
        why: Option<&str>,
        whole: bool,
    ) -> Carried {
        let mut carried = Carried::default();
        if !self.gate.is_open() {
            carried.refused = Some("this scheduler is not the leader".into());
            return carried;
        }
        if whole {
            for v in victims {
                let node = node_of_victims.get(&v.uid).cloned().unwrap_or_default();
                let message = match why {
                    Some(why) => format!("Preempted by {by} on node {node} {why}"),
                    None => format!("Preempted by {by} on node {node}"),
                };
                match self.api.evict(v, &message).await {
                    Ok(()) | Err(crate::api::ApiError::NotFound(_)) => {
                        carried.evicted += 1;
                        self.events.emit(v, "Normal", "Preempted", message);
                    }
                    Err(e) => {
                        carried.refused = Some(format!("evicting {v} was refused ({e})"));
                        return carried;
                    }
                }
            }
            self.write_nominations(nominate).await;
            return carried;
        }
        let evictions = victims.iter().map(|v| {
            let node = node_of_victims.get(&v.uid).cloned().unwrap_or_default();
            let message = match why {
                Some(why) => format!("Preempted by {by} on node {node} {why}"),
                None => format!("Preempted by {by} on node {node}"),
            };
            let api = self.api.clone();
            async move { (v, api.evict(v, &message).await, message) }
        });
        for (victim, result, message) in futures::future::join_all(evictions).await {
            match result {
                Ok(()) | Err(crate::api::ApiError::NotFound(_)) => {
                    carried.evicted += 1;
                    self.events.emit(victim, "Normal", "Preempted", message);
                }
                Err(e) => {
                    tracing::warn!(victim = %victim, preemptor = %by, error = %e, "victim not evicted; preemption is tried again later");
                    carried.refused = Some(format!("evicting {victim} was refused ({e})"));
                    for (pod, _) in nominate {
                        self.unfinished.insert(pod.uid.clone());
                    }
                }
            }
        }
        self.write_nominations(nominate).await;
        carried
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
