//! A seeded stream of GPU pods of mixed shapes for the handshake harness, and the checks
//! that compare what the kubelets did with what the scheduler recorded.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuplace_model::{ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Allocated, Assignment};
use gpuplace_scheduler::k8s::gang::{PodGroup, PodGroupSpec};
use k8s_openapi::api::core::v1::Pod;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use crate::cluster::HandshakeCluster;

/// The shapes the generator draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One container with 1, 2, 4 or 8 GPUs.
    Whole(u32),
    /// Two app containers with GPUs (1+1 or 2+1).
    TwoApps(u32, u32),
    /// An init container with GPUs, then an app container (init n, app m).
    InitThenApp(u32, u32),
    /// An init container with 2 GPUs, then two app containers of 1: the kubelet splits the
    /// init's devices between the apps at random (no GetPreferredAllocation).
    InitSplit,
    /// A sidecar with 1 GPU and an app with 1.
    Sidecar,
    /// A GPU app container and an injected container without GPUs.
    Injected(u32),
    /// A gang member (two pods of 1 GPU, minMember 2).
    Gang,
    /// A share of one GPU (`gpuplace.io/gpu-milli`), in milli-GPU.
    Share(u32),
    /// Two app containers sharing one GPU (milli each).
    ShareTwo(u32, u32),
}

fn container(name: &str, gpus: u32) -> Value {
    let mut c = json!({"name": name, "image": "busybox",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}});
    if gpus > 0 {
        c["resources"]["limits"] = json!({"nvidia.com/gpu": gpus.to_string()});
    }
    c
}

fn share_container(name: &str, milli: u32) -> Value {
    json!({"name": name, "image": "busybox",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {gpuplace_model::SHARE_RESOURCE: milli.to_string()}}})
}

/// The pod (and for a gang its group) of one shape.
pub fn pod_of(name: &str, shape: Shape, group: Option<&str>) -> Pod {
    let (init, apps): (Vec<Value>, Vec<Value>) = match shape {
        Shape::Whole(n) => (vec![], vec![container("main", n)]),
        Shape::TwoApps(a, b) => (vec![], vec![container("a", a), container("b", b)]),
        Shape::InitThenApp(i, a) => (vec![container("init", i)], vec![container("main", a)]),
        Shape::InitSplit => (
            vec![container("init", 2)],
            vec![container("a", 1), container("b", 1)],
        ),
        Shape::Sidecar => {
            let mut s = container("proxy", 1);
            s["restartPolicy"] = json!("Always");
            (vec![s], vec![container("main", 1)])
        }
        Shape::Injected(n) => (
            vec![],
            vec![container("main", n), container("istio-proxy", 0)],
        ),
        Shape::Gang => (vec![], vec![container("worker", 1)]),
        Shape::Share(m) => (vec![], vec![share_container("main", m)]),
        Shape::ShareTwo(a, b) => (
            vec![],
            vec![share_container("a", a), share_container("b", b)],
        ),
    };
    let mut meta = json!({"name": name, "namespace": "ml",
        "creationTimestamp": jiff_now()});
    if let Some(g) = group {
        meta["labels"] = json!({"gpuplace.io/pod-group": g});
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"schedulerName": "gpuplace", "initContainers": init, "containers": apps},
        "status": {"phase": "Pending"}
    }))
    .unwrap_or_default()
}

fn jiff_now() -> String {
    crate::clock::server_time().to_string()
}

/// Draws a shape: mostly whole-GPU pods, a quarter of multi-container kinds, a few gangs.
pub fn draw(rng: &mut ChaCha8Rng) -> Shape {
    draw_mix(rng, 0)
}

