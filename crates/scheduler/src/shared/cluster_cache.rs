//! The cluster cache: the one owner of the cluster state kept across rounds, updated in
//! place from the watch, with the reservations made on it (assume, written, forget) and the
//! devices held for preemptors (nominations). The scheduler and the extender keep one each.
//!
//! It follows the pod store's change feed: each update takes only the pods changed since
//! the last one (their value then and now), gives back what the old value held and
//! accounts the new one, so the work is in proportion to the changes, not to the pods.
//! When the feed cannot say (the first update, a relist, a reader further behind than the
//! store remembers) the new list is walked against the pods it last took (both sorted by
//! key; unchanged pods are the same `Arc`). A change of any node (added, removed, its
//! inventory, labels, taints or capacity) builds the state anew: rare, and the node-class
//! index is rebuilt with it.
//!
//! Reservations live in the same state: applied once when a decision is made, kept while
//! the watch still shows the pod pending, replaced by the bound pod's own accounting when
//! the watch confirms it, given back when the write fails or the pod is gone.

use std::cmp::Ordering;
use std::sync::Arc;

use super::assume::{Reservation, Reservations};
use super::nominations::{Nomination, Nominations};
use super::pod_index::PodIndex;
use gpuplace_core::TargetWorkload;
use gpuplace_model::Cursor;
use k8s_openapi::api::core::v1::Node;

use crate::api::{ClusterView, PodFeed, PodKey};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Snapshot, build};

/// The persistent state, the view it reflects, and what is reserved and held on it.
#[derive(Default)]
pub struct ClusterCache {
    snapshot: Option<Snapshot>,
    /// The pods as of `cursor`, the state's moment.
    pods: PodIndex,
    cursor: Option<Cursor>,
    nodes: Vec<Arc<Node>>,
    /// The nodes as the last view listed them (before sorting): an equal list needs no
    /// sort and no comparison.
    listed: crate::api::Listed<Node>,
    /// Full builds, in-place updates and walks of the whole pod list so far.
    pub builds: usize,
    pub updates: usize,
    pub walks: usize,
    /// Pods assumed and not yet seen bound by the watch.
    reservations: Reservations,
    /// Preemptors waiting for their victims, and the devices held for them.
    nominations: Nominations,
    /// The claims no pod holds, as the state counts them now.
    claim_holds: Arc<[crate::k8s::dra::store::ClaimHold]>,
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
    let mut nodes = view.nodes.to_vec();
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
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    pub fn snapshot_mut(&mut self) -> Option<&mut Snapshot> {
        self.snapshot.as_mut()
    }

    /// Where the pods taken so far stand in the pod store's feed (`None`: none taken).
    pub fn cursor(&self) -> Option<Cursor> {
        self.cursor
    }

    /// FGD's target workload: `declared`, else the shapes of the pods taken.
    pub fn workload(&self, declared: Option<&Arc<TargetWorkload>>) -> Arc<TargetWorkload> {
        match declared {
            Some(declared) => Arc::clone(declared),
            None => self.pods.workload(),
        }
    }

    /// The pods as of the state's moment.
    pub fn pods(&self) -> &PodIndex {
        &self.pods
    }

    /// Brings the state to `view` and the pods changed in `feed` (`view.pods` holds every
    /// pod when `feed.changes` is `None`), with the reservations applied (and those the
    /// pods confirm, or that lost their node, dropped; the latter are returned).
    /// The round takes the state out and gives it back with [`keep`](Self::keep); a round
    /// that fails before giving it back makes the next one build it anew.
    pub fn update(&mut self, view: &ClusterView, feed: PodFeed, gpu_resource: &str) -> Brought {
        let mut brought = self.bring(view, feed, gpu_resource);
        // Claims no pod holds: the state's earlier ones given back where they changed.
        let before: &[_] = if brought.rebuilt {
            &[]
        } else {
            &self.claim_holds
        };
        brought.snapshot.follow_claims(before, view);
        self.claim_holds = Arc::clone(&view.claim_holds);
        brought
    }

