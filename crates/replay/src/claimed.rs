//! A workload's GPUs read as DRA claims (`gpuplace simulate --dra`): each shape's
//! ResourceClaimTemplate as `replay --dra` creates it ([`crate::claims::claim_template`]),
//! its claim read by the scheduler's own code (`ClaimInfo::of`, `plans_of`,
//! `ClaimPlan::asked`, and the claim-selector filter over each node's GPUs as gpuplace's
//! driver publishes them), and what the claim asks compared with what the pod asked. The
//! simulator then replays claim pods with exactly what the scheduler places them by; a
//! shape a claim cannot carry is refused by name.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use gpuplace_model::{GpuNeed, NodeInventory, Request};
use gpuplace_scheduler::framework::claim_selectors::node_verdict;
use gpuplace_scheduler::k8s::dra::pod::{ClaimLookup, ClaimPlan, PodClaimRef, plans_of};
use gpuplace_scheduler::k8s::dra::{ClaimInfo, DraSettings};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claims::{POD_CLAIM, claim_template, template_name};
use crate::objects::ObjectError;

/// Why a workload's GPUs cannot be read as claims.
#[derive(Debug, thiserror::Error)]
pub enum ClaimedError {
    #[error("the claim of shape {shape}: {source}")]
    Template { shape: String, source: ObjectError },
    #[error("the claim of shape {shape} is not read as gpuplace's to allocate: {reason}")]
    Unread { shape: String, reason: String },
    #[error(
        "the claim of shape {shape} asks {claimed}, where the pod asked {asked}: a claim made from a trace shape carries whole GPUs or a share, allowed models and a required topology only (no preferred topology, model patterns or memory bounds)"
    )]
    NotAsAsked {
        shape: String,
        asked: String,
        claimed: String,
    },
    #[error(
        "the selectors of the claim of shape {shape} match the GPUs of some {model} nodes and not of others, which the simulator cannot replay"
    )]
    ModelSplit { shape: String, model: String },
}

/// What reading a workload's GPUs as claims found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// Pods whose GPUs are claimed (those that ask GPUs).
    pub pods: usize,
    /// Their shapes, each one ResourceClaimTemplate.
    pub shapes: usize,
}

/// Reads every GPU-asking request of `requests` as the claim of its shape would be read on
/// a cluster of `nodes`, and checks that the claim asks what the request asked.
pub fn read_as_claims<'a>(
    requests: impl IntoIterator<Item = &'a Request>,
    nodes: &[NodeInventory],
) -> Result<Claimed, ClaimedError> {
    let mut seen = HashSet::new();
    let mut pods = 0;
    for request in requests.into_iter().filter(|r| r.gpu_count > 0) {
        pods += 1;
        if seen.insert(gpu_part(request)) {
            check_shape(request, nodes)?;
        }
    }
    Ok(Claimed {
        pods,
        shapes: seen.len(),
    })
}

/// What a claim of `request`'s shape is made from: the request without CPU and memory.
fn gpu_part(request: &Request) -> Request {
    Request {
        cpu_milli: 0,
        memory_mib: 0,
        ..request.clone()
    }
}

/// The claim of `request`'s shape read as the scheduler reads it: asked as `request` asks.
fn check_shape(request: &Request, nodes: &[NodeInventory]) -> Result<(), ClaimedError> {
    let shape = template_name(request);
    let plan = plan_of(request, &shape)?;
    let base = Request {
        gpu_count: 0,
        gpu_milli: 0,
        allowed_models: Vec::new(),
        need: GpuNeed::default(),
        ..request.clone()
    };
    let claimed = Request {
        allowed_models: models_of(&plan, nodes, &shape)?,
        ..plan.asked(&base)
    };
    let asked = Request {
        allowed_models: present(nodes, |model| {
            request.allows_model(model) && request.need.allows_model(model)
        }),
        ..request.clone()
    };
    if claimed != asked {
        return Err(ClaimedError::NotAsAsked {
            shape,
            asked: described(&asked),
            claimed: described(&claimed),
        });
    }
    Ok(())
}

/// The one plan of the claim made from `request`'s shape.
fn plan_of(request: &Request, shape: &str) -> Result<ClaimPlan, ClaimedError> {
    let unread = |reason: String| ClaimedError::Unread {
        shape: shape.to_string(),
        reason,
    };
    let template = claim_template("simulate", "default", request).map_err(|source| {
        ClaimedError::Template {
            shape: shape.to_string(),
            source,
        }
    })?;
    let claim = ResourceClaim {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("{shape}-claim")),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: template.spec.spec,
        status: None,
    };
    let settings = DraSettings::default();
    let lookup = OneClaim(Arc::new(ClaimInfo::of(&claim, &settings)));
    let refs = [PodClaimRef {
        name: POD_CLAIM.to_string(),
        claim: claim.metadata.name.clone(),
    }];
    let mut plans = plans_of(&settings.driver, "default", "uid", &refs, &lookup).map_err(unread)?;
    if plans.len() != 1 || plans[0].all || plans[0].allocate.len() != 1 {
        return Err(unread(format!(
            "{} ways to meet it, where a trace shape has one",
            plans.len()
        )));
    }
    Ok(plans.remove(0))
}

/// The models whose nodes the plan's selectors admit (every GPU matches, as the
/// scheduler's filter asks), as a request's allowed models: empty when every model is.
fn models_of(
    plan: &ClaimPlan,
    nodes: &[NodeInventory],
    shape: &str,
) -> Result<Vec<String>, ClaimedError> {
    let mut admitted = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for node in nodes.iter().filter(|n| !n.gpus.is_empty()) {
        let model = node.gpu_model().to_string();
        if node_verdict(node, plan).is_none() {
            admitted.insert(model);
        } else {
            refused.insert(model);
        }
    }
    if let Some(model) = admitted.intersection(&refused).next() {
        return Err(ClaimedError::ModelSplit {
            shape: shape.to_string(),
            model: model.clone(),
        });
    }
    Ok(if refused.is_empty() {
        Vec::new()
    } else {
        admitted.into_iter().collect()
    })
}

/// The models of `nodes` that `allows` admits, as allowed models (empty: all of them).
fn present(nodes: &[NodeInventory], allows: impl Fn(&str) -> bool) -> Vec<String> {
    let models: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| !n.gpus.is_empty())
        .map(|n| n.gpu_model())
        .collect();
    let admitted: Vec<String> = models
        .iter()
        .filter(|m| allows(m))
        .map(|m| m.to_string())
        .collect();
    if admitted.len() == models.len() {
        Vec::new()
    } else {
        admitted
    }
}

/// `request`'s GPU part as a message shows it.
fn described(request: &Request) -> String {
    let gpus = gpu_part(request);
    serde_json::to_string(&gpus).unwrap_or_else(|_| format!("{gpus:?}"))
}

/// The scheduler's claim lookup over one claim.
struct OneClaim(Arc<ClaimInfo>);

impl ClaimLookup for OneClaim {
    fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<ClaimInfo>> {
        (self.0.namespace == namespace && self.0.name == name).then_some(&self.0)
    }
}

#[cfg(test)]
mod tests;