/// [`draw`] with `share_percent` of the pods asking for a share of one GPU (100-900 milli;
/// one in five of them with two containers sharing it).
pub fn draw_mix(rng: &mut ChaCha8Rng, share_percent: u32) -> Shape {
    if share_percent > 0 && rng.random_range(0..100) < share_percent {
        return if rng.random_range(0..5) == 0 {
            let a = rng.random_range(50..=450);
            Shape::ShareTwo(a, rng.random_range(50..=450))
        } else {
            Shape::Share(rng.random_range(100..=900))
        };
    }
    match rng.random_range(0..100) {
        0..=29 => Shape::Whole(1),
        30..=44 => Shape::Whole(2),
        45..=54 => Shape::Whole(4),
        55..=59 => Shape::Whole(8),
        60..=65 => Shape::TwoApps(1, 1),
        66..=69 => Shape::TwoApps(2, 1),
        70..=74 => Shape::InitThenApp(1, 2),
        75..=78 => Shape::InitThenApp(2, 1),
        79..=82 => Shape::InitSplit,
        83..=87 => Shape::Sidecar,
        88..=93 => Shape::Injected(rng.random_range(1..=2)),
        _ => Shape::Gang,
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub created: usize,
    pub admitted: usize,
    pub refused: usize,
    /// GPU containers compared with the assignment.
    pub compared: usize,
    /// Containers whose kubelet devices differ from the assignment.
    pub mismatches: usize,
    /// Of those, containers whose devices all came from a larger pool of an init
    /// container's devices: the kubelet picks among them at random, with no
    /// GetPreferredAllocation to answer.
    pub mismatches_random_reuse: usize,
    /// Devices the kubelets found held by two pods at once.
    pub double_use: usize,
    /// Live pods whose record (allocated, else assignment) differs from the kubelet's.
    pub untrue_records: usize,
    /// Of the live pods, records true except that a regular init container whose devices
    /// the plugin could not attribute is missing, all its devices held by the pod's
    /// recorded app containers (so no GPU in use looks free). Not counted as untrue;
    /// bounded by the tests.
    pub init_unrecorded: usize,
    /// Live pods whose recorded whole devices overlap another live pod's on the same node.
    pub overlapping_records: usize,
    /// GPUs found over 1000 milli by a kubelet's record (whole use plus shares, or shares
    /// beyond 1000), checked after every admission batch.
    pub overcommitted: usize,
    /// Share pods admitted.
    pub shares_admitted: usize,
    pub elapsed: Duration,
    /// A few mismatches outside the random reuse, for the reader.
    pub examples: Vec<String>,
    /// A few untrue records at the last check (those missing only an init container
    /// too, so marked): the pod, its record, the kubelet's devices.
    pub untrue_examples: Vec<String>,
    pub by_shape: HashMap<String, usize>,
}

fn ids(devices: &[gpuplace_model::DeviceShare]) -> HashSet<String> {
    devices.iter().map(|d| d.id.clone()).collect()
}

/// The GPUs behind kubelet device IDs (a share's slices are of one GPU).
fn gpus_of(devices: &[String]) -> HashSet<String> {
    devices
        .iter()
        .map(|d| {
            gpuplace_deviceplugin::devices::slice_gpu(d)
                .unwrap_or(d)
                .to_string()
        })
        .collect()
}

/// Creates `total` pods (at most `inflight` alive), deletes each some time after its
/// kubelet admitted it, and at the end keeps the last ones alive for the record checks.
/// How pods are deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// A deletionTimestamp; the kubelet deletes the pod for good once it has stopped.
    Graceful,
    /// Gone from the API at once (`--grace-period 0 --force`), whatever the kubelet holds.
    Force,
}

#[allow(clippy::too_many_arguments)]
pub async fn run(
    cluster: &HandshakeCluster,
    total: usize,
    inflight: usize,
    lifetime_ms: (u64, u64),
    deletion: Deletion,
    seed: u64,
    deadline: Duration,
) -> RunReport {
    run_mix(
        cluster,
        total,
        inflight,
        lifetime_ms,
        deletion,
        seed,
        deadline,
        0,
    )
    .await
}

