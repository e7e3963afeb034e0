//! A random part of a cluster: how a policy does on small clusters, measured on the trace's
//! own node types (`gpuplace simulate --sample-nodes K`).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::workload::Workload;

/// Why a node sample cannot be drawn.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SampleError {
    #[error("a node sample needs at least one node")]
    Empty,
    #[error("cannot sample {wanted} nodes from a cluster of {have}")]
    TooMany { wanted: usize, have: usize },
}

impl Workload {
    /// Keeps `count` of the workload's nodes, drawn uniformly without replacement with
    /// `seed` (in their original order), and names the workload after the sample.
    pub fn sample_nodes(&mut self, count: usize, seed: u64) -> Result<(), SampleError> {
        let have = self.nodes.len();
        if count == 0 {
            return Err(SampleError::Empty);
        }
        if count > have {
            return Err(SampleError::TooMany {
                wanted: count,
                have,
            });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut picks: Vec<usize> = (0..have).collect();
        for i in 0..count {
            let j = rng.random_range(i..have);
            picks.swap(i, j);
        }
        let mut keep = vec![false; have];
        for &i in &picks[..count] {
            keep[i] = true;
        }
        let mut at = 0;
        self.nodes.retain(|_| {
            at += 1;
            keep[at - 1]
        });
        self.name = format!("{}, {count} of {have} nodes (sample {seed})", self.name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(nodes: usize) -> Workload {
        Workload {
            name: "w".into(),
            nodes: (0..nodes)
                .map(|i| {
                    gpuplace_model::NodeInventory::uniform(&format!("n{i}"), 8000, 1024, 2, "T4")
                })
                .collect(),
            pods: Vec::new(),
        }
    }

    #[test]
    fn samples_are_seeded_distinct_and_in_order() {
        let mut a = workload(50);
        a.sample_nodes(10, 7).unwrap();
        let mut b = workload(50);
        b.sample_nodes(10, 7).unwrap();
        let names = |w: &Workload| w.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b));
        assert_eq!(a.nodes.len(), 10);
        let index = |n: &str| n[1..].parse::<usize>().unwrap();
        assert!(names(&a).windows(2).all(|w| index(&w[0]) < index(&w[1])));
        let mut c = workload(50);
        c.sample_nodes(10, 8).unwrap();
        assert_ne!(names(&a), names(&c));
        assert_eq!(a.name, "w, 10 of 50 nodes (sample 7)");
        let mut all = workload(5);
        all.sample_nodes(5, 1).unwrap();
        assert_eq!(all.nodes.len(), 5);
    }

    #[test]
    fn impossible_samples_are_refused() {
        assert_eq!(workload(5).sample_nodes(0, 1), Err(SampleError::Empty));
        assert_eq!(
            workload(5).sample_nodes(6, 1),
            Err(SampleError::TooMany { wanted: 6, have: 5 })
        );
    }
}
