//! A trace replayed through the whole stack instead of the simulator: the in-memory API,
//! one fake kubelet with gpuplace's device plugin (whole GPUs and shares) per node, and the
//! scheduler's loop. Pods arrive one at a time in the simulator's arrival order; each is
//! bound or found unschedulable (its `FailedScheduling` Event) before the next comes, and
//! an unschedulable pod is deleted, as the simulator drops it. After each arrival the
//! unallocated GPU share is sampled from the scheduler's records (the bound pods' GPU
//! requests) per arrived percent, as `gpuplace simulate` samples its state; at the end the
//! kubelets' records must hold exactly what the scheduler recorded.

use std::path::Path;
use std::time::{Duration, Instant};

use gpuplace_model::{NodeInventory, Request, SHARE_RESOURCE};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::cluster::{ClusterOptions, HandshakeCluster};

/// What a replay did.
#[derive(Clone, Debug, Default)]
pub struct ReplayReport {
    pub arrived: usize,
    pub bound: usize,
    pub unschedulable: usize,
    /// Pods the kubelets refused at admission (must be 0).
    pub refused: usize,
    /// Unallocated GPU as % of capacity, per arrived percent (index), as the simulator's
    /// curve: the mean of the samples that fell on each percent.
    pub unallocated: Vec<f64>,
    /// Milli-GPU allocated at the end by the scheduler's records and by the kubelets'.
    pub allocated_by_scheduler: u64,
    pub allocated_by_kubelets: u64,
    pub capacity_milli: u64,
    pub elapsed: Duration,
}

impl ReplayReport {
    /// Unallocated GPU % at arrived `percent` (`None` past the replay's end).
    pub fn unallocated_at(&self, percent: usize) -> Option<f64> {
        self.unallocated.get(percent).copied()
    }
}

