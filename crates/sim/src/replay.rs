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
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::trace::TracePod;
pub use crate::workload::Workload;

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the cluster is invalid: {0}")]
    Cluster(#[from] StateError),
    #[error("the cluster has no GPUs, so there is nothing to measure")]
    NoGpus,
    #[error("the pod list is empty")]
    NoPods,
    #[error(
        "no pod in the pod list asks for a GPU: the replay measures GPU allocation and inflates the workload by its GPU requests"
    )]
    NoGpuPods,
    #[error(
        "inflating to {inflate} would take about {expected} arrivals (GPU pods are too rare in this pod list); the limit is {MAX_ARRIVALS}"
    )]
    TooManyArrivals { inflate: f64, expected: u64 },
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
    /// With preemption: what it cost (see [`crate::preemption`]).
    pub preemption: Option<crate::preemption::PreemptionCost>,
    /// Ticks (arrivals) the replay lasted and the GPU capacity in milli, to scale the cost.
    pub ticks: u64,
    pub capacity_milli: u64,
    pub elapsed: Duration,
}

impl RunResult {
    /// Work lost to preemption as % of the replay's GPU time (0 without preemption).
    pub fn work_lost_pct(&self) -> f64 {
        match self.preemption {
            Some(c) if self.ticks > 0 && self.capacity_milli > 0 => {
                100.0 * c.lost as f64 / (self.capacity_milli as f64 * self.ticks as f64)
            }
            _ => 0.0,
        }
    }
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

/// The most arrivals one replay may take: bounds time and memory for any input.
pub const MAX_ARRIVALS: u64 = 5_000_000;

/// About how many arrivals inflating `pods` to `inflate` times the capacity takes (the
/// original pods, then random picks until the GPU request reaches the target); `None` when
/// no pod asks for a GPU, so the target is never reached.
pub fn expected_arrivals(pods: &[TracePod], capacity_milli: u64, inflate: f64) -> Option<u64> {
    let total: u64 = pods.iter().map(|p| p.request.total_gpu_milli()).sum();
    if total == 0 {
        return None;
    }
    let mean = total as f64 / pods.len() as f64;
    let missing = (inflate * capacity_milli as f64 - total as f64).max(0.0);
    Some(pods.len() as u64 + (missing / mean).ceil() as u64)
}

/// The arrival order for one seed: indexes into `pods`. Never longer than
/// [`MAX_ARRIVALS`] (and the original pods), whatever the input.
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
    if pods.is_empty() || total == 0 {
        return order;
    }
    let limit = (MAX_ARRIVALS as usize).max(pods.len());
    while order.len() < limit {
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
    /// A pod that fits nowhere evicts lower-priority pods (`--preempt`).
    preempt: bool,
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
        if workload
            .pods
            .iter()
            .all(|p| p.request.total_gpu_milli() == 0)
        {
            return Err(SimError::NoGpuPods);
        }
        let target = TargetWorkload::from_requests(workload.pods.iter().map(|p| &p.request), 0.95);
        base.set_workload(Arc::new(target));
        Ok(Prepared {
            base,
            workload,
            preempt: false,
        })
    }

    /// Lets a pod that fits nowhere evict pods of lower priority.
    pub fn with_preemption(mut self, enabled: bool) -> Self {
        self.preempt = enabled;
        self
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Whether `inflate` is in range and reachable within [`MAX_ARRIVALS`] arrivals.
    pub fn check_inflate(&self, inflate: f64) -> Result<(), SimError> {
        if !(0.01..=10.0).contains(&inflate) {
            return Err(SimError::BadInflate(inflate));
        }
        let capacity = self.base.gpu_capacity_milli();
        match expected_arrivals(&self.workload.pods, capacity, inflate) {
            None => Err(SimError::NoGpuPods),
            Some(expected) if expected > MAX_ARRIVALS => {
                Err(SimError::TooManyArrivals { inflate, expected })
            }
            Some(_) => Ok(()),
        }
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
        let mut ledger = crate::preemption::Ledger::default();
        for (tick, &i) in order.iter().enumerate() {
            let (request, priority) = (&pods[i].request, pods[i].priority);
            let tick = tick as u64;
            arrived += request.total_gpu_milli();
            match placer.place(&mut state, request) {
                Ok(d) => {
                    placed += 1;
                    if self.preempt {
                        ledger.record(d.node, request, &d.gpus, priority, tick);
                    }
                }
                Err(_) if self.preempt => {
                    if ledger.preempt(&mut state, request, priority, tick) {
                        placed += 1;
                    }
                }
                Err(_) => {}
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
            preemption: self.preempt.then_some(ledger.cost),
            ticks: order.len() as u64,
            capacity_milli: capacity,
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
    prepared.check_inflate(inflate)?;
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

    #[test]
    fn pod_lists_without_gpu_pods_fail_and_rare_gpu_pods_stay_bounded() {
        // No GPU pod: the inflation never reaches its target; refused, and the order
        // alone stays the original pods.
        let mut w = small();
        w.pods.retain(|p| p.request.total_gpu_milli() == 0);
        assert!(!w.pods.is_empty());
        let capacity: u64 = w.nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
        assert_eq!(arrival_order(&w.pods, capacity, 1, 1.3).len(), w.pods.len());
        let err = Prepared::new(w).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("no pod in the pod list asks for a GPU")));
        // One GPU pod among many CPU pods on a large cluster: far too many arrivals to
        // reach 10x.
        let mut w = small();
        w.nodes = crate::builtin::cluster(1);
        let capacity: u64 = w.nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
        let smallest = w
            .pods
            .iter()
            .map(|p| p.request.total_gpu_milli())
            .filter(|&m| m > 0)
            .min();
        let mut kept_gpu = false;
        w.pods.retain(|p| {
            let milli = p.request.total_gpu_milli();
            let keep = milli == 0 || (!kept_gpu && Some(milli) == smallest);
            kept_gpu |= milli > 0 && keep;
            keep
        });
        let prepared = Prepared::new(w).unwrap();
        let none = |_: &RunResult| {};
        let err = run_all(&prepared, &[Policy::Fgd], &[1], 10.0, &none).err();
        assert!(
            matches!(err, Some(SimError::TooManyArrivals { .. })),
            "{err:?}"
        );
        let order = arrival_order(&prepared.workload().pods, capacity, 1, 10.0);
        assert_eq!(order.len() as u64, MAX_ARRIVALS);
    }
}
