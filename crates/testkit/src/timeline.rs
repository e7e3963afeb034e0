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
}

/// A round request to the scheduler's thread: the simulated time; the answer is when the
/// queue next has a pod due.
type RoundCall = (Instant, oneshot::Sender<Option<Instant>>);

/// The pod names of `jobs`: they sort in the order the simulator queues them (arrival,
/// a controller's new pod before an arrival at the same instant, then job order), which
/// breaks ties of priority and creation second as the simulator's sequence does.
fn job_names(jobs: &[StackJob]) -> Vec<String> {
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
    for (name, spec) in &options.queues {
        cluster.api.put_queue(name, spec.clone());
    }
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
            defrag: gpuplace_scheduler::scheduler::defrag::DefragConfig {
                settings: options.defrag.clone(),
                ..Default::default()
            },
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
    (calls, thread)
}

/// The replay's bookkeeping: the pods' names, what each got, the runs under way.
struct Replay<'j> {
    jobs: &'j [StackJob],
    names: Vec<String>,
    out: Vec<StackOutcome>,
    /// Run ends: (time, job).
    departures: BinaryHeap<std::cmp::Reverse<(u64, usize)>>,
    waiting: BTreeSet<usize>,
    running: BTreeSet<usize>,
    /// Arrivals (jobs not made by a controller), in arrival order.
    arrivals: Vec<usize>,
}

impl Replay<'_> {
    /// Records the waiting pods bound by the round at `now`; those bound.
    fn read_bound(&mut self, api: &crate::api::MemoryApi, now: u64) -> Vec<usize> {
        let mut bound = Vec::new();
        for &i in &self.waiting {
            let Some(p) = api.pod("trace", &self.names[i]) else {
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
            self.out[i] = StackOutcome {
                start_ms: Some(now),
                node: Some(node),
                devices,
                ..StackOutcome::default()
            };
            self.departures
                .push(std::cmp::Reverse((now + self.jobs[i].run_ms, i)));
            bound.push(i);
        }
        for i in &bound {
            self.waiting.remove(i);
            self.running.insert(*i);
        }
        bound
    }

    /// Running pods the round evicted (terminating or gone), recorded as ended at `now`.
    fn read_evicted(&mut self, api: &crate::api::MemoryApi, now: u64) -> Vec<usize> {
        let evicted: Vec<usize> = self
            .running
            .iter()
            .copied()
            .filter(|&i| {
                api.pod("trace", &self.names[i])
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            })
            .collect();
        for &i in &evicted {
            self.running.remove(&i);
            self.out[i].end_ms = Some(now);
            self.out[i].evicted = true;
        }
        evicted
    }
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
    let mut arrivals: Vec<usize> = (0..jobs.len())
        .filter(|&i| jobs[i].replaces.is_none())
        .collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival_ms, i));
    let mut r = Replay {
        jobs,
        names: job_names(jobs),
        out: vec![StackOutcome::default(); jobs.len()],
        departures: BinaryHeap::new(),
        waiting: BTreeSet::new(),
        running: BTreeSet::new(),
        arrivals,
    };
    let created_at = |ms: u64| {
        wall.checked_add(SignedDuration::from_secs((ms / 1000) as i64))
            .map_err(|e| e.to_string())
    };
    let (mut next, mut due): (usize, Option<u64>) = (0, None);
    loop {
        let at = [
            r.arrivals.get(next).map(|&i| jobs[i].arrival_ms),
            r.departures.peek().map(|d| d.0.0),
            due,
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = at.filter(|t| *t <= options.end_ms) else {
            break;
        };
        let mut gone = Vec::new();
        while let Some(&std::cmp::Reverse((t, i))) = r.departures.peek()
            && t <= now
        {
            r.departures.pop();
            // An evicted pod's run ended with its eviction.
            if r.running.remove(&i) {
                api.delete_pod("trace", &r.names[i]);
                r.out[i].end_ms = Some(t);
                gone.push(i);
            }
        }
        while let Some(&i) = r.arrivals.get(next)
            && jobs[i].arrival_ms <= now
        {
            put_group(api, &r.names, &jobs[i]);
            let made = pod(&r.names, i, &jobs[i], i, created_at(jobs[i].arrival_ms)?);
            api.put_pod(made);
            r.waiting.insert(i);
            next += 1;
        }
        settle_deletions(cluster, &r.names, &gone, options.settle_timeout).await?;
        let (reply, answer) = oneshot::channel();
        calls
            .send((base + Duration::from_millis(now), reply))
            .await
            .map_err(|_| "the scheduler's thread ended".to_string())?;
        due = answer
            .await
            .map_err(|_| "the scheduler's thread ended".to_string())?
            .map(|t| t.saturating_duration_since(base).as_millis() as u64);
        let bound = r.read_bound(api, now);
        settle_admissions(cluster, &r.names, &bound, options.settle_timeout).await?;
        // Victims: gone once their kubelet let them go; their controller makes them again
        // at once, and the scheduler looks again at this instant.
        let evicted = r.read_evicted(api, now);
        if !evicted.is_empty() {
            settle_gone(api, &r.names, &evicted, options.settle_timeout).await?;
            settle_deletions(cluster, &r.names, &evicted, options.settle_timeout).await?;
            for (k, job) in jobs.iter().enumerate() {
                if job.replaces.is_some_and(|v| evicted.contains(&v)) {
                    put_group(api, &r.names, job);
                    api.put_pod(pod(&r.names, k, job, controller(jobs, k), created_at(now)?));
                    r.waiting.insert(k);
                }
            }
            due = Some(now);
        }
    }
    Ok(r.out)
}

