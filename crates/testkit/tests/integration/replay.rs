//! The openb default trace replayed through the scheduler, the device plugins and fake
//! kubelets (1,213 nodes, 6,212 GPUs, shares as `gpuplace.io/gpu-milli`), against
//! `gpuplace simulate` with the same policy, arrival order and tie-break seed. Skips,
//! saying why, when the trace is absent.

use std::path::PathBuf;
use std::time::Duration;

use gpuplace_core::{Policy, TargetWorkload};
use gpuplace_sim::replay::arrival_order;
use gpuplace_sim::{Prepared, Workload, load_nodes, load_pods};
use gpuplace_testkit::replay::{ReplayOptions, replay};

fn trace_dir() -> Option<PathBuf> {
    gpuplace_sim::trace::shared_openb_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
        .map_err(|why| println!("skipped: {why}"))
        .ok()
}

/// The simulator's placer seed for arrival seed `seed` (see `Prepared::run`).
fn placer_seed(seed: u64) -> u64 {
    seed ^ 0x9e37_79b9_7f4a_7c15
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openb_through_scheduler_and_kubelets_matches_the_simulator() {
    let Some(dir) = trace_dir() else { return };
    let nodes = load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    // `GPUPLACE_REPLAY_SEED` replays another arrival order (default 42).
    let seed = std::env::var("GPUPLACE_REPLAY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    let policy = Policy::Fgd;
    let prepared = Prepared::new(Workload {
        name: "default".into(),
        nodes: nodes.clone(),
        pods: pods.clone(),
    })
    .unwrap();
    let simulated = prepared.run(policy, seed, 1.3);
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    let arrivals: Vec<_> = arrival_order(&pods, capacity, seed, 1.3)
        .into_iter()
        .map(|i| pods[i].request.clone())
        .collect();
    let work = tempfile::tempdir().unwrap();
    let report = replay(
        work.path(),
        &nodes,
        &arrivals,
        &ReplayOptions {
            policy,
            placer_seed: placer_seed(seed),
            until_percent: 100,
            per_pod_timeout: Duration::from_secs(20),
            // FGD's target workload as `simulate` binds it: the whole trace's shapes (the
            // scheduler's `--fgd-workload`); without it the scheduler measures against the
            // pods it has seen so far, and seeds differ by up to 0.9 points.
            workload: Some(std::sync::Arc::new(TargetWorkload::from_requests(
                pods.iter().map(|p| &p.request),
                0.95,
            ))),
        },
    )
    .await
    .unwrap();
    let sim = simulated.curves.unallocated[100];
    let stack = report.unallocated_at(100).unwrap();
    println!(
        "openb default, {policy:?}, seed {seed}: unallocated GPU at arrived 100%: simulate {sim:.2}%, scheduler + kubelets {stack:.2}% (arrived {}, bound {}, unschedulable {}, refused {}, {:.0} s)",
        report.arrived,
        report.bound,
        report.unschedulable,
        report.refused,
        report.elapsed.as_secs_f64()
    );
    assert_eq!(report.refused, 0, "{report:?}");
    assert_eq!(
        report.allocated_by_kubelets, report.allocated_by_scheduler,
        "the kubelets' records hold what the scheduler recorded"
    );
    assert!(
        (sim - stack).abs() <= 0.3,
        "simulate {sim:.2}% vs scheduler + kubelets {stack:.2}%"
    );
}
