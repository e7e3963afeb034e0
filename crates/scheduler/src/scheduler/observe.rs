//! What changed since the last view, and which parked pods that could help: a node added
//! or changed, a pod on a node gone or finished, a pod group made or changed, volumes,
//! budgets, queues. Its cost follows the changes, not the cluster: the pods are read from
//! the pod store's change feed (a full comparison only when the feed cannot say, after a
//! relist), and each kind of object is looked at only when the cache handed out a new list.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::{Scheduler, Seen};
use crate::api::{ClusterApi, ClusterView, Listed, PodFeed};

/// Whether `list` is the very list `seen` holds (the caches hand out one list per kind
/// until that kind changes).
fn same<T>(seen: &Option<Listed<T>>, list: &Listed<T>) -> bool {
    seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, list))
}

impl Seen {
    /// Brings the active pods up to `view` and says whether one that was active is not any
    /// more (its GPUs freed): from the feed's changes when it has them (the value each
    /// changed pod had in the last view, and now), else by comparing every pod.
    /// Each pod that ended so (as the last view showed it) is handed to `ended`.
    fn pods_freed(
        &mut self,
        view: &ClusterView,
        feed: &PodFeed,
        ended: &mut dyn FnMut(&crate::k8s::pod_info::PodInfo),
    ) -> bool {
        let Some(changes) = &feed.changes else {
            let active: HashSet<String> = view
                .pods
                .iter()
                .filter(|p| p.is_active_bound())
                .map(|p| p.key.uid.clone())
                .collect();
            let freed = self.active.iter().any(|uid| !active.contains(uid));
            self.active = active;
            return freed;
        };
        let mut freed = false;
        for change in changes {
            if let Some(before) = change.before.as_ref().filter(|p| p.is_active_bound()) {
                self.active.remove(&before.key.uid);
                let still = change
                    .after
                    .as_ref()
                    .is_some_and(|p| p.is_active_bound() && p.key.uid == before.key.uid);
                if !still {
                    ended(before);
                }
                freed |= !still;
            }
            if let Some(after) = change.after.as_ref().filter(|p| p.is_active_bound()) {
                self.active.insert(after.key.uid.clone());
            }
        }
        freed
    }

    /// The groups whose spec changed, or that were made or are gone, by `namespace/name`.
    fn groups_changed(&mut self, view: &ClusterView) -> HashSet<String> {
        if same(&self.group_list, &view.groups) {
            return HashSet::new();
        }
        let groups: HashMap<String, String> = view
            .groups
            .iter()
            .map(|g| {
                let id = format!(
                    "{}/{}",
                    g.metadata.namespace.as_deref().unwrap_or_default(),
                    g.metadata.name.as_deref().unwrap_or_default()
                );
                (id, serde_json::to_string(&g.spec).unwrap_or_default())
            })
            .collect();
        let changed = groups
            .iter()
            .filter(|(id, spec)| self.groups.get(*id) != Some(*spec))
            .map(|(id, _)| id.clone())
            .chain(
                self.groups
                    .keys()
                    .filter(|id| !groups.contains_key(*id))
                    .cloned(),
            )
            .collect();
        self.groups = groups;
        self.group_list = Some(Arc::clone(&view.groups));
        changed
    }

    /// Whether the nodes changed in what scheduling reads.
    fn nodes_changed(&mut self, view: &ClusterView) -> bool {
        if same(&self.node_list, &view.nodes) {
            return false;
        }
        let nodes = crate::shared::cluster_cache::sorted_nodes(view);
        let changed = crate::shared::cluster_cache::nodes_differ(&self.nodes, &nodes);
        self.nodes = nodes;
        self.node_list = Some(Arc::clone(&view.nodes));
        changed
    }