/// Makes `job`'s PodGroup if it has one not made yet.
fn put_group(api: &crate::api::MemoryApi, names: &[String], job: &StackJob) {
    let Some((first, min_member)) = job.gang else {
        return;
    };
    let name = &names[first];
    if api.group("trace", name).is_some() {
        return;
    }
    let mut group = gpuplace_scheduler::k8s::gang::PodGroup::new(
        name,
        gpuplace_scheduler::k8s::gang::PodGroupSpec {
            min_member,
            ..Default::default()
        },
    );
    group.metadata.namespace = Some("trace".into());
    api.put_group(group);
}

/// The first job of `k`'s line of replacements: its ReplicaSet's.
fn controller(jobs: &[StackJob], mut k: usize) -> usize {
    while let Some(v) = jobs[k].replaces {
        k = v;
    }
    k
}

/// Waits until the pods `evicted` are gone from the API (their kubelet ended them).
async fn settle_gone(
    api: &crate::api::MemoryApi,
    names: &[String],
    evicted: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while evicted
        .iter()
        .any(|&i| api.pod("trace", &names[i]).is_some())
    {
        if Instant::now() >= deadline {
            return Err("evicted pods were not deleted in time".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The pod of job `k` (`job`, named `names[k]`): its request (see
/// [`crate::replay::trace_pod`]), priority, creation time and gang.
fn pod(
    names: &[String],
    k: usize,
    job: &StackJob,
    controller: usize,
    created: Timestamp,
) -> k8s_openapi::api::core::v1::Pod {
    let name = &names[k];
    let mut pod = crate::replay::trace_pod(name, &job.request);
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{controller}"),
            uid: format!("rs-uid-{controller}"),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    if job.movable {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(gpuplace_model::keys::MOVABLE_KEY.to_string(), "true".into());
    }
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    if let Some(spec) = pod.spec.as_mut() {
        spec.priority = Some(job.priority);
    }
    if let Some((first, _)) = job.gang {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                gpuplace_model::keys::POD_GROUP_LABEL.to_string(),
                names[first].clone(),
            );
    }
    if let Some(queue) = &job.queue {
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                gpuplace_scheduler::k8s::queue::QUEUE_LABEL.to_string(),
                queue.clone(),
            );
    }
    pod
}

/// Waits until no kubelet holds devices for the pods `gone`.
async fn settle_deletions(
    cluster: &HandshakeCluster,
    job_names: &[String],
    gone: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    if gone.is_empty() {
        return Ok(());
    }
    let names: std::collections::HashSet<&String> = gone.iter().map(|&i| &job_names[i]).collect();
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
    job_names: &[String],
    bound: &[usize],
    timeout: Duration,
) -> Result<(), String> {
    let names: std::collections::HashSet<&String> = bound.iter().map(|&i| &job_names[i]).collect();
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
