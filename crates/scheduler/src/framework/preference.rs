//! Soft preferences, scored as kube-scheduler's score plugins score them and summed with
//! their default weights: NodeAffinity's preferred terms (weight 2), TaintToleration's
//! `PreferNoSchedule` taints the pod does not tolerate (3), InterPodAffinity's preferred
//! terms, the pod's and (symmetrically) placed pods' (2), and PodTopologySpread's
//! `ScheduleAnyway` constraints (2). Each plugin's raw score is normalised to 0-100 over the
//! nodes still allowed, as kube-scheduler normalises it.
//!
//! The scheduler ranks the nodes where the pod fits by this sum first and lets the placement
//! policy choose the node and GPUs among those with the best sum: a preference is honoured
//! whenever it can be, and GPU packing decides everything the preferences leave open.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Taint, TopologySpreadConstraint, WeightedPodAffinityTerm};

use crate::framework::interpod::{Placed, term_selects};
use crate::framework::node_filters::{labels, term_matches, tolerates};
use crate::k8s::pod_info::PodInfo;
use crate::k8s::selector::selects;

const NODE_AFFINITY_WEIGHT: i64 = 2;
const TAINT_WEIGHT: i64 = 3;
const INTER_POD_WEIGHT: i64 = 2;
const SPREAD_WEIGHT: i64 = 2;
const MAX_SCORE: i64 = 100;

/// Whether `node` has a `PreferNoSchedule` taint (then every pod is scored).
pub fn has_soft_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.effect == "PreferNoSchedule"))
}

/// Whether `pod` has preferences to score (its own, or through placed pods' preferred
/// terms when `placed_prefer`, or through nodes' soft taints when `soft_taints`).
pub fn wanted(pod: &PodInfo, placed_prefer: bool, soft_taints: bool) -> bool {
    placed_prefer
        || soft_taints
        || pod
            .terms
            .as_ref()
            .is_some_and(|t| t.preferred_node_affinity.is_some())
        || pod.placement.as_ref().is_some_and(|t| t.has_preferences())
}

/// kube's DefaultNormalizeScore: scaled so the highest allowed raw score is 100 (reversed:
/// the lowest), over the allowed nodes.
fn add_scaled(total: &mut [i64], raw: &[i64], allowed: &[bool], reverse: bool, weight: i64) {
    let max = (0..raw.len())
        .filter(|&n| allowed[n])
        .map(|n| raw[n])
        .max()
        .unwrap_or(0);
    for n in 0..raw.len() {
        let scaled = if max > 0 { MAX_SCORE * raw[n] / max } else { 0 };
        let scaled = if reverse { MAX_SCORE - scaled } else { scaled };
        total[n] += weight * scaled;
    }
}

/// Min-max scaling to 0-100 (InterPodAffinity's normalisation); all equal gives 0.
fn add_min_max(total: &mut [i64], raw: &[i64], allowed: &[bool], weight: i64) {
    let scored = (0..raw.len()).filter(|&n| allowed[n]).map(|n| raw[n]);
    let (min, max) = scored.fold((i64::MAX, i64::MIN), |(lo, hi), s| (lo.min(s), hi.max(s)));
    if max <= min {
        return;
    }
    for n in 0..raw.len() {
        total[n] += weight * MAX_SCORE * (raw[n] - min) / (max - min);
    }
}

fn soft_taints_not_tolerated(node: &Node, pod: &PodInfo) -> i64 {
    let tolerations = pod
        .terms
        .as_ref()
        .and_then(|t| t.tolerations.as_deref())
        .unwrap_or_default();
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|t| {
            !tolerations.iter().any(|tol| {
                tol.effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == "PreferNoSchedule")
                    && tolerates(tol, t)
            })
        })
        .count() as i64
}

/// The preference sum per node (0 to 900); only `allowed` nodes are meaningful.
pub fn scores(placed: &Placed, pod: &PodInfo, allowed: &[bool]) -> Vec<i64> {
    let n_nodes = placed.nodes.len();
    let mut total = vec![0; n_nodes];
    if let Some(prefs) = pod
        .terms
        .as_ref()
        .and_then(|t| t.preferred_node_affinity.as_ref())
    {
        let raw: Vec<i64> = placed
            .nodes
            .iter()
            .map(|node| {
                prefs
                    .iter()
                    .filter(|p| term_matches(&p.preference, node, labels(node)))
                    .map(|p| i64::from(p.weight))
                    .sum()
            })
            .collect();
        add_scaled(&mut total, &raw, allowed, false, NODE_AFFINITY_WEIGHT);
    }
    let raw: Vec<i64> = placed
        .nodes
        .iter()
        .map(|node| soft_taints_not_tolerated(node, pod))
        .collect();
    if raw.iter().any(|&r| r > 0) {
        add_scaled(&mut total, &raw, allowed, true, TAINT_WEIGHT);
    }
    let raw = inter_pod(placed, pod);
    add_min_max(&mut total, &raw, allowed, INTER_POD_WEIGHT);
    if let Some(terms) = pod.placement.as_ref().filter(|t| !t.soft_spread.is_empty()) {
        let scaled = spread(placed, pod, &terms.soft_spread, allowed);
        for (t, s) in total.iter_mut().zip(scaled) {
            *t += SPREAD_WEIGHT * s;
        }
    }
    total
}

