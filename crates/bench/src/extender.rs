//! `gpuplace-bench extender`: the extender's
//! filter + prioritize time per pod at scale, as kube-scheduler calls them with
//! `nodeCacheCapable: true` (NodeNames), in process through the HTTP router (JSON decoded
//! and encoded, no socket) against the in-memory API. Each pod is then bound to the best
//! node, so the state fills up as in a real burst.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use clap::Args;
use gpuplace_scheduler::api::ClusterApi;
use gpuplace_scheduler::extender::http::{ExtenderMetrics, router};
use gpuplace_scheduler::extender::{Extender, ExtenderConfig, FilterMode};
use gpuplace_testkit::MemoryApi;
use serde_json::{Value, json};
use tower::ServiceExt;

#[derive(Args, Debug)]
pub struct ExtenderBenchArgs {
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Pods bound before timing starts (one GPU each, spread over the nodes).
    #[arg(long, default_value_t = 20_000)]
    prefill: usize,
    /// Pods timed (filter, prioritize, then bound to the best node).
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    #[arg(long, default_value = "all")]
    filter_mode: FilterMode,
    /// Fraction of pods with GPU requirements (model, memory, NVLink, NUMA).
    #[arg(long, default_value_t = 0.0)]
    requirements: f64,
    #[arg(long)]
    json: bool,
}

/// One call: the time until the whole answer is in (kube-scheduler's wait), then the
/// answer decoded (not timed: that is kube-scheduler's work).
async fn call(app: &axum::Router, verb: &str, body: Vec<u8>) -> anyhow::Result<(Duration, Value)> {
    let started = Instant::now();
    let response = app
        .clone()
        .oneshot(Request::post(format!("/{verb}")).body(Body::from(body))?)
        .await?;
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    let took = started.elapsed();
    Ok((took, serde_json::from_slice(&bytes)?))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run(args: ExtenderBenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: ExtenderBenchArgs) -> anyhow::Result<()> {
    let api = MemoryApi::new();
    let linked = args.requirements > 0.0;
    let mut names = Vec::with_capacity(args.nodes);
    for i in 0..args.nodes {
        let node = crate::scheduler::node(i, args.gpus_per_node, linked)?;
        names.push(node.metadata.name.clone().unwrap_or_default());
        api.put_node(node);
    }
    for i in 0..args.prefill {
        let mut pod = crate::scheduler::pod(1_000_000 + i, 0.0)?;
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.node_name = Some(names[i % names.len().max(1)].clone());
        spec.containers[0].resources = serde_json::from_value(
            json!({"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "1"}}),
        )?;
        pod.metadata.uid = Some(format!("prefill-{i}"));
        api.put_pod(pod);
    }
    let config = ExtenderConfig {
        filter_mode: args.filter_mode,
        ..Default::default()
    };
    let app = router(
        Arc::new(Extender::new(api.clone(), config)),
        ExtenderMetrics::default(),
        usize::MAX,
    );
    let (mut filter_t, mut prioritize_t, mut both_t, mut bind_t) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut unschedulable = 0;
    let started = Instant::now();
    for i in 0..args.pods {
        let mut pod = crate::scheduler::pod(i, args.requirements)?;
        pod.metadata.uid = Some(format!("uid-{i}"));
        api.put_pod(pod.clone());
        // kube-scheduler sends the pod as its informer has it, resourceVersion included.
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pod = api.pod("bench", &name).unwrap_or(pod);
        // The extender's watch shows the pod before kube-scheduler asks about it (both
        // informers see it at once; kube-scheduler queues it first): the in-memory API
        // converts it now, as KubeApi's reflector does on the event, not on the call.
        let _ = api.generation();
        let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": names}))?;
        let (filter_took, filtered) = call(&app, "filter", body).await?;
        let passing: Vec<String> =
            serde_json::from_value(filtered["NodeNames"].clone()).unwrap_or_default();
        if passing.is_empty() {
            unschedulable += 1;
            filter_t.push(filter_took);
            continue;
        }
        let body = serde_json::to_vec(&json!({"Pod": pod, "NodeNames": passing}))?;
        let (prioritize_took, scores) = call(&app, "prioritize", body).await?;
        filter_t.push(filter_took);
        prioritize_t.push(prioritize_took);
        both_t.push(filter_took + prioritize_took);
        let best = scores
            .as_array()
            .and_then(|list| list.iter().max_by_key(|h| h["Score"].as_i64().unwrap_or(0)))
            .and_then(|h| h["Host"].as_str())
            .unwrap_or_default()
            .to_string();
        let bind = json!({"PodName": pod.metadata.name, "PodNamespace": "bench",
            "PodUID": format!("uid-{i}"), "Node": best});
        let (bind_took, result) = call(&app, "bind", serde_json::to_vec(&bind)?).await?;
        bind_t.push(bind_took);
        if result["Error"].as_str().is_some_and(|e| !e.is_empty()) {
            anyhow::bail!("bind failed: {}", result["Error"]);
        }
    }
    let wall = started.elapsed();
    for v in [&mut filter_t, &mut prioritize_t, &mut both_t, &mut bind_t] {
        v.sort();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let row = |v: &[Duration]| {
        json!({"p50_ms": ms(percentile(v, 0.5)), "p99_ms": ms(percentile(v, 0.99)),
            "max_ms": ms(v.last().copied().unwrap_or_default())})
    };
    let report = json!({
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "prefill": args.prefill,
        "pods": args.pods, "unschedulable": unschedulable, "filter_mode": format!("{:?}", args.filter_mode),
        "filter": row(&filter_t), "prioritize": row(&prioritize_t),
        "filter_plus_prioritize": row(&both_t), "bind": row(&bind_t),
        "wall_s": wall.as_secs_f64(),
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{} nodes x {} GPUs ({} pods bound first), {} pods, filter mode {:?}; in process through the HTTP router, in-memory API (not a server)",
        args.nodes, args.gpus_per_node, args.prefill, args.pods, args.filter_mode
    );
    for (label, v) in [
        ("filter", &filter_t),
        ("prioritize", &prioritize_t),
        ("filter + prioritize", &both_t),
        ("bind", &bind_t),
    ] {
        println!(
            "  {label:<20} p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(v.last().copied().unwrap_or_default())
        );
    }
    println!(
        "  unschedulable {unschedulable}, wall {:.1} s",
        wall.as_secs_f64()
    );
    Ok(())
}