    fn bring(&mut self, view: &ClusterView, feed: PodFeed, gpu_resource: &str) -> Brought {
        let nodes_changed = self.nodes_changed(view);
        let kept = self.snapshot.take().filter(|_| !nodes_changed);
        self.cursor = Some(feed.cursor);
        let reservations = &mut self.reservations;
        match (kept, feed.changes) {
            (Some(mut snapshot), Some(changes)) => {
                self.updates += 1;
                for change in &changes {
                    apply_change(
                        &mut snapshot,
                        change.before.as_ref(),
                        change.after.as_ref(),
                        reservations,
                    );
                    self.pods.apply(change);
                }
                reservations.settle(&self.pods, &mut snapshot);
                Brought {
                    snapshot,
                    lost: Vec::new(),
                    rebuilt: false,
                }
            }
            (Some(mut snapshot), None) => {
                self.walks += 1;
                apply_changes(&mut snapshot, &self.pods.all(), &view.pods, reservations);
                self.pods.reset(&view.pods);
                reservations.settle(&self.pods, &mut snapshot);
                Brought {
                    snapshot,
                    lost: Vec::new(),
                    rebuilt: false,
                }
            }
            (None, changes) => {
                self.builds += 1;
                match changes {
                    Some(changes) => changes.iter().for_each(|c| self.pods.apply(c)),
                    None => self.pods.reset(&view.pods),
                }
                let mut snapshot = build(&view.nodes, &self.pods.all(), gpu_resource);
                let lost = reservations.reconcile(&self.pods, &mut snapshot);
                Brought {
                    snapshot,
                    lost,
                    rebuilt: true,
                }
            }
        }
    }

    /// Whether the nodes changed in what scheduling reads since the last update.
    fn nodes_changed(&mut self, view: &ClusterView) -> bool {
        // The cache hands out the same list while no node changed: one pointer compared.
        let same_list = Arc::ptr_eq(&self.listed, &view.nodes)
            || (self.listed.len() == view.nodes.len()
                && self
                    .listed
                    .iter()
                    .zip(view.nodes.iter())
                    .all(|(a, b)| Arc::ptr_eq(a, b)));
        if same_list {
            return false;
        }
        let nodes = sorted_nodes(view);
        let changed = nodes_differ(&self.nodes, &nodes);
        self.nodes = nodes;
        self.listed = Arc::clone(&view.nodes);
        changed
    }

