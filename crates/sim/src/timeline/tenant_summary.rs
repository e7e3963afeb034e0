//! Tenants across seeds: Jain's index of allocation against entitlement while contended
//! (with the queues serving, and for the same arrivals served without them), each queue's
//! mean allocation and fair share, its waits, how long queues took from asking for their guarantee to
//! having it, pods reclaimed, and what sharing cost in allocation against the same replay
//! without queues.

use std::fmt::Write;

use serde::Serialize;

use super::run::TimelineRun;
use crate::report::{Stat, duration_text};

/// One queue across seeds.
#[derive(Clone, Debug, Serialize)]
pub struct QueueSummary {
    pub name: String,
    pub guaranteed_gpus: f64,
    pub allocated_gpus: Stat,
    pub fair_share_gpus: Stat,
    /// While the cluster was contended: mean GPUs held and entitled (over the seeds that
    /// were contended).
    pub contended_allocated_gpus: Stat,
    pub contended_entitled_gpus: Stat,
    /// Its pods' waits, seconds (each seed's percentile, mean and sd over seeds).
    pub wait_p50_s: Stat,
    pub wait_p99_s: Stat,
    /// From below its guarantee (asking) to having it: mean and p90 over every episode of
    /// every seed (seconds), and how many episodes.
    pub to_guarantee_mean_s: f64,
    pub to_guarantee_p90_s: f64,
    pub episodes: usize,
    pub reclaimed_pods: Stat,
}

/// Jain's index per hour window across seeds: each seed's mean and lowest over its
/// contended hours.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HourlyJain {
    pub mean: Stat,
    pub min: Stat,
    /// Contended hours, over every seed.
    pub hours: usize,
}

impl HourlyJain {
    fn of(with: &[&super::engine::TenantRun]) -> Option<HourlyJain> {
        let seeds: Vec<&Vec<f64>> = with
            .iter()
            .map(|t| &t.jain_hourly)
            .filter(|h| !h.is_empty())
            .collect();
        if seeds.is_empty() {
            return None;
        }
        let means: Vec<f64> = seeds
            .iter()
            .map(|h| h.iter().sum::<f64>() / h.len() as f64)
            .collect();
        let mins: Vec<f64> = seeds
            .iter()
            .map(|h| h.iter().copied().fold(f64::INFINITY, f64::min))
            .collect();
        Some(HourlyJain {
            mean: Stat::of(&means),
            min: Stat::of(&mins),
            hours: seeds.iter().map(|h| h.len()).sum(),
        })
    }

    fn text(j: Option<HourlyJain>) -> String {
        j.map_or_else(
            || "-".to_string(),
            |j| {
                format!(
                    "{:.3} (lowest {:.3}, {} h)",
                    j.mean.mean, j.min.mean, j.hours
                )
            },
        )
    }
}

/// Tenants across one policy's seeds.
#[derive(Clone, Debug, Serialize)]
pub struct TenantSummary {
    /// Jain's index of allocation over entitlement while contended, queues serving, over
    /// the seeds whose cluster was contended (none if none was).
    pub jain: Option<Stat>,
    /// Jain's index per contended hour of the window, queues serving.
    pub jain_hourly: Option<HourlyJain>,
    /// The same with the queues' usage over time off (set by the caller that ran it when
    /// the queues decay usage).
    pub jain_hourly_without_decay: Option<HourlyJain>,
    /// The same arrivals served without queues (set by the caller that ran it).
    pub jain_hourly_without_queues: Option<HourlyJain>,
    /// Seeds whose cluster was contended at some time of the window.
    pub contended_seeds: usize,
    /// Share of the window the cluster was contended, %.
    pub contended_pct: Stat,
    pub queues: Vec<QueueSummary>,
    /// The same replay's allocation % without queues (set by the caller that ran it).
    pub allocation_without_queues_pct: Option<Stat>,
    /// The same arrivals served by priority then arrival (queues measuring only): Jain's
    /// index, and each queue's figures (set by the caller that ran it).
    pub jain_without_queues: Option<Stat>,
    pub contended_seeds_without_queues: Option<usize>,
    pub queues_without_queues: Option<Vec<QueueSummary>>,
}

