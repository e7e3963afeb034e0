//! Timeline runs summarised over seeds: `--json`, the terminal table, and the report on
//! disk (summary.json, series.csv, plots, index.html).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuplace_core::Policy;
use serde::Serialize;

use super::metrics::{Class, Series, Waits};
use super::run::TimelineRun;
use crate::report::{ClusterSize, Stat, duration_text};

/// Waits of one class, each figure the mean over seeds (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WaitMeans {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    /// Pods of the class per seed (mean).
    pub count: f64,
    /// Of those, not started by the end (mean).
    pub never_started: f64,
    /// Of those, deleted by their user while they waited (mean; `--patience`).
    pub abandoned: f64,
    /// The same as a percentage of the class's pods.
    pub abandoned_pct: f64,
}

/// One policy across seeds.
#[derive(Clone, Debug, Serialize)]
pub struct TimelinePolicy {
    pub policy: String,
    pub allocation_pct: Stat,
    pub fragmentation_pct: Stat,
    pub pending_gpus: Stat,
    /// Waits per class key (`share`, `1`, `2-4`, `8`, `nvlink`); a class no pod is in is
    /// absent.
    pub wait_s: BTreeMap<String, WaitMeans>,
    pub completed_gpu_hours: Stat,
    pub busy_gpu_hours: Stat,
    /// Work done in the window and not thrown away, % of capacity (beside
    /// `allocation_pct`, which counts GPUs held however they are used).
    pub goodput_pct: Stat,
    /// Work thrown away by evictions and moves, GPU-hours over the whole run.
    pub gpu_hours_lost: Stat,
    pub moves_per_hour: Stat,
    pub never_started: Stat,
    /// Pods whose user gave up waiting (`--patience`).
    pub abandoned: Stat,
    pub preempted_pods: Stat,
    pub work_lost_pct: Stat,
    pub moved_pods: Stat,
    pub moved_gpus_per_hour: Stat,
    pub move_lost_pct: Stat,
    /// Scheduling attempts that left a pod waiting, over the whole run (warm start
    /// included), to set beside a live scheduler's own count (kube-scheduler's
    /// `scheduler_schedule_attempts_total{result="unschedulable"}`); absent in a live report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_attempts: Option<Stat>,
    /// Means over seeds of the series over time.
    pub series: Series,
    /// Per class key, the mean wait (s) at each percent 0..=100.
    pub cdf: BTreeMap<String, Vec<f64>>,
    /// One core's seconds for all seeds.
    pub elapsed_s: f64,
    /// Tenants' fairness and guarantees (`--tenants`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<super::tenant_summary::TenantSummary>,
    /// Per class key, the expected start's median absolute error (s, mean and sd over
    /// seeds) and the pods estimated and unknown over all seeds (`--declared-share`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub start_estimates: BTreeMap<String, EstimateSummary>,
}

/// One class's expected starts across seeds.
#[derive(Clone, Debug, Serialize)]
pub struct EstimateSummary {
    pub median_abs_error_s: Stat,
    /// Actual start less the estimate, median (positive: later than told).
    pub median_signed_error_s: Stat,
    /// The baselines' in the same runs: "starts now", and "when the longest running pod
    /// on the best node ends".
    pub now_median_abs_error_s: Stat,
    pub longest_median_abs_error_s: Stat,
    /// The projection with nothing ahead in the line.
    pub alone_median_abs_error_s: Stat,
    /// Share of starts within the stated range, in percent.
    pub range_held_pct: Stat,
    pub estimated: usize,
    pub unknown: usize,
    /// The same over every seed's pods together (the medians of all pods, not the mean
    /// of each seed's median).
    pub pooled: super::engine::EstimateRun,
}