/// The pod the kubelet and the scheduler see for one trace request: CPU and memory
/// requests, whole GPUs as `nvidia.com/gpu`, a share as `gpuplace.io/gpu-milli`, models
/// as `gpuplace.io/gpu-model`.
pub fn trace_pod(name: &str, request: &Request) -> Pod {
    let mut limits = serde_json::Map::new();
    if request.gpu_count > 0 {
        if request.gpu_milli < 1000 {
            limits.insert(SHARE_RESOURCE.into(), json!(request.gpu_milli.to_string()));
        } else {
            limits.insert(
                "nvidia.com/gpu".into(),
                json!(request.gpu_count.to_string()),
            );
        }
    }
    let mut annotations = serde_json::Map::new();
    if !request.allowed_models.is_empty() {
        annotations.insert(
            "gpuplace.io/gpu-model".into(),
            json!(request.allowed_models.join(",")),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "trace", "annotations": annotations,
            "creationTimestamp": crate::clock::server_time().to_string()},
        "spec": {"schedulerName": "gpuplace", "containers": [{"name": "main", "image": "busybox",
            "resources": {"requests": {"cpu": format!("{}m", request.cpu_milli),
                "memory": format!("{}Mi", request.memory_mib)}, "limits": limits}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap_or_default()
}

/// The file backend's inventory file for `node` (its GPU IDs are the UUIDs).
fn inventory_file(node: &NodeInventory) -> String {
    let gpus: Vec<serde_json::Value> = node
        .gpus
        .iter()
        .map(|g| {
            json!({"index": g.index, "uuid": g.id, "model": g.model,
                "memory_mib": g.memory_mib, "healthy": g.healthy})
        })
        .collect();
    json!({"cpu_milli": node.cpu_milli, "memory_mib": node.memory_mib, "gpus": gpus,
        "links": node.links})
    .to_string()
}

/// Writes each node's inventory file under `<dir>/inventories`; returns (node, file).
pub(crate) fn inventory_files(
    dir: &Path,
    nodes: &[NodeInventory],
) -> Result<Vec<(String, std::path::PathBuf)>, String> {
    let files = dir.join("inventories");
    std::fs::create_dir_all(&files).map_err(|e| e.to_string())?;
    let mut listed = Vec::with_capacity(nodes.len());
    for node in nodes {
        // One folder each: the backend watches its file's folder, and reads of a shared
        // folder's files would wake every node's watcher.
        let folder = files.join(&node.name);
        std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
        let path = folder.join("inventory.json");
        std::fs::write(&path, inventory_file(node)).map_err(|e| e.to_string())?;
        listed.push((node.name.clone(), path));
    }
    Ok(listed)
}

/// How a replay runs.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub policy: gpuplace_core::Policy,
    /// The scheduler's tie-break seed (the simulator's placer seed for the same order).
    pub placer_seed: u64,
    /// Stop once the arrived GPU request passes this percent of capacity.
    pub until_percent: usize,
    /// Longest wait for one pod's outcome.
    pub per_pod_timeout: Duration,
    /// FGD's target workload for the scheduler, as the simulator binds it (`None`: the
    /// pods the scheduler has seen).
    pub workload: Option<std::sync::Arc<gpuplace_core::TargetWorkload>>,
}

/// Replays `arrivals` (requests in arrival order) on `nodes`; sockets and inventory files
/// live under `dir`.
pub async fn replay(
    dir: &Path,
    nodes: &[NodeInventory],
    arrivals: &[Request],
    options: &ReplayOptions,
) -> Result<ReplayReport, String> {
    let listed = inventory_files(dir, nodes)?;
    let cluster = HandshakeCluster::start(
        &dir.join("nodes"),
        ClusterOptions {
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
    let report = drive(&cluster, nodes, arrivals, options).await;
    cluster.stop().await;
    report
}

async fn drive(
    cluster: &HandshakeCluster,
    nodes: &[NodeInventory],
    arrivals: &[Request],
    options: &ReplayOptions,
) -> Result<ReplayReport, String> {
    let started = Instant::now();
    let api = &cluster.api;
    let capacity: u64 = nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .filter(|g| g.healthy)
        .map(|g| u64::from(g.milli_capacity))
        .sum();
    if capacity == 0 {
        return Err("the nodes have no GPUs".into());
    }
    let mut report = ReplayReport {
        capacity_milli: capacity,
        ..ReplayReport::default()
    };
    let mut sums = vec![0.0f64; options.until_percent + 1];
    let mut counts = vec![0u32; options.until_percent + 1];
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let mut events_seen = 0usize;
    for (i, request) in arrivals.iter().enumerate() {
        let percent = ((arrived + request.total_gpu_milli()) * 100 / capacity) as usize;
        if percent > options.until_percent {
            break;
        }
        arrived += request.total_gpu_milli();
        report.arrived += 1;
        let name = format!("a{i:06}");
        api.put_pod(trace_pod(&name, request));
        let deadline = Instant::now() + options.per_pod_timeout;
        loop {
            if api
                .pod("trace", &name)
                .and_then(|p| p.spec.and_then(|s| s.node_name))
                .is_some()
            {
                report.bound += 1;
                allocated += request.total_gpu_milli();
                break;
            }
            let (events, total) = api.events_since(events_seen);
            events_seen = total;
            let failed = events
                .iter()
                .any(|e| e.reason == "FailedScheduling" && e.pod.name == name);
            if failed || Instant::now() >= deadline {
                api.delete_pod("trace", &name);
                report.unschedulable += 1;
                break;
            }
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        let unallocated = 100.0 * (capacity - allocated.min(capacity)) as f64 / capacity as f64;
        sums[percent] += unallocated;
        counts[percent] += 1;
    }
    // As the simulator: a percent no sample fell on takes the previous one's value.
    let mut last = 100.0;
    for (sum, count) in sums.iter().zip(&counts) {
        if *count > 0 {
            last = sum / f64::from(*count);
        }
        report.unallocated.push(last);
    }
    report.allocated_by_scheduler = allocated;
    // Every bound pod admitted by its kubelet (or refused), then the kubelets' records.
    let wait_until = Instant::now() + Duration::from_secs(120);
    loop {
        let (mut admitted, mut refused) = (0, 0);
        for n in &cluster.nodes {
            n.fake.with_admissions(|log| {
                admitted += log.len();
                refused += log.iter().filter(|a| a.error.is_some()).count();
            });
        }
        report.refused = refused;
        if admitted >= report.bound || Instant::now() >= wait_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report.allocated_by_kubelets = cluster
        .nodes
        .iter()
        .flat_map(|n| n.fake.gpu_milli().into_values())
        .map(u64::from)
        .sum();
    report.elapsed = started.elapsed();
    Ok(report)
}
