//! `gpuplace-bench scheduler`: the scheduling loop against the in-memory API at cluster
//! scale (default 5,000 nodes x 8 GPUs, 50,000 pending pods of an openb-like mix).
//!
//! Reports pods bound per second end to end and where the time went (the loop times each
//! phase itself), the core alone in decisions per second, and memory: the scheduler's own
//! heap (its pod cache, snapshots, queues; counted by the binary's allocator) apart from the
//! in-memory API server's objects, which in a cluster live in another process.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gpuplace_core::{Placer, Policy, TargetWorkload};
use gpuplace_model::{INVENTORY_ANNOTATION, Link, NodeInventory, PcieLevel};
use gpuplace_scheduler::snapshot::build;
use gpuplace_scheduler::{ClusterApi, RoundTimings, Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::api::ServerCosts;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use crate::heap;

#[derive(Args, Debug)]
pub struct SchedulerBenchArgs {
    #[arg(long, default_value_t = 5_000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    #[arg(long, default_value_t = 50_000)]
    pods: usize,
    #[arg(long, default_value = "fgd")]
    policy: Policy,
    /// Also time the core with its node-class index off (every decision scans every node).
    #[arg(long)]
    compare_scan: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Fraction of pods (0-1) carrying GPU requirements (topology required or preferred,
    /// model, memory); nodes then publish inventories with links (V100 hybrid cube mesh and
    /// A100 NVSwitch, alternating), and the core is also timed on the same pods without them.
    #[arg(long, default_value_t = 0.0)]
    requirements: f64,
    /// Time the core alone (no end-to-end loop), e.g. under a profiler.
    #[arg(long)]
    core_only: bool,
    /// Passes of the core-alone timing (with `--requirements`, a constrained and a stripped
    /// pass per round, which goes first alternating); the median of each is reported, and
    /// the ratio is the median of the per-round ratios.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// The in-memory API server's cost per request of the scheduler's (Bindings, Events),
    /// in ms (fractions allowed), so the loop pays for its writes as on a server.
    #[arg(long, default_value_t = 0.0)]
    write_latency_ms: f64,
    /// Requests the server serves at once (0: no limit).
    #[arg(long, default_value_t = 0)]
    server_concurrency: usize,
    /// Watch events reach the scheduler this many ms late.
    #[arg(long, default_value_t = 0)]
    watch_delay_ms: u64,
    /// Bindings the scheduler keeps in flight (its `--max-in-flight`).
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Share the cluster among this many queues (each guaranteed an equal part of the
    /// GPUs), the pods labelled round-robin; 0: no queues (the stage stands aside).
    #[arg(long, default_value_t = 0)]
    queues: usize,
    /// Create the pods at this many per second while the scheduler's production loop runs
    /// (a round on every change), instead of all pending before it starts; reports the CPU
    /// seconds per pod.
    #[arg(long)]
    stream_rate: Option<f64>,
    /// Every pod asks one whole GPU (the real-API runs' pods) instead of the openb-like mix.
    #[arg(long)]
    one_gpu: bool,
}

/// Queue `q`'s name in the benchmark.
fn queue_name(q: usize) -> String {
    format!("q{q:03}")
}

/// The inventory of a node with links: even nodes V100 32 GB in a hybrid cube mesh (halves
/// fully NVLinked, plus g <-> g + half), odd ones A100 80 GB all NVLinked (NVSwitch).
fn linked_inventory(name: &str, i: usize, gpus: u32) -> String {
    let v100 = i.is_multiple_of(2);
    let (model, memory) = if v100 {
        ("Tesla-V100-SXM2-32GB", 32_768)
    } else {
        ("NVIDIA-A100-SXM4-80GB", 81_920)
    };
    let mut inv = NodeInventory::uniform(name, 0, 0, gpus, model);
    let half = (gpus / 2).max(1);
    for g in &mut inv.gpus {
        g.memory_mib = memory;
        g.numa_node = Some(g.index / half);
    }
    for a in 0..gpus {
        for b in a + 1..gpus {
            let linked = !v100 || a / half == b / half || b == a + half;
            inv.links.push(Link {
                a,
                b,
                nvlinks: if linked { 2 } else { 0 },
                pcie: if a / half == b / half {
                    PcieLevel::SingleSwitch
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    inv.to_json()
}

pub(crate) fn node(i: usize, gpus: u32, linked: bool) -> anyhow::Result<Node> {
    let name = format!("node-{i:05}");
    let annotations = if linked {
        json!({INVENTORY_ANNOTATION: linked_inventory(&name, i, gpus)})
    } else {
        json!({})
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}, "annotations": annotations},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": gpus.to_string(),
                "gpuplace.io/gpu-milli": (gpus * 1000).to_string(), "pods": "250"}
        }
    }))?)
}

/// By pods: 13% CPU-only, 38% GPU shares, 45% one GPU, 4% 2, 4 or 8 GPUs (openb-like).
/// With `requirements` (0-1), that fraction of pods carries GPU requirements: multi-GPU
/// pods NVLink (required or preferred) or NUMA; one-GPU pods a model, an exclusion or a
/// memory minimum.
pub(crate) fn pod(i: usize, requirements: f64) -> anyhow::Result<Pod> {
    shaped(i, requirements, false)
}

/// Pod `i`: of the openb-like mix, or one whole GPU (`one_gpu`).
fn shaped(i: usize, requirements: f64, one_gpu: bool) -> anyhow::Result<Pod> {
    let r = if one_gpu { 51 } else { (i * 7919) % 100 };
    let (gpus, milli) = match r {
        0..=12 => (0, None),
        13..=50 => (1, Some([250, 500, 470, 810][i % 4])),
        51..=95 => (1, None),
        96..=97 => (2, None),
        98 => (4, None),
        _ => (8, None),
    };
    let mut annotations = serde_json::Map::new();
    // A share asks the share resource instead of whole GPUs.
    let limits = match milli {
        Some(m) => json!({"gpuplace.io/gpu-milli": m.to_string()}),
        None => json!({"nvidia.com/gpu": gpus.to_string()}),
    };
    let picked = (((i * 37) % 1000) as f64) < requirements * 1000.0;
    if picked && gpus > 0 {
        let (key, value) = match (gpus, i % 3) {
            (1, 0) => ("gpuplace.io/gpu-model", "A100"),
            (1, 1) => ("nvidia.com/nouse-gputype", "V100"),
            (1, _) => ("gpuplace.io/gpu-memory-min", "40Gi"),
            (_, 0) => ("gpuplace.io/topology", "nvlink"),
            (_, 1) => ("gpuplace.io/topology-preference", "nvlink"),
            (_, _) => ("gpuplace.io/topology", "numa"),
        };
        annotations.insert(key.into(), json!(value));
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": "bench", "annotations": annotations},
        "spec": {
            "schedulerName": "gpuplace",
            "containers": [{"name": "main", "resources": {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": limits}}]
        },
        "status": {"phase": "Pending"}
    }))?)
}

/// An in-memory API holding the benchmark's nodes and pods.
fn populated(args: &SchedulerBenchArgs) -> anyhow::Result<MemoryApi> {
    let api = MemoryApi::new();
    for i in 0..args.nodes {
        api.put_node(node(i, args.gpus_per_node, args.requirements > 0.0)?);
    }
    let gpus = args.nodes as u64 * u64::from(args.gpus_per_node);
    for q in 0..args.queues {
        let guaranteed = (gpus / args.queues as u64).to_string();
        let spec = serde_json::from_value(json!({"guaranteed": {"nvidia.com/gpu": guaranteed}}))?;
        api.put_queue(&queue_name(q), spec);
    }
    if args.stream_rate.is_none() {
        for p in bench_pods(args)? {
            api.put_pod(p);
        }
    }
    Ok(api)
}

/// The benchmark's pods, labelled with their queues.
fn bench_pods(args: &SchedulerBenchArgs) -> anyhow::Result<Vec<Pod>> {
    (0..args.pods)
        .map(|i| {
            let mut p = shaped(i, args.requirements, args.one_gpu)?;
            if args.queues > 0 {
                p.metadata.labels =
                    Some([("gpuplace.io/queue".to_string(), queue_name(i % args.queues))].into());
            }
            Ok(p)
        })
        .collect()
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

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Decisions per second of the core alone on the empty cluster, every pod in turn;
/// `strip` drops the pods' GPU requirements (the unconstrained rate of the same pods).
async fn core_alone(
    api: &MemoryApi,
    policy: Policy,
    index: bool,
    strip: bool,
) -> anyhow::Result<(f64, usize, usize)> {
    let view = api.view().await?;
    let requests: Vec<_> = view
        .pods
        .iter()
        .filter_map(|p| p.demand.as_ref().ok())
        .map(|d| {
            let mut r = d.request.clone();
            if strip {
                r.need = Default::default();
            }
            r
        })
        .collect();
    let mut state = build(&view.nodes, &[], "nvidia.com/gpu").state;
    state.set_workload(std::sync::Arc::new(TargetWorkload::from_requests(
        &requests, 0.95,
    )));
    let mut placer = Placer::new(policy, 42).with_index(index);
    let started = Instant::now();
    let mut classes = 0usize;
    let placed = requests
        .iter()
        .filter(|r| {
            let ok = placer.place(&mut state, r).is_ok();
            classes += placer.class_count();
            ok
        })
        .count();
    Ok((
        requests.len() as f64 / started.elapsed().as_secs_f64(),
        placed,
        classes / requests.len().max(1),
    ))
}

/// How the core-alone figures were taken, for the report.
fn passes(repeat: usize) -> String {
    match repeat {
        0 | 1 => String::new(),
        n => format!(" (median of {n} passes)"),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub fn run(args: SchedulerBenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(bench(args))
}

async fn bench(args: SchedulerBenchArgs) -> anyhow::Result<()> {
    if let Some(rate) = args.stream_rate {
        return streamed(&args, rate).await;
    }
    let before_objects = heap::live();
    let api = MemoryApi::new();
    for i in 0..args.nodes {
        api.put_node(node(i, args.gpus_per_node, args.requirements > 0.0)?);
    }
    let node_objects = heap::live().saturating_sub(before_objects);
    for i in 0..args.pods {
        api.put_pod(pod(i, args.requirements)?);
    }
    let objects = heap::live().saturating_sub(before_objects);

    let (mut rates, mut plain_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut core_placed, mut core_classes, mut unconstrained) = (0, 0, None);
    for round in 0..args.repeat.max(1) {
        // The stripped pass goes first in odd rounds, so neither pass is always the colder.
        let stripped_first = args.requirements > 0.0 && round % 2 == 1;
        let plain_pass = match stripped_first {
            true => Some(core_alone(&api, args.policy, true, true).await?),
            false => None,
        };
        let (rate, placed, classes) = core_alone(&api, args.policy, true, false).await?;
        (core_placed, core_classes) = (placed, classes);
        rates.push(rate);
        if args.requirements > 0.0 {
            let (plain, placed, classes) = match plain_pass {
                Some(pass) => pass,
                None => core_alone(&api, args.policy, true, true).await?,
            };
            plain_rates.push(plain);
            ratios.push(rate / plain);
            unconstrained = Some((placed, classes));
        }
    }
    let core_rate = median(&mut rates);
    let unconstrained =
        unconstrained.map(|(p, c)| (median(&mut plain_rates), p, c, median(&mut ratios)));
    let scan_rate = match args.compare_scan {
        true => Some(core_alone(&api, args.policy, false, false).await?.0),
        false => None,
    };

    if args.core_only {
        println!(
            "core alone{}: {core_rate:.0} decisions/s ({core_placed} of {} placed, {core_classes} node classes per decision){}",
            passes(args.repeat),
            args.pods,
            unconstrained
                .map(|(r, p, c, ratio)| format!("; without requirements {r:.0} decisions/s ({p} placed, {c} classes), ratio {ratio:.2}"))
                .unwrap_or_default()
        );
        return Ok(());
    }
    // The scheduler starts cold (its pod cache is built by its first view), on an API that
    // the core-alone pass above has not touched.
    drop(api);
    let delay = Duration::from_millis(args.watch_delay_ms);
    let fresh = populated(&args)?.with_costs(ServerCosts {
        latency: Duration::from_secs_f64(args.write_latency_ms.max(0.0) / 1000.0),
        max_in_flight: args.server_concurrency,
        watch_delay: (delay, delay),
        ..Default::default()
    });
    let baseline = heap::live();
    heap::reset_peak();
    let config = SchedulerConfig {
        policy: args.policy,
        max_in_flight: args.in_flight.max(1),
        ..SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(fresh.clone(), config);
    let started = Instant::now();
    let (mut bound, mut rounds) = (0, 0);
    let mut timings = RoundTimings::default();
    loop {
        let report = scheduler.round(Instant::now()).await?;
        rounds += 1;
        bound += report.bound;
        timings.add(&report.timings);
        if report.bound == 0 && report.assumed == 0 && !report.idle {
            break;
        }
        if report.idle {
            // Waiting for the watch to show the writes.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let total = started.elapsed();
    let scheduler_peak = heap::peak().saturating_sub(baseline);
    let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64();
    let rate = bound as f64 / total.as_secs_f64();
    if args.json {
        println!(
            "{}",
            json!({
                "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods,
                "policy": args.policy.to_string(), "queues": args.queues,
                "fake_server": {"ms_per_request": args.write_latency_ms, "concurrency": args.server_concurrency, "watch_delay_ms": args.watch_delay_ms, "in_flight": args.in_flight},
                "end_to_end": {"bound": bound, "seconds": total.as_secs_f64(), "pods_per_s": rate, "rounds": rounds,
                    "seconds_by_phase": {"view": timings.view.as_secs_f64(), "snapshot": timings.snapshot.as_secs_f64(),
                        "filter": timings.filter.as_secs_f64(), "core": timings.core.as_secs_f64(),
                        "api": timings.api.as_secs_f64(), "gangs": timings.gangs.as_secs_f64()}},
                "core_alone": {"decisions_per_s": core_rate, "placed": core_placed, "scan_decisions_per_s": scan_rate,
                    "requirements_fraction": args.requirements,
                    "classes_per_decision": core_classes,
                    "passes": args.repeat.max(1),
                    "without_requirements": unconstrained.map(|(r, p, c, ratio)| json!({"decisions_per_s": r, "placed": p, "classes_per_decision": c, "ratio": ratio}))},
                "memory_mib": {"scheduler_peak_heap": mib(scheduler_peak), "api_objects_heap": mib(objects), "api_node_objects_heap": mib(node_objects),
                    "process_peak_rss": peak_rss_mib()},
            })
        );
        return Ok(());
    }
    println!(
        "{} nodes x {} GPUs, {} pending pods, policy {}, {} queues; in-memory API (in process, not a server): {} ms per request, {} at once, watch {} ms late; {} Bindings in flight",
        args.nodes,
        args.gpus_per_node,
        args.pods,
        args.policy,
        args.queues,
        args.write_latency_ms,
        if args.server_concurrency == 0 {
            "any".to_string()
        } else {
            args.server_concurrency.to_string()
        },
        args.watch_delay_ms,
        args.in_flight
    );
    println!(
        "end to end: {bound} pods bound in {:.2} s = {rate:.0} pods/s ({rounds} rounds)",
        total.as_secs_f64()
    );
    println!(
        "  time by phase: view {:.2} s ({:.0}%), snapshot+queue {:.2} s ({:.0}%), filters {:.2} s ({:.0}%), core {:.2} s ({:.0}%), API writes {:.2} s ({:.0}%), gangs {:.2} s",
        timings.view.as_secs_f64(),
        share(timings.view),
        timings.snapshot.as_secs_f64(),
        share(timings.snapshot),
        timings.filter.as_secs_f64(),
        share(timings.filter),
        timings.core.as_secs_f64(),
        share(timings.core),
        timings.api.as_secs_f64(),
        share(timings.api),
        timings.gangs.as_secs_f64(),
    );
    println!(
        "core alone{}: {core_rate:.0} decisions/s ({core_placed} of {} placed){}",
        passes(args.repeat),
        args.pods,
        scan_rate
            .map(|r| format!("; without the node-class index {r:.0} decisions/s"))
            .unwrap_or_default()
    );
    if let Some((rate, placed, classes, ratio)) = unconstrained {
        println!(
            "  {:.0}% of pods with GPU requirements: {core_rate:.0} decisions/s ({core_classes} node classes on average); the same pods without them: {rate:.0} decisions/s ({placed} placed, {classes} classes); ratio {ratio:.2}",
            args.requirements * 100.0,
        );
    }
    println!(
        "memory: scheduler peak heap {:.0} MiB (pod cache, snapshots, queue, events it wrote); in-memory API objects {:.0} MiB, of which Nodes {:.0} MiB (the API server's; a scheduler in a cluster caches the Nodes too); process peak RSS {:.0} MiB",
        mib(scheduler_peak),
        mib(objects),
        mib(node_objects),
        peak_rss_mib()
    );
    Ok(())
}

/// `--stream-rate`: the production loop while the pods come (no core-alone pass).
async fn streamed(args: &SchedulerBenchArgs, rate: f64) -> anyhow::Result<()> {
    let delay = Duration::from_millis(args.watch_delay_ms);
    let api = populated(args)?.with_costs(ServerCosts {
        latency: Duration::from_secs_f64(args.write_latency_ms.max(0.0) / 1000.0),
        max_in_flight: args.server_concurrency,
        watch_delay: (delay, delay),
        ..Default::default()
    });
    let config = SchedulerConfig {
        policy: args.policy,
        max_in_flight: args.in_flight.max(1),
        ..SchedulerConfig::default()
    };
    let s = crate::stream::run(api, config, bench_pods(args)?, rate).await?;
    let per_pod_ms = 1000.0 * s.cpu.as_secs_f64() / s.created.max(1) as f64;
    let t = &s.timings;
    if args.json {
        println!(
            "{}",
            json!({
                "nodes": args.nodes, "pods": args.pods, "queues": args.queues, "one_gpu": args.one_gpu,
                "stream_rate": rate, "created": s.created, "bound": s.bound,
                "creating_s": s.creating.as_secs_f64(), "bound_after_s": s.bound_after.as_secs_f64(),
                "rounds": s.rounds, "busy_rounds": s.busy_rounds,
                "cpu_s": s.cpu.as_secs_f64(), "cpu_ms_per_pod": per_pod_ms,
                "seconds_by_phase": {"view": t.view.as_secs_f64(), "snapshot": t.snapshot.as_secs_f64(),
                    "filter": t.filter.as_secs_f64(), "core": t.core.as_secs_f64(),
                    "api": t.api.as_secs_f64(), "gangs": t.gangs.as_secs_f64()},
            })
        );
        return Ok(());
    }
    println!(
        "{} nodes x {} GPUs, {} pods created at {rate} per second ({}), {} queues; the production loop; in-memory API: {} ms per request, watch {} ms late; {} Bindings in flight",
        args.nodes,
        args.gpus_per_node,
        args.pods,
        if args.one_gpu {
            "one GPU each"
        } else {
            "openb-like mix"
        },
        args.queues,
        args.write_latency_ms,
        args.watch_delay_ms,
        args.in_flight
    );
    println!(
        "streamed: {} created in {:.1} s, {} bound, the last {:.2} s after the last was created; {} rounds ({} looked at the cluster)",
        s.created,
        s.creating.as_secs_f64(),
        s.bound,
        s.bound_after.as_secs_f64(),
        s.rounds,
        s.busy_rounds
    );
    println!(
        "  CPU {:.2} s = {per_pod_ms:.3} ms a pod (the scheduler and the in-memory API together); in rounds: view {:.2} s, snapshot+queue {:.2} s, filters {:.2} s, core {:.2} s, API writes {:.2} s, gangs {:.2} s",
        s.cpu.as_secs_f64(),
        t.view.as_secs_f64(),
        t.snapshot.as_secs_f64(),
        t.filter.as_secs_f64(),
        t.core.as_secs_f64(),
        t.api.as_secs_f64(),
        t.gangs.as_secs_f64(),
    );
    Ok(())
}
