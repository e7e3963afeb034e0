//! Which parked pods the pods that left since the last round wake: core's
//! [`gpuplace_core::wake`] rule, as the timeline follows it. A pod alone wakes only where
//! a node a pod left could take it once what pods of its priority or higher keep there is
//! counted; a gang, a nominee, a pod with inter-pod terms, volumes or claims, and every
//! pod while queues serve, make-room looks for room or a placed pod has anti-affinity,
//! wake at any departure. Anything else that changed (nodes, volumes, budgets, queues, a
//! reservation gone, a claim giving GPUs back) wakes every parked pod, as before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::preempt::{Amounts, amounts_of};
use gpuplace_core::wake::{Reach, helped_by};

use super::Scheduler;
use crate::api::{ClusterApi, ClusterView};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// What left since the parked pods were last woken.
#[derive(Debug, Default)]
pub(super) enum Left {
    #[default]
    Nothing,
    /// Pods left these nodes (by name) and nothing else changed.
    Nodes(Vec<String>),
    /// Something that may help any parked pod.
    Anything,
}

impl Left {
    /// Pods left `node`.
    pub(super) fn node(&mut self, node: &str) {
        match self {
            Left::Nothing => *self = Left::Nodes(vec![node.to_string()]),
            Left::Nodes(nodes) => nodes.push(node.to_string()),
            Left::Anything => {}
        }
    }

    /// Something changed that may help any parked pod.
    pub(super) fn anything(&mut self) {
        *self = Left::Anything;
    }
}

/// What pods of `priority` or higher that are not leaving hold on node `n`.
fn kept(snapshot: &Snapshot, n: usize, priority: i32) -> Amounts {
    let mut kept = [0u64; 3];
    let Some(pods) = snapshot.placed.get(n) else {
        return kept;
    };
    for pod in pods
        .iter()
        .filter(|p| p.priority >= priority && !p.deleting)
    {
        if let Some(held) = snapshot.held.get(&pod.key.uid) {
            for (k, a) in kept.iter_mut().zip(amounts_of(&held.request)) {
                *k += a;
            }
        }
    }
    kept
}

impl<A: ClusterApi> Scheduler<A> {
    /// Wakes the parked pods what left since the last round could help (see the module's
    /// text), on the round's `snapshot` (what left is gone from it).
    pub(super) fn wake_parked(
        &mut self,
        snapshot: &Snapshot,
        view: &ClusterView,
        queues_in_use: bool,
        now: Instant,
    ) {
        let names = match std::mem::take(&mut self.seen.left) {
            Left::Nothing => return,
            Left::Anything => return self.queue.wake_all(now),
            Left::Nodes(names) => names,
        };
        let everyone = queues_in_use
            || self.config.defrag.settings.mode.makes_room()
            || snapshot.anti_affinity_pods > 0;
        if everyone {
            return self.queue.wake_all(now);
        }
        let mut nodes: Vec<usize> = names
            .iter()
            .filter_map(|n| snapshot.node_index(n))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        let pending: HashMap<&str, &Arc<PodInfo>> = view
            .pods
            .iter()
            .filter(|p| p.node_name.is_none())
            .map(|p| (p.key.uid.as_str(), p))
            .collect();
        let cluster = &self.cluster;
        let mut helped: HashMap<(&gpuplace_model::Request, i32), bool> = HashMap::new();
        self.queue.wake_where(now, |uid| {
            let Some(pod) = pending.get(uid.as_str()) else {
                return true;
            };
            let reach = Reach {
                gang: pod.group.is_some(),
                nominated: pod.nominated.is_some() || cluster.nomination(uid).is_some(),
                queued: false,
                moves: false,
                inter_pod: pod.placement.is_some(),
                claims: !pod.claims.is_empty() || pod.dra.is_some(),
            };
            let Ok(demand) = &pod.demand else {
                return true;
            };
            if reach.anywhere() {
                return true;
            }
            let priority = pod.priority;
            *helped
                .entry((&demand.request, priority))
                .or_insert_with(|| {
                    helped_by(
                        &snapshot.state,
                        &nodes,
                        |n| kept(snapshot, n, priority),
                        &demand.request,
                    )
                })
        });
    }
}