/// [`run`] with `share_percent` of the pods asking for shares (see [`draw_mix`]).
#[allow(clippy::too_many_arguments)]
pub async fn run_mix(
    cluster: &HandshakeCluster,
    total: usize,
    inflight: usize,
    lifetime_ms: (u64, u64),
    deletion: Deletion,
    seed: u64,
    deadline: Duration,
    share_percent: u32,
) -> RunReport {
    let api = &cluster.api;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = Instant::now();
    let mut report = RunReport::default();
    // name -> (shape, admitted at)
    let mut alive: HashMap<String, (Shape, Option<Instant>, Option<Duration>)> = HashMap::new();
    let mut seen: Vec<usize> = vec![0; cluster.nodes.len()];
    let mut gang_no = 0usize;
    let mut last_progress = Instant::now();
    while (report.created < total || alive.values().any(|(_, a, _)| a.is_none()))
        && start.elapsed() < deadline
    {
        while report.created < total && alive.len() < inflight {
            let shape = draw_mix(&mut rng, share_percent);
            if shape == Shape::Gang {
                gang_no += 1;
                let group = format!("gang-{gang_no}");
                let pg = PodGroup::new(
                    &group,
                    PodGroupSpec {
                        min_member: 2,
                        schedule_timeout_seconds: Some(60),
                        topology_key: None,
                    },
                );
                let mut pg = pg;
                pg.metadata.namespace = Some("ml".into());
                api.put_group(pg);
                for m in 0..2 {
                    let name = format!("p{}-{group}-{m}", report.created);
                    api.put_pod(pod_of(&name, shape, Some(&group)));
                    alive.insert(name.clone(), (shape, None, None));
                    report.created += 1;
                }
            } else {
                let name = format!("p{}", report.created);
                api.put_pod(pod_of(&name, shape, None));
                alive.insert(name.clone(), (shape, None, None));
                report.created += 1;
            }
            *report.by_shape.entry(format!("{shape:?}")).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "[{:>4}s] created {} admitted {} refused {} alive {} (waiting for admission {})",
                start.elapsed().as_secs(),
                report.created,
                report.admitted,
                report.refused,
                alive.len(),
                alive.values().filter(|(_, a, _)| a.is_none()).count()
            );
        }
        for (i, node) in cluster.nodes.iter().enumerate() {
            let log = node.fake.admissions_since(seen[i]);
            for a in &log {
                if let Some(entry) = alive.get_mut(&a.name) {
                    entry.1 = Some(Instant::now());
                    entry.2 = Some(Duration::from_millis(
                        rng.random_range(lifetime_ms.0..=lifetime_ms.1),
                    ));
                }
                if let Some(error) = &a.error {
                    report.refused += 1;
                    if report.examples.len() < 8 {
                        let so_far: Vec<(&String, HashSet<String>)> = a
                            .containers
                            .iter()
                            .map(|(n, _, d)| (n, gpus_of(d)))
                            .collect();
                        report.examples.push(format!(
                            "{} refused: {error}; admitted so far {so_far:?}; plan {:?}",
                            a.name, a.assignment
                        ));
                    }
                } else {
                    report.admitted += 1;
                    if alive
                        .get(&a.name)
                        .is_some_and(|(s, _, _)| matches!(s, Shape::Share(_) | Shape::ShareTwo(..)))
                    {
                        report.shares_admitted += 1;
                    }
                }
                compare(a, &mut report);
            }
            seen[i] += log.len();
            if !log.is_empty() {
                let over = node.fake.overcommitted();
                if !over.is_empty() && report.examples.len() < 8 {
                    report
                        .examples
                        .push(format!("{}: GPUs over 1000 milli: {over:?}", node.name));
                }
                report.overcommitted += over.len();
            }
        }
        // Keep the last pods alive for the record checks at the end.
        let finishing = report.created >= total && alive.values().all(|(_, at, _)| at.is_some());
        let expired: Vec<String> = alive
            .iter()
            .filter(|(_, (_, at, life))| {
                !finishing && matches!((at, life), (Some(at), Some(life)) if at.elapsed() >= *life)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in expired {
            match deletion {
                Deletion::Graceful => api.delete_pod_gracefully("ml", &name),
                Deletion::Force => api.delete_pod("ml", &name),
            }
            alive.remove(&name);
        }
    }
    report.elapsed = start.elapsed();
    // Let the reconcilers catch up, then check every live record: records must end true,
    // so they are checked until they are (or 15 s pass: on a loaded machine the plugin's
    // watch may lag by its whole 5 s wait, and its resync runs every 0.5 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    loop {
        report.untrue_records = 0;
        report.init_unrecorded = 0;
        report.overlapping_records = 0;
        report.untrue_examples.clear();
        check_records(cluster, &mut report);
        if report.untrue_records + report.overlapping_records == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.double_use = cluster.nodes.iter().map(|n| n.fake.double_use()).sum();
    report
}

fn compare(a: &crate::kubelet_node::Admission, report: &mut RunReport) {
    let Some(plan) = a
        .assignment
        .as_deref()
        .and_then(|t| Assignment::from_json(t).ok())
    else {
        return;
    };
    if a.error.is_some() {
        return;
    }
    // The kubelet's pool of init containers' devices, as it walks the containers.
    let mut pool: HashSet<String> = HashSet::new();
    let mut picked_at_random = false;
    for (name, kind, got) in &a.containers {
        let got: HashSet<String> = got.iter().cloned().collect();
        let gpus = gpus_of(&got.iter().cloned().collect::<Vec<_>>());
        // All from the pool: at random when the pool was larger, or the rest of a pool an
        // earlier container picked from at random.
        let from_pool = !got.is_empty() && got.is_subset(&pool);
        let random_pick = from_pool && (pool.len() > got.len() || picked_at_random);
        picked_at_random |= random_pick;
        match kind {
            gpuplace_model::ContainerKind::Init => pool.extend(got.iter().cloned()),
            _ => pool.retain(|d| !got.contains(d)),
        }
        let Some(planned) = plan.container(name) else {
            continue;
        };
        report.compared += 1;
        if gpus != ids(&planned.devices) {
            report.mismatches += 1;
            if random_pick {
                report.mismatches_random_reuse += 1;
            } else if report.examples.len() < 5 {
                let all: Vec<(&String, HashSet<String>)> = a
                    .containers
                    .iter()
                    .map(|(n, _, d)| (n, gpus_of(d)))
                    .collect();
                report.examples.push(format!(
                    "{} container {name}: planned {:?}, got {:?} ({} devices); all containers {all:?}; plan {:?}",
                    a.name,
                    ids(&planned.devices),
                    gpus,
                    got.len(),
                    plan.containers
                ));
            }
        }
    }
}

/// Whether `recorded` is `kubelet`'s but for regular init containers whose devices are all
/// among the recorded ones.
fn only_an_init_container_is_missing(
    pod: &Pod,
    recorded: &[(String, HashSet<String>)],
    kubelet: &HashMap<String, Vec<String>>,
) -> bool {
    let regular_init: HashSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() != Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let held: HashSet<&String> = recorded.iter().flat_map(|(_, d)| d).collect();
    let same = recorded.iter().all(|(name, devices)| {
        kubelet
            .get(name)
            .is_some_and(|got| gpus_of(got) == *devices)
    });
    same && kubelet.iter().all(|(name, got)| {
        recorded.iter().any(|(n, _)| n == name)
            || (regular_init.contains(name.as_str())
                && gpus_of(got).iter().all(|d| held.contains(d)))
    })
}

/// Every live admitted pod: its record (allocated, else assignment) equals the kubelet's,
/// and no two live pods' records share a device.
fn check_records(cluster: &HandshakeCluster, report: &mut RunReport) {
    let pods = cluster.api.pods();
    for node in &cluster.nodes {
        let record = node.fake.record();
        let mut used: HashMap<String, String> = HashMap::new();
        for pod in &pods {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let Some(kubelet) = record.get(uid) else {
                continue;
            };
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            let recorded: Option<Vec<(String, HashSet<String>)>> = annotations
                .get(ALLOCATED_ANNOTATION)
                .and_then(|t| Allocated::from_json(t).ok())
                .map(|a| {
                    a.containers
                        .iter()
                        .map(|c| (c.name.clone(), ids(&c.devices)))
                        .collect()
                })
                .or_else(|| {
                    annotations
                        .get(ASSIGNMENT_ANNOTATION)
                        .and_then(|t| Assignment::from_json(t).ok())
                        .map(|a| {
                            a.containers
                                .iter()
                                .map(|c| (c.name.clone(), ids(&c.devices)))
                                .collect()
                        })
                });
            let Some(recorded) = recorded else {
                continue;
            };
            let truthful = recorded.iter().all(|(name, devices)| {
                kubelet.get(name).is_none_or(|got| gpus_of(got) == *devices)
            }) && kubelet
                .iter()
                .all(|(name, _)| recorded.iter().any(|(n, _)| n == name));
            let init_only = !truthful && only_an_init_container_is_missing(pod, &recorded, kubelet);
            if init_only {
                report.init_unrecorded += 1;
            } else if !truthful {
                report.untrue_records += 1;
            }
            if !truthful && report.untrue_examples.len() < 5 {
                let kubelet: Vec<(&String, HashSet<String>)> =
                    kubelet.iter().map(|(n, d)| (n, gpus_of(d))).collect();
                report.untrue_examples.push(format!(
                    "{}/{} on {}: recorded {recorded:?} ({}{}), kubelet {kubelet:?}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    node.name,
                    if annotations.contains_key(ALLOCATED_ANNOTATION) {
                        "allocated"
                    } else {
                        "assignment"
                    },
                    if init_only {
                        "; an init container only"
                    } else {
                        ""
                    },
                ));
            }
            // Whole devices only: shares of one GPU are meant to meet.
            let mut mine: HashSet<String> = HashSet::new();
            for ids in kubelet.values() {
                if ids
                    .iter()
                    .all(|d| gpuplace_deviceplugin::devices::slice_gpu(d).is_none())
                {
                    mine.extend(recorded.iter().flat_map(|(_, d)| d.iter().cloned()));
                }
            }
            for d in mine {
                if let Some(other) = used.insert(d, uid.to_string())
                    && other != uid
                {
                    report.overlapping_records += 1;
                }
            }
        }
    }
}
