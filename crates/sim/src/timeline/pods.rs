//! Every pod's life in one replay, simulated or live (`pods.csv` in a report): when it
//! arrived, was bound and left, and where. The figures are percentiles over these; the rows
//! let a live run and its simulation be set side by side pod by pod (which pods waited
//! longer, which warm-start pods never found room); [`super::pods_csv`] writes them.

use super::engine::Job;
use crate::trace::TracePod;

/// One pod's life, as `pods.csv` has it (seconds of simulated time).
#[derive(Clone, Debug, PartialEq)]
pub struct PodRecord {
    /// Index into the pod list (its row, header excluded).
    pub pod: u32,
    /// Its arrival unit: a gang's pods share one; warm-start pods come first.
    pub unit: u32,
    /// What it asks: CPU (milli), memory (MiB), whole GPUs or one share, and its GPUs in
    /// all in milli-GPUs (a 1-GPU pod 1000, a share of 0.3 GPU 300).
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    pub gpu_milli: u64,
    /// Arrived in the measurement window (its wait counts in the figures).
    pub measured: bool,
    /// Made by its controller for a pod evicted or moved.
    pub by_controller: bool,
    pub arrival_s: f64,
    /// When its Binding was written (empty: never).
    pub bound_s: Option<f64>,
    /// When it left (finished, evicted, given up); empty: still there at the end.
    pub end_s: Option<f64>,
    /// Its node, the index into the node list (empty: never bound, or not known).
    pub node: Option<u32>,
    pub evicted: bool,
    pub abandoned: bool,
    /// The scheduler's attempts that left it waiting (empty in a live report: only the
    /// scheduler knows them; kube-scheduler logs them at --v=3).
    pub failed_attempts: Option<u32>,
}

impl PodRecord {
    /// `job`'s record; `attempts_known`: the run counted its attempts (a simulated one).
    pub(super) fn of(job: &Job, pods: &[TracePod], attempts_known: bool) -> PodRecord {
        let bound = job.start;
        let request = pods.get(job.pod as usize).map(|p| &p.request);
        PodRecord {
            pod: job.pod,
            unit: job.unit,
            cpu_milli: request.map_or(0, |r| r.cpu_milli),
            memory_mib: request.map_or(0, |r| r.memory_mib),
            gpus: request.map_or(0, |r| r.gpu_count),
            gpu_milli: request.map_or(0, |r| r.total_gpu_milli()),
            measured: job.measured,
            by_controller: job.by_controller,
            arrival_s: seconds(job.arrival.0),
            bound_s: bound.map(|b| seconds(b.0)),
            end_s: job.end.map(|e| seconds(e.0)),
            node: (bound.is_some() && job.node != u32::MAX).then_some(job.node),
            evicted: job.evicted,
            abandoned: job.abandoned,
            failed_attempts: attempts_known.then_some(job.failed_attempts),
        }
    }
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1e3
}
