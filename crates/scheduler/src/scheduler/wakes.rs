//! Which parked pods the pods that left since the last round wake: core's
//! [`gpuplace_core::wake`] rule, as the timeline follows it, on the round's state (with
//! nominees' holds). Pods alone of one shape wake only as many as the nodes pods left
//! could take (what is free there with what running pods below their priority hold),
//! first in queue order; a gang, a nominee, a pod with inter-pod terms, volumes or claims, and every
//! pod while queues serve, make-room looks for room or a placed pod has anti-affinity,
//! wake at any departure. A pod decided and gone before a view showed it bound left its
//! node as any pod does. Anything else that changed (nodes, volumes, budgets, queues, a
//! claim giving GPUs back) wakes every parked pod, as before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use gpuplace_core::wake::{Below, Reach, slots};

use super::Scheduler;
use super::left::Left;
use crate::api::{ClusterApi, ClusterView};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// What running pods below `priority` that are not leaving hold on node `n`.
fn below(snapshot: &Snapshot, n: usize, priority: i32) -> Below {
    let mut below = Below::default();
    let Some(pods) = snapshot.placed.get(n) else {
        return below;
    };
    for pod in pods.iter().filter(|p| p.priority < priority && !p.deleting) {
        if let Some(held) = snapshot.held.get(&pod.key.uid) {
            below.add(&held.request, &held.gpus);
        }
    }
    below
}

impl<A: ClusterApi> Scheduler<A> {
    /// Wakes the parked pods what left since the last round could help (see the module's
    /// text), on the round's `snapshot` (what left is gone from it; nominees' places held).
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
        let chosen = self.chosen(snapshot, view, &nodes);
        self.queue
            .wake_where(now, |uid| chosen.contains(uid.as_str()));
    }

    /// The parked pods to wake: those that wait for more than room on one node, and of
    /// each shape (the same request, priority and node terms) the first in queue order,
    /// as many as the departures from `nodes` opened slots for (core's [`slots`]).
    fn chosen<'v>(
        &self,
        snapshot: &Snapshot,
        view: &'v ClusterView,
        nodes: &[usize],
    ) -> HashSet<&'v str> {
        let mut chosen: HashSet<&str> = HashSet::new();
        let mut shapes: HashMap<Shape<'v>, Vec<&'v Arc<PodInfo>>> = HashMap::new();
        for pod in view.pods.iter().filter(|p| p.node_name.is_none()) {
            let uid = pod.key.uid.as_str();
            if !self.queue.is_parked(uid) {
                continue;
            }
            let reach = Reach {
                gang: pod.group.is_some(),
                nominated: pod.nominated.is_some() || self.cluster.nomination(uid).is_some(),
                queued: false,
                moves: false,
                inter_pod: pod.placement.is_some(),
                claims: !pod.claims.is_empty() || pod.dra.is_some(),
            };
            match &pod.demand {
                Ok(demand) if !reach.anywhere() => {
                    let shape = Shape {
                        request: &demand.request,
                        extended: &demand.extended,
                        priority: pod.priority,
                        never_preempts: pod.never_preempts,
                        terms: &pod.filter_key,
                    };
                    shapes.entry(shape).or_default().push(pod);
                }
                _ => {
                    chosen.insert(uid);
                }
            }
        }
        for (shape, mut pods) in shapes {
            let priority = shape.priority;
            let below = |n| below(snapshot, n, priority);
            let open = slots(&snapshot.state, nodes, below, shape.request);
            if open == 0 {
                continue;
            }
            // Queue order, as the round's units (priority, then creation, then name).
            pods.sort_by_cached_key(|p| (p.created, p.key.to_string()));
            chosen.extend(pods.iter().take(open).map(|p| p.key.uid.as_str()));
        }
        chosen
    }
}

/// Pods that fit the same nodes the same way: woken in queue order, as many as slots.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Shape<'a> {
    request: &'a gpuplace_model::Request,
    extended: &'a std::collections::BTreeMap<String, i64>,
    priority: i32,
    never_preempts: bool,
    terms: &'a str,
}