/// InterPodAffinity's raw score: for every placed pod, the weights of the incoming pod's
/// preferred terms that select it (anti-affinity negative), and of its own preferred terms
/// that select the incoming pod, credited to its topology domain; a node sums its domains.
fn inter_pod(placed: &Placed, pod: &PodInfo) -> Vec<i64> {
    let mut by_domain: HashMap<String, HashMap<String, i64>> = HashMap::new();
    let none: &[WeightedPodAffinityTerm] = &[];
    let own = pod.placement.as_deref();
    let (like, unlike) = own.map_or((none, none), |t| {
        (&t.preferred_affinity[..], &t.preferred_anti_affinity[..])
    });
    let ns = pod.key.namespace.as_str();
    for (m, q) in placed.each() {
        let theirs = q.placement.as_deref();
        let (their_like, their_unlike) = theirs.map_or((none, none), |t| {
            (&t.preferred_affinity[..], &t.preferred_anti_affinity[..])
        });
        let mut credit = |term: &WeightedPodAffinityTerm, sign: i64| {
            if let Some(value) = placed.label(m, &term.pod_affinity_term.topology_key) {
                *by_domain
                    .entry(term.pod_affinity_term.topology_key.clone())
                    .or_default()
                    .entry(value.clone())
                    .or_default() += sign * i64::from(term.weight);
            }
        };
        // The pod's terms select placed pods; placed pods' terms select the pod.
        let owner = q.key.namespace.as_str();
        let passes: [(&[WeightedPodAffinityTerm], &str, &PodInfo, i64); 4] = [
            (like, ns, q, 1),
            (unlike, ns, q, -1),
            (their_like, owner, pod, 1),
            (their_unlike, owner, pod, -1),
        ];
        for (terms, term_owner, selected, sign) in passes {
            for term in terms
                .iter()
                .filter(|t| term_selects(&t.pod_affinity_term, term_owner, selected))
            {
                credit(term, sign);
            }
        }
    }
    (0..placed.nodes.len())
        .map(|n| {
            by_domain
                .iter()
                .filter_map(|(key, values)| placed.label(n, key).and_then(|v| values.get(v)))
                .sum()
        })
        .collect()
}

/// PodTopologySpread's normalised score for `ScheduleAnyway` constraints: per constraint,
/// the matching pods in the node's domain plus `maxSkew - 1`, weighted by
/// `ln(domains + 2)`; fewer is better; nodes without every key score 0.
fn spread(
    placed: &Placed,
    pod: &PodInfo,
    constraints: &[TopologySpreadConstraint],
    allowed: &[bool],
) -> Vec<i64> {
    let n_nodes = placed.nodes.len();
    let has_keys = |n: usize| {
        constraints
            .iter()
            .all(|c| placed.label(n, &c.topology_key).is_some())
    };
    let mut raw = vec![0.0f64; n_nodes];
    for c in constraints {
        let mut counts: HashMap<&String, i64> = HashMap::new();
        for n in (0..n_nodes).filter(|&n| allowed[n] && has_keys(n)) {
            if let Some(v) = placed.label(n, &c.topology_key) {
                counts.entry(v).or_default();
            }
        }
        for (m, q) in placed.each() {
            if q.key.namespace == pod.key.namespace
                && allowed.get(m).copied().unwrap_or(false)
                && selects(c.label_selector.as_ref(), &q.labels)
                && let Some(v) = placed.label(m, &c.topology_key)
                && let Some(count) = counts.get_mut(v)
            {
                *count += 1;
            }
        }
        let weight = ((counts.len() + 2) as f64).ln();
        for (n, r) in raw.iter_mut().enumerate() {
            if let Some(count) = placed.label(n, &c.topology_key).and_then(|v| counts.get(v)) {
                *r += (*count + i64::from(c.max_skew) - 1) as f64 * weight;
            }
        }
    }
    let raw: Vec<i64> = raw.into_iter().map(|r| r.round() as i64).collect();
    let scored: Vec<usize> = (0..n_nodes)
        .filter(|&n| allowed[n] && has_keys(n))
        .collect();
    let max = scored.iter().map(|&n| raw[n]).max().unwrap_or(0);
    let min = scored.iter().map(|&n| raw[n]).min().unwrap_or(0);
    (0..n_nodes)
        .map(|n| {
            if !has_keys(n) {
                0
            } else if max == 0 {
                MAX_SCORE
            } else {
                MAX_SCORE * (max + min - raw[n]) / max
            }
        })
        .collect()
}

/// The nodes to place among: of the `allowed` nodes where `fits` holds, those with the
/// best preference sum. `None` when no allowed node fits (the caller explains why).
pub fn best_nodes(
    scores: &[i64],
    allowed: &[bool],
    fits: impl Fn(usize) -> bool,
) -> Option<Vec<bool>> {
    let fitting: Vec<bool> = (0..scores.len()).map(|n| allowed[n] && fits(n)).collect();
    let best = (0..scores.len())
        .filter(|&n| fitting[n])
        .map(|n| scores[n])
        .max()?;
    Some(
        (0..scores.len())
            .map(|n| fitting[n] && scores[n] == best)
            .collect(),
    )
}

#[cfg(test)]
#[path = "preference/tests.rs"]
mod tests;
