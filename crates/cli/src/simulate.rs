//! `gpuplace simulate`: replay a trace against policies and report.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use gpuplace_core::Policy;
use gpuplace_model::GpuTopology;
use gpuplace_sim::asks::{self, TopologyAsk};
use gpuplace_sim::report::{self, ClusterSize, Summary};
use gpuplace_sim::{Prepared, RunResult, builtin_workload, load_workload, run_all};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Node list CSV (openb format: sn,cpu_milli,memory_mib,gpu,model). Needs --pods.
    #[arg(long, requires = "pods")]
    pub(crate) nodes: Option<PathBuf>,
    /// Pod list CSV (openb format: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]).
    #[arg(long, requires = "nodes")]
    pub(crate) pods: Option<PathBuf>,
    /// Comma-separated policies; `paper` = the FGD paper's six, `ablation` = gpuplace with each of its ideas off in turn and its finer score on (and FGD), `all` = every policy.
    #[arg(
        long,
        default_value = "random,dotprod,gpu-clustering,gpu-packing,best-fit,fgd,gpuplace"
    )]
    pub(crate) policies: String,
    /// Number of seeds (runs per policy).
    #[arg(long, default_value_t = 10)]
    pub(crate) seeds: u64,
    /// First seed; seeds are consecutive from here.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed_start: u64,
    /// Inflate the pod list until its GPU request reaches this multiple of capacity.
    #[arg(long, default_value_t = 1.3)]
    pub(crate) inflate: f64,
    /// Write summary.json, curves.csv, plots (SVG, PNG) and index.html here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print one JSON object on stdout and nothing else there.
    #[arg(long)]
    pub(crate) json: bool,
    /// Built-in workload only: shrink the openb-like cluster to 1/SCALE of its size.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) scale: u32,
    /// Replay on this many nodes drawn at random from the node list (small clusters of
    /// the trace's own node types); `--sample-seed` picks the sample.
    #[arg(long)]
    pub(crate) sample_nodes: Option<usize>,
    /// Which random sample `--sample-nodes` draws.
    #[arg(long, default_value_t = 0, requires = "sample_nodes")]
    pub(crate) sample_seed: u64,
    /// Fraction (0-1) of multi-GPU pods that require `--topology` (nodes without links get
    /// an assumed layout by model: see docs/simulate.md).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) require_topology: f64,
    /// Fraction (0-1) of the other multi-GPU pods that prefer `--topology`.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) prefer_topology: f64,
    /// The topology asked by `--require-topology` and `--prefer-topology`.
    #[arg(long, default_value = "nvlink")]
    pub(crate) topology: GpuTopology,
    /// A pod that fits nowhere evicts pods of lower priority (the scheduler's victim
    /// search); priorities from the trace's `qos` column (LS 2, Burstable 1, BE 0). The
    /// static replay preempts only with it; the timeline always does, as the scheduler
    /// does, unless `--no-preempt`.
    #[arg(long)]
    pub(crate) preempt: bool,
    /// With --timeline: never preempt (the scheduler always may).
    #[arg(long, conflicts_with = "preempt")]
    pub(crate) no_preempt: bool,
    /// Where pods preempt: give this fraction (0-1) of pods, chosen by name, priority 3
    /// (for traces without a `qos` column).
    #[arg(long, default_value_t = 0.0, conflicts_with = "no_preempt")]
    pub(crate) high_priority: f64,
    /// Refuse a pod list holding pods that fit no node even in the empty cluster. Without
    /// it they are named on stderr and replayed: they count as unallocated, as they were
    /// in the trace (openb's gpuspec10 list has two, both Failed there).
    #[arg(long)]
    pub(crate) refuse_unplaceable: bool,
    /// The pods' GPUs claimed through DRA (Kubernetes 1.34+), as `replay --dra` claims
    /// them: each shape's ResourceClaimTemplate is read by the scheduler's claim code and
    /// must ask what the pod asked (a shape it cannot carry is refused by name). gpuplace's
    /// policies allocate claims as they place device-plugin pods; `kube-dra` is
    /// kube-scheduler's own allocator (the first devices that match), and `kube-default`
    /// (the device plugin's devices) is refused.
    #[arg(long)]
    pub(crate) dra: bool,
    #[command(flatten)]
    pub(crate) timeline: crate::simulate_timeline::TimelineArgs,
}

/// Names the pods that fit no node of the empty cluster (the first five, then a count) on
/// stderr, or refuses the list with them when `refuse`.
fn say_unplaceable(workload: &gpuplace_sim::Workload, refuse: bool) -> anyhow::Result<()> {
    let found = workload
        .unplaceable()
        .context("cannot replay this workload")?;
    if found.is_empty() {
        return Ok(());
    }
    let mut lines: Vec<String> = found.iter().take(5).map(|u| u.to_string()).collect();
    if found.len() > 5 {
        lines.push(format!("and {} more", found.len() - 5));
    }
    let text = format!(
        "{} of {} pods of {} fit no node even in the empty cluster:\n  {}",
        found.len(),
        workload.pods.len(),
        workload.name,
        lines.join("\n  ")
    );
    if refuse {
        bail!("{text}\n(--refuse-unplaceable is set)");
    }
    eprintln!(
        "warning: {text}\nthey are replayed and count as unallocated (--refuse-unplaceable refuses such a list)"
    );
    Ok(())
}