fn estimates(runs: &[&TimelineRun]) -> BTreeMap<String, EstimateSummary> {
    let mut out = BTreeMap::new();
    for class in Class::ALL {
        let of: Vec<&super::engine::EstimateRun> = runs
            .iter()
            .filter_map(|r| r.estimates.get(&class))
            .collect();
        if of.is_empty() {
            continue;
        }
        let stat = |f: fn(&super::engine::EstimateRun) -> f64| {
            let v: Vec<f64> = of
                .iter()
                .filter(|e| e.estimated > 0)
                .map(|e| f(e))
                .collect();
            Stat::of(&v)
        };
        out.insert(
            class.key().to_string(),
            EstimateSummary {
                median_abs_error_s: stat(|e| e.median_abs_error_s),
                median_signed_error_s: stat(|e| e.median_signed_error_s),
                now_median_abs_error_s: stat(|e| e.now_median_abs_error_s),
                longest_median_abs_error_s: stat(|e| e.longest_median_abs_error_s),
                alone_median_abs_error_s: stat(|e| e.alone_median_abs_error_s),
                range_held_pct: stat(|e| e.range_held_pct),
                estimated: of.iter().map(|e| e.estimated).sum(),
                unknown: of.iter().map(|e| e.unknown).sum(),
                pooled: super::engine::EstimateErrors::merged(of.iter().map(|e| &e.errors))
                    .run(of.iter().map(|e| e.unknown).sum()),
            },
        );
    }
    out
}

/// Everything `simulate --timeline --json` prints and `summary.json` holds.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineSummary {
    pub workload: String,
    pub cluster: ClusterSize,
    pub pods: usize,
    pub load: f64,
    pub arrivals: usize,
    pub warmup: f64,
    pub durations: String,
    pub warm_start: bool,
    pub preempt: bool,
    /// Defragmentation: `off`, or the mode with its movable share and cost model.
    pub defrag: String,
    /// What carrying out a decision cost in simulated time.
    pub costs: CostsSummary,
    /// Evicted and moved pods resumed instead of starting over.
    pub checkpointed: bool,
    /// `off`, or `trace`: users gave up on waiting pods as the openb trace's did.
    pub patience: String,
    /// Shares were given whole GPUs (`--whole-gpus`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub whole_gpus: bool,
    /// The pods' GPUs claimed through DRA (`--dra`): how many pods and shapes were read
    /// as claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims: Option<String>,
    pub seeds: Vec<u64>,
    pub arrivals_per_s: f64,
    /// Simulated hours of one run, and of its measurement window (means over seeds).
    pub simulated_h: f64,
    pub window_h: f64,
    pub policies: Vec<TimelinePolicy>,
    pub wall_s: f64,
}

/// The costs charged, seconds (`--eviction-grace`, `--recreate`, `--start`,
/// `--bind-latency`, `--attempt-cost`, `--placed-attempt-cost`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CostsSummary {
    pub eviction_grace_s: f64,
    pub recreate_s: f64,
    pub start_s: f64,
    pub bind_latency_s: f64,
    pub attempt_s: f64,
    pub placed_attempt_s: f64,
}

impl From<super::options::Costs> for CostsSummary {
    fn from(c: super::options::Costs) -> Self {
        CostsSummary {
            eviction_grace_s: c.eviction_grace.as_secs_f64(),
            recreate_s: c.recreate.as_secs_f64(),
            start_s: c.start.as_secs_f64(),
            bind_latency_s: c.bind_latency.as_secs_f64(),
            attempt_s: c.attempt.as_secs_f64(),
            placed_attempt_s: c.placed_attempt.as_secs_f64(),
        }
    }
}

fn stat(runs: &[&TimelineRun], f: impl Fn(&TimelineRun) -> f64) -> Stat {
    Stat::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>())
}

fn mean_of(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Element-wise means of equally long vectors (the shortest length wins).
fn mean_curve<'a>(curves: impl Iterator<Item = &'a Vec<f64>> + Clone) -> Vec<f64> {
    let len = curves.clone().map(Vec::len).min().unwrap_or(0);
    (0..len)
        .map(|i| mean_of(curves.clone().map(|c| c[i])))
        .collect()
}

