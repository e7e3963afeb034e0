//! What the stack replay is given and gives back: its jobs and options, what each pod got,
//! and the pods' names.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_model::Request;
use tokio::sync::oneshot;

/// One pod of the replay.
#[derive(Clone, Debug)]
pub struct StackJob {
    pub arrival_ms: u64,
    pub request: Request,
    pub priority: i32,
    pub run_ms: u64,
    /// The job whose eviction makes this one (its controller's new pod): created when the
    /// replay sees that pod evicted, not at `arrival_ms`.
    pub replaces: Option<usize>,
    /// Its queue (the `gpuplace.io/queue` label), if queues are in use.
    pub queue: Option<String>,
    /// Whether it opted in to moves (`gpuplace.io/movable`). Every pod has a ReplicaSet
    /// controller, its first job's, so that a moved pod's replacement is known.
    pub movable: bool,
    /// Its gang: the job whose pod name the PodGroup takes (made with that job's pod;
    /// gangs are ordered by name, as pods are) and its `minMember`.
    pub gang: Option<(usize, u32)>,
}

/// What the stack gave one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOutcome {
    pub start_ms: Option<u64>,
    pub node: Option<String>,
    /// Device IDs of the assignment, sorted.
    pub devices: Vec<String>,
    /// When the pod was gone: its run ended, or it was evicted.
    pub end_ms: Option<u64>,
    /// Whether it was evicted (preempted, reclaimed or moved).
    pub evicted: bool,
}

/// How the replay runs.
#[derive(Clone, Debug)]
pub struct TimelineStackOptions {
    pub policy: gpuplace_core::Policy,
    pub placer_seed: u64,
    /// FGD's target workload, as the simulator binds it.
    pub workload: Option<Arc<gpuplace_core::TargetWorkload>>,
    /// Nothing after this time (ms) is replayed.
    pub end_ms: u64,
    /// Longest wait for the kubelets to catch up at one step.
    pub settle_timeout: Duration,
    /// Queues made before the first pod (name, spec).
    pub queues: Vec<(String, gpuplace_scheduler::k8s::queue::QueueSpec)>,
    /// Defragmentation, as the simulator's.
    pub defrag: gpuplace_core::defrag::Settings,
    /// Who plays the nodes.
    pub nodes: StackNodes,
    /// What the cluster's steps take on the simulated clock.
    pub costs: StackCosts,
}

/// Who plays the nodes of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackNodes {
    /// A fake kubelet with gpuplace's device plugin and handshake per node: every bound
    /// pod is admitted with exactly the scheduler's devices before the next step.
    #[default]
    Kubelets,
    /// No kubelet: the replay writes what kubelets would (a bound pod running from its
    /// start, an evicted pod gone after its grace period). Decisions only, fast.
    Replayed,
}

/// The simulator's costs (`--eviction-grace`, `--recreate`, `--start`) on the replay's
/// clock, in milliseconds. The Binding is written at the decision (the simulator's
/// `--bind-latency 0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCosts {
    /// From an eviction until the pod is gone (its GPUs held until then).
    pub grace_ms: u64,
    /// From an eviction until its controller's new pod exists.
    pub recreate_ms: u64,
    /// From the Binding until the container runs (its run time counts from there).
    pub start_ms: u64,
}

/// A round request to the scheduler's thread: the simulated time; the answer is when the
/// queue next has a pod due.
pub(super) type RoundCall = (Instant, oneshot::Sender<Option<Instant>>);

/// The pod names of `jobs`: they sort in the order the simulator queues them (arrival,
/// a controller's new pod before an arrival at the same instant, then job order), which
/// breaks ties of priority and creation second as the simulator's sequence does.
pub fn job_names(jobs: &[StackJob]) -> Vec<String> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].arrival_ms, jobs[i].replaces.is_none(), i));
    let mut names = vec![String::new(); jobs.len()];
    for (rank, i) in order.into_iter().enumerate() {
        names[i] = format!("j{rank:06}");
    }
    names
}
