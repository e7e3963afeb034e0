//! kube-scheduler's own scan, for `kube-default` (v1.26 to v1.33, `schedule_one.go`):
//!
//! - On clusters of 100 nodes or more it stops filtering once it has found
//!   `numFeasibleNodesToFind` feasible nodes (`percentageOfNodesToScore`; 0, the default,
//!   is adaptive: `50 - nodes/125` percent, at least 5%, and never fewer than 100 nodes),
//!   and scores only those.
//! - The scan starts where the last one stopped (`nextStartNodeIndex` moves on by the
//!   nodes it processed, feasible or not, whatever the outcome) so every node gets its turn.
//! - Equal top scores go to one of them uniformly (`selectHost`'s reservoir sampling).
//!
//! kube-scheduler filters in 16 goroutines and keeps whichever feasible nodes they report
//! first; the scan here takes them in order, which finds the same number from the same
//! start.

use gpuplace_model::Request;
use rand::RngExt;

use super::{Decision, Placer, Sampling};
use crate::devices::{choose_gpus, preference_bonus};
use crate::fit::{Asked, Unschedulable};
use crate::policy::simple_score;
use crate::state::ClusterState;

/// Below this many nodes every node is scored (`minFeasibleNodesToFind`).
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// The adaptive percentage never goes below this (`minFeasibleNodesPercentageToFind`).
const MIN_FEASIBLE_NODES_PERCENTAGE: usize = 5;

/// `numFeasibleNodesToFind`: how many feasible nodes a scan of `nodes` looks for.
pub fn nodes_to_find(percentage: u32, nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES_TO_FIND {
        return nodes;
    }
    let percentage = match percentage as usize {
        0 => (50usize.saturating_sub(nodes / 125)).max(MIN_FEASIBLE_NODES_PERCENTAGE),
        p => p,
    };
    (nodes * percentage / 100).clamp(MIN_FEASIBLE_NODES_TO_FIND, nodes)
}

impl Placer {
    /// Sets kube-scheduler's `percentageOfNodesToScore` for `kube-default` (0: adaptive,
    /// its default; 100: every node). Other policies score every node.
    pub fn with_percentage_of_nodes_to_score(mut self, percentage: u32) -> Self {
        if let Some(sampling) = &mut self.sampling {
            sampling.percentage = percentage;
        }
        self
    }

