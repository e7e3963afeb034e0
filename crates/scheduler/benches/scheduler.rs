//! Scheduler benchmark: `cargo bench -p gpuplace-scheduler --bench scheduler [-- NODES PODS]`.
//!
//! 5,000 nodes x 8 GPUs and 50,000 pending pods (openb-like mix: shares, 1, 2, 4 and 8 GPUs,
//! CPU-only) against the in-memory API. Reports pods bound per second end to end, the time
//! split between the core's decisions and the rest (view, filters, patch, bind, events), the
//! core alone in decisions per second, and peak memory (VmHWM).

use std::time::Instant;

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_scheduler::demand::pod_demand;
use gpuplace_scheduler::snapshot::build;
use gpuplace_scheduler::{ClusterApi, Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {"nvidia.com/gpu.product": "A100"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "250"}
        }
    }))
    .expect("node")
}

fn pod(i: usize) -> Pod {
    // Mix by pods: 13% CPU-only, 38% shares, 45% one GPU, 4% 2/4/8 GPUs.
    let r = (i * 7919) % 100;
    let (gpus, milli) = match r {
        0..=12 => (0, None),
        13..=50 => (1, Some([250, 500, 470, 810][i % 4])),
        51..=95 => (1, None),
        96..=97 => (2, None),
        98 => (4, None),
        _ => (8, None),
    };
    let mut annotations = serde_json::Map::new();
    if let Some(m) = milli {
        annotations.insert("gpuplace.io/gpu-milli".into(), json!(m.to_string()));
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": "bench", "annotations": annotations},
        "spec": {
            "schedulerName": "gpuplace",
            "containers": [{"name": "main", "resources": {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]
        },
        "status": {"phase": "Pending"}
    }))
    .expect("pod")
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(5_000);
    let pods = args.get(1).copied().unwrap_or(50_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let api = MemoryApi::new();
        for i in 0..nodes {
            api.put_node(node(i));
        }
        for i in 0..pods {
            api.put_pod(pod(i));
        }
        let rss_before = peak_rss_mib();

        // The core alone: every decision on the same cluster, no API.
        let view = api.view().await.expect("view");
        let snapshot = build(&view.nodes, &[], "nvidia.com/gpu");
        let requests: Vec<_> = view
            .pods
            .iter()
            .filter_map(|p| pod_demand(p, "nvidia.com/gpu").ok())
            .map(|d| d.request)
            .collect();
        let mut state: ClusterState = snapshot.state;
        state.set_workload(std::sync::Arc::new(TargetWorkload::from_requests(&requests, 0.95)));
        let mut placer = Placer::new(Policy::Fgd, 42);
        let started = Instant::now();
        let mut placed = 0;
        for r in &requests {
            if placer.place(&mut state, r).is_ok() {
                placed += 1;
            }
        }
        let core = started.elapsed();
        println!(
            "core alone (fgd): {} decisions in {:.2} s = {:.0} decisions/s ({} placed)",
            requests.len(),
            core.as_secs_f64(),
            requests.len() as f64 / core.as_secs_f64(),
            placed
        );

        // End to end: the scheduling loop against the in-memory API.
        let mut scheduler = Scheduler::new(api.clone(), SchedulerConfig::default());
        let started = Instant::now();
        let mut bound = 0;
        let mut rounds = 0;
        loop {
            let report = scheduler.round(Instant::now()).await.expect("round");
            rounds += 1;
            bound += report.bound;
            if report.bound == 0 {
                break;
            }
        }
        let total = started.elapsed();
        println!(
            "end to end: {bound} of {pods} pods bound on {nodes} nodes x 8 GPUs in {:.2} s = {:.0} pods/s ({rounds} rounds)",
            total.as_secs_f64(),
            bound as f64 / total.as_secs_f64()
        );
        println!(
            "time split: core decisions ~{:.2} s ({:.0}%), API path, snapshot and filters ~{:.2} s",
            core.as_secs_f64(),
            100.0 * core.as_secs_f64() / total.as_secs_f64(),
            (total - core.min(total)).as_secs_f64()
        );
        println!(
            "peak memory (VmHWM): {:.0} MiB with the in-memory API's objects ({:.0} MiB before scheduling)",
            peak_rss_mib(),
            rss_before
        );
    });
}
