//! The timeline replay through the whole stack: the in-memory API, one fake kubelet with
//! gpuplace's device plugin per node, and the scheduler, its rounds run at simulated
//! times. Pods are created at their arrival times (priority, creation time and name give
//! the simulator's queue order), deleted when their run ends, and the scheduler's queue
//! backs off on the simulated clock. Before each round the kubelets have caught up (every
//! bound pod admitted, every deleted pod's devices freed), so the scheduler sees what the
//! simulator's state holds. What each pod got (start time, node, devices) is read back
//! from the API, to compare with `gpuplace simulate --timeline`.

use std::collections::{BTreeSet, BinaryHeap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_model::{Assignment, NodeInventory, Request};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::{ClusterOptions, HandshakeCluster};

/// One pod of the replay, in arrival order.
#[derive(Clone, Debug)]
pub struct StackJob {
    pub arrival_ms: u64,
    pub request: Request,
    pub priority: i32,
    pub run_ms: u64,
}

/// What the stack gave one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOutcome {
    pub start_ms: Option<u64>,
    pub node: Option<String>,
    /// Device IDs of the assignment, sorted.
    pub devices: Vec<String>,
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
}

/// A round request to the scheduler's thread: the simulated time; the answer is when the
/// queue next has a pod due.
type RoundCall = (Instant, oneshot::Sender<Option<Instant>>);

/// The pod name of job `i` (names sort in arrival order).
fn job_name(i: usize) -> String {
    format!("j{i:06}")
}

/// Replays `jobs` on `nodes`; sockets and inventory files live under `dir`.
pub async fn replay_timeline(
    dir: &Path,
    nodes: &[NodeInventory],
    jobs: &[StackJob],
    options: &TimelineStackOptions,
) -> Result<Vec<StackOutcome>, String> {
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
    let (calls, scheduler_thread) = scheduler_thread(&cluster, options);
    let outcome = drive(&cluster, jobs, options, &calls).await;
    drop(calls);
    let _ = tokio::task::spawn_blocking(move || scheduler_thread.join()).await;
    cluster.stop().await;
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
    cluster: &HandshakeCluster,
    options: &TimelineStackOptions,
) -> (mpsc::Sender<RoundCall>, std::thread::JoinHandle<()>) {
    let mut scheduler = Scheduler::new(
        cluster.api.clone(),
        SchedulerConfig {
            seed: options.placer_seed,
            policy: options.policy,
            workload: options.workload.clone(),
            // The production backoff (1 s doubling to 60 s), on the simulated clock.
            ..SchedulerConfig::default()
        },
    );
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
                // the pods the round left undecided.
                if let Err(e) = scheduler.round(now).await {
                    eprintln!("timeline replay: scheduling round failed: {e}");
                }
                let _ = reply.send(scheduler.next_due(now));
            }
        });
    });
    (calls, thread)
}

async fn drive(
    cluster: &HandshakeCluster,
    jobs: &[StackJob],
    options: &TimelineStackOptions,
    calls: &mpsc::Sender<RoundCall>,
) -> Result<Vec<StackOutcome>, String> {
    let base = Instant::now();
    let wall = Timestamp::now();
    let api = &cluster.api;
    let mut out = vec![StackOutcome::default(); jobs.len()];
    let mut departures: BinaryHeap<std::cmp::Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut waiting: BTreeSet<usize> = BTreeSet::new();
    let (mut next, mut due): (usize, Option<u64>) = (0, None);
    loop {
        let at = [
            jobs.get(next).map(|j| j.arrival_ms),
            departures.peek().map(|d| d.0.0),
            due,
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = at.filter(|t| *t <= options.end_ms) else {
            break;
        };
        let mut gone = Vec::new();
        while let Some(&std::cmp::Reverse((t, i))) = departures.peek()
            && t <= now
        {
            departures.pop();
            api.delete_pod("trace", &job_name(i));
            gone.push(i);
        }
        while let Some(job) = jobs.get(next)
            && job.arrival_ms <= now
        {
            let created = wall
                .checked_add(SignedDuration::from_secs((job.arrival_ms / 1000) as i64))
                .map_err(|e| e.to_string())?;
            api.put_pod(pod(&job_name(next), job, created));
            waiting.insert(next);
            next += 1;
        }
        settle_deletions(cluster, &gone, options.settle_timeout).await?;
        let (reply, answer) = oneshot::channel();
        calls
            .send((base + Duration::from_millis(now), reply))
            .await
            .map_err(|_| "the scheduler's thread ended".to_string())?;
        due = answer
            .await
            .map_err(|_| "the scheduler's thread ended".to_string())?
            .map(|t| t.saturating_duration_since(base).as_millis() as u64);
        let mut bound = Vec::new();
        for &i in &waiting {
            let Some(p) = api.pod("trace", &job_name(i)) else {
                continue;
            };
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let assignment = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(gpuplace_model::ASSIGNMENT_ANNOTATION))
                .and_then(|a| Assignment::from_json(a).ok());
            let mut devices: Vec<String> = assignment
                .map(|a| a.devices().map(|d| d.id.clone()).collect())
                .unwrap_or_default();
            devices.sort();
            devices.dedup();
            out[i] = StackOutcome {
                start_ms: Some(now),
                node: Some(node),
                devices,
            };
            departures.push(std::cmp::Reverse((now + jobs[i].run_ms, i)));
            bound.push(i);
        }
        for i in &bound {
            waiting.remove(i);
        }
        settle_admissions(cluster, &bound, options.settle_timeout).await?;
    }
    Ok(out)
}

/// The pod of `job`: its request (see [`crate::replay::trace_pod`]), priority and creation
/// time.
fn pod(name: &str, job: &StackJob, created: Timestamp) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = crate::replay::trace_pod(name, &job.request);
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    if let Some(spec) = pod.spec.as_mut() {
        spec.priority = Some(job.priority);
    }
    pod
}

/// Waits until no kubelet holds devices for the pods `gone`.
async fn settle_deletions(
    cluster: &HandshakeCluster,
    gone: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    if gone.is_empty() {
        return Ok(());
    }
    let names: std::collections::HashSet<String> = gone.iter().map(|&i| job_name(i)).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let held = cluster.nodes.iter().any(|n| {
            n.fake
                .admissions()
                .iter()
                .filter(|a| names.contains(&a.name))
                .any(|a| n.fake.record().contains_key(&a.uid))
        });
        if !held {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "kubelets still hold devices of deleted pods {names:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until every pod of `bound` is admitted by its kubelet; a refusal is an error.
async fn settle_admissions(
    cluster: &HandshakeCluster,
    bound: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    let names: std::collections::HashSet<String> = bound.iter().map(|&i| job_name(i)).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let admitted: Vec<crate::kubelet_node::Admission> = cluster
            .nodes
            .iter()
            .flat_map(|n| n.fake.admissions())
            .filter(|a| names.contains(&a.name))
            .collect();
        if let Some(refused) = admitted.iter().find(|a| a.error.is_some()) {
            return Err(format!(
                "kubelet refused {}: {:?}",
                refused.name, refused.error
            ));
        }
        if admitted.len() >= names.len() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} of {} bound pods admitted in time",
                admitted.len(),
                names.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
