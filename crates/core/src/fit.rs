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
    /// No GPU of an allowed model has the memory the pod requires.
    GpuMemoryTooSmall,
    /// Enough GPUs are free, but no set of them meets the pod's topology requirement.
    TopologyUnavailable,
}

impl FitFailure {
    /// All reasons, in the order messages list them.
    pub const ALL: [FitFailure; 8] = [
        FitFailure::InsufficientCpu,
        FitFailure::InsufficientMemory,
        FitFailure::NoGpus,
        FitFailure::ModelNotAllowed,
        FitFailure::InsufficientGpus,
        FitFailure::NoGpuWithShare,
        FitFailure::GpuMemoryTooSmall,
        FitFailure::TopologyUnavailable,
    ];

    fn slot(self) -> usize {
        self as usize
    }

    /// Phrase in kube-scheduler's style, for `resource` (e.g. `nvidia.com/gpu`) and the
    /// request's requirements.
    pub fn phrase_for(self, resource: &str, ask: &Asked) -> String {
        match self {
            FitFailure::GpuMemoryTooSmall => format!(
                "node(s) had no GPU with {} of memory",
                mebibytes(ask.min_memory_mib)
            ),
            FitFailure::TopologyUnavailable => format!(
                "node(s) had no {} GPUs {}",
                ask.gpu_count,
                ask.topology.phrase()
            ),
            other => other.phrase(resource),
        }
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
            FitFailure::GpuMemoryTooSmall => "node(s) had no GPU with the requested memory".into(),
            FitFailure::TopologyUnavailable => {
                "node(s) had no GPU set with the requested topology".into()
            }
        }
    }
}

/// `40Gi` for whole GiB, else `1536Mi`.
fn mebibytes(mib: u64) -> String {
    if mib > 0 && mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// What the explained request asked, for the phrases that name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub gpu_count: u32,
    pub topology: gpuplace_model::GpuTopology,
    pub min_memory_mib: u64,
}

impl Asked {
    pub fn of(request: &gpuplace_model::Request) -> Asked {
        Asked {
            gpu_count: request.gpu_count,
            topology: request.need.topology,
            min_memory_mib: request.need.min_memory_mib,
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
    /// What the request asked, for phrases that name it.
    pub asked: Asked,
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
            .map(|r| (self.count(*r), r.phrase_for(resource, &self.asked)))
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
