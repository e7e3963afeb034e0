//! Places planned for pods that are not there yet, held in the round's snapshot so no other
//! pod takes them: a preemptor's nomination (until its victims are gone and it binds) and a
//! moved pod's replacement's planned place ([`Planned`], shared with the steers of
//! `scheduler::defrag`). The cluster cache owns the nominations.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuplace_core::{ClusterState, Decision};
use gpuplace_model::{Placement, Request};

use crate::api::{ClusterView, PodKey};
use crate::snapshot::{Held, Snapshot};

/// A place planned for a pod that is not there yet.
pub struct Planned<'a> {
    pub node: &'a str,
    pub request: &'a Request,
    /// GPU IDs and milli.
    pub gpus: &'a [(String, u32)],
    pub extended: &'a BTreeMap<String, i64>,
}

impl Planned<'_> {
    /// A pod's decision on the planned devices, when `decided` is on the planned node and
    /// every planned GPU still has room on `state` (the round's, or a trial copy of it):
    /// the plan's exact place (the policy may prefer other GPUs of the node now that the
    /// plan's other pods hold theirs, but the plan counted on these). Otherwise `decided`
    /// as it is.
    pub fn exact_in(
        &self,
        snapshot: &Snapshot,
        state: &ClusterState,
        decided: Decision,
    ) -> Decision {
        let Some(node) = snapshot.node_index(self.node) else {
            return decided;
        };
        if decided.node != node || decided.gpus.len() != self.gpus.len() {
            return decided;
        }
        let free = &state.node(node).gpu_free;
        let planned: Option<Vec<(usize, u32)>> = self
            .gpus
            .iter()
            .map(|(id, milli)| {
                let g = snapshot.gpu_position(node, id)?;
                (free.get(g).is_some_and(|&f| f >= *milli)).then_some((g, *milli))
            })
            .collect();
        match planned {
            Some(gpus) => Decision { gpus, ..decided },
            None => decided,
        }
    }
}

/// Holds under `key`, of what `p` plans, the part already free (CPU, memory and each
/// planned GPU as far as they go): no other pod is placed there meanwhile.
pub fn hold_planned(snapshot: &mut Snapshot, key: String, p: &Planned<'_>) {
    if snapshot.held.contains_key(&key) {
        return;
    }
    let Some(node) = snapshot.node_index(p.node) else {
        return;
    };
    let free = snapshot.state.node(node);
    let gpus: Vec<(usize, u32)> = p
        .gpus
        .iter()
        .filter_map(|(id, milli)| {
            let g = snapshot.gpu_position(node, id)?;
            // What the victims still hold stays theirs; the rest of the GPU is the
            // nominee's, so nothing else is placed on it meanwhile (kube-scheduler counts
            // a nominated pod on its node the same way).
            let free_now = free.gpu_free[g].min(*milli);
            (free_now > 0).then_some((g, free_now))
        })
        .collect();
    let mut request = p.request.clone();
    request.cpu_milli = request.cpu_milli.min(free.cpu_free);
    request.memory_mib = request.memory_mib.min(free.memory_free);
    if snapshot.state.apply(node, &request, &gpus).is_err() {
        return;
    }
    snapshot.scalars.take(node, p.extended);
    snapshot.held.insert(
        key,
        Held {
            node,
            request,
            gpus,
            extended: p.extended.clone(),
        },
    );
}

/// A preemptor waiting for its victims to go, and the devices it will take then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nomination {
    pub key: PodKey,
    pub priority: i32,
    pub node: String,
    pub request: Request,
    /// GPU IDs and milli planned on the node.
    pub gpus: Vec<(String, u32)>,
    pub extended: BTreeMap<String, i64>,
    pub victims: Vec<PodKey>,
    /// Adopted from the API (an earlier run's): its plan is not known, only that pods
    /// terminate on its node, so the pod's next preemption is planned again on that node
    /// (what is still to evict is evicted, what terminates counts as freeing) before it
    /// waits; cleared then ([`Nominations::take_adopted`]).
    pub adopted: bool,
}

