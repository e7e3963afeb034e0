//! A pod's claims resolved against the claims the scheduler knows: what a pending pod
//! still has to get allocated (its GPU demand) and which allocated claims it joins, and
//! which devices a bound pod holds (each claim's devices counted on one pod only).

use std::sync::Arc;

use gpuplace_model::device_attributes::device_index;
use gpuplace_model::{GpuTopology, MILLI_PER_GPU};
use k8s_openapi::api::core::v1::Pod;

use super::{ClaimInfo, DraSettings, MAX_OPTIONS, MAX_RESERVED_FOR, ShapeRequest};

/// One of `spec.resourceClaims`: its name in the pod and the ResourceClaim it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaimRef {
    pub name: String,
    /// The ResourceClaim's name; `None` while the claim of a template is not made yet.
    pub claim: Option<String>,
}

/// The pod's `spec.resourceClaims`, each with its claim: named, or made from a template
/// (the name the controller wrote in `status.resourceClaimStatuses`). An entry whose
/// status says no claim was needed is left out.
pub fn refs_of(pod: &Pod) -> Vec<PodClaimRef> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| {
            if let Some(name) = &c.resource_claim_name {
                return Some(PodClaimRef {
                    name: c.name.clone(),
                    claim: Some(name.clone()),
                });
            }
            match statuses.and_then(|s| s.iter().find(|s| s.name == c.name)) {
                Some(status) => status.resource_claim_name.as_ref().map(|n| PodClaimRef {
                    name: c.name.clone(),
                    claim: Some(n.clone()),
                }),
                None => Some(PodClaimRef {
                    name: c.name.clone(),
                    claim: None,
                }),
            }
        })
        .collect()
}

/// What a pending pod's claims ask of the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPlan {
    /// Claims to allocate, in the pod's order, with the pod's name for each.
    pub allocate: Vec<Arc<ClaimInfo>>,
    /// Allocated claims the pod is not yet a user of.
    pub join: Vec<Arc<ClaimInfo>>,
    /// The node the allocated claims are on (the pod must go there).
    pub node: Option<String>,
    /// The GPUs to allocate: per device, milli (all equal), and how they are linked.
    pub count: u32,
    pub milli: u32,
    pub topology: GpuTopology,
    /// The share's memory, when a share asks one.
    pub memory_mib: Option<u64>,
    /// The driver whose devices are allocated.
    pub driver: String,
    /// The CEL selectors of the requests to allocate: every device must match them all.
    pub selectors: Vec<Arc<super::selectors::Selectors>>,
    /// For each claim of `allocate`, which of its options (`ClaimShape::options`) this
    /// plan meets it by.
    pub picks: Vec<usize>,
    /// Its one request asks all of a node's GPUs (`allocationMode: All`): `count` is the
    /// size of the nodes this plan is for (0 until [`super::store::alternatives`] says).
    pub all: bool,
}

impl ClaimPlan {
    /// `base` (a pod's own CPU, memory and node terms) with the GPUs this plan allocates:
    /// their count, milli per device and how they are linked. Device selectors are not
    /// part of it: they filter nodes ([`crate::framework::claim_selectors`]).
    pub fn asked(&self, base: &gpuplace_model::Request) -> gpuplace_model::Request {
        let mut request = base.clone();
        request.gpu_count = self.count;
        request.gpu_milli = if self.count > 0 { self.milli } else { 0 };
        request.need = gpuplace_model::GpuNeed {
            topology: self.topology,
            ..request.need
        };
        request
    }

    /// Requests to allocate, in the order devices are handed to them.
    pub fn requests(&self) -> impl Iterator<Item = (&Arc<ClaimInfo>, &ShapeRequest)> {
        self.allocate
            .iter()
            .zip(&self.picks)
            .flat_map(|(c, &pick)| {
                c.shape
                    .as_ref()
                    .ok()
                    .and_then(|s| s.options.get(pick))
                    .map(|o| o.requests.iter())
                    .into_iter()
                    .flatten()
                    .map(move |r| (c, r))
            })
    }
}

/// Looks claims up by namespace and name.
pub trait ClaimLookup {
    fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<ClaimInfo>>;
}

