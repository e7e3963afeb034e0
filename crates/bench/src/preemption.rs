//! `gpuplace-bench preemption`: the decision time of preemption at cluster scale, through
//! the scheduler's own rounds on the in-memory API.
//!
//! A cluster (default 5,000 nodes x 8 GPUs, linked inventories) is filled with
//! low-priority pods of an openb-like mix by the scheduler itself; then high-priority pods
//! arrive one at a time (1 GPU, 2 GPUs, 4 GPUs needing NVLink, 8 GPUs, in turn). Each
//! preempts; its victims are then deleted for good, as their kubelets would, and it binds.
//! Timed: each preemption search as the scheduler makes it (candidates from the state, the
//! victim search, the plan), not the evictions' writes.

use std::time::{Duration, Instant};

use clap::Args;
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

#[derive(Args, Debug)]
pub struct PreemptionBenchArgs {
    #[arg(long, default_value_t = 5_000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Low-priority pods to fill the cluster with (pods that do not fit stay pending).
    #[arg(long, default_value_t = 50_000)]
    fill: usize,
    /// High-priority pods that preempt, one after another.
    #[arg(long, default_value_t = 200)]
    preemptors: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn preemptor(i: usize) -> anyhow::Result<Pod> {
    let (gpus, annotations) = match i % 4 {
        0 => (1, json!({})),
        1 => (2, json!({})),
        2 => (4, json!({"gpuplace.io/topology": "nvlink"})),
        _ => (8, json!({})),
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("hi-{i:05}"), "namespace": "bench",
            "uid": format!("hi-uid-{i}"), "annotations": annotations},
        "spec": {
            "schedulerName": "gpuplace",
            "priority": 1000,
            "containers": [{"name": "main", "resources": {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]
        },
        "status": {"phase": "Pending"}
    }))?)
}

pub fn run(args: PreemptionBenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: PreemptionBenchArgs) -> anyhow::Result<()> {
    let api = MemoryApi::new();
    for i in 0..args.nodes {
        api.put_node(crate::scheduler::node(i, args.gpus_per_node, true)?);
    }
    for i in 0..args.fill {
        api.put_pod(crate::scheduler::pod(i, 0.0)?);
    }
    let mut scheduler = Scheduler::new(api.clone(), SchedulerConfig::default());
    let mut t = Instant::now();
    let started = Instant::now();
    let mut bound = 0;
    loop {
        t += Duration::from_secs(1);
        let report = scheduler.round(t).await?;
        bound += report.bound;
        if report.assumed == 0 {
            break;
        }
    }
    let fill_s = started.elapsed().as_secs_f64();
    let mut times = Vec::new();
    let (mut victims, mut placed, mut failed) = (0usize, 0usize, 0usize);
    for i in 0..args.preemptors {
        let pod = preemptor(i)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        api.put_pod(pod);
        t += Duration::from_secs(1);
        times.extend(scheduler.round(t).await?.preemption_searches);
        let Some(nomination) = scheduler.nominations().get(&uid).cloned() else {
            failed += 1;
            continue;
        };
        victims += nomination.victims.len();
        for v in &nomination.victims {
            api.delete_pod(&v.namespace, &v.name);
        }
        t += Duration::from_secs(1);
        let report = scheduler.round(t).await?;
        placed += report.bound;
    }
    times.sort_unstable();
    let at = |q: f64| {
        times
            .get(((times.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let out = json!({
        "nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node as usize,
        "fill_pods": args.fill, "fill_bound": bound, "fill_s": fill_s,
        "preemptors": args.preemptors, "searches": times.len(),
        "preemptors_bound": placed, "no_plan": failed,
        "victims_per_preemptor": victims as f64 / (args.preemptors - failed).max(1) as f64,
        "search_p50_ms": ms(at(0.5)), "search_p99_ms": ms(at(0.99)),
        "search_max_ms": ms(times.last().copied().unwrap_or_default()),
    });
    if args.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} nodes x {} GPUs filled with {bound} low-priority pods in {fill_s:.1}s (in-memory API, one thread)",
        args.nodes, args.gpus_per_node
    );
    println!(
        "{} preemptors (1, 2, 4 NVLink, 8 GPUs in turn): {} searches, {placed} bound, {failed} without a plan, {:.1} victims each",
        args.preemptors,
        times.len(),
        out["victims_per_preemptor"].as_f64().unwrap_or(0.0)
    );
    println!(
        "preemption search (candidates + victim search + plan): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(at(0.5)),
        ms(at(0.99)),
        ms(times.last().copied().unwrap_or_default())
    );
    Ok(())
}