    /// kube-scheduler's choice: the feasible nodes one scan from the rotating start finds,
    /// the best of them, equal scores broken uniformly.
    pub(super) fn choose_sampled(
        &mut self,
        state: &ClusterState,
        request: &Request,
        allowed: Option<&[bool]>,
    ) -> Result<Decision, Unschedulable> {
        let total = state.len();
        let mut why = Unschedulable::new(total);
        why.asked = Asked::of(request);
        let Some(sampling) = self.sampling.filter(|_| total > 0) else {
            return Err(why);
        };
        let to_find = nodes_to_find(sampling.percentage, total);
        let start = sampling.next_start % total;
        let mut best: Option<(i64, usize)> = None;
        let mut ties = 0u32;
        let (mut feasible, mut processed) = (0, 0);
        while feasible < to_find && processed < total {
            let n = (start + processed) % total;
            processed += 1;
            if allowed.is_some_and(|mask| !mask.get(n).copied().unwrap_or(false)) {
                continue;
            }
            if let Err(reason) = state.fit(n, request) {
                why.add(reason);
                continue;
            }
            feasible += 1;
            let score = simple_score(self.policy, n, state.inventory(n), state.node(n), request)
                + preference_bonus(state, n, request);
            match best {
                Some((top, _)) if score < top => {}
                Some((top, _)) if score == top => {
                    ties += 1;
                    if self.rng.random_range(0..ties) == 0 {
                        best = Some((score, n));
                    }
                }
                _ => {
                    best = Some((score, n));
                    ties = 1;
                }
            }
        }
        // kube-scheduler moves its start on whether or not the pod fits.
        self.sampling = Some(Sampling {
            next_start: (start + processed) % total,
            ..sampling
        });
        let Some((score, node)) = best else {
            if let Some(mask) = allowed {
                why.nodes = why.nodes.min(mask.len());
            }
            return Err(why);
        };
        let gpus = choose_gpus(self.policy, &mut self.rng, state, node, request, 0);
        Ok(Decision { node, gpus, score })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use gpuplace_model::NodeInventory;

    fn req(cpu: u64, count: u32) -> Request {
        Request {
            cpu_milli: cpu,
            memory_mib: 1024,
            gpu_count: count,
            gpu_milli: 1000,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    fn cluster(n: usize) -> ClusterState {
        let nodes = (0..n)
            .map(|i| NodeInventory::uniform(&format!("n{i:04}"), 96_000, 393_216, 8, "A100"))
            .collect();
        ClusterState::new(nodes).unwrap()
    }

    #[test]
    fn finds_as_many_nodes_as_kube_scheduler() {
        // Under 100 nodes: all of them.
        assert_eq!(nodes_to_find(0, 99), 99);
        // 500 nodes: 50 - 4 = 46% (the 230 kube-scheduler logged on the real server).
        assert_eq!(nodes_to_find(0, 500), 230);
        // 1,213 nodes (openb): 50 - 9 = 41%.
        assert_eq!(nodes_to_find(0, 1213), 497);
        // 5,000 nodes: 10%; 6,000: the 5% floor, 300.
        assert_eq!(nodes_to_find(0, 5000), 500);
        assert_eq!(nodes_to_find(0, 6000), 300);
        // 200 nodes at 10% would be 20: never fewer than 100.
        assert_eq!(nodes_to_find(10, 200), 100);
        assert_eq!(nodes_to_find(100, 500), 500);
        assert_eq!(nodes_to_find(250, 500), 500);
    }

    #[test]
    fn the_scan_rotates_and_scores_only_what_it_found() {
        let mut state = cluster(500);
        // Empty nodes all tie; a node made emptier than the rest would win a full scan.
        let mut placer = Placer::new(Policy::KubeDefault, 1);
        let pod = req(1_000, 1);
        // Pods fill the cluster; every choice comes from the 230 nodes of its own scan,
        // and the scans walk around the cluster.
        let mut starts = Vec::new();
        for _ in 0..6 {
            let start = placer.sampling.unwrap().next_start;
            starts.push(start);
            let d = placer.place(&mut state, &pod).unwrap();
            let offset = (d.node + 500 - start) % 500;
            assert!(
                offset < 230,
                "node {} outside the scan from {start}",
                d.node
            );
        }
        assert_eq!(starts, vec![0, 230, 460, 190, 420, 150]);
    }

    #[test]
    fn infeasible_nodes_count_as_processed_and_ties_spread() {
        let mut state = cluster(200);
        // The first 150 nodes are full: a scan from 0 processes them and finds the 50 free.
        let full = req(96_000, 8);
        for n in 0..150 {
            state
                .apply(n, &full, &(0..8).map(|g| (g, 1000)).collect::<Vec<_>>())
                .unwrap();
        }
        let mut placer = Placer::new(Policy::KubeDefault, 7);
        let d = placer.choose(&state, &req(1_000, 1), None).unwrap();
        assert!(d.node >= 150);
        // 100 nodes to find, 50 feasible in the whole cluster: one full turn.
        assert_eq!(placer.sampling.unwrap().next_start, 0);
        // Equal nodes: the pick spreads over them (kube-scheduler's reservoir sampling), it
        // does not keep landing on one.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..40 {
            seen.insert(placer.choose(&state, &req(1_000, 1), None).unwrap().node);
        }
        assert!(seen.len() > 10, "{seen:?}");
        // Nothing fits: every node's reason counted, the scan still moves on.
        let err = placer.choose(&state, &req(200_000, 1), None).unwrap_err();
        assert_eq!(err.nodes, 200);
    }

    #[test]
    fn a_mask_counts_as_filtered_and_every_node_can_be_scored() {
        let state = cluster(300);
        let mut mask = vec![false; 300];
        mask[299] = true;
        let mut placer = Placer::new(Policy::KubeDefault, 3);
        let d = placer.choose(&state, &req(1_000, 1), Some(&mask)).unwrap();
        assert_eq!(d.node, 299);
        let mut all = Placer::new(Policy::KubeDefault, 3).with_percentage_of_nodes_to_score(100);
        all.choose(&state, &req(1_000, 1), None).unwrap();
        assert_eq!(all.sampling.unwrap().next_start, 0);
    }
}
