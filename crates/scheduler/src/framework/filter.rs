//! The filter stage: per-node verdicts of the filters outside core (taints, selectors,
//! affinity, readiness), computed once per round for each distinct set of pod terms, and
//! the mask core places within (extended resources checked against what is still free).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuplace_core::Unschedulable;

use crate::framework::interpod::Placed;
use crate::framework::node_filters::{NodeRejection, check_node};
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::{Scalars, Snapshot};

/// Per-node verdicts and the mask core places within.
#[derive(Clone)]
pub struct Filtered {
    allowed: Vec<bool>,
    pub rejected: BTreeMap<String, usize>,
    /// Per node: 0 when not rejected, else 1 + the index of its phrase in `phrases`.
    why: Vec<u16>,
    phrases: Vec<String>,
    /// Narrowed to the nodes the pod's preferences rank best (see [`with_preferences`]).
    narrowed: bool,
}

impl Filtered {
    /// The mask for core; none when every node is allowed.
    pub fn mask(&self) -> Option<&[bool]> {
        (!self.rejected.is_empty() || self.narrowed).then_some(&self.allowed[..])
    }

    /// Whether node `n` may be used.
    pub fn allows(&self, n: usize) -> bool {
        self.allowed.get(n).copied().unwrap_or(true)
    }

    /// Why node `n` was rejected, in kube-scheduler's phrase.
    pub fn why(&self, n: usize) -> Option<&str> {
        match self.why.get(n).copied().unwrap_or(0) {
            0 => None,
            i => self.phrases.get(usize::from(i) - 1).map(String::as_str),
        }
    }

    /// Rejects node `n` for `phrase` (counted once per node).
    pub(crate) fn reject(&mut self, n: usize, phrase: &str) {
        if n >= self.allowed.len() || !self.allowed[n] {
            return;
        }
        if self.why.len() < self.allowed.len() {
            self.why.resize(self.allowed.len(), 0);
        }
        self.allowed[n] = false;
        let i = match self.phrases.iter().position(|p| p == phrase) {
            Some(i) => i,
            None => {
                self.phrases.push(phrase.to_string());
                self.phrases.len() - 1
            }
        };
        self.why[n] = u16::try_from(i + 1).unwrap_or(u16::MAX);
        *self.rejected.entry(phrase.to_string()).or_default() += 1;
    }

    /// The same verdicts over exactly `n_nodes` nodes (a mask of another length is reset).
    fn sized(mut self, n_nodes: usize) -> Filtered {
        if self.allowed.len() != n_nodes {
            self = Filtered::all(n_nodes);
        }
        self
    }

    /// Every node allowed, none rejected.
    fn all(n_nodes: usize) -> Filtered {
        Filtered {
            allowed: vec![true; n_nodes],
            rejected: BTreeMap::new(),
            why: vec![0; n_nodes],
            phrases: Vec::new(),
            narrowed: false,
        }
    }

    /// Keeps only the nodes `within` allows (a gang's topology domain).
    pub fn restrict(&mut self, within: &[bool]) {
        if self.allowed.len() != within.len() {
            *self = Filtered::all(within.len());
        }
        for (a, w) in self.allowed.iter_mut().zip(within) {
            *a &= *w;
        }
        self.narrowed = true;
    }
}

/// The verdicts for one filter key (see [`crate::k8s::pod_info::SchedulingTerms::key`]) and the
/// mask they give a pod without extended resources.
pub struct NodeFilter {
    verdicts: Vec<Result<(), NodeRejection>>,
    plain: Filtered,
    /// `plain` without the nodes whose device plugin advertises no shares (made on first
    /// use by a share pod).
    shares: std::sync::OnceLock<Filtered>,
    /// `plain` without the nodes whose GPUs are served through DRA claims (made on first
    /// use by a pod asking whole GPUs of the device plugin).
    plugin: std::sync::OnceLock<Filtered>,
}

/// Whether node `n` serves its GPUs through gpuplace's DRA driver.
fn is_dra(scalars: &Scalars, n: usize) -> bool {
    scalars.serves_claims(n)
}

/// Whether node `n` advertises the share resource (`gpuplace.io/gpu-milli`).
fn has_shares(scalars: &Scalars, n: usize) -> bool {
    scalars.free[n]
        .get(crate::k8s::demand::SHARE_RESOURCE)
        .is_some_and(|slices| *slices > 0)
}

pub type Verdicts = Arc<NodeFilter>;

fn mask_of<'a>(verdicts: impl ExactSizeIterator<Item = Result<(), &'a NodeRejection>>) -> Filtered {
    let mut out = Filtered::all(verdicts.len());
    for (n, verdict) in verdicts.enumerate() {
        if let Err(r) = verdict {
            out.reject(n, &r.phrase());
        }
    }
    out
}

