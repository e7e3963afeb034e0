//! Replays a pod list against a cluster the way the FGD paper does.
//!
//! Per seed: shuffle the pods, then append pods drawn uniformly with replacement from the
//! original list until the total GPU request would pass `inflate` times the cluster's GPU
//! capacity (the paper's stop test adds the candidate's per-GPU milli; we keep that quirk).
//! Pods are placed one at a time, each fully or not at all, never retried and never leaving.
//! After every pod the allocation and fragmentation are sampled against the arrived GPU
//! request; samples are averaged per integer arrived percent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::{ClusterState, Placer, Policy, StateError, TargetWorkload};
use gpuplace_model::NodeInventory;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::trace::TracePod;

/// A cluster and the pods to replay on it.
#[derive(Clone, Debug)]
pub struct Workload {
    /// What the workload is (a file name, or `builtin`).
    pub name: String,
    pub nodes: Vec<NodeInventory>,
    pub pods: Vec<TracePod>,
}

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the cluster is invalid: {0}")]
    Cluster(#[from] StateError),
    #[error("the cluster has no GPUs, so there is nothing to measure")]
    NoGpus,
    #[error("the pod list is empty")]
    NoPods,
    #[error("inflate must be between 0.01 and 10, got {0}")]
    BadInflate(f64),
    #[error("no policies to run")]
    NoPolicies,
    #[error("at least one seed is needed")]
    NoSeeds,
}

/// Per integer arrived percent (index = percent): the mean of the samples that fell there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    /// Unallocated GPU as % of capacity.
    pub unallocated: Vec<f64>,
    /// Fragmented GPU as % of capacity.
    pub frag_capacity: Vec<f64>,
    /// Fragmented GPU as % of idle GPU.
    pub frag_idle: Vec<f64>,
}

/// What one (policy, seed) replay measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub policy: Policy,
    pub seed: u64,
    pub curves: Curves,
    pub pods_arrived: usize,
    pub pods_placed: usize,
    pub pods_failed: usize,
    pub elapsed: Duration,
}

/// Sums of samples per arrived percent.
struct Buckets {
    sums: Vec<[f64; 3]>,
    counts: Vec<u32>,
}

impl Buckets {
    fn new(len: usize) -> Self {
        Buckets {
            sums: vec![[0.0; 3]; len],
            counts: vec![0; len],
        }
    }

    fn add(&mut self, percent: usize, sample: [f64; 3]) {
        if let Some(sum) = self.sums.get_mut(percent) {
            for (s, v) in sum.iter_mut().zip(sample) {
                *s += v;
            }
            self.counts[percent] += 1;
        }
    }

    /// Means per percent; a percent no sample fell on (a large pod jumped over it) takes
    /// the previous percent's value, so curves have no holes.
    fn finish(self) -> Curves {
        let mut curves = Curves::default();
        let mut last = [100.0, 0.0, 0.0];
        for (sum, count) in self.sums.iter().zip(&self.counts) {
            if *count > 0 {
                last = sum.map(|s| s / f64::from(*count));
            }
            curves.unallocated.push(last[0]);
            curves.frag_capacity.push(last[1]);
            curves.frag_idle.push(last[2]);
        }
        curves
    }
}

/// Number of arrived-percent buckets for `inflate` (131 for 1.3).
pub fn bucket_count(inflate: f64) -> usize {
    (inflate * 100.0).round() as usize + 1
}

/// The arrival order for one seed: indexes into `pods`.
pub fn arrival_order(
    pods: &[TracePod],
    capacity_milli: u64,
    seed: u64,
    inflate: f64,
) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    for i in (1..order.len()).rev() {
        let j = rng.random_range(0..=i);
        order.swap(i, j);
    }
    let target = inflate * capacity_milli as f64;
    let mut total: u64 = pods.iter().map(|p| p.request.total_gpu_milli()).sum();
    if pods.is_empty() {
        return order;
    }
    loop {
        let pick = rng.random_range(0..pods.len());
        let request = &pods[pick].request;
        if (total + u64::from(request.gpu_milli)) as f64 > target {
            break;
        }
        order.push(pick);
        total += request.total_gpu_milli();
    }
    order
}

/// A workload made ready to replay: validated cluster, FGD target workload bound.
pub struct Prepared {
    base: ClusterState,
    workload: Workload,
}