    /// Compares the kept state with one built afresh from `view` (with the same
    /// reservations): `Err` names the first node whose free resources differ. For tests of
    /// the incremental cache (feature `bench-hooks`).
    #[cfg(feature = "bench-hooks")]
    pub fn verify(&mut self, view: &ClusterView, gpu_resource: &str) -> Result<(), String> {
        let Some(kept) = self.snapshot.as_ref().map(|s| s.free_by_node()) else {
            return Ok(());
        };
        let mut fresh = build(&view.nodes, &view.pods, gpu_resource);
        fresh.follow_claims(&[], view);
        let mut copy = Reservations::default();
        for uid in self.reservations.uids() {
            if let Some(r) = self.reservations.get(&uid) {
                copy.assume(r.clone());
            }
        }
        copy.reconcile(view, &mut fresh);
        let fresh = fresh.free_by_node();
        match kept.iter().zip(&fresh).find(|(a, b)| a != b) {
            None if kept.len() == fresh.len() => Ok(()),
            None => Err(format!("{} nodes kept, {} built", kept.len(), fresh.len())),
            Some((a, b)) => Err(format!("kept {a:?}, built {b:?}")),
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

    /// The reservations, to read (they change through [`Self::assume`],
    /// [`Self::written`], [`Self::forget`] and the watch).
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// The nominations, to read (they change through [`Self::nominate`] and the other
    /// operations below).
    pub fn nominations(&self) -> &Nominations {
        &self.nominations
    }

    /// Pod `uid`'s reservation, while it has one.
    pub fn reservation(&self, uid: &str) -> Option<&Reservation> {
        self.reservations.get(uid)
    }

    /// Whether pod `uid` is reserved (decided; the watch has not shown it bound yet).
    pub fn is_reserved(&self, uid: &str) -> bool {
        self.reservations.contains(uid)
    }

    /// How many pods are reserved.
    pub fn reserved_count(&self) -> usize {
        self.reservations.len()
    }

    /// The nodes of written reservations whose pod is gone from `view` or finished (what
    /// it held there is free).
    pub fn reservations_gone(&self, view: &ClusterView) -> Vec<String> {
        self.reservations.gone_from(view)
    }

    /// Pod `uid`'s nomination, while it waits for its victims.
    pub fn nomination(&self, uid: &str) -> Option<&Nomination> {
        self.nominations.get(uid)
    }

    /// How many preemptors wait for their victims.
    pub fn nominated_count(&self) -> usize {
        self.nominations.len()
    }

    /// Nominates a preemptor: its earlier hold given back, the new one applied.
    pub fn nominate(&mut self, nomination: Nomination, snapshot: &mut Snapshot) {
        let uid = nomination.key.uid.clone();
        self.nominations.release(&uid, snapshot);
        self.nominations.insert(nomination);
        self.nominations.restore(&uid, snapshot);
    }

    /// The node of pod `uid`'s nomination when it was adopted from an earlier run and not
    /// yet planned again (see [`Nomination::adopted`]); from now on it is not.
    pub fn take_adopted(&mut self, uid: &str) -> Option<String> {
        self.nominations.take_adopted(uid)
    }

    /// Victims some nomination of a pod other than `deciding` waits for (promised).
    pub fn promised_victims(&self, deciding: &[&PodKey]) -> std::collections::HashSet<&str> {
        self.nominations.victims(deciding)
    }

    /// Applies every nomination's hold for a round (see [`Nominations::hold`]); the pods
    /// whose `nominatedNodeName` is to be cleared.
    pub fn hold_nominations(
        &mut self,
        view: &ClusterView,
        snapshot: &mut Snapshot,
        scheduler_name: &str,
    ) -> Vec<PodKey> {
        self.nominations.hold(view, snapshot, scheduler_name)
    }

    /// Gives back every nomination's hold (before the state is kept).
    pub fn release_nominations(&self, snapshot: &mut Snapshot) {
        self.nominations.release_all(snapshot);
    }

    /// The nodes of those of `uids` that are nominated, on `snapshot` (tried first when
    /// they are decided again).
    pub fn nominated_nodes<'u>(
        &self,
        uids: impl IntoIterator<Item = &'u str>,
        snapshot: &Snapshot,
    ) -> crate::shared::members::Nominated {
        uids.into_iter()
            .filter_map(|uid| Some((uid.to_string(), self.nominations.node_in(uid, snapshot)?)))
            .collect()
    }

    /// Frees what is held for preemptor `uid`, to decide it with its own devices free.
    pub fn free_nominee(&self, uid: &str, snapshot: &mut Snapshot) {
        self.nominations.release(uid, snapshot);
    }

    /// Holds again what is held for preemptor `uid` (its decision failed).
    pub fn hold_nominee(&mut self, uid: &str, snapshot: &mut Snapshot) {
        self.nominations.restore(uid, snapshot);
    }

    /// Preemptor `uid` was decided at `placement` (see [`Nominations::decided`]).
    pub fn nominee_decided(&mut self, uid: &str, placement: &gpuplace_model::Placement) {
        self.nominations.decided(uid, placement);
    }

    /// Whether pod `uid`, whose Binding is settled, has a stale `nominatedNodeName` to
    /// clear (asked once).
    pub fn take_stale_nomination(&mut self, uid: &str) -> bool {
        self.nominations.take_stale(uid)
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

/// Gives back and accounts again the pods that changed between `old` and `new` (both
/// sorted by namespace and name).
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
                (Some(&old[i - 1]), Some(&new[j - 1]))
            }
        };
        apply_change(snapshot, before, after, reservations);
    }
}

/// Gives back what one pod's old value held and accounts its new one.
fn apply_change(
    snapshot: &mut Snapshot,
    before: Option<&Arc<PodInfo>>,
    after: Option<&Arc<PodInfo>>,
    reservations: &Reservations,
) {
    if let (Some(a), Some(b)) = (before, after)
        && Arc::ptr_eq(a, b)
    {
        return;
    }
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