/// Summarises one policy's runs.
pub fn summarize_policy(policy: Policy, runs: &[&TimelineRun]) -> TimelinePolicy {
    let mut wait_s = BTreeMap::new();
    let mut cdf = BTreeMap::new();
    for class in Class::ALL {
        let with: Vec<&TimelineRun> = runs
            .iter()
            .copied()
            .filter(|r| r.waits.contains_key(&class))
            .collect();
        if with.is_empty() {
            continue;
        }
        let m = |f: fn(&Waits) -> f64| mean_of(with.iter().map(|r| f(&r.waits[&class])));
        wait_s.insert(
            class.key().to_string(),
            WaitMeans {
                p50: m(|w| w.p50),
                p90: m(|w| w.p90),
                p99: m(|w| w.p99),
                max: m(|w| w.max),
                mean: m(|w| w.mean),
                count: m(|w| w.count as f64),
                never_started: m(|w| w.never_started as f64),
                abandoned: m(|w| w.abandoned as f64),
                abandoned_pct: m(|w| 100.0 * w.abandoned as f64 / w.count.max(1) as f64),
            },
        );
        cdf.insert(
            class.key().to_string(),
            mean_curve(with.iter().filter_map(|r| r.cdf.get(&class))),
        );
    }
    TimelinePolicy {
        policy: policy.name().to_string(),
        allocation_pct: stat(runs, |r| r.means.allocation_pct),
        fragmentation_pct: stat(runs, |r| r.means.fragmentation_pct),
        pending_gpus: stat(runs, |r| r.means.pending_gpus),
        wait_s,
        completed_gpu_hours: stat(runs, |r| r.completed_gpu_hours),
        busy_gpu_hours: stat(runs, |r| r.busy_gpu_hours),
        goodput_pct: stat(runs, |r| r.goodput_pct),
        gpu_hours_lost: stat(runs, |r| r.gpu_hours_lost),
        moves_per_hour: stat(runs, |r| r.moves_per_hour),
        never_started: stat(runs, |r| r.never_started as f64),
        abandoned: stat(runs, |r| r.abandoned as f64),
        preempted_pods: stat(runs, |r| r.preempted_pods as f64),
        work_lost_pct: stat(runs, |r| r.work_lost_pct),
        moved_pods: stat(runs, |r| r.moved_pods as f64),
        moved_gpus_per_hour: stat(runs, |r| r.moved_gpus_per_hour),
        move_lost_pct: stat(runs, |r| r.move_lost_pct),
        failed_attempts: runs
            .iter()
            .map(|r| r.failed_attempts.map(|n| n as f64))
            .collect::<Option<Vec<f64>>>()
            .map(|v| Stat::of(&v)),
        series: Series {
            t_s: mean_curve(runs.iter().map(|r| &r.series.t_s)),
            allocation_pct: mean_curve(runs.iter().map(|r| &r.series.allocation_pct)),
            fragmentation_pct: mean_curve(runs.iter().map(|r| &r.series.fragmentation_pct)),
            pending_gpus: mean_curve(runs.iter().map(|r| &r.series.pending_gpus)),
        },
        cdf,
        elapsed_s: runs.iter().map(|r| r.elapsed.as_secs_f64()).sum(),
        tenants: super::tenant_summary::summarize(runs),
        start_estimates: estimates(runs),
    }
}

/// Groups runs by policy (in the order given) and summarises each.
pub fn summarize(policies: &[Policy], runs: &[TimelineRun]) -> Vec<TimelinePolicy> {
    policies
        .iter()
        .map(|&p| {
            let mine: Vec<&TimelineRun> = runs.iter().filter(|r| r.policy == p).collect();
            summarize_policy(p, &mine)
        })
        .collect()
}

fn wait_cell(p: &TimelinePolicy, class: &str, pick: fn(&WaitMeans) -> f64) -> String {
    p.wait_s
        .get(class)
        .map_or_else(|| "-".to_string(), |w| duration_text(pick(w)))
}

