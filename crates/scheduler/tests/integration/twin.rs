//! The scheduler decides as the simulator does when the same pods come one after another:
//! a pod decided in a later round sees an earlier round's pod where that pod went, however
//! late the watch shows its Binding. Found by `gpuplace replay` on the real API server: the
//! simulator packed the first warm-start pods onto one node, the live scheduler put the
//! second on another empty node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_model::{NodeInventory, Request};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::api::ServerCosts;
use serde_json::json;

use crate::common::*;

const NODES: usize = 6;

fn request(cpu: u64, memory: u64, gpus: u32) -> Request {
    Request {
        cpu_milli: cpu,
        memory_mib: memory,
        gpu_count: gpus,
        gpu_milli: 1000,
        allowed_models: vec![],
        need: Default::default(),
    }
}

fn workload() -> Arc<TargetWorkload> {
    let shapes = [
        request(12_000, 24_576, 1),
        request(4_000, 8_192, 1),
        request(32_000, 65_536, 0),
    ];
    Arc::new(TargetWorkload::from_requests(shapes.iter(), 0.95))
}

fn inventories() -> Vec<NodeInventory> {
    (0..NODES)
        .map(|i| NodeInventory::uniform(&format!("twin-{i}"), 64_000, 262_144, 8, "V100"))
        .collect()
}

/// Where the core's placer, deciding the pods one after another, puts them.
fn simulated(seed: u64, pods: &[Request]) -> Vec<String> {
    let mut state = ClusterState::new(inventories()).unwrap();
    state.set_workload(workload());
    let mut placer = Placer::new(Policy::GPUPLACE, seed);
    pods.iter()
        .map(|r| {
            let d = placer.place(&mut state, r).unwrap();
            state.inventory(d.node).name.clone()
        })
        .collect()
}

fn twin_pod(name: &str, r: &Request, at: u64) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        r.gpu_count,
        json!({"metadata": {"creationTimestamp": format!("2030-01-01T00:00:{at:02}Z")},
            "spec": {"containers": [{"name": "main", "resources": {
            "requests": {"cpu": format!("{}m", r.cpu_milli), "memory": format!("{}Mi", r.memory_mib)},
            "limits": {"nvidia.com/gpu": r.gpu_count.to_string()}}}]}}),
    )
}

/// The scheduler's places for `pods` created one per round, the watch `delay_ms` late.
async fn live(seed: u64, pods: &[Request], delay_ms: u64) -> Vec<String> {
    let api = MemoryApi::new().with_costs(ServerCosts {
        watch_delay: (
            Duration::from_millis(delay_ms),
            Duration::from_millis(delay_ms),
        ),
        ..Default::default()
    });
    for inv in inventories() {
        api.put_node(node(
            &inv.name,
            8,
            json!({"metadata": {"annotations": {"gpuplace.io/inventory": inv.to_json()}},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}),
        ));
    }
    let mut scheduler = Scheduler::new(
        api.clone(),
        SchedulerConfig {
            policy: Policy::GPUPLACE,
            seed,
            workload: Some(workload()),
            ..Default::default()
        },
    );
    let t0 = Instant::now();
    for (i, r) in pods.iter().enumerate() {
        api.put_pod(twin_pod(&format!("p{i}"), r, i as u64));
        tokio::time::advance(Duration::from_millis(delay_ms + 10)).await;
        let at = t0 + Duration::from_millis((i as u64 + 1) * (delay_ms + 10));
        let report = scheduler.round(at).await.unwrap();
        assert_eq!(report.bound, 1, "p{i}: {report:?}");
    }
    tokio::time::advance(Duration::from_millis(delay_ms + 10)).await;
    assert_no_double_booking(&api);
    (0..pods.len())
        .map(|i| bound_node(&api, &format!("p{i}")).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn pods_decided_one_per_round_go_where_the_simulator_puts_them() {
    let pods = vec![
        request(12_000, 24_576, 1),
        request(12_000, 24_576, 1),
        request(12_000, 16_384, 1),
        request(4_000, 8_192, 1),
        request(32_000, 65_536, 0),
        request(12_000, 24_576, 1),
    ];
    for seed in [42, 7] {
        let want = simulated(seed, &pods);
        // The placer packs the first pods onto one node: a scheduler that did not see the
        // first pod where it went would spread them.
        assert_eq!(want[0], want[1], "seed {seed}: {want:?}");
        for delay_ms in [0, 300] {
            assert_eq!(
                live(seed, &pods, delay_ms).await,
                want,
                "seed {seed}, watch {delay_ms} ms late"
            );
        }
    }
}
