//! Aggregating runs across seeds, and writing the summary, curves, plots and an HTML page.

use std::fmt::Write as _;
use std::path::Path;

use gpuplace_core::Policy;
use serde::Serialize;

use crate::replay::RunResult;

/// Mean and sample standard deviation over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stat {
    pub mean: f64,
    pub sd: f64,
}

/// A wait in a short human form (`45s`, `12m`, `3.2h`).
pub fn duration_text(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{seconds:.0}s")
    } else if seconds < 5_400.0 {
        format!("{:.0}m", seconds / 60.0)
    } else {
        format!("{:.1}h", seconds / 3_600.0)
    }
}

impl Stat {
    pub fn of(values: &[f64]) -> Stat {
        let n = values.len() as f64;
        if values.is_empty() {
            return Stat { mean: 0.0, sd: 0.0 };
        }
        let mean = values.iter().sum::<f64>() / n;
        let sd = if values.len() > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Stat { mean, sd }
    }
}

/// The stable keys other tools read (`"100"`, `"130"`, `"80"`), absent points as null.
#[derive(Clone, Debug, Serialize)]
pub struct UnallocatedPoints {
    #[serde(rename = "100")]
    pub at_100: Option<Stat>,
    #[serde(rename = "130")]
    pub at_130: Option<Stat>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FragmentationPoints {
    #[serde(rename = "80")]
    pub at_80: Option<Stat>,
}

/// One policy across all seeds.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    pub policy: String,
    pub unallocated_pct: UnallocatedPoints,
    pub fragmentation_pct: FragmentationPoints,
    /// Mean unallocated % per arrived % (index = arrived %).
    pub unallocated_curve: Vec<f64>,
    /// Standard deviation of unallocated % per arrived %.
    pub unallocated_sd_curve: Vec<f64>,
    /// Mean fragmentation (% of capacity) per arrived %.
    pub fragmentation_curve: Vec<f64>,
    /// Mean fragmentation (% of idle GPU) per arrived %.
    pub fragmentation_idle_curve: Vec<f64>,
    pub pods_failed_mean: f64,
    /// With preemption: pods and GPUs evicted, and the work lost (% of GPU time), means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preempted: Option<PreemptedMeans>,
    /// Sum of this policy's run times (seconds of one core).
    pub elapsed_s: f64,
}

/// What preemption cost a policy, mean over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PreemptedMeans {
    pub pods: f64,
    pub gpus: f64,
    pub work_lost_pct: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClusterSize {
    pub nodes: usize,
    pub gpus: usize,
}

/// Everything `simulate --json` prints and `summary.json` holds.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub workload: String,
    pub cluster: ClusterSize,
    pub pods: usize,
    pub inflate: f64,
    pub seeds: Vec<u64>,
    pub policies: Vec<PolicySummary>,
    /// Wall time of the whole experiment.
    pub wall_s: f64,
    /// Topology asked of multi-GPU pods (`--require-topology`, `--prefer-topology`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_asks: Option<String>,
    /// Preemption (`--preempt`) and where the priorities came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemption: Option<String>,
    /// The pods' GPUs claimed through DRA (`--dra`): how many pods and shapes were read
    /// as claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims: Option<String>,
}

fn point(runs: &[&RunResult], pick: impl Fn(&RunResult) -> Option<f64>) -> Option<Stat> {
    let values: Option<Vec<f64>> = runs.iter().map(|r| pick(r)).collect();
    values.map(|v| Stat::of(&v))
}

fn curve(runs: &[&RunResult], pick: impl Fn(&RunResult) -> &Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    let len = runs.iter().map(|r| pick(r).len()).min().unwrap_or(0);
    (0..len)
        .map(|i| {
            let values: Vec<f64> = runs.iter().map(|r| pick(r)[i]).collect();
            let s = Stat::of(&values);
            (s.mean, s.sd)
        })
        .unzip()
}

/// Summarises one policy's runs.
pub fn summarize_policy(policy: Policy, runs: &[&RunResult]) -> PolicySummary {
    let at = |v: &Vec<f64>, i: usize| v.get(i).copied();
    let (unallocated_curve, unallocated_sd_curve) = curve(runs, |r| &r.curves.unallocated);
    let (fragmentation_curve, _) = curve(runs, |r| &r.curves.frag_capacity);
    let (fragmentation_idle_curve, _) = curve(runs, |r| &r.curves.frag_idle);
    let failed: Vec<f64> = runs.iter().map(|r| r.pods_failed as f64).collect();
    PolicySummary {
        policy: policy.name().to_string(),
        unallocated_pct: UnallocatedPoints {
            at_100: point(runs, |r| at(&r.curves.unallocated, 100)),
            at_130: point(runs, |r| at(&r.curves.unallocated, 130)),
        },
        fragmentation_pct: FragmentationPoints {
            at_80: point(runs, |r| at(&r.curves.frag_capacity, 80)),
        },
        unallocated_curve,
        unallocated_sd_curve,
        fragmentation_curve,
        fragmentation_idle_curve,
        pods_failed_mean: Stat::of(&failed).mean,
        preempted: runs.iter().any(|r| r.preemption.is_some()).then(|| {
            let mean = |f: &dyn Fn(&RunResult) -> f64| {
                Stat::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>()).mean
            };
            PreemptedMeans {
                pods: mean(&|r| r.preemption.map_or(0.0, |c| c.pods as f64)),
                gpus: mean(&|r| r.preemption.map_or(0.0, |c| c.gpu_milli as f64 / 1000.0)),
                work_lost_pct: mean(&|r| r.work_lost_pct()),
            }
        }),
        elapsed_s: runs.iter().map(|r| r.elapsed.as_secs_f64()).sum(),
    }
}

