//! Why a request does not fit on a node, and the cluster-wide explanation built from it.

use std::fmt;

/// The first reason a node cannot take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FitFailure {
    /// Not enough CPU left.
    InsufficientCpu,
    /// Not enough memory left.
    InsufficientMemory,
    /// The node has no GPUs at all (or none healthy).
    NoGpus,
    /// The node's GPU model is not in the request's allowed list.
    ModelNotAllowed,
    /// Fewer fully free GPUs than requested.
    InsufficientGpus,
    /// No single GPU has the fractional share free.
    NoGpuWithShare,
}

impl FitFailure {
    /// All reasons, in the order messages list them.
    pub const ALL: [FitFailure; 6] = [
        FitFailure::InsufficientCpu,
        FitFailure::InsufficientMemory,
        FitFailure::NoGpus,
        FitFailure::ModelNotAllowed,
        FitFailure::InsufficientGpus,
        FitFailure::NoGpuWithShare,
    ];

    fn slot(self) -> usize {
        self as usize
    }

    /// Phrase in kube-scheduler's style, for `resource` (e.g. `nvidia.com/gpu`).
    pub fn phrase(self, resource: &str) -> String {
        match self {
            FitFailure::InsufficientCpu => "Insufficient cpu".to_string(),
            FitFailure::InsufficientMemory => "Insufficient memory".to_string(),
            FitFailure::NoGpus => format!("node(s) had no {resource}"),
            FitFailure::ModelNotAllowed => "node(s) had a GPU model the pod does not allow".into(),
            FitFailure::InsufficientGpus => format!("Insufficient {resource}"),
            FitFailure::NoGpuWithShare => {
                "node(s) had no single GPU with the requested share free".into()
            }
        }
    }
}

/// Per-reason counts of nodes that rejected a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unschedulable {
    /// Nodes considered.
    pub nodes: usize,
    counts: [usize; FitFailure::ALL.len()],
    /// Extra node counts for reasons decided outside core (taints, selectors...), by phrase.
    pub other: Vec<(String, usize)>,
}

impl Unschedulable {
    /// An empty explanation over `nodes` nodes.
    pub fn new(nodes: usize) -> Self {
        Unschedulable {
            nodes,
            ..Default::default()
        }
    }

    /// Counts one node rejected for `reason`.
    pub fn add(&mut self, reason: FitFailure) {
        self.counts[reason.slot()] += 1;
    }

    /// Nodes rejected for `reason`.
    pub fn count(&self, reason: FitFailure) -> usize {
        self.counts[reason.slot()]
    }

    /// `0/5 nodes are available: 3 Insufficient nvidia.com/gpu, 2 Insufficient cpu.`
    pub fn message(&self, resource: &str) -> String {
        let mut parts: Vec<(usize, String)> = FitFailure::ALL
            .iter()
            .filter(|r| self.count(**r) > 0)
            .map(|r| (self.count(*r), r.phrase(resource)))
            .collect();
        parts.extend(self.other.iter().map(|(p, n)| (*n, p.clone())));
        // kube-scheduler sorts the reasons alphabetically by phrase.
        parts.sort_by(|a, b| a.1.cmp(&b.1));
        let listed: Vec<String> = parts.iter().map(|(n, p)| format!("{n} {p}")).collect();
        if listed.is_empty() {
            format!("0/{} nodes are available.", self.nodes)
        } else {
            format!(
                "0/{} nodes are available: {}.",
                self.nodes,
                listed.join(", ")
            )
        }
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message("nvidia.com/gpu"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_reads_like_kube_scheduler() {
        let mut u = Unschedulable::new(5);
        for _ in 0..3 {
            u.add(FitFailure::InsufficientGpus);
        }
        u.other
            .push(("node(s) had untolerated taint {gpu: true}".into(), 2));
        assert_eq!(
            u.message("nvidia.com/gpu"),
            "0/5 nodes are available: 3 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {gpu: true}."
        );
        assert_eq!(
            Unschedulable::new(0).to_string(),
            "0/0 nodes are available."
        );
    }
}