/// The mask for `demand`: the cached one, unless it asks for scalar resources (extended
/// resources, the pod count, ephemeral storage, hugepages), whose free amounts change as
/// pods are placed.
pub fn filter_nodes<'a>(
    scalars: &Scalars,
    filter: &'a NodeFilter,
    demand: &crate::k8s::demand::PodDemand,
) -> Cow<'a, Filtered> {
    let share = demand.is_share();
    // A pod asking whole GPUs of the device plugin's resource: kept off nodes served
    // through DRA, unless gpuplace's DeviceClass serves that resource there (then its
    // GPUs come through a claim made for it: `dra::extended`).
    let plugin = demand.request.gpu_count > 0
        && !demand.extended.contains_key(crate::k8s::dra::DRA_GPUS)
        && !(scalars.gpu_class.is_some()
            && crate::k8s::dra::extended::serves(&demand.containers, demand.request.gpu_count));
    if !scalars.must_check(&demand.extended) {
        if plugin && !share {
            let mask = filter.plugin.get_or_init(|| {
                let verdicts: Vec<Result<(), NodeRejection>> = filter
                    .verdicts
                    .iter()
                    .enumerate()
                    .map(|(n, v)| match v {
                        Err(r) => Err(r.clone()),
                        Ok(()) if is_dra(scalars, n) => Err(NodeRejection::Extended(
                            crate::k8s::dra::PLUGIN_GPUS.to_string(),
                        )),
                        Ok(()) => Ok(()),
                    })
                    .collect();
                mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ())))
            });
            return Cow::Borrowed(mask);
        }
        if share {
            let mask = filter.shares.get_or_init(|| {
                let verdicts = filter.verdicts.iter().enumerate().map(|(n, v)| match v {
                    Err(r) => Err(r.clone()),
                    Ok(()) if has_shares(scalars, n) => Ok(()),
                    Ok(()) => Err(NodeRejection::Extended(
                        crate::k8s::demand::SHARE_RESOURCE.to_string(),
                    )),
                });
                let verdicts: Vec<Result<(), NodeRejection>> = verdicts.collect();
                mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ())))
            });
            return Cow::Borrowed(mask);
        }
        return Cow::Borrowed(&filter.plain);
    }
    let shortfall = |n: usize| {
        // A node that declares no pod limit is not limited.
        if scalars.free[n].get("pods").is_some_and(|slots| *slots < 1) {
            return Some(NodeRejection::Extended("pods".into()));
        }
        if plugin && is_dra(scalars, n) {
            return Some(NodeRejection::Extended(
                crate::k8s::dra::PLUGIN_GPUS.to_string(),
            ));
        }
        if share && !has_shares(scalars, n) {
            return Some(NodeRejection::Extended(
                crate::k8s::demand::SHARE_RESOURCE.to_string(),
            ));
        }
        demand
            .extended
            .iter()
            .find(|(resource, want)| match scalars.free[n].get(*resource) {
                Some(free) => free < *want,
                None => **want > 0,
            })
            .map(|(resource, _)| NodeRejection::Extended(resource.clone()))
    };
    let verdicts: Vec<Result<(), NodeRejection>> = filter
        .verdicts
        .iter()
        .enumerate()
        .map(|(n, verdict)| match verdict {
            Err(r) => Err(r.clone()),
            Ok(()) => shortfall(n).map_or(Ok(()), Err),
        })
        .collect();
    Cow::Owned(mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ()))))
}

/// Adds the filters about other pods (host ports, pod affinity and anti-affinity, topology
/// spread) to `filtered`, when the pod has such terms or a placed pod has anti-affinity.
/// `extra` are pods placed in a trial (a gang's members).
pub fn with_interpod<'a>(
    filtered: Cow<'a, Filtered>,
    snapshot: &Snapshot,
    pod: &PodInfo,
    extra: &[(usize, std::sync::Arc<PodInfo>)],
) -> Cow<'a, Filtered> {
    let anti = snapshot.anti_affinity_pods > 0
        || extra.iter().any(|(_, p)| {
            p.placement
                .as_ref()
                .is_some_and(|t| !t.anti_affinity.is_empty())
        });
    if !pod.placement.as_ref().is_some_and(|t| t.has_requirements()) && !anti {
        return filtered;
    }
    let n_nodes = snapshot.nodes.len();
    let eligible: Vec<bool> = if filtered.allowed.len() == n_nodes {
        filtered.allowed.clone()
    } else {
        vec![true; n_nodes]
    };
    let placed = Placed {
        nodes: &snapshot.nodes,
        pods: &snapshot.placed,
        extra,
    };
    let verdicts = placed.check(pod, &eligible);
    let mut out = filtered.into_owned().sized(n_nodes);
    for (n, verdict) in verdicts.into_iter().enumerate() {
        if let Err(why) = verdict {
            out.reject(n, why.phrase());
        }
    }
    Cow::Owned(out)
}