/// The claims of a pending pod, resolved: what to allocate and join, or why it waits.
/// One plan for each way its claims may be met (their `firstAvailable` subrequests), in
/// order of preference; never empty.
pub fn plans_of(
    driver: &str,
    namespace: &str,
    uid: &str,
    refs: &[PodClaimRef],
    claims: &impl ClaimLookup,
) -> Result<Vec<ClaimPlan>, String> {
    let mut base = ClaimPlan {
        allocate: Vec::new(),
        join: Vec::new(),
        node: None,
        count: 0,
        milli: MILLI_PER_GPU,
        topology: GpuTopology::Any,
        memory_mib: None,
        driver: driver.to_string(),
        selectors: Vec::new(),
        picks: Vec::new(),
        all: false,
    };
    for r in refs {
        let claim = resolved(namespace, r, claims)?;
        match &claim.allocation {
            Some(allocated) => {
                if let Some(node) = &allocated.node {
                    if base.node.as_ref().is_some_and(|n| n != node) {
                        return Err(format!(
                            "its claims are allocated on two nodes ({} and {node})",
                            base.node.as_deref().unwrap_or_default()
                        ));
                    }
                    base.node = Some(node.clone());
                }
                if !claim.reserved_for_pod(uid) {
                    if claim.reserved_for.len() >= MAX_RESERVED_FOR {
                        return Err(format!(
                            "ResourceClaim {} already has {MAX_RESERVED_FOR} users, the most the API allows",
                            claim.key()
                        ));
                    }
                    base.join.push(Arc::clone(claim));
                }
            }
            None => {
                let shape = claim
                    .shape
                    .as_ref()
                    .map_err(|e| format!("ResourceClaim {}: {e}", claim.key()))?;
                base.topology = super::constraints::both(base.topology, shape.topology)?;
                base.allocate.push(Arc::clone(claim));
            }
        }
    }
    let sizes: Vec<usize> = base
        .allocate
        .iter()
        .map(|c| c.shape.as_ref().map_or(1, |s| s.options.len()))
        .collect();
    let combinations = super::product(&sizes);
    if combinations > MAX_OPTIONS {
        return Err(format!(
            "its claims' firstAvailable lists make {} combinations; gpuplace tries at most {MAX_OPTIONS} a pod",
            super::counted(combinations)
        ));
    }
    let tried = super::combinations_of(&sizes).map(|picks| with_picks(&base, picks));
    super::kept(tried, "its claims ask nothing")
}

/// The claim `r` names, or why the pod waits for it.
fn resolved<'c>(
    namespace: &str,
    r: &PodClaimRef,
    claims: &'c impl ClaimLookup,
) -> Result<&'c Arc<ClaimInfo>, String> {
    let Some(name) = &r.claim else {
        return Err(format!(
            "waiting for the ResourceClaim of {:?} to be made from its template",
            r.name
        ));
    };
    let claim = claims
        .claim(namespace, name)
        .ok_or_else(|| format!("waiting for ResourceClaim {namespace}/{name}"))?;
    if claim.deleting {
        return Err(format!("ResourceClaim {namespace}/{name} is being deleted"));
    }
    Ok(claim)
}

/// `base` with its claims to allocate met by the options `picks` names: the GPUs they
/// ask together, or why they cannot be asked of one pod.
fn with_picks(base: &ClaimPlan, picks: Vec<usize>) -> Result<ClaimPlan, String> {
    let mut plan = ClaimPlan {
        picks,
        ..base.clone()
    };
    let requests: Vec<ShapeRequest> = plan.requests().map(|(_, r)| r.clone()).collect();
    if requests.iter().any(|r| r.all) && requests.len() > 1 {
        return Err(
            "its claims ask all of a node's GPUs (allocationMode All) and other devices; gpuplace allocates All as a pod's only request"
                .into(),
        );
    }
    for request in &requests {
        plan.all |= request.all;
        if request.milli < MILLI_PER_GPU || plan.milli < MILLI_PER_GPU {
            if plan.count > 0 {
                return Err(
                    "its claims ask a share and other devices; a pod asks whole GPUs or one share"
                        .into(),
                );
            }
            plan.milli = request.milli;
            plan.memory_mib = request.memory_mib;
        }
        plan.count += request.count;
        if let Some(s) = &request.selectors
            && !plan.selectors.contains(s)
        {
            plan.selectors.push(Arc::clone(s));
        }
    }
    Ok(plan)
}

/// The GPUs a bound pod holds through its claims: each allocated claim's devices of
/// `settings.driver` in the node's pool, counted on its owner (its first user that is
/// in the store: `alive(name, uid)`), as (GPU index, milli).
pub fn held_by(
    namespace: &str,
    uid: &str,
    node: &str,
    refs: &[PodClaimRef],
    claims: &impl ClaimLookup,
    settings: &DraSettings,
    alive: impl Fn(&str, &str) -> bool,
) -> Vec<(u32, u32)> {
    let mut held = Vec::new();
    for r in refs {
        let Some(claim) = r.claim.as_ref().and_then(|n| claims.claim(namespace, n)) else {
            continue;
        };
        let Some(allocated) = &claim.allocation else {
            continue;
        };
        let owner = claim
            .reserved_for
            .iter()
            .find(|c| c.resource == "pods" && alive(&c.name, &c.uid));
        if owner.is_none_or(|c| c.uid != uid) {
            continue;
        }
        for d in &allocated.devices {
            if d.driver != settings.driver || d.pool != node {
                continue;
            }
            if let Some(index) = device_index(&d.device)
                && !held.iter().any(|(i, _)| *i == index)
            {
                held.push((index, d.milli));
            }
        }
    }
    held
}
