//! Places planned for pods that are not there yet, held in the round's snapshot so no other
//! pod takes them: a preemptor's nomination (until its victims are gone and it binds) and a
//! moved pod's replacement's planned place ([`Planned`], shared with the steers of
//! `scheduler::defrag`). The cluster cache owns the nominations.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuplace_core::Decision;
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
    /// The planned place as a decision on `snapshot`'s nodes (node and GPU positions);
    /// whether it still has room is the caller's to check on its state.
    pub fn decision_in(&self, snapshot: &Snapshot) -> Option<Decision> {
        let node = snapshot.node_index(self.node)?;
        let gpus: Option<Vec<(usize, u32)>> = self
            .gpus
            .iter()
            .map(|(id, milli)| Some((snapshot.gpu_position(node, id)?, *milli)))
            .collect();
        Some(Decision {
            node,
            gpus: gpus?,
            score: 0,
        })
    }
}

/// Holds under `key`, of what `p` plans, the part already free (CPU, memory and each
/// planned GPU as far as they go): no other pod is placed there meanwhile.
pub fn hold_planned(snapshot: &mut Snapshot, key: String, p: &Planned<'_>) {
    hold_capped(snapshot, key, p, None);
}

/// Amounts of a plan's place: CPU, memory and milli per planned GPU (in the plan's order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: Vec<u32>,
}

impl Amounts {
    fn add(&mut self, other: &Amounts) {
        self.cpu_milli += other.cpu_milli;
        self.memory_mib += other.memory_mib;
        for (a, b) in self.gpus.iter_mut().zip(&other.gpus) {
            *a += b;
        }
    }
}

/// How far a nomination's hold may grow while its victims leave: what was free of its
/// plan when it was made, and what each victim gone since gave back. What other pods free
/// meanwhile is not the nominee's (its plan counted on its victims, and they still hold
/// their part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cap {
    pub allowed: Amounts,
    /// The victims still there, each with what it holds of the plan's place.
    pub leaving: Vec<(PodKey, Amounts)>,
}

/// How far a nomination's hold may grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldLimit {
    /// Not held yet since it was made: its first hold sets its [`Cap`].
    First,
    /// While its victims are still there.
    Capped(Cap),
    /// Its victims are gone (or it was adopted, or decided): what it planned, as far as
    /// it is free.
    Open,
}

/// What pod `uid` holds of the place `p` plans (its CPU and memory on the node, its milli
/// on each planned GPU).
fn share_of(snapshot: &Snapshot, uid: &str, p: &Planned<'_>) -> Amounts {
    let mut out = Amounts {
        gpus: vec![0; p.gpus.len()],
        ..Amounts::default()
    };
    let (Some(held), Some(node)) = (snapshot.held.get(uid), snapshot.node_index(p.node)) else {
        return out;
    };
    if held.node != node {
        return out;
    }
    out.cpu_milli = held.request.cpu_milli;
    out.memory_mib = held.request.memory_mib;
    for (i, (id, _)) in p.gpus.iter().enumerate() {
        if let Some(g) = snapshot.gpu_position(node, id) {
            out.gpus[i] = held.gpus.iter().filter(|h| h.0 == g).map(|h| h.1).sum();
        }
    }
    out
}

