//! The timeline replay through the whole stack: the in-memory API, one fake kubelet with
//! gpuplace's device plugin per node, and the scheduler, its rounds run at simulated
//! times. Pods are created at their arrival times (priority, creation time and name give
//! the simulator's queue order), deleted when their run ends, and the scheduler's queue
//! backs off on the simulated clock. Before each round the kubelets have caught up (every
//! bound pod admitted, every deleted pod's devices freed), so the scheduler sees what the
//! simulator's state holds. What each pod got (start time, node, devices) is read back
//! from the API, to compare with `gpuplace simulate --timeline`.
//!
//! With [`StackNodes::Replayed`] no kubelet or device plugin runs: the replay plays the
//! kubelets' part in the API (a bound pod runs, with its `startTime`; an evicted pod is
//! deleted for good once its grace period is over), so that thousands of seeded scenarios
//! with costs (grace periods, re-creation, start times) run in the differential test.

mod drive;
mod settle;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_model::{NodeInventory, Request};
use gpuplace_scheduler::clock::WallClock;
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use tokio::sync::{mpsc, oneshot};

use crate::api::MemoryApi;
use crate::cluster::{ClusterOptions, HandshakeCluster};

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
type RoundCall = (Instant, oneshot::Sender<Option<Instant>>);

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

/// Replays `jobs` on `nodes`; sockets and inventory files live under `dir`.
pub async fn replay_timeline(
    dir: &Path,
    nodes: &[NodeInventory],
    jobs: &[StackJob],
    options: &TimelineStackOptions,
) -> Result<Vec<StackOutcome>, String> {
    match options.nodes {
        StackNodes::Kubelets => with_kubelets(dir, nodes, jobs, options).await,
        StackNodes::Replayed => replayed(nodes, jobs, options).await,
    }
}

async fn with_kubelets(
    dir: &Path,
    nodes: &[NodeInventory],
    jobs: &[StackJob],
    options: &TimelineStackOptions,
) -> Result<Vec<StackOutcome>, String> {
    if options.costs.grace_ms > 0 {
        return Err("a grace period needs StackNodes::Replayed (the fake kubelets end an evicted pod at once)".into());
    }
    let listed = crate::replay::inventory_files(dir, nodes)?;
    let cluster = HandshakeCluster::start_without_scheduler(
        &dir.join("nodes"),
        &ClusterOptions {
            nodes: listed,
            seed: options.placer_seed,
            admission_delay_ms: (0, 0),
            plugin_watch_delay_ms: (0, 0),
            terminating_ms: None,
            numa_alignment: false,
            pod_resources_get: true,
            round_interval: Duration::from_millis(1),
            policy: Some(options.policy),
            placer_seed: Some(options.placer_seed),
            exact_resources: true,
            workload: options.workload.clone(),
        },
    )
    .await?;
    devices_advertised(&cluster, nodes, options.settle_timeout).await?;
    let outcome = run_scheduler(&cluster.api, Some(&cluster), jobs, options).await;
    cluster.stop().await;
    outcome
}

async fn replayed(
    nodes: &[NodeInventory],
    jobs: &[StackJob],
    options: &TimelineStackOptions,
) -> Result<Vec<StackOutcome>, String> {
    let api = MemoryApi::new();
    for node in nodes {
        api.put_node(crate::cluster::exact_node_object(&node.name, node));
    }
    run_scheduler(&api, None, jobs, options).await
}

/// The scheduler on its own thread, driven through `jobs`.
async fn run_scheduler(
    api: &MemoryApi,
    cluster: Option<&HandshakeCluster>,
    jobs: &[StackJob],
    options: &TimelineStackOptions,
) -> Result<Vec<StackOutcome>, String> {
    for (name, spec) in &options.queues {
        api.put_queue(name, spec.clone());
    }
    let (calls, wall, scheduler_thread) = scheduler_thread(api, options);
    let side = drive::Side { api, cluster, wall };
    let outcome = drive::drive(&side, jobs, options, &calls).await;
    drop(calls);
    let _ = tokio::task::spawn_blocking(move || scheduler_thread.join()).await;
    outcome
}

/// Waits until every kubelet holds its plugin's devices of both resources (registered is
/// not enough: under load the device list can arrive after the first admission).
async fn devices_advertised(
    cluster: &HandshakeCluster,
    nodes: &[NodeInventory],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    for (rig, node) in cluster.nodes.iter().zip(nodes) {
        let gpus = node.gpus.iter().filter(|g| g.healthy).count();
        loop {
            let whole = rig
                .fake
                .kubelet
                .handle()
                .devices(gpuplace_model::keys::GPU_RESOURCE)
                .len();
            let slices = rig
                .fake
                .kubelet
                .handle()
                .devices(gpuplace_model::SHARE_RESOURCE)
                .len();
            if whole >= gpus && (gpus == 0 || slices > 0) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: the kubelet has {whole} devices of {gpus} and {slices} slices",
                    rig.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

/// The scheduler on its own thread (its round is not Send), running a round at each time
/// it is sent.
fn scheduler_thread(
    api: &MemoryApi,
    options: &TimelineStackOptions,
) -> (
    mpsc::Sender<RoundCall>,
    WallClock,
    std::thread::JoinHandle<()>,
) {
    let mut scheduler = Scheduler::new(
        api.clone(),
        SchedulerConfig {
            seed: options.placer_seed,
            policy: options.policy,
            workload: options.workload.clone(),
            defrag: gpuplace_scheduler::scheduler::defrag::DefragConfig {
                settings: options.defrag.clone(),
                ..Default::default()
            },
            // The production backoff (1 s doubling to 60 s), on the simulated clock.
            ..SchedulerConfig::default()
        },
    );
    let wall = scheduler.wall_clock();
    let (calls, mut rx) = mpsc::channel::<RoundCall>(1);
    let thread = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            while let Some((now, reply)) = rx.recv().await {
                // Cannot fail against the in-memory API; if it did, the comparison fails on
                // the pods the round left undecided. A round that stopped at its decision
                // cap is followed at once, as the scheduler's loop does.
                loop {
                    match scheduler.round(now).await {
                        Ok(report) if report.more => continue,
                        Ok(_) => break,
                        Err(e) => {
                            eprintln!("timeline replay: scheduling round failed: {e}");
                            break;
                        }
                    }
                }
                let _ = reply.send(scheduler.next_due(now));
            }
        });
    });
    (calls, wall, thread)
}
