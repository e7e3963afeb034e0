//! The cluster cache: the one owner of the cluster state kept across rounds, updated in
//! place from the watch, with the reservations made on it (assume, written, forget) and the
//! devices held for preemptors (nominations). The scheduler and the extender keep one each.
//!
//! The pod cache hands out the same `Arc<PodInfo>` until a pod changes, so a round finds
//! what changed by walking the new view against the last one (both sorted by key) and
//! comparing pointers; only changed pods are given back and accounted again. A change of
//! any node (added, removed, its inventory, labels, taints or capacity) builds the state
//! anew: rare, and the node-class index is rebuilt with it.
//!
//! Reservations live in the same state: applied once when a decision is made, kept while
//! the watch still shows the pod pending, replaced by the bound pod's own accounting when
//! the watch confirms it, given back when the write fails or the pod is gone.

use std::cmp::Ordering;
use std::sync::Arc;

use super::assume::{Reservation, Reservations};
use super::preempt::Nominations;
use k8s_openapi::api::core::v1::Node;

use crate::api::ClusterView;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Snapshot, build};

/// The persistent state, the view it reflects, and what is reserved and held on it.
#[derive(Default)]
pub struct ClusterCache {
    snapshot: Option<Snapshot>,
    pods: Vec<Arc<PodInfo>>,
    nodes: Vec<Arc<Node>>,
    /// The nodes as the last view listed them (before sorting): an equal list needs no
    /// sort and no comparison.
    listed: Vec<Arc<Node>>,
    /// Full builds and in-place updates so far.
    pub builds: usize,
    pub updates: usize,
    /// Pods assumed and not yet seen bound by the watch.
    pub reservations: Reservations,
    /// Preemptors waiting for their victims, and the devices held for them.
    pub nominations: Nominations,
}

/// The state brought up to a view.
pub struct Brought {
    pub snapshot: Snapshot,
    /// Reservations whose node is gone (dropped; their pods are decided again).
    pub lost: Vec<Reservation>,
    /// The state was built anew (a node changed, or none was kept).
    pub rebuilt: bool,
}

/// The nodes sorted by name.
pub fn sorted_nodes(view: &ClusterView) -> Vec<Arc<Node>> {
    let mut nodes = view.nodes.clone();
    let by_name = |a: &Arc<Node>, b: &Arc<Node>| a.metadata.name.cmp(&b.metadata.name);
    // Caches that keep nodes in name order (and views taken twice) need no sort.
    if !nodes.is_sorted_by(|a, b| by_name(a, b).is_le()) {
        nodes.sort_by(by_name);
    }
    nodes
}

/// Whether two nodes differ in what scheduling reads: name, labels, gpuplace's
/// annotations, taints, the cordon, allocatable. Status heartbeats and conditions do not
/// count (readiness reaches the scheduler as taints).
pub fn node_differs(a: &Node, b: &Node) -> bool {
    let spec = |n: &Node| {
        n.spec
            .as_ref()
            .map(|s| (s.taints.clone(), s.unschedulable))
            .unwrap_or_default()
    };
    let allocatable = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    a.metadata.name != b.metadata.name
        || a.metadata.labels != b.metadata.labels
        || a.metadata.annotations != b.metadata.annotations
        || spec(a) != spec(b)
        || allocatable(a) != allocatable(b)
}

/// Whether the node sets (sorted by name) differ in what scheduling reads.
pub fn nodes_differ(old: &[Arc<Node>], new: &[Arc<Node>]) -> bool {
    old.len() != new.len()
        || old
            .iter()
            .zip(new)
            .any(|(a, b)| !Arc::ptr_eq(a, b) && node_differs(a, b))
}

fn key(p: &PodInfo) -> (&str, &str) {
    (p.key.namespace.as_str(), p.key.name.as_str())
}

impl ClusterCache {
    pub fn snapshot_mut(&mut self) -> Option<&mut Snapshot> {
        self.snapshot.as_mut()
    }

    /// Brings the state to `view`, with the reservations applied (and those the view
    /// confirms, or that lost their node, dropped; the latter are returned).
    /// The round takes the state out and gives it back with [`keep`](Self::keep); a round
    /// that fails before giving it back makes the next one build it anew.
    pub fn update(&mut self, view: &ClusterView, gpu_resource: &str) -> Brought {
        let out = self.bring(view, gpu_resource);
        self.pods = view.pods.clone();
        out
    }

