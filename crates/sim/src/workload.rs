//! A cluster and the pods to replay on it.

use gpuplace_model::NodeInventory;

use crate::trace::TracePod;

/// A cluster and the pods to replay on it.
#[derive(Clone, Debug)]
pub struct Workload {
    /// What the workload is (a file name, or `builtin`).
    pub name: String,
    pub nodes: Vec<NodeInventory>,
    pub pods: Vec<TracePod>,
}

/// A pod of the list that fits no node even in the empty cluster: it can only ever be
/// counted unallocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaceable {
    /// Its index in the pod list (its data row; the CSV line is one more, after the header).
    pub row: usize,
    pub name: String,
    /// Why, as kube-scheduler sums it up: `0/1213 nodes fit: 1000 Insufficient cpu, ...`.
    pub why: String,
}

impl std::fmt::Display for Unplaceable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {} (row {}): {}", self.name, self.row + 1, self.why)
    }
}

impl Workload {
    /// The pods that fit no node of the empty cluster (each distinct request tried once).
    pub fn unplaceable(&self) -> Result<Vec<Unplaceable>, gpuplace_core::StateError> {
        let state = gpuplace_core::ClusterState::new(self.nodes.clone())?;
        let mut verdicts: std::collections::HashMap<&gpuplace_model::Request, Option<String>> =
            Default::default();
        let mut out = Vec::new();
        for (row, pod) in self.pods.iter().enumerate() {
            let why = verdicts.entry(&pod.request).or_insert_with(|| {
                let mut counts = [0usize; gpuplace_core::FitFailure::ALL.len()];
                for n in 0..self.nodes.len() {
                    match state.fit(n, &pod.request) {
                        Ok(()) => return None,
                        Err(e) => counts[e as usize] += 1,
                    }
                }
                let reasons: Vec<String> = gpuplace_core::FitFailure::ALL
                    .iter()
                    .zip(counts)
                    .filter(|(_, c)| *c > 0)
                    .map(|(f, c)| format!("{c} {}", f.phrase(gpuplace_model::keys::GPU_RESOURCE)))
                    .collect();
                Some(format!(
                    "0/{} nodes fit: {}",
                    self.nodes.len(),
                    reasons.join(", ")
                ))
            });
            if let Some(why) = why {
                out.push(Unplaceable {
                    row,
                    name: pod.name.clone(),
                    why: why.clone(),
                });
            }
        }
        Ok(out)
    }
}
