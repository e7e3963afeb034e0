//! Preemption's helpers: the candidates a search may evict, in the cluster's order, and
//! the messages. The nominations (preemptors waiting for their victims) and the devices held
//! for them are [`crate::shared::nominations`]; the PostFilter stage that uses them is
//! [`super::post_filter`].

use std::collections::HashSet;
use std::sync::Arc;

use gpuplace_core::preempt::{Candidates, Holder};

use crate::api::{ClusterView, PodKey};
use crate::k8s::pod_info::PodInfo;
use crate::shared::nominations::Nomination;
use crate::snapshot::{Held, Snapshot};

/// The candidates for a preemptor of `priority` on the nodes `allowed` lets it use (and,
/// with `only`, among the pods it accepts: the preemptor's queue, or the queues reclaim may
/// take from): units of lower priority (a gang only when every member is a candidate), pods of lower
/// priority already terminating (free at no cost), the budgets. `reserved` pods (decided,
/// Binding in flight) and victims already promised to another preemptor are neither.
/// Returns the candidates (borrowing what the state holds) and the pod of each holder,
/// then of each terminating pod (`keys[holders.len() + i]` is `freeing[i]`'s).
pub fn candidates<'a>(
    snapshot: &'a Snapshot,
    view: &ClusterView,
    priority: i32,
    only: Option<&dyn Fn(&PodInfo) -> bool>,
    reserved: &dyn Fn(&str) -> bool,
    promised: &HashSet<&str>,
    allowed: Option<&[bool]>,
) -> (Candidates<'a>, Vec<Arc<PodInfo>>) {
    let mut out = Candidates::default();
    let mut keys: Vec<Arc<PodInfo>> = Vec::new();
    if !snapshot.has_priority_below(priority) {
        return (out, keys);
    }
    let budgets = crate::k8s::budgets::Budgets::new(&view.budgets);
    out.budgets = budgets.allowed();
    let mut gangs: HashSet<(&str, &str)> = HashSet::new();
    let holder = |pod: &PodInfo, held: &'a Held| Holder {
        node: held.node,
        request: &held.request,
        gpus: &held.gpus,
        budgets: budgets.covering(pod),
    };
    let skip = |uid: &str| (!promised.is_empty() && promised.contains(uid)) || reserved(uid);
    let mut units: Vec<Listed<'a>> = Vec::new();
    let mut freeing: Vec<Arc<PodInfo>> = Vec::new();
    for (n, list) in snapshot.placed.iter().enumerate() {
        if allowed.is_some_and(|m| !m.get(n).copied().unwrap_or(false)) {
            continue;
        }
        for pod in list
            .iter()
            .filter(|p| p.priority < priority && only.is_none_or(|f| f(p)))
        {
            let uid = pod.key.uid.as_str();
            let Some(held) = snapshot.held.get(uid) else {
                continue;
            };
            if skip(uid) {
                continue;
            }
            if pod.deleting {
                out.freeing.push(holder(pod, held));
                freeing.push(Arc::clone(pod));
                continue;
            }
            let members = match &pod.group {
                None => vec![(Arc::clone(pod), held)],
                Some(group) => {
                    if !gangs.insert((pod.key.namespace.as_str(), group.as_str())) {
                        continue;
                    }
                    let Some(members) = gang_members(snapshot, view, pod, priority, only, &skip)
                    else {
                        continue;
                    };
                    members
                }
            };
            units.push(Listed::of(members));
        }
    }
    // The victim search tells equals apart as every driver does, not by the order this
    // snapshot lists its pods in.
    Listed::sort_in_cluster_order(&mut units);
    for unit in units {
        out.push_unit(
            unit.priority,
            unit.made,
            unit.members.iter().map(|(p, h)| holder(p, h)),
        );
        keys.extend(unit.members.into_iter().map(|(p, _)| p));
    }
    keys.extend(freeing);
    (out, keys)
}

/// A unit (one pod, or a gang's members, by name) as the victim search and make-room list
/// it: its members, highest priority and when its first was made.
pub(super) struct Listed<'a> {
    pub members: Vec<(Arc<PodInfo>, &'a Held)>,
    pub priority: i32,
    pub made: i64,
}

