//! The handshake on a small mixed workload, in one process: three nodes (DGX-1 cube-mesh,
//! 8-GPU NVSwitch, 4-GPU PCIe) with a fake kubelet and gpuplace's device plugin each, and
//! the scheduler. Prints, per container: pod -> node -> the scheduler's devices -> the
//! kubelet's devices.
//!
//!     cargo run -p gpuplace-testkit --example handshake

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuplace_model::{ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Assignment};
use gpuplace_testkit::cluster::{ClusterOptions, HandshakeCluster};
use gpuplace_testkit::workload::{Shape, pod_of};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let inventories = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/inventories");
    let dir = std::env::temp_dir().join(format!("gpuplace-handshake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let cluster = HandshakeCluster::start(
        &dir,
        ClusterOptions {
            nodes: vec![
                (
                    "dgx1".into(),
                    inventories.join("dgx1-hybrid-cube-mesh.yaml"),
                ),
                ("nvswitch".into(), inventories.join("nvswitch-8.yaml")),
                ("pcie".into(), inventories.join("pcie-4.yaml")),
            ],
            seed: 42,
            admission_delay_ms: (0, 20),
            plugin_watch_delay_ms: (0, 20),
            terminating_ms: None,
            numa_alignment: false,
            pod_resources_get: true,
            round_interval: Duration::from_millis(5),
            policy: None,
            placer_seed: None,
            exact_resources: false,
            workload: None,
        },
    )
    .await?;
    let shapes = [
        Shape::Whole(4),
        Shape::Whole(2),
        Shape::Whole(1),
        Shape::TwoApps(2, 1),
        Shape::InitThenApp(1, 2),
        Shape::Sidecar,
        Shape::Injected(2),
        Shape::Whole(8),
        Shape::Whole(1),
    ];
    for (i, shape) in shapes.iter().enumerate() {
        cluster
            .api
            .put_pod(pod_of(&format!("demo-{i}"), *shape, None));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster
        .nodes
        .iter()
        .map(|n| n.fake.admissions().len())
        .sum::<usize>()
        < shapes.len()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give the reconcilers a pass.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let index: HashMap<String, u32> = cluster
        .nodes
        .iter()
        .flat_map(|n| n.inventory.gpus.iter().map(|g| (g.id.clone(), g.index)))
        .collect();
    let show = |ids: &[String]| {
        let mut v: Vec<u32> = ids.iter().filter_map(|id| index.get(id).copied()).collect();
        v.sort_unstable();
        format!("{v:?}")
    };
    println!(
        "{:<8} {:<9} {:<12} {:<14} {:<14} same",
        "pod", "node", "container", "scheduler", "kubelet"
    );
    let mut same = 0;
    let mut total = 0;
    for node in &cluster.nodes {
        for a in node.fake.admissions() {
            let plan = a
                .assignment
                .as_deref()
                .and_then(|t| Assignment::from_json(t).ok());
            for (container, _, got) in &a.containers {
                let planned: Vec<String> = plan
                    .as_ref()
                    .and_then(|p| p.container(container))
                    .map(|c| c.devices.iter().map(|d| d.id.clone()).collect())
                    .unwrap_or_default();
                let equal = show(&planned) == show(got);
                total += 1;
                same += usize::from(equal);
                println!(
                    "{:<8} {:<9} {:<12} {:<14} {:<14} {}",
                    a.name,
                    node.name,
                    container,
                    show(&planned),
                    show(got),
                    if equal { "yes" } else { "NO" }
                );
            }
            if let Some(error) = &a.error {
                println!("{:<8} {:<9} refused: {error}", a.name, node.name);
            }
        }
    }
    let admitted: Vec<String> = cluster
        .nodes
        .iter()
        .flat_map(|n| n.fake.admissions().into_iter().map(|a| a.name))
        .collect();
    for pod in cluster.api.pods() {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if !admitted.contains(&name) {
            println!("{name:<8} pending: no node has the GPUs it asks for free at once");
        }
    }
    let recorded = cluster
        .api
        .pods()
        .iter()
        .filter(|p| {
            p.metadata.annotations.as_ref().is_some_and(|a| {
                a.contains_key(ASSIGNMENT_ANNOTATION) && a.contains_key(ALLOCATED_ANNOTATION)
            })
        })
        .count();
    println!(
        "\n{same} of {total} containers got exactly the scheduler's GPUs (GPU indexes shown); {recorded} pods carry a gpuplace.io/allocated correction"
    );
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
