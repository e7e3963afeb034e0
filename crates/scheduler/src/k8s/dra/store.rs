//! The claims the pod store knows, which pods use each, and a claim pod's [`PodInfo`]
//! resolved against them: a pending pod's GPU demand is what its unallocated claims ask
//! (and the node its allocated ones bind it to); a bound pod's GPUs are those of the
//! claims it owns.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpuplace_model::ObjectKey;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};

use super::pod::{ClaimLookup, ClaimPlan, held_by, plans_of};
use super::{ClaimInfo, DraSettings};
use crate::k8s::demand::PodDemand;
use crate::k8s::pod_info::{PodDra, PodInfo, SchedulingTerms};

/// An allocated claim no pod in the store holds: reserved for nobody, or only for pods
/// gone or finished while the resource claim controller has not yet deallocated it. Its
/// devices stay taken until then (the write check counts every allocation), so the state
/// counts them too, under `key` (no pod's UID), never as a victim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimHold {
    /// `claim/<namespace>/<name>`.
    pub key: Arc<str>,
    pub node: Arc<str>,
    /// (GPU index, milli) of the driver's devices in the node's pool.
    pub gpus: Arc<[(u32, u32)]>,
    /// The UIDs of the pods still in its `reservedFor` (gone or finished): a preemptor
    /// whose victim is among them waits for the claim, as for a victim still stopping.
    pub reserved_for: Arc<[String]>,
}

/// The key a claim's hold is counted under in the state: `claim/<namespace>/<name>`.
fn hold_key(claim: &ObjectKey) -> String {
    format!("claim/{}/{}", claim.0, claim.1)
}

impl ClaimHold {
    /// Whether `holds` (sorted by key, as [`ClaimIndex::unowned`] gives them) has this one
    /// as it is: a lookup by key, not a walk, as rounds compare two lists of them.
    pub fn is_in(&self, holds: &[ClaimHold]) -> bool {
        holds
            .binary_search_by(|h| h.key.cmp(&self.key))
            .is_ok_and(|i| holds[i] == *self)
    }
}

/// Claims by namespace and name, and the pods that name each.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    pub settings: DraSettings,
    claims: HashMap<ObjectKey, Arc<ClaimInfo>>,
    users: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// The claims each claim pod names (the other way round).
    named: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// Per allocated device (driver, pool, device): the claims (UID) holding it, and how
    /// much (milli), so a write is checked against the record without a walk over claims.
    held: HashMap<(String, String, String), HashMap<String, u32>>,
    /// Each allocated claim of the driver as the hold it makes when no user holds it, by
    /// the hold's key, with the claim's: made as the claim comes, so the holds, counted
    /// again at each round where pods changed, are copied by pointer in key order (made
    /// afresh at each count, a mass deletion of 2,000 claim pods made some 4 million of
    /// them, 82% of the run's allocations).
    holdable: BTreeMap<Arc<str>, (ObjectKey, ClaimHold)>,
    /// The claims made for pods' extended resources, by the owning pod's UID.
    extended: HashMap<String, BTreeSet<ObjectKey>>,
}

impl ClaimLookup for ClaimIndex {
    fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<ClaimInfo>> {
        self.claims.get(&(namespace.to_string(), name.to_string()))
    }
}

impl ClaimIndex {
    pub fn new(settings: DraSettings) -> Self {
        ClaimIndex {
            settings,
            ..Default::default()
        }
    }

    /// A claim was added or changed; the pods that name it (to resolve again).
    pub fn apply(&mut self, claim: ClaimInfo) -> Vec<ObjectKey> {
        let key = (claim.namespace.clone(), claim.name.clone());
        if let Some(old) = self.claims.get(&key).cloned() {
            self.release(&old);
        }
        let claim = Arc::new(claim);
        self.hold(&claim);
        match self.hold_of(&claim) {
            Some(hold) => self
                .holdable
                .insert(Arc::clone(&hold.key), (key.clone(), hold)),
            None => self.holdable.remove(hold_key(&key).as_str()),
        };
        self.claims.insert(key.clone(), claim);
        self.users_of(&key)
    }

