//! GetPreferredAllocation latency with the handshake on a busy node: 500 pods bound to one
//! 16-GPU node (the kubelet lists them all), then 1-GPU pods scheduled one after another;
//! each admission's GetPreferredAllocation round trip is timed at the fake kubelet (gRPC
//! over a unix socket, the plugin's PodResources List of every active pod over another,
//! identification and the answer).
//!
//! Pods arrive every PACE_MS (default 50: 20 admissions a second, more than a kubelet
//! admits on one node); with PACE_MS 0 they arrive back to back and the plugin's
//! PodResources rate limit (50 List calls a second) sets the pace, and the latency.
//!
//!     cargo bench -p gpuplace-testkit --bench handshake [-- PODS ROUNDS PACE_MS]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuplace_testkit::cluster::{ClusterOptions, HandshakeCluster};
use gpuplace_testkit::workload::{Shape, pod_of};
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let bound = args.first().copied().unwrap_or(500);
    let rounds = args.get(1).copied().unwrap_or(600);
    let pace = Duration::from_millis(args.get(2).copied().unwrap_or(50) as u64);
    let inventories = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/inventories");
    let dir = std::env::temp_dir().join(format!("gpuplace-bench-handshake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let cluster = HandshakeCluster::start(
        &dir,
        ClusterOptions {
            nodes: vec![("node".into(), inventories.join("pairs-16.yaml"))],
            seed: 1,
            admission_delay_ms: (0, 0),
            plugin_watch_delay_ms: (0, 0),
            terminating_ms: None,
            numa_alignment: false,
            pod_resources_get: true,
            round_interval: Duration::from_millis(10),
            policy: None,
            placer_seed: None,
            exact_resources: false,
            workload: None,
        },
    )
    .await?;
    // Pods already on the node: CPU-only, bound by nodeName (no scheduler involved).
    for i in 0..bound {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": format!("resident-{i}"), "namespace": "ml"},
            "spec": {"nodeName": "node", "containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": "Running"}
        }))
        .map_err(|e| e.to_string())?;
        cluster.api.put_pod(pod);
    }
    let node = &cluster.nodes[0];
    let wait_admissions = |n: usize| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        while node.fake.admissions().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        node.fake.admissions().len() >= n
    };
    if !wait_admissions(bound).await {
        return Err("the resident pods were not admitted".into());
    }
    // The kubelet's List alone, as the plugin calls it (all resident pods active).
    let podres = gpuplace_deviceplugin::kubelet::podresources::PodResources::new(
        node.fake.pod_resources_socket(),
        "nvidia.com/gpu",
    );
    let mut list_latency = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let listed = podres
            .list(gpuplace_deviceplugin::kubelet::podresources::Priority::Admission)
            .await
            .map_err(|e| e.to_string())?;
        list_latency.push(t.elapsed());
        if listed.map(|l| l.len()) != Some(bound) {
            return Err("List does not show every resident pod".into());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    list_latency.sort_unstable();
    println!(
        "PodResources List of {bound} pods alone: p50 {:?}  p99 {:?}",
        percentile(&list_latency, 0.5),
        percentile(&list_latency, 0.99)
    );
    let mut latencies = Vec::new();
    let started = Instant::now();
    for r in 0..rounds {
        let next = Instant::now() + pace;
        let name = format!("gpu-{r}");
        cluster.api.put_pod(pod_of(&name, Shape::Whole(1), None));
        if !wait_admissions(bound + r + 1).await {
            return Err(format!("pod {name} was not admitted"));
        }
        cluster.api.delete_pod("ml", &name);
        tokio::time::sleep_until(next.into()).await;
    }
    let elapsed = started.elapsed();
    let mut planned = 0;
    for a in node.fake.admissions() {
        latencies.extend(a.preferred_latency.iter().copied());
        planned += usize::from(a.error.is_none() && a.preferred_calls > 0);
    }
    latencies.sort_unstable();
    let answered = node.handshake_counters();
    println!(
        "GetPreferredAllocation with {bound} pods on the node, {} calls ({planned} GPU pods admitted in {:.1} s, one every {pace:?} at most):\n  p50 {:?}  p90 {:?}  p99 {:?}  max {:?}\n  {}",
        latencies.len(),
        elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        answered.join("\n  ")
    );
    // The plugin's own histogram: how many calls took at most 1 ms, apart for the calls
    // that waited for the pod watch (the kubelet saw the pod before the plugin's watch did).
    let text = node.metrics_text();
    for waited in ["false", "true"] {
        let series = format!("waited_for_watch=\"{waited}\"");
        let count = |bound: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("gpuplace_deviceplugin_preferred_allocation_seconds_bucket")
                        && l.contains(&series)
                        && l.contains(&format!("le=\"{bound}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let (all, within) = (count("+Inf"), count("0.001"));
        if all > 0 {
            println!(
                "  in the plugin, waited for the pod watch {waited}: {all} calls, {within} ({:.1}%) within 1 ms, {} ({:.1}%) within 0.5 ms",
                within as f64 * 100.0 / all as f64,
                count("0.0005"),
                count("0.0005") as f64 * 100.0 / all as f64
            );
        }
    }
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