impl<'a> Listed<'a> {
    pub fn of(mut members: Vec<(Arc<PodInfo>, &'a Held)>) -> Listed<'a> {
        if members.len() > 1 {
            members.sort_by(|a, b| a.0.key.name.cmp(&b.0.key.name));
        }
        let priority = members.iter().map(|(p, _)| p.priority).max().unwrap_or(0);
        let made = members
            .iter()
            .map(|(p, _)| created_ms(p))
            .min()
            .unwrap_or(0);
        Listed {
            members,
            priority,
            made,
        }
    }

    /// Its first member's name.
    fn name(&self) -> &str {
        self.members
            .first()
            .map_or("", |(p, _)| p.key.name.as_str())
    }

    /// Sorts `units` in the cluster's order, oldest first, then by name: an order that
    /// does not depend on the cache's, so plans break ties alike every time (and as the
    /// timeline replay's, whose order the test stack's names follow).
    pub fn sort_in_cluster_order(units: &mut [Listed<'_>]) {
        units.sort_by(|a, b| (a.made, a.name()).cmp(&(b.made, b.name())));
    }
}

/// A gang (of `member`) as one unit: every active member bound, none terminating, reserved,
/// promised or of the preemptor's priority or above; else `None` (it cannot be evicted).
fn gang_members<'a>(
    snapshot: &'a Snapshot,
    view: &ClusterView,
    member: &PodInfo,
    priority: i32,
    only: Option<&dyn Fn(&PodInfo) -> bool>,
    skip: &dyn Fn(&str) -> bool,
) -> Option<Vec<(Arc<PodInfo>, &'a Held)>> {
    let mut out = Vec::new();
    let mut allowed = Vec::new();
    for p in view.pods.iter().filter(|p| {
        p.key.namespace == member.key.namespace && p.group == member.group && p.is_active_bound()
    }) {
        let uid = p.key.uid.as_str();
        let held = snapshot.held.get(uid)?;
        allowed
            .push(p.priority < priority && !p.deleting && !skip(uid) && only.is_none_or(|f| f(p)));
        out.push((Arc::clone(p), held));
    }
    gpuplace_core::preempt::unit_may_be_evicted(allowed).then_some(out)
}

/// Whether a pod that preempted or made room before (ours, or by `status.nominatedNodeName`
/// after a restart) should wait for its victims rather than evict or move more:
/// kube-scheduler's rule, a pod nominated to a node where pods are still terminating waits
/// (any priority: the pods a make-room plan moved may rank above the pod it was for).
pub fn waiting_for_victims(
    pod: &PodInfo,
    nomination: Option<&Nomination>,
    view: &ClusterView,
    snapshot: &Snapshot,
) -> bool {
    if let Some(n) = nomination {
        // Adopted from an earlier run: planned again first (its plan is unknown).
        if n.adopted {
            return false;
        }
        // Every victim is gone or terminating: wait while one still holds devices (a pod
        // stopping, or a claim of a gone pod not yet deallocated); one still running means
        // an eviction failed, and preemption is tried again.
        return n.victims.iter().all(|v| {
            view.pod(&v.namespace, &v.name)
                .filter(|p| p.key.uid == v.uid)
                .is_none_or(|p| p.deleting || !p.is_active_bound())
        }) && n.victims.iter().any(|v| {
            view.pod(&v.namespace, &v.name)
                .is_some_and(|p| p.key.uid == v.uid && p.is_active_bound())
                || view
                    .claim_holds
                    .iter()
                    .any(|h| h.reserved_for.contains(&v.uid))
        });
    }
    waiting_on_node(pod, snapshot)
}

/// When the victims of `nomination` are gone at the latest (wall-clock ms): a deleting
/// victim at its `deletionTimestamp` (its grace period's end), one whose deletion the
/// watch has not shown yet `now_ms` plus its grace period, a gone one now. A nomination
/// planned again over pods already terminating on its node (after a restart: no victim of
/// its own) waits for those. `None` for an adopted nomination not planned again yet (its
/// victims are not known).
pub fn victims_gone_by(nomination: &Nomination, view: &ClusterView, now_ms: i64) -> Option<i64> {
    if nomination.adopted {
        return None;
    }
    if nomination.victims.is_empty() {
        return leaving_gone_by(
            (view.pods.iter())
                .filter(|p| p.is_active_bound())
                .filter(|p| p.node_name.as_deref() == Some(nomination.node.as_str()))
                .map(|p| &**p),
        );
    }
    let gone_by = |v: &PodKey| match view.pod(&v.namespace, &v.name) {
        Some(p) if p.key.uid == v.uid && p.is_active_bound() => match p.deleted_by {
            Some(t) if p.deleting => t.as_millisecond(),
            _ => now_ms.saturating_add(p.grace_s.saturating_mul(1_000)),
        },
        _ => now_ms,
    };
    nomination.victims.iter().map(gone_by).max()
}

/// When the last of `pods` that is terminating is gone: its `deletionTimestamp` (its grace
/// period's end); `None` when none is terminating.
pub fn leaving_gone_by<'p>(pods: impl Iterator<Item = &'p PodInfo>) -> Option<i64> {
    pods.filter(|p| p.deleting)
        .filter_map(|p| p.deleted_by.map(|t| t.as_millisecond()))
        .max()
}

/// Whether pods are terminating on the node `pod`'s `status.nominatedNodeName` names.
pub fn waiting_on_node(pod: &PodInfo, snapshot: &Snapshot) -> bool {
    let Some(node) = pod
        .nominated
        .as_deref()
        .and_then(|n| snapshot.node_index(n))
    else {
        return false;
    };
    snapshot.placed[node].iter().any(|p| p.deleting)
}

/// `mask` (all nodes when `None`) narrowed to `node` alone: an adopted nomination's
/// preemption, and a nominee's make-room, are planned on its node first. `None` when the
/// node is unknown.
pub fn on_node_only(snapshot: &Snapshot, node: &str, mask: Option<&[bool]>) -> Option<Vec<bool>> {
    let n = snapshot.node_index(node)?;
    let mut only = vec![false; snapshot.nodes.len()];
    only[n] = mask.is_none_or(|m| m.get(n).copied().unwrap_or(false));
    Some(only)
}

/// Each member's filter mask (in `order`) narrowed to `domain` (all nodes when `None`): a
/// gang's search, preemption's and make-room's, plans every member within one domain. A
/// member whose filters reject everything (`None`) gets an empty mask.
pub fn masks_within(
    order: &[usize],
    masks: &[Option<Vec<bool>>],
    domain: Option<&[bool]>,
) -> Vec<Vec<bool>> {
    order
        .iter()
        .map(|&i| {
            let mut m = masks[i].clone().unwrap_or_default();
            if let Some(d) = domain {
                m.iter_mut().zip(d).for_each(|(a, b)| *a &= *b);
            }
            m
        })
        .collect()
}

/// kube-scheduler's words when no eviction can help: nodes its filters rejected for
/// reasons eviction cannot change, and the others.
pub fn no_victims(nodes: usize, not_helpful: usize) -> String {
    let searched = nodes.saturating_sub(not_helpful);
    let mut parts = Vec::new();
    if searched > 0 {
        parts.push(format!(
            "{searched} No preemption victims found for incoming pod"
        ));
    }
    if not_helpful > 0 {
        parts.push(format!(
            "{not_helpful} Preemption is not helpful for scheduling"
        ));
    }
    format!(
        "preemption: 0/{nodes} nodes are available: {}.",
        parts.join(", ")
    )
}

/// `victims` as a message to a pod of `namespace` may name them: the first few of its own
/// namespace by name, every other one counted, never named (a message reaches whoever
/// reads pods or events of the pod's namespace).
pub fn victims_named_for(victims: &[PodKey], namespace: &str) -> String {
    let own: Vec<&PodKey> = victims
        .iter()
        .filter(|v| v.namespace == namespace)
        .collect();
    let mut parts: Vec<String> = own.iter().take(5).map(|v| v.to_string()).collect();
    if own.len() > 5 {
        parts.push(format!("{} more of namespace {namespace}", own.len() - 5));
    }
    let other = victims.len() - own.len();
    if other > 0 {
        parts.push(format!("{other} of other namespaces"));
    }
    parts.join(", ")
}

/// When `pod` was made, in ms since the epoch (unknown: the epoch, the oldest).
pub(super) fn created_ms(pod: &PodInfo) -> i64 {
    pod.created.map_or(0, |t| t.as_millisecond())
}