    /// A claim was deleted; the pods that name it.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Vec<ObjectKey> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.claims.remove(&key) {
            self.release(&old);
        }
        self.holdable.remove(hold_key(&key).as_str());
        self.users_of(&key)
    }

    fn hold(&mut self, claim: &ClaimInfo) {
        if let Some(owner) = &claim.extended_owner {
            self.extended
                .entry(owner.clone())
                .or_default()
                .insert((claim.namespace.clone(), claim.name.clone()));
        }
        for d in claim.allocation.iter().flat_map(|a| a.devices.iter()) {
            self.held
                .entry((d.driver.clone(), d.pool.clone(), d.device.clone()))
                .or_default()
                .insert(claim.uid.clone(), d.milli);
        }
    }

    fn release(&mut self, claim: &ClaimInfo) {
        if let Some(owner) = &claim.extended_owner
            && let Some(claims) = self.extended.get_mut(owner)
        {
            claims.remove(&(claim.namespace.clone(), claim.name.clone()));
            if claims.is_empty() {
                self.extended.remove(owner);
            }
        }
        for d in claim.allocation.iter().flat_map(|a| a.devices.iter()) {
            let key = (d.driver.clone(), d.pool.clone(), d.device.clone());
            if let Some(holders) = self.held.get_mut(&key) {
                holders.remove(&claim.uid);
                if holders.is_empty() {
                    self.held.remove(&key);
                }
            }
        }
    }

    /// The claims made for the extended resources of the pod `uid`.
    pub fn extended_of(&self, uid: &str) -> Vec<Arc<ClaimInfo>> {
        self.extended
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|key| self.claims.get(key))
            .cloned()
            .collect()
    }

    /// Every claim (for checks across claims).
    pub fn claims(&self) -> impl Iterator<Item = &Arc<ClaimInfo>> {
        self.claims.values()
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    fn users_of(&self, claim: &ObjectKey) -> Vec<ObjectKey> {
        self.users
            .get(claim)
            .map(|u| u.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Why `write` would allocate a device that another claim known here already holds
    /// beyond what is left of it (the record says it is taken), if it would.
    pub fn taken(&self, write: &super::write::ClaimWrite) -> Option<String> {
        let allocation = write.allocation.as_ref()?;
        let results = allocation.devices.as_ref()?.results.as_ref()?;
        for r in results {
            let wanted = super::consumed_milli(r.consumed_capacity.as_ref());
            let key = (r.driver.clone(), r.pool.clone(), r.device.clone());
            let held: u32 = self
                .held
                .get(&key)
                .into_iter()
                .flatten()
                .filter(|(uid, _)| **uid != write.uid)
                .map(|(_, milli)| *milli)
                .sum();
            if held + wanted > gpuplace_model::MILLI_PER_GPU {
                return Some(format!(
                    "device {} of pool {} is held by other claims ({held} milli of 1000)",
                    r.device, r.pool
                ));
            }
        }
        None
    }

    /// The allocations of gpuplace's driver that no user holds (see [`ClaimHold`]), by
    /// key. `holds(pod, uid)`: the store's pod `pod` has UID `uid` and holds the claim's
    /// devices itself or will (bound and running, or waiting to be placed). Only the pods
    /// that name a claim are asked, and nothing is allocated for the asking.
    pub fn unowned(&self, holds: impl Fn(&ObjectKey, &str) -> bool) -> Vec<ClaimHold> {
        self.holdable
            .values()
            .filter(|(key, _)| {
                let Some(claim) = self.claims.get(key) else {
                    return false;
                };
                !self.users.get(key).into_iter().flatten().any(|pod| {
                    claim
                        .reserved_for
                        .iter()
                        .any(|c| c.resource == "pods" && c.name == pod.1 && holds(pod, &c.uid))
                })
            })
            .map(|(_, hold)| hold.clone())
            .collect()
    }

    /// The hold `claim` makes when no user holds it: its devices of the driver on the node
    /// of its first, if it is allocated any.
    fn hold_of(&self, claim: &ClaimInfo) -> Option<ClaimHold> {
        let mine = claim
            .allocation
            .as_ref()?
            .devices
            .iter()
            .filter(|d| d.driver == self.settings.driver);
        let node = mine.clone().next()?.pool.as_str();
        let mut gpus: Vec<(u32, u32)> = Vec::new();
        for d in mine.filter(|d| d.pool == node) {
            if let Some(index) = gpuplace_model::device_attributes::device_index(&d.device)
                && !gpus.iter().any(|(i, _)| *i == index)
            {
                gpus.push((index, d.milli));
            }
        }
        (!gpus.is_empty()).then(|| ClaimHold {
            key: hold_key(&(claim.namespace.clone(), claim.name.clone())).into(),
            node: node.into(),
            gpus: gpus.into(),
            reserved_for: claim
                .reserved_for
                .iter()
                .filter(|c| c.resource == "pods")
                .map(|c| c.uid.clone())
                .collect(),
        })
    }

    /// Whether the pod `pod` was recorded as naming claims.
    pub fn names_any(&self, pod: &ObjectKey) -> bool {
        self.named.contains_key(pod)
    }

    /// Records which claims the pod `pod` names (`None`: it is gone); returns the other
    /// users of the claims it named, whose owner may change.
    pub fn track(&mut self, pod: &ObjectKey, info: Option<&PodInfo>) -> Vec<ObjectKey> {
        let mut others = Vec::new();
        for claim in self.named.remove(pod).unwrap_or_default() {
            if let Some(users) = self.users.get_mut(&claim) {
                users.remove(pod);
                others.extend(users.iter().cloned());
                if users.is_empty() {
                    self.users.remove(&claim);
                }
            }
        }
        if let Some(dra) = info.and_then(|i| i.dra.as_ref()) {
            let claims: Vec<ObjectKey> = dra
                .refs
                .iter()
                .filter_map(|r| r.claim.as_ref().map(|n| (pod.0.clone(), n.clone())))
                .collect();
            for claim in &claims {
                self.users
                    .entry(claim.clone())
                    .or_default()
                    .insert(pod.clone());
            }
            self.named.insert(pod.clone(), claims);
        }
        others.sort();
        others.dedup();
        others.retain(|k| k != pod);
        others
    }

    /// `info` resolved against the claims: its demand, node terms and held GPUs.
    /// `alive` says whether a pod (name, UID) of the pod's namespace is in the store.
    pub fn resolve(&self, info: &PodInfo, alive: impl Fn(&str, &str) -> bool) -> PodInfo {
        let mut out = info.clone();
        let Some(dra) = &info.dra else {
            return out;
        };
        let ns = &info.key.namespace;
        match &info.node_name {
            None => {
                let mut dra = (**dra).clone();
                let planned = plans_of(&self.settings.driver, ns, &info.key.uid, &dra.refs, self);
                out.terms = dra.base_terms.clone();
                let first = planned.as_ref().map(|plans| &plans[0]);
                out.demand = match (&dra.base, first) {
                    (Err(e), _) | (Ok(_), Err(e)) => Err(e.clone()),
                    (Ok(base), Ok(plan)) => {
                        if let Some(node) = &plan.node {
                            out.terms = Some(Arc::new(on_node(out.terms.as_deref(), node)));
                        }
                        if plan.all {
                            Err(ALL_OF_A_NODE.to_string())
                        } else {
                            Ok(demand_with(base, plan))
                        }
                    }
                };
                out.filter_key = out
                    .terms
                    .as_ref()
                    .map_or_else(|| Arc::from(""), |t| Arc::from(t.key()));
                let mut plans = planned.unwrap_or_default().into_iter().map(Arc::new);
                dra.plan = plans.next();
                dra.alternatives = plans.collect();
                out.dra = Some(Arc::new(dra));
                out.claim_gpus = None;
            }
            Some(node) => {
                let held = held_by(
                    ns,
                    &info.key.uid,
                    node,
                    &dra.refs,
                    self,
                    &self.settings,
                    alive,
                );
                out.demand = dra.base.clone().map(|mut demand| {
                    demand.request.gpu_count = held.len() as u32;
                    demand.request.gpu_milli = match held.first() {
                        Some(&(_, m)) if held.iter().all(|&(_, x)| x == m) => m,
                        Some(_) => gpuplace_model::MILLI_PER_GPU,
                        None => 0,
                    };
                    if !held.is_empty() {
                        demand.extended.insert(super::DRA_GPUS.to_string(), 1);
                    }
                    demand
                });
                out.claim_gpus = Some(held.into());
            }
        }
        out
    }
}

/// A pending pod's demand with its claims met by `plan`: its own (CPU, memory, other
/// resources) and the plan's GPUs.
fn demand_with(base: &PodDemand, plan: &ClaimPlan) -> PodDemand {
    let mut demand = base.clone();
    demand.request = plan.asked(&base.request);
    if plan.count > 0 {
        demand.extended.insert(super::DRA_GPUS.to_string(), 1);
    }
    demand
}

/// What a pod whose claim asks all of a node's GPUs is told until a node's size is
/// chosen for it ([`alternatives`]).
pub const ALL_OF_A_NODE: &str = "its claim asks all of a node's GPUs (allocationMode All), which gpuplace gives on a node whose every GPU is free";

/// A resolved pending claim pod's other ways to be met (its claims' `firstAvailable`
/// subrequests after the first), each as the pod asking it: the demand and the plan
/// that way, in order of preference. A way that asks all of a node's GPUs
/// (`allocationMode: All`, the first way included) becomes one way for each of `sizes`
/// (the nodes' numbers of healthy GPUs, smallest first, so that a pod asking a whole
/// node takes the smallest that serves). Empty for a pod with one way of a fixed size.
pub fn alternatives(info: &PodInfo, sizes: &[u32]) -> Vec<Arc<PodInfo>> {
    let Some(dra) = &info.dra else {
        return Vec::new();
    };
    let Ok(base) = &dra.base else {
        return Vec::new();
    };
    let first_all = dra.plan.as_ref().filter(|p| p.all);
    let as_way = |plan: Arc<ClaimPlan>| {
        let mut alternative = info.clone();
        alternative.demand = Ok(demand_with(base, &plan));
        alternative.dra = Some(Arc::new(PodDra {
            plan: Some(plan),
            alternatives: Vec::new(),
            ..(**dra).clone()
        }));
        Arc::new(alternative)
    };
    first_all
        .into_iter()
        .chain(&dra.alternatives)
        .flat_map(|plan| {
            let sized: Vec<Arc<ClaimPlan>> = if plan.all {
                sizes
                    .iter()
                    .map(|&count| {
                        Arc::new(ClaimPlan {
                            count,
                            ..(**plan).clone()
                        })
                    })
                    .collect()
            } else {
                vec![Arc::clone(plan)]
            };
            sized
        })
        .map(as_way)
        .collect()
}

/// The numbers of healthy GPUs `state`'s nodes have, smallest first, each once (the
/// sizes a claim asking all of a node's GPUs is tried at).
pub fn node_sizes(state: &gpuplace_core::ClusterState) -> Vec<u32> {
    let mut sizes: Vec<u32> = (0..state.len())
        .map(|n| {
            let gpus = &state.inventory(n).gpus;
            gpus.iter().filter(|g| g.healthy).count() as u32
        })
        .filter(|&n| n > 0)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Whether the pod's first way asks all of a node's GPUs, or it has other ways.
pub fn has_ways(info: &PodInfo) -> bool {
    info.dra
        .as_ref()
        .is_some_and(|d| !d.alternatives.is_empty() || d.plan.as_ref().is_some_and(|p| p.all))
}

/// `terms` with the pod held to `node` (the node its allocated claims are on), as the
/// allocation's node selector says: `metadata.name In [node]` added to every term.
fn on_node(terms: Option<&SchedulingTerms>, node: &str) -> SchedulingTerms {
    let mut terms = terms.cloned().unwrap_or_default();
    let field = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let selector = terms
        .required_node_affinity
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: vec![Default::default()],
        });
    if selector.node_selector_terms.is_empty() {
        selector.node_selector_terms.push(Default::default());
    }
    for term in &mut selector.node_selector_terms {
        term.match_fields
            .get_or_insert_with(Vec::new)
            .push(field.clone());
    }
    terms
}
