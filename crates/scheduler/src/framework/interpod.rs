//! Filters that depend on the pods already placed, as kube-scheduler's NodePorts,
//! InterPodAffinity and PodTopologySpread plugins judge them: host ports; required pod
//! affinity and anti-affinity, the incoming pod's and (symmetrically) existing pods'
//! anti-affinity; topology spread constraints with `whenUnsatisfiable: DoNotSchedule`.
//!
//! Namespaces of a term: its `namespaces`, else the owner's namespace; a
//! `namespaceSelector` of `{}` means every namespace (other selectors are read as the
//! owner's namespace: the scheduler does not watch Namespaces).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PodAffinityTerm, TopologySpreadConstraint};

use crate::k8s::pod_info::PodInfo;
use crate::k8s::pod_terms::{HostPort, PodTerms};
use crate::k8s::selector::selects;

/// Why a node was refused because of other pods, in kube-scheduler's phrases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterPodRejection {
    Ports,
    Affinity,
    AntiAffinity,
    ExistingAntiAffinity,
    Spread,
    SpreadMissingLabel,
}

impl InterPodRejection {
    pub fn phrase(&self) -> &'static str {
        match self {
            InterPodRejection::Ports => {
                "node(s) didn't have free ports for the requested pod ports"
            }
            InterPodRejection::Affinity => "node(s) didn't match pod affinity rules",
            InterPodRejection::AntiAffinity => "node(s) didn't match pod anti-affinity rules",
            InterPodRejection::ExistingAntiAffinity => {
                "node(s) didn't satisfy existing pods anti-affinity rules"
            }
            InterPodRejection::Spread => "node(s) didn't match pod topology spread constraints",
            InterPodRejection::SpreadMissingLabel => {
                "node(s) didn't match pod topology spread constraints (missing required label)"
            }
        }
    }
}

/// Whether `term`, owned by a pod in `owner_namespace`, selects `pod`.
pub fn term_selects(term: &PodAffinityTerm, owner_namespace: &str, pod: &PodInfo) -> bool {
    let all_namespaces = term.namespace_selector.as_ref().is_some_and(|s| {
        s.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
    });
    let in_namespace = match term.namespaces.as_deref() {
        Some(list) if !list.is_empty() => list.contains(&pod.key.namespace),
        _ => all_namespaces || pod.key.namespace == owner_namespace,
    };
    in_namespace && selects(term.label_selector.as_ref(), &pod.labels)
}

/// The pods placed per node (bound, or reserved by this scheduler) and the nodes.
pub struct Placed<'a> {
    pub nodes: &'a [Arc<Node>],
    pub pods: &'a [Vec<Arc<PodInfo>>],
    /// Pods placed in a trial not yet in `pods` (a gang's members), with their node.
    pub extra: &'a [(usize, Arc<PodInfo>)],
}