    /// [`update`](Self::update) from a view the caller gives up: its pod list is kept
    /// without a copy.
    pub fn update_owned(&mut self, mut view: ClusterView, gpu_resource: &str) -> Brought {
        let out = self.bring(&view, gpu_resource);
        self.pods = std::mem::take(&mut view.pods);
        out
    }

    fn bring(&mut self, view: &ClusterView, gpu_resource: &str) -> Brought {
        let reservations = &mut self.reservations;
        let same_list = self.listed.len() == view.nodes.len()
            && self
                .listed
                .iter()
                .zip(&view.nodes)
                .all(|(a, b)| Arc::ptr_eq(a, b));
        let nodes_changed = if same_list {
            false
        } else {
            let nodes = sorted_nodes(view);
            let changed = nodes_differ(&self.nodes, &nodes);
            self.nodes = nodes;
            self.listed = view.nodes.clone();
            changed
        };
        let kept = self.snapshot.take().filter(|_| !nodes_changed);
        match kept {
            Some(mut snapshot) => {
                self.updates += 1;
                apply_changes(&mut snapshot, &self.pods, &view.pods, reservations);
                reservations.settle(view, &mut snapshot);
                Brought {
                    snapshot,
                    lost: Vec::new(),
                    rebuilt: false,
                }
            }
            None => {
                self.builds += 1;
                let mut snapshot = build(&view.nodes, &view.pods, gpu_resource);
                let lost = reservations.reconcile(view, &mut snapshot);
                Brought {
                    snapshot,
                    lost,
                    rebuilt: true,
                }
            }
        }
    }

    /// Gives the state back after a round.
    pub fn keep(&mut self, snapshot: Snapshot) {
        self.snapshot = Some(snapshot);
    }

    /// A decision's reservation, already applied to the state (see [`super::assume::reserve`]).
    pub fn assume(&mut self, reservation: Reservation) {
        self.reservations.assume(reservation);
    }

    /// The reserved pod's Binding was written: the reservation stays until the watch shows
    /// the pod bound.
    pub fn written(&mut self, uid: &str) {
        self.reservations.written(uid);
    }

    /// A reserved pod's Binding failed: the reservation is forgotten and what it holds in
    /// the kept state given back (once the watch confirmed the pod bound, the reservation
    /// is gone and what it holds is the bound pod's: nothing is given back).
    pub fn forget(&mut self, uid: &str) {
        if self.reservations.forget(uid).is_some()
            && let Some(snapshot) = self.snapshot.as_mut()
        {
            snapshot.release(uid);
        }
    }
}

/// Gives back and accounts again the pods that changed between `old` and `new`.
fn apply_changes(
    snapshot: &mut Snapshot,
    old: &[Arc<PodInfo>],
    new: &[Arc<PodInfo>],
    reservations: &Reservations,
) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        // Most pods are the same entry of the pod cache: no key comparison needed.
        if let (Some(a), Some(b)) = (old.get(i), new.get(j))
            && Arc::ptr_eq(a, b)
        {
            i += 1;
            j += 1;
            continue;
        }
        let order = match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) => key(a).cmp(&key(b)),
            (Some(_), None) => Ordering::Less,
            (None, _) => Ordering::Greater,
        };
        let (before, after) = match order {
            Ordering::Less => {
                i += 1;
                (Some(&old[i - 1]), None)
            }
            Ordering::Greater => {
                j += 1;
                (None, Some(&new[j - 1]))
            }
            Ordering::Equal => {
                i += 1;
                j += 1;
                if Arc::ptr_eq(&old[i - 1], &new[j - 1]) {
                    continue;
                }
                (Some(&old[i - 1]), Some(&new[j - 1]))
            }
        };
        if let Some(before) = before {
            // A reserved pod the watch still shows pending keeps its reservation.
            let still_reserved = reservations.contains(&before.key.uid)
                && after.is_some_and(|a| a.key.uid == before.key.uid && a.node_name.is_none());
            if !still_reserved {
                snapshot.release(&before.key.uid);
            }
        }
        if let Some(after) = after
            && after.is_active_bound()
            && !snapshot.held.contains_key(&after.key.uid)
        {
            snapshot.account(after);
            if let Some(n) = snapshot.held.get(&after.key.uid).map(|h| h.node) {
                snapshot.place(n, after);
            }
        }
    }
}