/// [`hold_planned`] within `cap`; what it held (nothing when the key holds already or
/// the node is unknown).
fn hold_capped(
    snapshot: &mut Snapshot,
    key: String,
    p: &Planned<'_>,
    cap: Option<&Amounts>,
) -> Option<Amounts> {
    if snapshot.held.contains_key(&key) {
        return None;
    }
    let node = snapshot.node_index(p.node)?;
    let free = snapshot.state.node(node);
    let mut held_gpus = Vec::with_capacity(p.gpus.len());
    let mut gpus: Vec<(usize, u32)> = Vec::with_capacity(p.gpus.len());
    for (i, (id, milli)) in p.gpus.iter().enumerate() {
        // What the victims still hold stays theirs; the rest of the GPU is the
        // nominee's, so nothing else is placed on it meanwhile (kube-scheduler counts a
        // nominated pod on its node the same way).
        let mut take = snapshot
            .gpu_position(node, id)
            .map_or(0, |g| free.gpu_free[g].min(*milli));
        if let Some(cap) = cap {
            take = take.min(cap.gpus.get(i).copied().unwrap_or(0));
        }
        held_gpus.push(take);
        if let Some(g) = snapshot.gpu_position(node, id)
            && take > 0
        {
            gpus.push((g, take));
        }
    }
    let mut request = p.request.clone();
    request.cpu_milli = request.cpu_milli.min(free.cpu_free);
    request.memory_mib = request.memory_mib.min(free.memory_free);
    if let Some(cap) = cap {
        request.cpu_milli = request.cpu_milli.min(cap.cpu_milli);
        request.memory_mib = request.memory_mib.min(cap.memory_mib);
    }
    if snapshot.state.apply(node, &request, &gpus).is_err() {
        return None;
    }
    snapshot.scalars.take(node, p.extended);
    let held = Amounts {
        cpu_milli: request.cpu_milli,
        memory_mib: request.memory_mib,
        gpus: held_gpus,
    };
    snapshot.held.insert(
        key,
        Held {
            node,
            request,
            gpus,
            extended: p.extended.clone(),
        },
    );
    Some(held)
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
    /// How far its hold may grow.
    pub hold: HoldLimit,
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

    /// Pod `uid`'s nominated node as `snapshot`'s node index, if it is nominated (tried
    /// first when it is decided again).
    pub fn node_in(&self, uid: &str, snapshot: &Snapshot) -> Option<usize> {
        snapshot.node_index(&self.by_uid.get(uid)?.node)
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
        // A new plan: its first hold sets its cap.
        nomination.hold = HoldLimit::First;
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
        // Its cap was of the devices planned before.
        n.hold = HoldLimit::Open;
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
        // What each victim gone since gave back is its nominee's; once they are all gone,
        // a nomination holds what it planned as far as it is free.
        for n in self.by_uid.values_mut() {
            let HoldLimit::Capped(cap) = &mut n.hold else {
                continue;
            };
            let there = |v: &PodKey| {
                view.pod(&v.namespace, &v.name)
                    .is_some_and(|p| p.key.uid == v.uid)
            };
            let (gone, still): (Vec<_>, Vec<_>) = std::mem::take(&mut cap.leaving)
                .into_iter()
                .partition(|(v, _)| !there(v));
            for (_, amounts) in &gone {
                cap.allowed.add(amounts);
            }
            cap.leaving = still;
            if cap.leaving.is_empty() {
                n.hold = HoldLimit::Open;
            }
        }
        let mut uids: Vec<String> = self.by_uid.keys().cloned().collect();
        uids.sort_unstable();
        for uid in uids {
            self.apply(&uid, snapshot);
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
    pub fn restore(&mut self, uid: &str, snapshot: &mut Snapshot) {
        self.apply(uid, snapshot);
    }

    /// Holds, of what pod `uid`'s nomination planned, the part free (as far as it goes,
    /// within its cap); its first hold sets the cap.
    fn apply(&mut self, uid: &str, snapshot: &mut Snapshot) {
        let Some(n) = self.by_uid.get_mut(uid) else {
            return;
        };
        let planned = Planned {
            node: &n.node,
            request: &n.request,
            gpus: &n.gpus,
            extended: &n.extended,
        };
        let cap = match &n.hold {
            HoldLimit::Capped(cap) => Some(&cap.allowed),
            HoldLimit::First | HoldLimit::Open => None,
        };
        let held = hold_capped(snapshot, hold_key(uid), &planned, cap);
        if n.hold == HoldLimit::First {
            n.hold = match held {
                Some(allowed) => HoldLimit::Capped(Cap {
                    allowed,
                    leaving: n
                        .victims
                        .iter()
                        .map(|v| (v.clone(), share_of(snapshot, &v.uid, &planned)))
                        .collect(),
                }),
                None => HoldLimit::Open,
            };
        }
    }
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
        hold: HoldLimit::Open,
    })
}
