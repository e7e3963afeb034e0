//! `gpuplace bench`: speed of the placement engine, measured, not asserted.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_sim::replay::arrival_order;
use gpuplace_sim::{Workload, builtin_workload, load_workload};
use serde_json::json;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Replay one seed per policy and time every placement decision.
    Placement(PlacementArgs),
    /// In `gpuplace-bench`, which links the in-memory API server.
    #[command(hide = true)]
    Scheduler(ElsewhereArgs),
    /// In `gpuplace-bench`.
    #[command(hide = true)]
    Extender(ElsewhereArgs),
    /// In `gpuplace-bench`.
    #[command(hide = true)]
    Preemption(ElsewhereArgs),
}

/// Whatever follows a bench that lives in `gpuplace-bench`, passed on in the message.
#[derive(Args, Debug)]
pub struct ElsewhereArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

#[derive(Args, Debug)]
pub struct PlacementArgs {
    /// Node list CSV (openb format); the built-in workload when absent.
    #[arg(long, requires = "pods")]
    nodes: Option<PathBuf>,
    /// Pod list CSV (openb format).
    #[arg(long, requires = "nodes")]
    pods: Option<PathBuf>,
    /// Policies to time.
    #[arg(long, default_value = "all")]
    policies: String,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also time FGD without its node-class index, and without index and score cache
    /// (what grouping identical nodes and incremental state save).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    compare_uncached: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    let (name, args) = match command {
        BenchCommand::Placement(args) => return placement(args),
        BenchCommand::Scheduler(args) => ("scheduler", args),
        BenchCommand::Extender(args) => ("extender", args),
        BenchCommand::Preemption(args) => ("preemption", args),
    };
    Err(elsewhere(name, &args.rest))
}

/// The benches that run against the in-memory API server link test fakes and a counting
/// allocator, which the release binary leaves out: say where they are instead of clap's
/// "unrecognized subcommand".
fn elsewhere(name: &str, rest: &[String]) -> anyhow::Error {
    let mut command = format!("cargo run --release -p gpuplace-bench -- {name}");
    for arg in rest {
        command.push(' ');
        command.push_str(arg);
    }
    anyhow::anyhow!(
        "`bench {name}` runs against the in-memory API server (test fakes), which the release \
         binary leaves out; it is the separate binary gpuplace-bench: {command}"
    )
}

struct Timing {
    label: String,
    decisions: usize,
    total: Duration,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn time_policy(
    workload: &Workload,
    base: &ClusterState,
    placer: Placer,
    seed: u64,
    label: String,
) -> Timing {
    let mut state = base.clone();
    let mut placer = placer;
    let order = arrival_order(&workload.pods, state.gpu_capacity_milli(), seed, 1.3);
    let mut samples = Vec::with_capacity(order.len());
    let started = Instant::now();
    for &i in &order {
        let t = Instant::now();
        let _ = placer.place(&mut state, &workload.pods[i].request);
        samples.push(t.elapsed());
    }
    let total = started.elapsed();
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Timing {
        label,
        decisions: samples.len(),
        total,
        p50: at(0.5),
        p99: at(0.99),
        max: samples.last().copied().unwrap_or_default(),
    }
}

fn placement(args: PlacementArgs) -> anyhow::Result<()> {
    let policies = Policy::parse_list(&args.policies)?;
    let workload = match (&args.nodes, &args.pods) {
        (Some(nodes), Some(pods)) => load_workload(nodes, pods)?,
        _ => builtin_workload(1),
    };
    let mut base = ClusterState::new(workload.nodes.clone()).context("invalid cluster")?;
    base.set_workload(std::sync::Arc::new(TargetWorkload::from_requests(
        workload.pods.iter().map(|p| &p.request),
        0.95,
    )));
    let mut timings = Vec::new();
    for &policy in &policies {
        let placer = Placer::new(policy, args.seed);
        timings.push(time_policy(
            &workload,
            &base,
            placer,
            args.seed,
            policy.to_string(),
        ));
        if policy == Policy::Fgd && args.compare_uncached {
            let baselines = [
                (
                    Placer::new(policy, args.seed).with_index(false),
                    "fgd (no index)",
                ),
                (
                    Placer::new(policy, args.seed)
                        .with_index(false)
                        .with_cache(false),
                    "fgd (no index/cache)",
                ),
            ];
            for (placer, label) in baselines {
                timings.push(time_policy(
                    &workload,
                    &base,
                    placer,
                    args.seed,
                    label.into(),
                ));
            }
        }
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if args.json {
        let rows: Vec<_> = timings
            .iter()
            .map(|t| {
                json!({
                    "policy": t.label, "decisions": t.decisions, "total_s": t.total.as_secs_f64(),
                    "decisions_per_s": t.decisions as f64 / t.total.as_secs_f64(),
                    "p50_us": us(t.p50), "p99_us": us(t.p99), "max_us": us(t.max),
                })
            })
            .collect();
        let out =
            json!({"workload": workload.name, "nodes": workload.nodes.len(), "results": rows});
        println!("{out}");
        return Ok(());
    }
    println!(
        "workload {}: {} nodes; one seed ({}), one thread, every decision timed",
        workload.name,
        workload.nodes.len(),
        args.seed
    );
    println!(
        "{:<20} {:>9} {:>9} {:>13} {:>9} {:>9} {:>9}",
        "policy", "decisions", "total(s)", "decisions/s", "p50(µs)", "p99(µs)", "max(µs)"
    );
    for t in &timings {
        println!(
            "{:<20} {:>9} {:>9.3} {:>13.0} {:>9.1} {:>9.1} {:>9.1}",
            t.label,
            t.decisions,
            t.total.as_secs_f64(),
            t.decisions as f64 / t.total.as_secs_f64(),
            us(t.p50),
            us(t.p99),
            us(t.max)
        );
    }
    Ok(())
}