impl Placed<'_> {
    pub fn label(&self, n: usize, key: &str) -> Option<&String> {
        self.nodes[n].metadata.labels.as_ref()?.get(key)
    }

    pub fn each(&self) -> impl Iterator<Item = (usize, &Arc<PodInfo>)> {
        self.pods
            .iter()
            .enumerate()
            .flat_map(|(n, pods)| pods.iter().map(move |p| (n, p)))
            .chain(self.extra.iter().map(|(n, p)| (*n, p)))
    }

    /// Whether any placed pod has anti-affinity terms (then every pod must be checked).
    pub fn any_anti_affinity(&self) -> bool {
        self.each().any(|(_, p)| {
            p.placement
                .as_ref()
                .is_some_and(|t| !t.anti_affinity.is_empty())
        })
    }

    /// Per-node verdicts for `pod`; `eligible` marks the nodes its node affinity and
    /// selector allow (the domains topology spread counts). A node keeps the first
    /// rejection found, in kube-scheduler's order: ports, existing pods' anti-affinity,
    /// the pod's anti-affinity, affinity, then topology spread.
    pub fn check(&self, pod: &PodInfo, eligible: &[bool]) -> Vec<Result<(), InterPodRejection>> {
        let mut out = Rejections(vec![Ok(()); self.nodes.len()]);
        let terms = pod.placement.as_deref();
        if let Some(ports) = terms.map(|t| &t.host_ports).filter(|p| !p.is_empty()) {
            self.check_ports(ports, &mut out);
        }
        self.check_existing_anti_affinity(pod, &mut out);
        let Some(terms) = terms else {
            return out.0;
        };
        self.check_anti_affinity(pod, terms, &mut out);
        if !terms.affinity.is_empty() {
            self.check_affinity(pod, terms, &mut out);
        }
        for c in &terms.spread {
            self.check_spread(pod, c, eligible, &mut out);
        }
        out.0
    }

    /// Nodes where a placed pod holds one of the host ports.
    fn check_ports(&self, ports: &[HostPort], out: &mut Rejections) {
        for (n, q) in self.each() {
            let taken = q
                .placement
                .as_ref()
                .map(|t| &t.host_ports[..])
                .unwrap_or_default();
            if taken.iter().any(|a| ports.iter().any(|b| a.conflicts(b))) {
                out.fail(n, InterPodRejection::Ports);
            }
        }
    }

    /// Existing pods' anti-affinity against this pod.
    fn check_existing_anti_affinity(&self, pod: &PodInfo, out: &mut Rejections) {
        let mut blocked: Vec<(String, String)> = Vec::new();
        for (m, q) in self.each() {
            for term in q.placement.iter().flat_map(|t| &t.anti_affinity) {
                if term_selects(term, &q.key.namespace, pod)
                    && let Some(v) = self.label(m, &term.topology_key)
                {
                    blocked.push((term.topology_key.clone(), v.clone()));
                }
            }
        }
        if blocked.is_empty() {
            return;
        }
        for n in 0..self.nodes.len() {
            if blocked.iter().any(|(k, v)| self.label(n, k) == Some(v)) {
                out.fail(n, InterPodRejection::ExistingAntiAffinity);
            }
        }
    }

    /// The topology values where pods `term` selects (from namespace `ns`) run.
    fn domains(&self, term: &PodAffinityTerm, ns: &str) -> Vec<String> {
        self.each()
            .filter(|(_, q)| term_selects(term, ns, q))
            .filter_map(|(m, _)| self.label(m, &term.topology_key).cloned())
            .collect()
    }

    /// The pod's anti-affinity: no node in a domain where a selected pod runs.
    fn check_anti_affinity(&self, pod: &PodInfo, terms: &PodTerms, out: &mut Rejections) {
        let ns = pod.key.namespace.as_str();
        for term in &terms.anti_affinity {
            let taken = self.domains(term, ns);
            for n in 0..self.nodes.len() {
                if self
                    .label(n, &term.topology_key)
                    .is_some_and(|v| taken.contains(v))
                {
                    out.fail(n, InterPodRejection::AntiAffinity);
                }
            }
        }
    }

    /// The pod's affinity: every term's domain holds a selected pod (or the pod is the
    /// first of a group that selects itself, which may go anywhere with the keys).
    fn check_affinity(&self, pod: &PodInfo, terms: &PodTerms, out: &mut Rejections) {
        let ns = pod.key.namespace.as_str();
        let per_term: Vec<Vec<String>> =
            terms.affinity.iter().map(|t| self.domains(t, ns)).collect();
        let first = per_term.iter().all(Vec::is_empty)
            && terms.affinity.iter().all(|t| term_selects(t, ns, pod));
        for n in 0..self.nodes.len() {
            let ok = terms.affinity.iter().zip(&per_term).all(|(t, found)| {
                self.label(n, &t.topology_key)
                    .is_some_and(|v| first || found.contains(v))
            });
            if !ok {
                out.fail(n, InterPodRejection::Affinity);
            }
        }
    }

    /// A hard topology spread constraint: the skew after placing the pod stays within
    /// `maxSkew`, counted over the eligible nodes' domains.
    fn check_spread(
        &self,
        pod: &PodInfo,
        c: &TopologySpreadConstraint,
        eligible: &[bool],
        out: &mut Rejections,
    ) {
        let ns = pod.key.namespace.as_str();
        let mut counts: HashMap<&String, i32> = HashMap::new();
        for n in 0..self.nodes.len() {
            if eligible.get(n).copied().unwrap_or(true)
                && let Some(v) = self.label(n, &c.topology_key)
            {
                counts.entry(v).or_default();
            }
        }
        for (m, q) in self.each() {
            if q.key.namespace == ns
                && selects(c.label_selector.as_ref(), &q.labels)
                && eligible.get(m).copied().unwrap_or(true)
                && let Some(v) = self.label(m, &c.topology_key)
                && let Some(count) = counts.get_mut(v)
            {
                *count += 1;
            }
        }
        let min = counts.values().copied().min().unwrap_or(0);
        let own = i32::from(selects(c.label_selector.as_ref(), &pod.labels));
        for n in 0..self.nodes.len() {
            match self.label(n, &c.topology_key) {
                None => out.fail(n, InterPodRejection::SpreadMissingLabel),
                Some(v) => {
                    let here = counts.get(v).copied().unwrap_or(0);
                    if here + own - min > c.max_skew {
                        out.fail(n, InterPodRejection::Spread);
                    }
                }
            }
        }
    }
}

/// Per-node verdicts being built: each node keeps its first rejection.
struct Rejections(Vec<Result<(), InterPodRejection>>);

impl Rejections {
    fn fail(&mut self, n: usize, why: InterPodRejection) {
        if self.0[n].is_ok() {
            self.0[n] = Err(why);
        }
    }
}
