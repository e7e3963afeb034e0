//! Tenants across seeds: Jain's index of allocation against fair share, each queue's mean
//! allocation and fair share, how long queues took from asking for their guarantee to
//! having it, pods reclaimed, and what sharing cost in allocation against the same replay
//! without queues.

use std::fmt::Write;

use serde::Serialize;

use super::run::TimelineRun;
use crate::report::Stat;

/// One queue across seeds.
#[derive(Clone, Debug, Serialize)]
pub struct QueueSummary {
    pub name: String,
    pub guaranteed_gpus: f64,
    pub allocated_gpus: Stat,
    pub fair_share_gpus: Stat,
    /// From below its guarantee (asking) to having it: mean and p90 over every episode of
    /// every seed (seconds), and how many episodes.
    pub to_guarantee_mean_s: f64,
    pub to_guarantee_p90_s: f64,
    pub episodes: usize,
    pub reclaimed_pods: Stat,
}

/// Tenants across one policy's seeds.
#[derive(Clone, Debug, Serialize)]
pub struct TenantSummary {
    pub jain: Stat,
    pub queues: Vec<QueueSummary>,
    /// The same replay's allocation % without queues (set by the caller that ran it).
    pub allocation_without_queues_pct: Option<Stat>,
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
            let of = |f: fn(&super::engine::QueueRun) -> f64| {
                Stat::of(
                    &with
                        .iter()
                        .filter_map(|t| t.queues.get(i))
                        .map(f)
                        .collect::<Vec<_>>(),
                )
            };
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
                to_guarantee_mean_s: mean,
                to_guarantee_p90_s: p90,
                episodes: waits.len(),
                reclaimed_pods: of(|q| q.reclaimed_pods as f64),
            }
        })
        .collect();
    Some(TenantSummary {
        jain: Stat::of(&with.iter().map(|t| t.jain).collect::<Vec<_>>()),
        queues,
        allocation_without_queues_pct: None,
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
        let _ = writeln!(
            out,
            "{:<21} tenants: Jain's index of allocation / fair share {:.3} ± {:.3}{cost}",
            policy, t.jain.mean, t.jain.sd
        );
        for q in &t.queues {
            let _ = writeln!(
                out,
                "{:<21}   queue {:<12} guaranteed {:>7.1} GPUs, allocated {:>7.1}, fair share {:>7.1}; to guarantee mean {:.0}s p90 {:.0}s ({} times); reclaimed {:.0} pods",
                "",
                q.name,
                q.guaranteed_gpus,
                q.allocated_gpus.mean,
                q.fair_share_gpus.mean,
                q.to_guarantee_mean_s,
                q.to_guarantee_p90_s,
                q.episodes,
                q.reclaimed_pods.mean
            );
        }
    }
}
