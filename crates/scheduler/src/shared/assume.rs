//! Assumed pods (kube-scheduler's assume/forget): a decision reserves its node and GPUs
//! at once; until the watch shows the pod bound, every round applies the reservation to
//! the state it builds, so no later decision can be given the same GPUs, however late the
//! watch is. The watch's confirmation (the pod bound, its assignment accounted from the
//! annotation the Binding wrote) replaces the reservation; a refused write forgets it.

use std::collections::{BTreeMap, HashMap};

use gpuplace_model::Request;

use crate::api::{ClusterView, PodKey, PodLookup};
use crate::snapshot::{Held, Snapshot};

/// What one assumed pod holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub key: PodKey,
    pub node: String,
    pub request: Request,
    /// GPU IDs and the milli-GPU taken on each.
    pub gpus: Vec<(String, u32)>,
    pub extended: BTreeMap<String, i64>,
    /// `namespace/name` of the pod's gang.
    pub gang: Option<String>,
    /// The Binding was written (it succeeded); the reservation now only waits for the watch.
    pub written: bool,
    /// The view has shown the pod since the reservation was made. The extender reserves
    /// pods kube-scheduler sent, which a lagging watch may not have shown yet: their absence
    /// from the view means "not seen yet", not "deleted".
    pub seen: bool,
    pub made: std::time::Instant,
}

/// A written reservation whose pod the view never showed is given up after this long (the
/// pod was deleted before the watch delivered it).
const UNSEEN_FOR: std::time::Duration = std::time::Duration::from_secs(120);

impl Reservation {
    /// Whether its pod's absence from the view means it is gone after the write.
    fn gone(&self) -> bool {
        self.written && (self.seen || self.made.elapsed() > UNSEEN_FOR)
    }
}

/// Reservations by pod UID.
#[derive(Debug, Default)]
pub struct Reservations {
    by_uid: HashMap<String, Reservation>,
}

impl Reservations {
    pub fn assume(&mut self, reservation: Reservation) {
        self.by_uid.insert(reservation.key.uid.clone(), reservation);
    }

    pub fn forget(&mut self, uid: &str) -> Option<Reservation> {
        self.by_uid.remove(uid)
    }

    pub fn get(&self, uid: &str) -> Option<&Reservation> {
        self.by_uid.get(uid)
    }

    /// The write succeeded: keep reserving until the watch shows it.
    pub fn written(&mut self, uid: &str) {
        if let Some(r) = self.by_uid.get_mut(uid) {
            r.written = true;
        }
    }

