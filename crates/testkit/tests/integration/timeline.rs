//! The timeline replay through the scheduler, the device plugins and fake kubelets, against
//! `gpuplace simulate --timeline` on the same small cluster, arrivals, run times, policy and
//! tie-break seed: every pod starts at the same simulated time, on the same node and GPUs.
//! The simulator's queue is the scheduler's (priority, then arrival; the same backoff and
//! parking), so its waits are the scheduler's waits.

use std::sync::Arc;
use std::time::Duration;

use gpuplace_core::{Policy, TargetWorkload};
use gpuplace_sim::timeline::options::Costs;
use gpuplace_sim::timeline::{DurationModel, Timeline, TimelineOptions};
use gpuplace_testkit::timeline::{StackJob, TimelineStackOptions, replay_timeline};

async fn compare(policy: Policy, seed: u64) {
    let mut workload = gpuplace_sim::builtin_workload(64);
    workload.sample_nodes(10, seed).expect("sample");
    let timeline = Timeline::new(
        workload,
        TimelineOptions {
            load: 1.0,
            arrivals: 250,
            warmup: 0.0,
            durations: DurationModel {
                max_s: Some(7_200.0),
                ..DurationModel::default()
            },
            // The stack's simulated clock binds and starts a pod at its decision.
            costs: Costs::FREE,
            ..TimelineOptions::default()
        },
    )
    .expect("timeline");
    let (run, jobs) = timeline.run_with_jobs(policy, seed);
    let pods = &timeline.workload().pods;
    let nodes = &timeline.workload().nodes;
    let stack_jobs: Vec<StackJob> = jobs
        .iter()
        .map(|j| StackJob {
            arrival_ms: j.arrival.0,
            request: pods[j.pod as usize].request.clone(),
            priority: pods[j.pod as usize].priority,
            run_ms: j.run_ms,
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let outcome = replay_timeline(
        dir.path(),
        nodes,
        &stack_jobs,
        &TimelineStackOptions {
            policy,
            placer_seed: Timeline::placer_seed(seed),
            workload: Some(Arc::new(TargetWorkload::from_requests(
                pods.iter().map(|p| &p.request),
                0.95,
            ))),
            end_ms: (run.simulated_s * 1e3).round() as u64,
            settle_timeout: Duration::from_secs(20),
        },
    )
    .await
    .expect("stack replay");
    let mut waited = 0;
    for (i, (sim, stack)) in jobs.iter().zip(&outcome).enumerate() {
        let node = sim.start.map(|_| nodes[sim.node as usize].name.clone());
        let mut devices: Vec<String> = sim
            .gpus
            .iter()
            .map(|&(g, _)| nodes[sim.node as usize].gpus[g].id.clone())
            .collect();
        devices.sort();
        assert_eq!(
            (sim.start.map(|s| s.0), node, devices),
            (stack.start_ms, stack.node.clone(), stack.devices.clone()),
            "{policy} seed {seed}: pod {i} (arrived at {} ms): simulator vs stack",
            sim.arrival.0
        );
        waited += usize::from(sim.start.is_some_and(|s| s > sim.arrival));
    }
    println!(
        "{policy} seed {seed}: {} pods, {waited} waited, all the same in the simulator and the stack",
        jobs.len()
    );
    assert!(
        waited > 0,
        "the replay must make pods wait to compare queues"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_starts_the_same_pods_at_the_same_times_on_the_same_gpus() {
    for (policy, seed) in [(Policy::DEFAULT, 2), (Policy::Fgd, 1), (Policy::BestFit, 3)] {
        compare(policy, seed).await;
    }
}