/// Adds the volume checks: the pod's claims must exist and be bound (else `Err`, in
/// kube-scheduler's `0/N nodes are available: ...` form), and nodes its bound volumes'
/// node affinity excludes are refused.
pub fn with_volumes<'a>(
    filtered: Cow<'a, Filtered>,
    snapshot: &Snapshot,
    volumes: &crate::framework::volumes::VolumeIndex,
    pod: &PodInfo,
) -> Result<Cow<'a, Filtered>, String> {
    if pod.claims.is_empty() {
        return Ok(filtered);
    }
    let n_nodes = snapshot.nodes.len();
    let selectors = volumes
        .check(&pod.key.namespace, &pod.claims)
        .map_err(|why| format!("0/{n_nodes} nodes are available: {why}."))?;
    if selectors.is_empty() {
        return Ok(filtered);
    }
    let mut out = filtered.into_owned().sized(n_nodes);
    for (n, node) in snapshot.nodes.iter().enumerate() {
        if out.allowed[n]
            && !selectors
                .iter()
                .all(|s| crate::framework::node_filters::matches_selector(node, s))
        {
            out.reject(n, crate::framework::volumes::NODE_CONFLICT);
        }
    }
    Ok(Cow::Owned(out))
}

/// Narrows `filtered` to the nodes where the pod fits on `state` with the best preference
/// sum (preferred node and pod affinity, soft taints, `ScheduleAnyway` spread: see
/// [`crate::framework::preference`]), when the pod or the cluster has preferences and they tell
/// fitting nodes apart. Unchanged when nothing fits, so core explains the failure.
pub fn with_preferences<'a>(
    filtered: Cow<'a, Filtered>,
    snapshot: &Snapshot,
    state: &gpuplace_core::ClusterState,
    pod: &PodInfo,
    request: &gpuplace_model::Request,
    extra: &[(usize, std::sync::Arc<PodInfo>)],
) -> Cow<'a, Filtered> {
    let placed_prefer = snapshot.preferring_pods > 0
        || extra
            .iter()
            .any(|(_, p)| p.placement.as_ref().is_some_and(|t| t.scores_others()));
    if !crate::framework::preference::wanted(pod, placed_prefer, snapshot.soft_taint_nodes > 0) {
        return filtered;
    }
    let n_nodes = snapshot.nodes.len();
    let allowed: Vec<bool> = match filtered.mask() {
        Some(mask) if mask.len() == n_nodes => mask.to_vec(),
        _ => vec![true; n_nodes],
    };
    let placed = Placed {
        nodes: &snapshot.nodes,
        pods: &snapshot.placed,
        extra,
    };
    let scores = crate::framework::preference::scores(&placed, pod, &allowed);
    let Some(best) = crate::framework::preference::best_nodes(&scores, &allowed, |n| {
        state.fit(n, request).is_ok()
    }) else {
        return filtered;
    };
    let mut out = filtered.into_owned();
    out.allowed = best;
    out.narrowed = true;
    Cow::Owned(out)
}

/// Node verdicts per filter key, computed once per round.
#[derive(Default)]
pub struct VerdictCache {
    by_key: HashMap<Arc<str>, Verdicts>,
}

impl VerdictCache {
    pub fn get(&mut self, snapshot: &Snapshot, pod: &PodInfo) -> Verdicts {
        if let Some(hit) = self.by_key.get(&pod.filter_key) {
            return hit.clone();
        }
        let terms = pod.terms.as_deref();
        let verdicts: Vec<_> = snapshot
            .nodes
            .iter()
            .map(|n| check_node(n, terms))
            .collect();
        let plain = mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ())));
        let filter = Arc::new(NodeFilter {
            verdicts,
            plain,
            shares: std::sync::OnceLock::new(),
            plugin: std::sync::OnceLock::new(),
        });
        self.by_key.insert(pod.filter_key.clone(), filter.clone());
        filter
    }
}

/// kube-scheduler's "0/N nodes are available: ..." for a pod that fits nowhere.
pub fn explain(
    mut why: Unschedulable,
    rejected: &BTreeMap<String, usize>,
    nodes: usize,
    resource: &str,
) -> String {
    why.nodes = nodes;
    why.other = rejected.iter().map(|(p, n)| (p.clone(), *n)).collect();
    why.message(resource)
}
