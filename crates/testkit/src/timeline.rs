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
mod jobs;
mod settle;

use std::path::Path;
use std::time::{Duration, Instant};

use gpuplace_model::NodeInventory;
use gpuplace_scheduler::clock::WallClock;
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use tokio::sync::mpsc;

use jobs::RoundCall;
pub use jobs::{StackCosts, StackJob, StackNodes, StackOutcome, TimelineStackOptions, job_names};

use crate::api::MemoryApi;
use crate::cluster::{ClusterOptions, HandshakeCluster};

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