    /// Whether a queue's spec or a namespace's default queue changed (the status this
    /// scheduler writes on a queue wakes nobody).
    fn queues_changed(&mut self, view: &ClusterView) -> bool {
        if same(&self.queue_list, &view.queues) && same(&self.namespace_list, &view.namespaces) {
            return false;
        }
        let queues: Vec<String> = view
            .queues
            .iter()
            .map(|q| {
                let spec = serde_json::to_string(&q.spec).unwrap_or_default();
                format!("{:?}={spec}", q.metadata.name)
            })
            .chain(view.namespaces.iter().map(|n| {
                let default = n
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::k8s::queue::DEFAULT_QUEUE_ANNOTATION));
                format!("{:?}={default:?}", n.metadata.name)
            }))
            .collect();
        let changed = queues != self.queues;
        self.queues = queues;
        self.queue_list = Some(Arc::clone(&view.queues));
        self.namespace_list = Some(Arc::clone(&view.namespaces));
        changed
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// What DRA claims changed for the pods that name them (the pod store resolves a
    /// claim pod again when its claims change): a waiting pod whose claims now say
    /// something else (made from its template, allocated by another, gone) is woken; a
    /// bound pod that holds fewer GPUs through its claims freed them (true).
    fn claim_changes(&mut self, feed: &PodFeed, now: Instant) -> bool {
        let Some(changes) = &feed.changes else {
            return false;
        };
        let mut freed = false;
        for change in changes {
            let (Some(before), Some(after)) = (&change.before, &change.after) else {
                continue;
            };
            if after.dra.is_none() || before.key.uid != after.key.uid {
                continue;
            }
            if after.node_name.is_none() {
                let plan =
                    |p: &crate::k8s::pod_info::PodInfo| p.dra.as_ref().map(|d| d.plan.clone());
                if before.demand.is_err() && after.demand.is_ok() {
                    // Its claims could not be read before (not yet made from their
                    // template): it was never really tried, as kube-scheduler holds such a
                    // pod before its queue, so no backoff; it is tried at once.
                    self.queue.forget(&after.key.uid);
                } else if before.demand != after.demand || plan(before) != plan(after) {
                    self.queue.wake(&after.key.uid, now);
                }
            } else {
                let held = |p: &crate::k8s::pod_info::PodInfo| {
                    p.claim_gpus.as_ref().map_or(0, |h| h.len())
                };
                freed |= held(after) < held(before);
            }
        }
        freed
    }

    /// Compares `view` (and `feed`, the pods changed since the last view) with the last
    /// view: parked pods wake on a node added or changed, a pod on a node gone or finished
    /// (one the last view showed bound, or one this scheduler bound since: a pod bound and
    /// deleted between two views held GPUs too); a pod group made, changed in its spec or
    /// gone wakes its own members (its status, which this scheduler writes, wakes nobody).
    pub(super) fn observe(&mut self, view: &ClusterView, feed: &PodFeed, now: Instant) {
        let groups_changed = self.seen.groups_changed(view);
        if !groups_changed.is_empty() {
            for pod in view.pods.iter() {
                if let Some(g) = &pod.group
                    && groups_changed.contains(&format!("{}/{g}", pod.key.namespace))
                {
                    self.queue.wake(&pod.key.uid, now);
                }
            }
        }
        // The tests' builds hold the feed's answer to a comparison of every pod: on every
        // view of up to 4,096 pods, and every 32nd of larger ones (a drift stays in the
        // kept set until the next; on every view it was a quarter of the openb replay's
        // CPU, the pods hashed twice a round).
        #[cfg(debug_assertions)]
        let before = {
            self.seen.observed += 1;
            (view.pods.len() <= 4096 || self.seen.observed.is_multiple_of(32))
                .then(|| self.seen.active.clone())
        };
        // What ran, for the expected starts: each pod that ended, from its start to now.
        let now_ms = self.wall.ms(now);
        self.jobs = view.jobs.clone();
        let (runs, jobs) = (&mut self.runs, &self.jobs);
        let mut left: Vec<String> = Vec::new();
        let mut ended = |pod: &crate::k8s::pod_info::PodInfo| {
            if let Some(node) = &pod.node_name {
                left.push(node.clone());
            }
            if let Some(since) = pod.started.or(pod.created) {
                let since = since.as_millisecond();
                let ran = now_ms.saturating_sub(since).max(0) as u64;
                let declared = jobs.declared_run(pod, since);
                runs.ran(&super::line::run_class(pod), ran, declared);
            }
        };
        let pods_freed = self.seen.pods_freed(view, feed, &mut ended);
        // A pod decided here and gone before a view showed it bound left its node too.
        left.extend(self.cluster.reservations_gone(view));
        for node in &left {
            self.seen.left.node(node);
        }
        if pods_freed && feed.changes.is_none() {
            // Compared without the feed: which nodes pods left is not known.
            self.seen.left.anything();
        }
        #[cfg(debug_assertions)]
        if let Some(before) = before {
            let now: HashSet<&str> = view
                .pods
                .iter()
                .filter(|p| p.is_active_bound())
                .map(|p| p.key.uid.as_str())
                .collect();
            let kept: HashSet<&str> = self.seen.active.iter().map(String::as_str).collect();
            assert_eq!(
                kept, now,
                "the active pods kept from the feed differ from the view's"
            );
            let freed = before.iter().any(|uid| !now.contains(uid.as_str()));
            assert_eq!(
                pods_freed, freed,
                "the feed's freed pods differ from the view's"
            );
        }
        let claims_freed = self.claim_changes(feed, now)
            || self
                .seen
                .claim_holds
                .iter()
                .any(|h| !h.is_in(&view.claim_holds));
        self.seen.claim_holds = std::sync::Arc::clone(&view.claim_holds);
        let class_changed = self.seen.gpu_class != view.gpu_class;
        self.seen.gpu_class = view.gpu_class.clone();
        let nodes_changed = self.seen.nodes_changed(view) || class_changed;
        let volumes = crate::framework::volumes::digest(&view.claims, &view.volumes);
        let budgets: Vec<String> = view
            .budgets
            .iter()
            .map(|b| b.metadata.resource_version.clone().unwrap_or_default())
            .collect();
        let budgets_changed =
            self.config.defrag.settings.mode.makes_room() && budgets != self.seen.budgets;
        let queues_changed = self.seen.queues_changed(view);
        // Pods that left wake who they could help, once the round's state shows them gone
        // ([`super::wakes`]); anything else wakes every parked pod.
        if nodes_changed
            || claims_freed
            || volumes != self.seen.volumes
            || budgets_changed
            || queues_changed
        {
            self.seen.left.anything();
        }
        // Nodes or budgets changed: what make-room found nothing for may be found now (the
        // timeline's nodes and budgets never change).
        if nodes_changed || budgets_changed {
            self.room_memo = Default::default();
        }
        self.seen.generation = Some(view.generation);
        self.seen.volumes = volumes;
        self.seen.budgets = budgets;
    }
}
