//! `gpuplace replay`'s report: the timeline's own summary (the same JSON, table and plots
//! as `simulate --timeline`) with what the live run cost beside it.

use gpuplace_core::Policy;
use gpuplace_model::NodeInventory;
use gpuplace_sim::report::ClusterSize;
use gpuplace_sim::timeline::options::Costs;
use gpuplace_sim::timeline::pods_csv;
use gpuplace_sim::timeline::summary::{self, TimelineSummary};
use gpuplace_sim::timeline::{Timeline, TimelineRun, report};
use serde::Serialize;

/// What the live run cost, beside the timeline's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Live {
    pub scheduler_name: String,
    pub speed: f64,
    pub fake_nodes: bool,
    /// Requests the replay made (creations, deletions; the scheduler's are its own).
    pub requests: u64,
    /// The scheduler's CPU seconds over the run (`--scheduler-pid`).
    pub scheduler_cpu_s: Option<f64>,
    /// How late pods were created against their arrival, real ms: p50, p99, most. Lags
    /// near a second or more mean the server (or this machine) did not keep up with
    /// `--speed`.
    pub creation_lag_ms: [f64; 3],
    /// How much longer than its run a finished pod held its node, real ms: p50, p99, most.
    pub deletion_lag_ms: [f64; 3],
    /// How long the warm start took to create and place before the clock started (s), and
    /// how many of its pods were bound by then, of how many.
    pub warm_start_s: f64,
    pub warm_start_bound: [usize; 2],
    pub wall_s: f64,
    /// What the run still had at its end (nodes, leases, queues, pods), deleted then.
    pub objects_deleted_at_end: usize,
}

/// The report: the live figures and the timeline's summary.
#[derive(Clone, Debug, Serialize)]
pub struct ReplaySummary {
    pub live: Live,
    #[serde(flatten)]
    pub timeline: TimelineSummary,
}

pub fn summary(
    timeline: &Timeline,
    seed: u64,
    policy: Policy,
    run: &TimelineRun,
    live: Live,
) -> ReplaySummary {
    let workload = timeline.workload();
    let options = timeline.options();
    let timed = workload
        .pods
        .iter()
        .filter(|p| p.duration_s.is_some())
        .count();
    let runs = std::slice::from_ref(run);
    ReplaySummary {
        timeline: TimelineSummary {
            workload: workload.name.clone(),
            cluster: ClusterSize {
                nodes: workload.nodes.len(),
                gpus: timeline.gpu_count(),
            },
            pods: workload.pods.len(),
            load: options.load,
            arrivals: options.arrivals,
            warmup: options.warmup,
            durations: crate::simulate_timeline::describe(
                &options.durations,
                timed,
                workload.pods.len(),
            ),
            warm_start: options.warm_start,
            preempt: false,
            defrag: "the scheduler's own".into(),
            costs: Costs::FREE.into(),
            checkpointed: false,
            patience: "off".into(),
            whole_gpus: options.whole_gpus,
            claims: None,
            seeds: vec![seed],
            arrivals_per_s: runs[0].arrivals_per_s,
            simulated_h: runs[0].simulated_s / 3_600.0,
            window_h: runs[0].window_s / 3_600.0,
            policies: summary::summarize(&[policy], runs),
            wall_s: live.wall_s,
        },
        live,
    }
}

/// Writes the plots and every pod's life (`--out`) and prints the JSON or the table.
pub fn emit(
    summary: &ReplaySummary,
    run: &TimelineRun,
    nodes: &[NodeInventory],
    out: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<()> {
    if let Some(dir) = out {
        let mut files = report::write_report(&summary.timeline, dir)?;
        files.extend(pods_csv::write_pods(std::slice::from_ref(run), nodes, dir)?);
        std::fs::write(
            dir.join("replay.json"),
            serde_json::to_string_pretty(summary)?,
        )?;
        if !json {
            println!(
                "wrote {} files to {}: {}, replay.json",
                files.len() + 1,
                dir.display(),
                files.join(", ")
            );
        }
    }
    if json {
        println!("{}", serde_json::to_string(summary)?);
        return Ok(());
    }
    let l = &summary.live;
    println!(
        "live replay: scheduler {}, speed {}x, {} nodes, {:.1} s wall, {} requests by the replay{}",
        l.scheduler_name,
        l.speed,
        if l.fake_nodes {
            "fake"
        } else {
            "the cluster's"
        },
        l.wall_s,
        l.requests,
        l.scheduler_cpu_s
            .map(|s| format!(", scheduler {s:.1} CPU s"))
            .unwrap_or_default()
    );
    println!(
        "warm start placed before the clock started: {} of {} pods bound in {:.1} s",
        l.warm_start_bound[0], l.warm_start_bound[1], l.warm_start_s
    );
    println!(
        "pods created behind their arrival (real ms): p50 {:.0}, p99 {:.0}, most {:.0}",
        l.creation_lag_ms[0], l.creation_lag_ms[1], l.creation_lag_ms[2]
    );
    println!(
        "pods gone after their run ended (real ms): p50 {:.0}, p99 {:.0}, most {:.0}",
        l.deletion_lag_ms[0], l.deletion_lag_ms[1], l.deletion_lag_ms[2]
    );
    print!("{}", summary::table(&summary.timeline));
    Ok(())
}