/// The tenants' summary of `runs` (one policy), if they had tenants.
pub fn summarize(runs: &[&TimelineRun]) -> Option<TenantSummary> {
    let with: Vec<&super::engine::TenantRun> =
        runs.iter().filter_map(|r| r.tenants.as_ref()).collect();
    let first = with.first()?;
    let queues = first
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            // Over the seeds that have the figure (a contended one only where contended).
            let of_some = |f: &dyn Fn(&super::engine::QueueRun) -> Option<f64>| {
                Stat::of(
                    &with
                        .iter()
                        .filter_map(|t| t.queues.get(i))
                        .filter_map(f)
                        .collect::<Vec<_>>(),
                )
            };
            let of = |f: fn(&super::engine::QueueRun) -> f64| of_some(&|q| Some(f(q)));
            let mut waits: Vec<f64> = with
                .iter()
                .filter_map(|t| t.queues.get(i))
                .flat_map(|q| q.to_guarantee_s.iter().copied())
                .collect();
            waits.sort_by(f64::total_cmp);
            let mean = if waits.is_empty() {
                0.0
            } else {
                waits.iter().sum::<f64>() / waits.len() as f64
            };
            let p90 = waits
                .get(((waits.len() as f64 * 0.9).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or(0.0);
            QueueSummary {
                name: q.name.clone(),
                guaranteed_gpus: q.guaranteed_gpus,
                allocated_gpus: of(|q| q.mean_allocated_gpus),
                fair_share_gpus: of(|q| q.mean_fair_share_gpus),
                contended_allocated_gpus: of_some(&|q| q.contended_allocated_gpus),
                contended_entitled_gpus: of_some(&|q| q.contended_entitled_gpus),
                wait_p50_s: of(|q| q.wait_p50_s),
                wait_p99_s: of(|q| q.wait_p99_s),
                to_guarantee_mean_s: mean,
                to_guarantee_p90_s: p90,
                episodes: waits.len(),
                reclaimed_pods: of(|q| q.reclaimed_pods as f64),
            }
        })
        .collect();
    Some(TenantSummary {
        jain: Some(with.iter().filter_map(|t| t.jain).collect::<Vec<_>>())
            .filter(|j| !j.is_empty())
            .map(|j| Stat::of(&j)),
        jain_hourly: HourlyJain::of(&with),
        jain_hourly_without_decay: None,
        jain_hourly_without_queues: None,
        contended_seeds: with.iter().filter(|t| t.jain.is_some()).count(),
        contended_pct: Stat::of(&with.iter().map(|t| t.contended_pct).collect::<Vec<_>>()),
        queues,
        allocation_without_queues_pct: None,
        jain_without_queues: None,
        contended_seeds_without_queues: None,
        queues_without_queues: None,
    })
}

/// The tenants' lines of the text report: per policy (its name, its allocation %, its
/// tenants' summary).
pub fn table<'a>(rows: impl Iterator<Item = (&'a str, Stat, &'a TenantSummary)>, out: &mut String) {
    for (policy, allocation, t) in rows {
        let cost = t
            .allocation_without_queues_pct
            .map(|w| {
                format!(
                    "; allocation {:.2}% vs {:.2}% without queues ({:+.2} points)",
                    allocation.mean,
                    w.mean,
                    allocation.mean - w.mean
                )
            })
            .unwrap_or_default();
        let jain = |j: Option<Stat>| {
            j.map_or_else(
                || "- (never contended)".to_string(),
                |j| format!("{:.3} ± {:.3}", j.mean, j.sd),
            )
        };
        let without = t
            .contended_seeds_without_queues
            .map(|seeds| {
                format!(
                    ", {} without queues ({seeds} seeds contended)",
                    jain(t.jain_without_queues)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<21} tenants: Jain's index of allocation / entitlement while contended ({:.0}% of the window, {} seeds) {}{without}{cost}",
            policy,
            t.contended_pct.mean,
            t.contended_seeds,
            jain(t.jain)
        );
        let without_decay = t
            .jain_hourly_without_decay
            .map(|j| format!(", {} without usage decay", HourlyJain::text(Some(j))))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<21} tenants: Jain's index per contended hour {}{without_decay}, {} without queues",
            "",
            HourlyJain::text(t.jain_hourly),
            HourlyJain::text(t.jain_hourly_without_queues)
        );
        let plain = t.queues_without_queues.as_deref().unwrap_or(&[]);
        for q in &t.queues {
            let off = plain
                .iter()
                .find(|o| o.name == q.name)
                .map(|o| {
                    format!(
                        "; without queues: contended {:.1} of {:.1}, waits p50 {} p99 {}",
                        o.contended_allocated_gpus.mean,
                        o.contended_entitled_gpus.mean,
                        duration_text(o.wait_p50_s.mean),
                        duration_text(o.wait_p99_s.mean)
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{:<21}   queue {:<12} guaranteed {:>7.1} GPUs, allocated {:>7.1}, fair share {:>7.1}; contended {:.1} of {:.1} entitled; waits p50 {} p99 {}; to guarantee mean {:.0}s p90 {:.0}s ({} times); reclaimed {:.0} pods{off}",
                "",
                q.name,
                q.guaranteed_gpus,
                q.allocated_gpus.mean,
                q.fair_share_gpus.mean,
                q.contended_allocated_gpus.mean,
                q.contended_entitled_gpus.mean,
                duration_text(q.wait_p50_s.mean),
                duration_text(q.wait_p99_s.mean),
                q.to_guarantee_mean_s,
                q.to_guarantee_p90_s,
                q.episodes,
                q.reclaimed_pods.mean
            );
        }
    }
}