impl Prepared {
    /// Validates the workload and binds FGD's target workload (from the original pods).
    pub fn new(workload: Workload) -> Result<Self, SimError> {
        let mut base = ClusterState::new(workload.nodes.clone())?;
        if base.gpu_capacity_milli() == 0 {
            return Err(SimError::NoGpus);
        }
        if workload.pods.is_empty() {
            return Err(SimError::NoPods);
        }
        let target = TargetWorkload::from_requests(workload.pods.iter().map(|p| &p.request), 0.95);
        base.set_workload(Arc::new(target));
        Ok(Prepared { base, workload })
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    pub fn gpu_count(&self) -> usize {
        self.workload.nodes.iter().map(|n| n.gpus.len()).sum()
    }

    /// Replays one policy with one seed.
    pub fn run(&self, policy: Policy, seed: u64, inflate: f64) -> RunResult {
        let started = Instant::now();
        let mut state = self.base.clone();
        let capacity = state.gpu_capacity_milli();
        let pods = &self.workload.pods;
        let order = arrival_order(pods, capacity, seed, inflate);
        // A separate stream for tie-breaks, so the arrival order does not depend on policy.
        let mut placer = Placer::new(policy, seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut buckets = Buckets::new(bucket_count(inflate));
        let mut arrived = 0u64;
        let mut placed = 0usize;
        for &i in &order {
            let request = &pods[i].request;
            arrived += request.total_gpu_milli();
            if placer.place(&mut state, request).is_ok() {
                placed += 1;
            }
            let percent = (arrived * 100 / capacity) as usize;
            let cap = capacity as f64;
            let idle = state.gpu_idle_milli() as f64;
            let frag = state.total_frag();
            let sample = [
                100.0 * idle / cap,
                100.0 * frag / cap,
                if idle > 0.0 { 100.0 * frag / idle } else { 0.0 },
            ];
            buckets.add(percent, sample);
        }
        RunResult {
            policy,
            seed,
            curves: buckets.finish(),
            pods_arrived: order.len(),
            pods_placed: placed,
            pods_failed: order.len() - placed,
            elapsed: started.elapsed(),
        }
    }
}

/// Runs every (policy, seed) pair in parallel; `done` is called as each finishes.
pub fn run_all(
    prepared: &Prepared,
    policies: &[Policy],
    seeds: &[u64],
    inflate: f64,
    done: &(dyn Fn(&RunResult) + Sync),
) -> Result<Vec<RunResult>, SimError> {
    if !(0.01..=10.0).contains(&inflate) {
        return Err(SimError::BadInflate(inflate));
    }
    if policies.is_empty() {
        return Err(SimError::NoPolicies);
    }
    if seeds.is_empty() {
        return Err(SimError::NoSeeds);
    }
    let jobs: Vec<(Policy, u64)> = policies
        .iter()
        .flat_map(|&p| seeds.iter().map(move |&s| (p, s)))
        .collect();
    let mut results: Vec<RunResult> = jobs
        .par_iter()
        .map(|&(policy, seed)| {
            let result = prepared.run(policy, seed, inflate);
            done(&result);
            result
        })
        .collect();
    results.sort_by_key(|r| {
        (
            policies.iter().position(|p| *p == r.policy).unwrap_or(0),
            r.seed,
        )
    });
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Workload {
        let nodes = crate::builtin::cluster(16);
        let pods = crate::builtin::pods(&nodes);
        Workload {
            name: "small".into(),
            nodes,
            pods,
        }
    }

    #[test]
    fn arrival_order_shuffles_and_inflates() {
        let w = small();
        let capacity: u64 = w.nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
        let a = arrival_order(&w.pods, capacity, 42, 1.3);
        assert_eq!(a, arrival_order(&w.pods, capacity, 42, 1.3));
        assert_ne!(a, arrival_order(&w.pods, capacity, 43, 1.3));
        assert!(a.len() > w.pods.len());
        let total: u64 = a.iter().map(|&i| w.pods[i].request.total_gpu_milli()).sum();
        assert!(total as f64 <= 1.3 * capacity as f64 + 8000.0);
        assert!(total as f64 >= 1.25 * capacity as f64);
    }

    #[test]
    fn same_seed_same_result_and_sane_curves() {
        let prepared = Prepared::new(small()).unwrap();
        let a = prepared.run(Policy::Fgd, 42, 1.3);
        let b = prepared.run(Policy::Fgd, 42, 1.3);
        assert_eq!(a.curves, b.curves);
        assert_eq!(a.curves.unallocated.len(), 131);
        assert!(a.curves.unallocated[0] > 99.0);
        // Unallocated can only fall as pods arrive and never leave.
        for w in a.curves.unallocated.windows(2) {
            assert!(w[1] <= w[0] + 1e-9);
        }
        assert!(a.curves.unallocated[130] < 30.0);
        assert_eq!(a.pods_placed + a.pods_failed, a.pods_arrived);
    }

    #[test]
    fn bad_setups_are_refused() {
        let mut w = small();
        w.pods.clear();
        assert!(matches!(Prepared::new(w), Err(SimError::NoPods)));
        let mut w = small();
        for n in &mut w.nodes {
            n.gpus.clear();
        }
        assert!(matches!(Prepared::new(w), Err(SimError::NoGpus)));
        let prepared = Prepared::new(small()).unwrap();
        let none = |_: &RunResult| {};
        assert!(run_all(&prepared, &[Policy::Fgd], &[1], 0.0, &none).is_err());
        assert!(run_all(&prepared, &[], &[1], 1.3, &none).is_err());
        assert!(run_all(&prepared, &[Policy::Fgd], &[], 1.3, &none).is_err());
    }
}