    /// The UIDs reserved.
    pub fn uids(&self) -> Vec<String> {
        self.by_uid.keys().cloned().collect()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// Every reservation.
    pub fn iter(&self) -> impl Iterator<Item = &Reservation> {
        self.by_uid.values()
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// The nodes of the reserved pods gone from `view` or finished there: what they held
    /// there is free (parked pods may fit), whether or not a view ever showed them bound.
    pub fn gone_from(&self, view: &ClusterView) -> Vec<String> {
        self.by_uid
            .iter()
            .filter(|(uid, r)| {
                match view
                    .pod(&r.key.namespace, &r.key.name)
                    .filter(|p| p.key.uid == **uid)
                {
                    None => r.written,
                    Some(p) => p.node_name.is_some() && !p.is_active_bound(),
                }
            })
            .map(|(_, r)| r.node.clone())
            .collect()
    }

    /// Members of `gang` reserved and not yet seen bound.
    pub fn of_gang<'a>(&'a self, gang: &'a str) -> impl Iterator<Item = &'a Reservation> + 'a {
        self.by_uid
            .values()
            .filter(move |r| r.gang.as_deref() == Some(gang))
    }

    /// For a state kept across rounds (whose changed pods were already given back and
    /// accounted again): drops the reservations `view` confirms, and those whose pod is gone
    /// after the write, giving back what they still hold.
    pub fn settle(&mut self, pods: &impl PodLookup, snapshot: &mut Snapshot) {
        self.by_uid.retain(|uid, r| {
            let seen = pods
                .pod(&r.key.namespace, &r.key.name)
                .filter(|p| p.key.uid == *uid);
            match seen {
                Some(p) if p.node_name.is_some() => false,
                Some(_) => {
                    r.seen = true;
                    true
                }
                None if r.gone() => {
                    snapshot.release(uid);
                    false
                }
                _ => true,
            }
        });
    }

    /// Drops what `view` confirms (bound) or shows gone after the write, and applies the
    /// rest to `snapshot`. Returns the reservations dropped because their node is gone
    /// (their pods go back to the queue).
    pub fn reconcile(
        &mut self,
        pods: &impl PodLookup,
        snapshot: &mut Snapshot,
    ) -> Vec<Reservation> {
        let mut lost = Vec::new();
        self.by_uid.retain(|uid, r| {
            let seen = pods
                .pod(&r.key.namespace, &r.key.name)
                .filter(|p| p.key.uid == *uid);
            match seen {
                // Confirmed: the state built from the view accounts it.
                Some(p) if p.node_name.is_some() => false,
                // Deleted after the Binding: nothing to hold any more.
                None if r.gone() => false,
                // Pending in the view (watch lag), not shown yet, or the write in flight.
                _ => {
                    r.seen |= seen.is_some();
                    if apply(snapshot, uid, r, seen) {
                        true
                    } else {
                        lost.push(r.clone());
                        false
                    }
                }
            }
        });
        lost
    }
}

/// Applies one reservation to the state (and the pod, when known, to the inter-pod
/// filters' index); false when its node is gone.
pub fn apply(
    snapshot: &mut Snapshot,
    uid: &str,
    r: &Reservation,
    pod: Option<&std::sync::Arc<crate::k8s::pod_info::PodInfo>>,
) -> bool {
    let Some(n) = snapshot.node_index(&r.node) else {
        return false;
    };
    let inventory = snapshot.state.inventory(n);
    let gpus: Vec<(usize, u32)> = r
        .gpus
        .iter()
        .filter_map(|(id, milli)| {
            inventory
                .gpus
                .iter()
                .position(|g| g.id == *id)
                .map(|p| (p, *milli))
        })
        .collect();
    if gpus.len() != r.gpus.len() {
        return false;
    }
    // A node that changed under the reservation (a pod bound outside gpuplace) is still
    // held as far as it goes: clamp rather than lose the reservation.
    let free = snapshot.state.node(n);
    let mut request = r.request.clone();
    request.cpu_milli = request.cpu_milli.min(free.cpu_free);
    request.memory_mib = request.memory_mib.min(free.memory_free);
    let gpus: Vec<(usize, u32)> = gpus
        .into_iter()
        .filter(|&(g, m)| free.gpu_free[g] >= m)
        .collect();
    if snapshot.state.apply(n, &request, &gpus).is_err() {
        return false;
    }
    snapshot.scalars.take(n, &r.extended);
    if let Some(pod) = pod {
        snapshot.place(n, pod);
    }
    snapshot.held.insert(
        uid.to_string(),
        Held {
            node: n,
            request,
            gpus,
            extended: r.extended.clone(),
        },
    );
    true
}

/// Reserves `decision` for `pod` in `snapshot` at once and returns the reservation and the
/// Binding that carries it (the assignment annotation, the pod's resourceVersion as the
/// precondition). The scheduler's loop and the extender's bind both decide through here.
pub fn reserve(
    snapshot: &mut Snapshot,
    pod: &std::sync::Arc<crate::k8s::pod_info::PodInfo>,
    demand: &crate::k8s::demand::PodDemand,
    decision: &gpuplace_core::Decision,
    policy: &str,
    gang: Option<String>,
) -> (Reservation, crate::api::BindRequest) {
    use crate::k8s::demand::{ASSIGNMENT_ANNOTATION, Assignment, split_devices};
    let placement = decision.to_placement(&snapshot.state);
    let claims = claim_writes(snapshot, pod, decision, &placement.node);
    let extended = extended_write(snapshot, pod, demand, decision, &placement.node);
    let containers = if pod.dra.is_some() {
        // A claim pod's containers take their devices through the claims.
        vec![gpuplace_model::ContainerAssignment {
            name: CLAIMS_ENTRY.to_string(),
            devices: placement.devices.clone(),
        }]
    } else {
        split_devices(&demand.containers, &placement.devices)
    };
    let assignment = Assignment {
        node: placement.node.clone(),
        containers,
        policy: policy.to_string(),
        time: crate::clock::rfc3339(std::time::SystemTime::now()),
    };
    let inventory = snapshot.state.inventory(decision.node);
    let reservation = Reservation {
        key: pod.key.clone(),
        node: placement.node.clone(),
        request: demand.request.clone(),
        gpus: decision
            .gpus
            .iter()
            .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
            .collect(),
        extended: demand.extended.clone(),
        gang,
        written: false,
        // The scheduler's loop decides pods from the view; the extender says otherwise.
        seen: true,
        made: std::time::Instant::now(),
    };
    if !apply(snapshot, &pod.key.uid, &reservation, Some(pod)) {
        tracing::warn!(pod = %pod.key, "a decision could not be reserved");
    }
    let request = crate::api::BindRequest {
        pod: pod.key.clone(),
        resource_version: pod.resource_version.clone(),
        inputs: pod.inputs,
        node: placement.node,
        annotations: BTreeMap::from([(ASSIGNMENT_ANNOTATION.to_string(), assignment.to_json())]),
        claims,
        extended,
    };
    (reservation, request)
}

/// The assignment's one entry for a claim pod: its containers take the devices through
/// their claims.
pub const CLAIMS_ENTRY: &str = "resourceclaims";

/// The GPUs of `decision` as the claim writes name them.
fn placed_gpus(
    snapshot: &Snapshot,
    decision: &gpuplace_core::Decision,
) -> Vec<crate::k8s::dra::write::PlacedGpu> {
    let inventory = snapshot.state.inventory(decision.node);
    decision
        .gpus
        .iter()
        .map(|&(g, _)| crate::k8s::dra::write::PlacedGpu {
            index: inventory.gpus[g].index,
            memory_mib: inventory.gpus[g].memory_mib,
        })
        .collect()
}

/// For a pod asking the device plugin's GPU resource placed on a node served through
/// DRA: the claim made for it with the GPUs of `decision` (`dra::extended`).
fn extended_write(
    snapshot: &Snapshot,
    pod: &crate::k8s::pod_info::PodInfo,
    demand: &crate::k8s::demand::PodDemand,
    decision: &gpuplace_core::Decision,
    node: &str,
) -> Option<Box<crate::k8s::dra::extended::ExtendedWrite>> {
    use crate::k8s::dra::extended::{ask_of, write_for};
    // A pod without GPUs (or with claims of its own) has nothing to claim this way.
    if pod.dra.is_some()
        || decision.gpus.is_empty()
        || !snapshot.scalars.serves_claims(decision.node)
    {
        return None;
    }
    let class = snapshot.scalars.gpu_class.as_deref()?;
    let Some(ask) = ask_of(&demand.containers, demand.request.gpu_count) else {
        tracing::error!(pod = %pod.key, "placed on a node served through DRA, but its GPU containers make no claim");
        return None;
    };
    match write_for(
        &pod.key,
        &ask,
        class,
        node,
        &placed_gpus(snapshot, decision),
    ) {
        Ok(write) => Some(Box::new(write)),
        Err(e) => {
            tracing::error!(pod = %pod.key, error = %e, "the extended-resource claim cannot be written");
            None
        }
    }
}

/// The claim writes that give `pod` the GPUs of `decision` (none for a pod without
/// claims).
fn claim_writes(
    snapshot: &Snapshot,
    pod: &crate::k8s::pod_info::PodInfo,
    decision: &gpuplace_core::Decision,
    node: &str,
) -> Vec<crate::k8s::dra::write::ClaimWrite> {
    use crate::k8s::dra::write::writes_for;
    let Some(plan) = pod.dra.as_ref().and_then(|d| d.plan.as_ref()) else {
        return Vec::new();
    };
    match writes_for(plan, &pod.key, node, &placed_gpus(snapshot, decision)) {
        Ok(writes) => writes,
        Err(e) => {
            tracing::error!(pod = %pod.key, error = %e, "the claims cannot be written");
            Vec::new()
        }
    }
}