/// The terminal table.
pub fn table(summary: &TimelineSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "timeline {}: {} nodes, {} GPUs, {} pods; load {}, {} arrivals ({:.3}/s, {:.1} h simulated, {:.1} h measured after a {:.0}% warm-up); {} seed(s) from {}",
        summary.workload,
        summary.cluster.nodes,
        summary.cluster.gpus,
        summary.pods,
        summary.load,
        summary.arrivals,
        summary.arrivals_per_s,
        summary.simulated_h,
        summary.window_h,
        summary.warmup * 100.0,
        summary.seeds.len(),
        summary.seeds.first().copied().unwrap_or(0),
    );
    let _ = writeln!(out, "durations: {}", summary.durations);
    if let Some(claims) = &summary.claims {
        let _ = writeln!(out, "claims: {claims}");
    }
    let _ = writeln!(
        out,
        "{:<21} {:>14} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "policy",
        "alloc %",
        "goodput %",
        "frag %",
        "pend GPU",
        "1 p50",
        "1 p99",
        "8 p50",
        "8 p99",
        "share p99",
        "unstart"
    );
    for p in &summary.policies {
        let _ = writeln!(
            out,
            "{:<21} {:>6.2} ± {:<5.2} {:>9.2} {:>8.2} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.0}",
            p.policy,
            p.allocation_pct.mean,
            p.allocation_pct.sd,
            p.goodput_pct.mean,
            p.fragmentation_pct.mean,
            p.pending_gpus.mean,
            wait_cell(p, "1", |w| w.p50),
            wait_cell(p, "1", |w| w.p99),
            wait_cell(p, "8", |w| w.p50),
            wait_cell(p, "8", |w| w.p99),
            wait_cell(p, "share", |w| w.p99),
            p.never_started.mean,
        );
    }
    if summary
        .policies
        .iter()
        .any(|p| p.wait_s.contains_key("nvlink"))
    {
        for p in &summary.policies {
            let _ = writeln!(
                out,
                "{:<21} nvlink-required: p50 {} p90 {} p99 {} max {}",
                p.policy,
                wait_cell(p, "nvlink", |w| w.p50),
                wait_cell(p, "nvlink", |w| w.p90),
                wait_cell(p, "nvlink", |w| w.p99),
                wait_cell(p, "nvlink", |w| w.max),
            );
        }
    }
    if summary.preempt {
        for p in &summary.policies {
            let _ = writeln!(
                out,
                "{:<21} preempted {:.0} pods, work lost {:.3}% of GPU time",
                p.policy, p.preempted_pods.mean, p.work_lost_pct.mean
            );
        }
    }
    if summary.patience != "off" {
        for p in &summary.policies {
            let shares: Vec<String> = p
                .wait_s
                .iter()
                .map(|(class, w)| format!("{class} {:.1}%", w.abandoned_pct))
                .collect();
            let _ = writeln!(
                out,
                "{:<21} given up while waiting: {:.0} pods ({})",
                p.policy,
                p.abandoned.mean,
                shares.join(", ")
            );
        }
    }
    if summary.defrag != "off" {
        for p in &summary.policies {
            let _ = writeln!(
                out,
                "{:<21} defrag {}: moved {:.0} pods ({:.2}/h), {:.2} GPUs/h, work lost to moves {:.3}% of GPU time",
                p.policy,
                summary.defrag,
                p.moved_pods.mean,
                p.moves_per_hour.mean,
                p.moved_gpus_per_hour.mean,
                p.move_lost_pct.mean
            );
        }
    }
    for p in &summary.policies {
        if p.start_estimates.is_empty() {
            continue;
        }
        let parts: Vec<String> = p
            .start_estimates
            .iter()
            .map(|(class, e)| {
                let e = &e.pooled;
                let part = |name: &str, p: &super::engine::PartRun| {
                    format!(
                        "{name} {} against now {} ({} pods, range held {:.0}%)",
                        duration_text(p.median_abs_error_s),
                        duration_text(p.now_median_abs_error_s),
                        p.estimated,
                        p.range_held_pct
                    )
                };
                format!(
                    "{class}: {} (bias {}{}; now {}, longest-on-best-node {}, nothing-ahead {}; range held {:.0}%; {} estimated, {} unknown; {}; {})",
                    duration_text(e.median_abs_error_s),
                    if e.median_signed_error_s < 0.0 { "-" } else { "+" },
                    duration_text(e.median_signed_error_s.abs()),
                    duration_text(e.now_median_abs_error_s),
                    duration_text(e.longest_median_abs_error_s),
                    duration_text(e.alone_median_abs_error_s),
                    e.range_held_pct,
                    e.estimated,
                    e.unknown,
                    part("in line", &e.line),
                    part("nominees", &e.nominees),
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<21} expected start, median |error| per class (every seed's pods together): {}",
            p.policy,
            parts.join("; ")
        );
    }
    super::tenant_summary::table(
        summary.policies.iter().filter_map(|p| {
            p.tenants
                .as_ref()
                .map(|t| (p.policy.as_str(), p.allocation_pct, t))
        }),
        &mut out,
    );
    let c = &summary.costs;
    let _ = writeln!(
        out,
        "costs: eviction grace {}s, re-create {}s, bind {}s, start {}s, attempt {}s (placing {}s); evicted pods {}; GPU-hours lost {}",
        c.eviction_grace_s,
        c.recreate_s,
        c.bind_latency_s,
        c.start_s,
        c.attempt_s,
        c.placed_attempt_s,
        if summary.checkpointed {
            "resume (checkpointed)"
        } else {
            "start over"
        },
        summary
            .policies
            .iter()
            .map(|p| format!("{} {:.1}", p.policy, p.gpu_hours_lost.mean))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "(time-weighted means over the window, mean ± sd over seeds; goodput = work kept, % of capacity; waits to the Binding, means over seeds of each seed's percentile; unstart = pods not started by the end; wall {:.2}s)",
        summary.wall_s
    );
    out
}

/// `series.csv`: one row per policy and time point.
pub fn series_csv(summary: &TimelineSummary) -> String {
    let mut out = String::from("policy,t_s,allocation_pct,fragmentation_pct,pending_gpus\n");
    for p in &summary.policies {
        let s = &p.series;
        for i in 0..s.t_s.len() {
            let _ = writeln!(
                out,
                "{},{:.0},{:.4},{:.4},{:.3}",
                p.policy, s.t_s[i], s.allocation_pct[i], s.fragmentation_pct[i], s.pending_gpus[i]
            );
        }
    }
    out
}

pub(super) fn html(summary: &TimelineSummary, charts: &[String]) -> String {
    let mut rows = String::new();
    for p in &summary.policies {
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{:.2} ± {:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td></tr>",
            p.policy,
            p.allocation_pct.mean,
            p.allocation_pct.sd,
            p.goodput_pct.mean,
            p.fragmentation_pct.mean,
            p.pending_gpus.mean,
            wait_cell(p, "1", |w| w.p50),
            wait_cell(p, "1", |w| w.p99),
            wait_cell(p, "8", |w| w.p50),
            wait_cell(p, "8", |w| w.p99),
            wait_cell(p, "share", |w| w.p99),
            p.never_started.mean
        );
    }
    let images: String = charts
        .iter()
        .filter(|c| c.ends_with(".svg"))
        .map(|c| format!("<img src=\"{c}\" alt=\"{c}\">\n"))
        .collect();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuplace simulate --timeline: {workload}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>gpuplace simulate --timeline</h1>
<p>Workload <b>{workload}</b>: {nodes} nodes, {gpus} GPUs, {pods} pods; offered load {load}, {arrivals} arrivals
({rate:.3}/s, {sim:.1} h simulated, the last {window:.1} h measured), {seeds} seed(s). Durations: {durations}.</p>
<table><tr><th>policy</th><th>allocation %</th><th>goodput %</th><th>fragmentation %</th><th>pending GPUs</th><th>1-GPU p50</th><th>1-GPU p99</th><th>8-GPU p50</th><th>8-GPU p99</th><th>share p99</th><th>not started</th></tr>
{rows}</table>
<p>Time-weighted means over the window (mean ± sd over seeds); waits are the mean over seeds of each seed's percentile, pods not started by the end counted with their wait so far.</p>
{images}<p>Data: <a href="summary.json">summary.json</a>, <a href="series.csv">series.csv</a>.</p>
</body></html>
"#,
        workload = summary.workload,
        nodes = summary.cluster.nodes,
        gpus = summary.cluster.gpus,
        pods = summary.pods,
        load = summary.load,
        arrivals = summary.arrivals,
        rate = summary.arrivals_per_s,
        sim = summary.simulated_h,
        window = summary.window_h,
        seeds = summary.seeds.len(),
        durations = summary.durations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration_text(12.0), "12s");
        assert_eq!(duration_text(600.0), "10m");
        assert_eq!(duration_text(7_200.0), "2.0h");
    }
}