/// Groups results by policy (in the order given) and summarises each.
pub fn summarize(policies: &[Policy], results: &[RunResult]) -> Vec<PolicySummary> {
    policies
        .iter()
        .map(|&p| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.policy == p).collect();
            summarize_policy(p, &runs)
        })
        .collect()
}

fn cell(stat: Option<Stat>) -> String {
    match stat {
        Some(s) => format!("{:6.2} ± {:4.2}", s.mean, s.sd),
        None => "     n/a     ".to_string(),
    }
}

/// The terminal table.
pub fn table(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "workload {}: {} nodes, {} GPUs, {} pods; {} seed(s) from {}; inflate {}",
        summary.workload,
        summary.cluster.nodes,
        summary.cluster.gpus,
        summary.pods,
        summary.seeds.len(),
        summary.seeds.first().copied().unwrap_or(0),
        summary.inflate
    );
    if let Some(asks) = &summary.topology_asks {
        let _ = writeln!(out, "topology: {asks}");
    }
    if let Some(preemption) = &summary.preemption {
        let _ = writeln!(out, "preemption: {preemption}");
    }
    if let Some(claims) = &summary.claims {
        let _ = writeln!(out, "claims: {claims}");
    }
    let _ = writeln!(
        out,
        "{:<21} {:>15} {:>15} {:>15} {:>10} {:>9}",
        "policy", "unalloc@100%", "unalloc@130%", "frag@80%", "failed", "time(s)"
    );
    for p in &summary.policies {
        let _ = writeln!(
            out,
            "{:<21} {:>15} {:>15} {:>15} {:>10.0} {:>9.2}",
            p.policy,
            cell(p.unallocated_pct.at_100),
            cell(p.unallocated_pct.at_130),
            cell(p.fragmentation_pct.at_80),
            p.pods_failed_mean,
            p.elapsed_s
        );
    }
    if summary.policies.iter().any(|p| p.preempted.is_some()) {
        let _ = writeln!(
            out,
            "{:<15} {:>15} {:>15} {:>15}",
            "policy", "pods preempted", "GPUs preempted", "work lost %"
        );
        for p in &summary.policies {
            if let Some(m) = p.preempted {
                let _ = writeln!(
                    out,
                    "{:<15} {:>15.1} {:>15.1} {:>15.3}",
                    p.policy, m.pods, m.gpus, m.work_lost_pct
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "(unallocated and fragmented GPU as % of capacity, mean ± sd over seeds, at the given arrived GPU %; time = one core's seconds for all seeds; wall {:.2}s)",
        summary.wall_s
    );
    out
}

/// Writes `curves.csv`: one row per policy and arrived percent.
pub fn curves_csv(summary: &Summary) -> String {
    let mut out = String::from(
        "policy,arrived_pct,unallocated_pct_mean,unallocated_pct_sd,fragmentation_pct_mean,fragmentation_idle_pct_mean\n",
    );
    for p in &summary.policies {
        for (i, u) in p.unallocated_curve.iter().enumerate() {
            let _ = writeln!(
                out,
                "{},{},{:.4},{:.4},{:.4},{:.4}",
                p.policy,
                i,
                u,
                p.unallocated_sd_curve.get(i).copied().unwrap_or(0.0),
                p.fragmentation_curve.get(i).copied().unwrap_or(0.0),
                p.fragmentation_idle_curve.get(i).copied().unwrap_or(0.0)
            );
        }
    }
    out
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot draw {path}: {message}")]
    Plot { path: String, message: String },
}

/// Creates `dir` and writes `summary` into it as summary.json (the start of every report).
pub(crate) fn start_report(dir: &Path, summary: &impl serde::Serialize) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let json = serde_json::to_string_pretty(summary).unwrap_or_default();
    write(&dir.join("summary.json"), &json)
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Write {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn html(summary: &Summary) -> String {
    let mut rows = String::new();
    for p in &summary.policies {
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.2}</td></tr>",
            p.policy,
            cell(p.unallocated_pct.at_100),
            cell(p.unallocated_pct.at_130),
            cell(p.fragmentation_pct.at_80),
            p.pods_failed_mean,
            p.elapsed_s
        );
    }
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuplace simulate: {workload}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>gpuplace simulate</h1>
<p>Workload <b>{workload}</b>: {nodes} nodes, {gpus} GPUs, {pods} pods, {seeds} seed(s), inflated to {inflate} of GPU capacity.
Values are mean ± sd over seeds, as % of GPU capacity, at the given arrived GPU request (% of capacity).</p>
<table><tr><th>policy</th><th>unallocated @100%</th><th>unallocated @130%</th><th>fragmentation @80%</th><th>failed pods</th><th>time (s)</th></tr>
{rows}</table>
<h2>Unallocated GPU</h2><img src="unallocated.svg" alt="unallocated GPU % against arrived GPU %">
<img src="unallocated_zoom.svg" alt="unallocated GPU % against arrived GPU %, from 70% arrived">
<h2>Fragmentation</h2><img src="fragmentation.svg" alt="fragmented GPU % against arrived GPU %">
<p>Data: <a href="summary.json">summary.json</a>, <a href="curves.csv">curves.csv</a>.</p>
</body></html>
"#,
        workload = summary.workload,
        nodes = summary.cluster.nodes,
        gpus = summary.cluster.gpus,
        pods = summary.pods,
        seeds = summary.seeds.len(),
        inflate = summary.inflate,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_uses_the_sample_sd() {
        let s = Stat::of(&[1.0, 3.0]);
        assert_eq!(s.mean, 2.0);
        assert!((s.sd - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(Stat::of(&[5.0]).sd, 0.0);
    }
}
