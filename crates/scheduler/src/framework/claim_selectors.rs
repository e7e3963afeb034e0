//! The filter for DRA claims' CEL selectors: a node is a candidate for a claim pod when
//! every healthy GPU it has matches the selectors of the claims to allocate, evaluated
//! against the attributes gpuplace's driver publishes for them. The policy then chooses
//! among the node's GPUs as for any pod, so every device allocated matches. A node where
//! only some GPUs match is not used (gpuplace's placement does not pick GPUs by selector
//! within a node yet); the pod's message says so.

use std::borrow::Cow;
use std::sync::Arc;

use gpuplace_model::device_attributes::device_attributes;

use crate::framework::filter::Filtered;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

/// `filtered` without the nodes whose GPUs do not all match the pod's claim selectors.
pub fn with_claim_selectors<'a>(
    filtered: Cow<'a, Filtered>,
    snapshot: &Snapshot,
    pod: &PodInfo,
) -> Cow<'a, Filtered> {
    let Some(plan) = pod.dra.as_ref().and_then(|d| d.plan.as_ref()) else {
        return filtered;
    };
    let filtered = of_its_size(filtered, snapshot, plan);
    if plan.selectors.is_empty() {
        return filtered;
    }
    let verdicts = verdicts(snapshot, plan);
    let mut out = filtered.into_owned();
    for (n, verdict) in verdicts.iter().enumerate() {
        if let Some(phrase) = verdict {
            out.reject(n, phrase);
        }
    }
    Cow::Owned(out)
}

/// A node of another size than the way is for.
pub const OTHER_SIZE: &str = "node(s) had another number of GPUs than this way of a claim asking all of a node's (allocationMode All)";

/// For a way that asks all of a node's GPUs (sized by `dra::store::alternatives`):
/// `filtered` without the nodes whose number of healthy GPUs is not the way's, so that
/// every GPU of the node is allocated, and only when every one is free.
fn of_its_size<'a>(
    filtered: Cow<'a, Filtered>,
    snapshot: &Snapshot,
    plan: &crate::k8s::dra::pod::ClaimPlan,
) -> Cow<'a, Filtered> {
    if !plan.all {
        return filtered;
    }
    let mut out = filtered.into_owned();
    for n in 0..snapshot.nodes.len() {
        let gpus = &snapshot.state.inventory(n).gpus;
        if gpus.iter().filter(|g| g.healthy).count() != plan.count as usize {
            out.reject(n, OTHER_SIZE);
        }
    }
    Cow::Owned(out)
}

/// Each node's verdict for the plan's selectors (`None`: every healthy GPU matches), made
/// once per snapshot and set of selectors.
fn verdicts(
    snapshot: &Snapshot,
    plan: &crate::k8s::dra::pod::ClaimPlan,
) -> Arc<Vec<Option<String>>> {
    let key = serde_json::json!([
        plan.driver,
        plan.selectors.iter().map(|s| s.texts()).collect::<Vec<_>>()
    ])
    .to_string();
    let mut cache = snapshot
        .selector_verdicts
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(v) = cache.get(&key) {
        return Arc::clone(v);
    }
    let made: Vec<Option<String>> = (0..snapshot.nodes.len())
        .map(|n| node_verdict(snapshot.state.inventory(n), plan))
        .collect();
    let made = Arc::new(made);
    cache.insert(key, Arc::clone(&made));
    made
}

/// A node none of whose GPUs matches the pod's claim selectors.
pub const NO_MATCH: &str = "node(s) had no GPU matching the claim's selectors";
/// A node some of whose GPUs match, not all.
pub const SOME_MATCH: &str = "node(s) had GPUs of which only some match the claim's selectors (gpuplace uses nodes whose GPUs all match)";
/// The start of the phrase for a node whose GPUs the selectors cannot be evaluated on.
pub const NOT_EVALUATED: &str = "node(s) had GPUs the claim's selectors cannot be evaluated on";

/// Whether `phrase` is this filter's (a node its claim selectors rule out).
pub fn is_selector_phrase(phrase: &str) -> bool {
    phrase == NO_MATCH || phrase == SOME_MATCH || phrase.starts_with(NOT_EVALUATED)
}

/// Whether every healthy GPU of a node (`inventory`) matches `plan`'s selectors
/// (`None`), or why the node is not used for the plan.
pub fn node_verdict(
    inventory: &gpuplace_model::NodeInventory,
    plan: &crate::k8s::dra::pod::ClaimPlan,
) -> Option<String> {
    let (mut matching, mut other) = (0usize, 0usize);
    for gpu in device_attributes(inventory).iter().filter(|g| g.healthy) {
        let mut all = true;
        for s in &plan.selectors {
            match s.matches(gpu, &plan.driver) {
                Ok(true) => {}
                Ok(false) => all = false,
                Err(e) => {
                    return Some(format!("{NOT_EVALUATED} ({e})"));
                }
            }
        }
        if all {
            matching += 1;
        } else {
            other += 1;
        }
    }
    match (matching, other) {
        (0, _) => Some(NO_MATCH.to_string()),
        (_, 0) => None,
        _ => Some(SOME_MATCH.to_string()),
    }
}