/// With `--dra`: the workload's GPUs read as claims (refused where a claim cannot ask
/// what a pod asks), and the policies checked against the mode: `kube-dra` allocates
/// claims, `kube-default` device-plugin GPUs. What was read, for the report.
fn claims_of(
    workload: &gpuplace_sim::Workload,
    policies: &[Policy],
    dra: bool,
) -> anyhow::Result<Option<String>> {
    if !dra {
        if policies.contains(&Policy::KubeDra) {
            bail!("kube-dra is kube-scheduler allocating DRA claims: add --dra");
        }
        return Ok(None);
    }
    if policies.contains(&Policy::KubeDefault) {
        bail!(
            "kube-default takes the device plugin's GPUs; with --dra kube-scheduler allocates the claims itself: ask kube-dra"
        );
    }
    let read = gpuplace_replay::claimed::read_as_claims(
        workload.pods.iter().map(|p| &p.request),
        &workload.nodes,
    )
    .context("--dra: cannot claim this workload's GPUs")?;
    Ok(Some(format!(
        "DRA: the GPUs of the list's {} GPU pods claimed from {} ResourceClaimTemplates (one per shape), each read by the scheduler's claim code as asking what its pods ask",
        read.pods, read.shapes
    )))
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let policies = Policy::parse_list(&args.policies)?;
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    if !(args.inflate.is_finite() && (0.01..=10.0).contains(&args.inflate)) {
        bail!(
            "--inflate must be between 0.01 and 10, got {}",
            args.inflate
        );
    }
    let mut workload = match (&args.nodes, &args.pods) {
        (Some(nodes), Some(pods)) => load_workload(nodes, pods)?,
        _ => builtin_workload(args.scale),
    };
    if let Some(count) = args.sample_nodes {
        workload.sample_nodes(count, args.sample_seed)?;
    }
    let topology_asks = if args.require_topology > 0.0 || args.prefer_topology > 0.0 {
        Some(asks::apply(
            &mut workload,
            TopologyAsk {
                topology: args.topology,
                required: args.require_topology,
                preferred: args.prefer_topology,
            },
        )?)
    } else {
        None
    };
    say_unplaceable(&workload, args.refuse_unplaceable)?;
    let claims = claims_of(&workload, &policies, args.dra)?;
    if args.no_preempt && !args.timeline.timeline {
        anyhow::bail!(
            "--no-preempt is for --timeline: the static replay preempts only with --preempt"
        );
    }
    // The timeline preempts as the scheduler does unless told not to.
    let preempt = args.preempt || (args.timeline.timeline && !args.no_preempt);
    if args.high_priority > 0.0 && !preempt {
        anyhow::bail!("--high-priority raises pods that preempt: add --preempt");
    }
    let preemption = if preempt {
        let raised = gpuplace_sim::preemption::raise_priority(&mut workload, args.high_priority)
            .map_err(anyhow::Error::msg)?;
        let mut levels: Vec<i32> = workload.pods.iter().map(|p| p.priority).collect();
        levels.sort_unstable();
        levels.dedup();
        Some(format!(
            "on; priorities from qos{}; levels {levels:?}",
            if raised > 0 {
                format!(" and {raised} pods raised to 3 by --high-priority")
            } else {
                String::new()
            }
        ))
    } else {
        None
    };
    let seeds: Vec<u64> = (0..args.seeds).map(|i| args.seed_start + i).collect();
    if args.timeline.timeline {
        let run = crate::simulate_timeline::Run {
            preempt,
            claims,
            out: args.out.as_deref(),
            json: args.json,
        };
        return crate::simulate_timeline::run(&args.timeline, run, workload, &policies, seeds);
    }
    let prepared = Prepared::new(workload)
        .context("cannot replay this workload")?
        .with_preemption(preempt);
    let jobs = (policies.len() * seeds.len()) as u64;
    let bar = crate::progress::bar(jobs);
    let started = Instant::now();
    let done = |r: &RunResult| {
        bar.set_message(format!("{} seed {}", r.policy, r.seed));
        bar.inc(1);
    };
    let results = run_all(&prepared, &policies, &seeds, args.inflate, &done)?;
    bar.finish_and_clear();
    let workload = prepared.workload();
    let summary = Summary {
        workload: workload.name.clone(),
        cluster: ClusterSize {
            nodes: workload.nodes.len(),
            gpus: prepared.gpu_count(),
        },
        pods: workload.pods.len(),
        inflate: args.inflate,
        seeds,
        policies: report::summarize(&policies, &results),
        wall_s: started.elapsed().as_secs_f64(),
        topology_asks,
        preemption,
        claims,
    };
    if let Some(dir) = &args.out {
        let files = gpuplace_sim::output::write_report(&summary, dir)?;
        if !args.json {
            println!(
                "wrote {} files to {}: {}",
                files.len(),
                dir.display(),
                files.join(", ")
            );
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", report::table(&summary));
    }
    Ok(())
}