/// Nominations by pod UID.
#[derive(Debug, Default)]
pub struct Nominations {
    by_uid: HashMap<String, Nomination>,
    /// Pods decided on another node than their nomination's, whose `nominatedNodeName`
    /// is cleared once their Binding's outcome is known: clearing it before would change
    /// the pod's resourceVersion under the Binding's precondition, and the Binding would
    /// be refused.
    stale: HashSet<String>,
}

/// The key under which a nomination's hold sits among the snapshot's holdings.
fn hold_key(uid: &str) -> String {
    format!("nominated/{uid}")
}

/// Whether pod `uid` is a nominee whose places `snapshot` holds.
pub fn holds(snapshot: &Snapshot, uid: &str) -> bool {
    snapshot.held.contains_key(&hold_key(uid))
}

impl Nominations {
    pub fn get(&self, uid: &str) -> Option<&Nomination> {
        self.by_uid.get(uid)
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// Nominates a pod. A pod nominated again to the same node keeps its earlier victims
    /// (those still terminating free devices promised to it, to no other preemptor).
    pub fn insert(&mut self, mut nomination: Nomination) {
        if let Some(old) = self.by_uid.remove(&nomination.key.uid)
            && old.node == nomination.node
        {
            for v in old.victims {
                if !nomination.victims.contains(&v) {
                    nomination.victims.push(v);
                }
            }
        }
        self.by_uid.insert(nomination.key.uid.clone(), nomination);
    }

    /// The node of pod `uid`'s nomination if adopted and not yet planned again; from now
    /// on it waits for its victims as any nomination does.
    pub fn take_adopted(&mut self, uid: &str) -> Option<String> {
        let n = self.by_uid.get_mut(uid)?;
        std::mem::take(&mut n.adopted).then(|| n.node.clone())
    }

    /// Pod `uid` was decided onto `decided` (a node's name and the GPU IDs and milli it
    /// takes). Decided where it was nominated, the nomination stays until the pod is seen
    /// bound, planned now on the devices decided: should the Binding fail, they stay held
    /// for it rather than free for a pod nominated elsewhere (whose own victims would then
    /// free devices nobody asked for). Decided elsewhere, the nomination ends, and its
    /// `nominatedNodeName` is cleared after the Binding ([`Self::take_stale`]).
    pub fn decided(&mut self, uid: &str, decided: &Placement) {
        let Some(n) = self.by_uid.get_mut(uid) else {
            return;
        };
        if n.node != decided.node {
            self.by_uid.remove(uid);
            self.stale.insert(uid.to_string());
            return;
        }
        n.gpus = decided
            .devices
            .iter()
            .map(|d| (d.id.clone(), d.milli))
            .collect();
    }

    /// Whether pod `uid`, whose Binding's outcome is known, has a `nominatedNodeName` to
    /// clear (it was decided on another node); asked once.
    pub fn take_stale(&mut self, uid: &str) -> bool {
        self.stale.remove(uid)
    }

    /// UIDs of every victim some nomination of a pod other than `deciding` waits for (not
    /// offered to other preemptors, and what they free is promised). A preemptor deciding
    /// again may take its own victims again (one whose eviction failed is evicted again).
    pub fn victims(&self, deciding: &[&PodKey]) -> HashSet<&str> {
        self.by_uid
            .iter()
            .filter(|(uid, _)| !deciding.iter().any(|k| k.uid == **uid))
            .flat_map(|(_, n)| n.victims.iter().map(|v| v.uid.as_str()))
            .collect()
    }

    /// Ends the nominations whose pod is gone or bound; returns the pods bound elsewhere
    /// than nominated (their `nominatedNodeName` is to be cleared), then applies the others'
    /// holds to `snapshot`. A pending pod of `scheduler_name` whose `nominatedNodeName` was
    /// written by an earlier run (before a restart or a change of leader) is adopted
    /// first: the nomination the API records is the hold it says it is.
    pub fn hold(
        &mut self,
        view: &ClusterView,
        snapshot: &mut Snapshot,
        scheduler_name: &str,
    ) -> Vec<PodKey> {
        for pod in view.pods.iter() {
            if pod.nominated.is_some()
                && pod.is_pending_for(scheduler_name)
                && !self.by_uid.contains_key(&pod.key.uid)
                && let Some(adopted) = adopt(pod, snapshot)
            {
                self.by_uid.insert(pod.key.uid.clone(), adopted);
            }
        }
        let mut clear = Vec::new();
        self.by_uid.retain(|uid, n| {
            let Some(pod) = view
                .pod(&n.key.namespace, &n.key.name)
                .filter(|p| p.key.uid == *uid)
            else {
                return false;
            };
            match &pod.node_name {
                Some(node) => {
                    if *node != n.node {
                        clear.push(n.key.clone());
                    }
                    false
                }
                None => true,
            }
        });
        for n in self.by_uid.values() {
            apply_hold(snapshot, n);
        }
        clear
    }

    /// Gives back every hold (before the state is kept for the next round).
    pub fn release_all(&self, snapshot: &mut Snapshot) {
        for uid in self.by_uid.keys() {
            snapshot.release(&hold_key(uid));
        }
    }

    /// Gives back the hold of pod `uid` (to decide it with its own devices free).
    pub fn release(&self, uid: &str, snapshot: &mut Snapshot) {
        if self.by_uid.contains_key(uid) {
            snapshot.release(&hold_key(uid));
        }
    }

    /// Applies the hold of pod `uid` again (its decision failed).
    pub fn restore(&self, uid: &str, snapshot: &mut Snapshot) {
        if let Some(n) = self.by_uid.get(uid) {
            apply_hold(snapshot, n);
        }
    }
}

/// Holds, of what `n` planned, the part already free (as far as it goes).
fn apply_hold(snapshot: &mut Snapshot, n: &Nomination) {
    hold_planned(
        snapshot,
        hold_key(&n.key.uid),
        &Planned {
            node: &n.node,
            request: &n.request,
            gpus: &n.gpus,
            extended: &n.extended,
        },
    );
}

/// The nomination an earlier run wrote for `pod` (`status.nominatedNodeName`), as far as
/// the API shows it: the node, the pod's request, its victims taken to be the pods
/// terminating there (a preemption's victims, or the pods a make-room plan moved, which
/// may be of any priority), and the GPUs planned where the most will be free once they are
/// gone (what is free now, plus what they hold). `None` when the node is unknown or the
/// pod's demand unreadable.
fn adopt(pod: &crate::k8s::pod_info::PodInfo, snapshot: &Snapshot) -> Option<Nomination> {
    let node_name = pod.nominated.as_deref()?;
    let demand = pod.demand.as_ref().ok()?;
    let n = snapshot.node_index(node_name)?;
    let terminating: Vec<&std::sync::Arc<crate::k8s::pod_info::PodInfo>> =
        snapshot.placed[n].iter().filter(|p| p.deleting).collect();
    let mut freed = snapshot.state.node(n).gpu_free.clone();
    for p in &terminating {
        if let Some(held) = snapshot.held.get(&p.key.uid) {
            for &(g, milli) in &held.gpus {
                if let Some(f) = freed.get_mut(g) {
                    *f += milli;
                }
            }
        }
    }
    let request = &demand.request;
    let mut order: Vec<usize> = (0..freed.len())
        .filter(|&g| freed[g] >= request.gpu_milli.max(1))
        .collect();
    // The GPUs the victims free first (then the emptiest), in index order among equals.
    order.sort_by_key(|&g| {
        std::cmp::Reverse(freed[g] - snapshot.state.node(n).gpu_free[g].min(freed[g]))
    });
    let inventory = snapshot.state.inventory(n);
    let gpus = order
        .into_iter()
        .take(request.gpu_count as usize)
        .filter_map(|g| Some((inventory.gpus.get(g)?.id.clone(), request.gpu_milli)))
        .collect();
    Some(Nomination {
        key: pod.key.clone(),
        priority: pod.priority,
        node: node_name.to_string(),
        request: request.clone(),
        gpus,
        extended: demand.extended.clone(),
        victims: terminating.iter().map(|p| p.key.clone()).collect(),
        adopted: true,
    })
}
