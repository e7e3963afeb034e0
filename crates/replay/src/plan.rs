//! What a replay creates when (pure): the timeline's warm start and arrivals for one seed,
//! the same draws `gpuplace simulate --timeline --seeds 1 --seed-start N` replays, each pod
//! named, timed, and given its queue and gang.

use gpuplace_sim::timeline::Timeline;
use gpuplace_sim::timeline::tenants::TenantQueue;

/// A pod the replay creates.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPod {
    /// Its name (`<prefix>-<unit>-<member>`).
    pub name: String,
    /// Index into the workload's pod list.
    pub pod: u32,
    /// Its arrival unit (warm-start units first, then arrivals; a gang's pods share one).
    pub unit: u32,
    /// When it is created, simulated ms from the start.
    pub arrival_ms: u64,
    /// How long it runs once bound, and its pod's whole run (a warm-start pod has part of
    /// it behind it).
    pub run_ms: u64,
    pub full_ms: u64,
    /// Arrived in the measurement window.
    pub measured: bool,
    /// Part of the warm start (made at 0 with part of its run behind it).
    pub warm: bool,
    /// Its queue (`--tenants`).
    pub queue: Option<String>,
    /// Its gang's PodGroup (named after the unit) and how many members it has.
    pub gang: Option<Gang>,
    /// The trace's priority (0 to 2).
    pub priority: i32,
}

/// A gang of a replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gang {
    pub name: String,
    pub members: u32,
}

/// Everything one replay creates.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// In creation order (arrival, then unit, then member).
    pub pods: Vec<PlannedPod>,
    /// The last arrival: the replay ends here.
    pub end_ms: u64,
    /// The first measured arrival.
    pub measure_from_ms: u64,
    /// The queues to make (`--tenants`), parents first.
    pub queues: Vec<TenantQueue>,
}

/// A plan that cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the schedule has no arrivals")]
    Empty,
    #[error(
        "the name prefix {0:?} is not a DNS label start (lower-case letters, digits and '-', starting with a letter, at most 30 characters)"
    )]
    Prefix(String),
}

impl Plan {
    /// The plan of seed `seed` of `timeline`; pod names start with `prefix`.
    pub fn new(timeline: &Timeline, seed: u64, prefix: &str) -> Result<Plan, PlanError> {
        check_prefix(prefix)?;
        let schedule = timeline.schedule(seed);
        let end_ms = schedule.arrivals.last().ok_or(PlanError::Empty)?.at.0;
        let warmup = timeline
            .warmup_index()
            .min(schedule.arrivals.len().saturating_sub(1));
        let measure_from_ms = schedule.arrivals[warmup].at.0;
        let mix = timeline.mix();
        let workload = timeline.workload();
        let tenants = timeline.tenants();
        let mut pods = Vec::new();
        let mut unit = 0u32;
        let starts = schedule
            .warm
            .iter()
            .map(|w| (w.template, 0, Some(w.left)))
            .chain(schedule.arrivals.iter().map(|a| (a.template, a.at.0, None)));
        for (template, at, left) in starts {
            let Some(t) = mix.templates.get(template as usize) else {
                continue;
            };
            let gang = (t.pods.len() > 1).then(|| Gang {
                name: format!("{prefix}-{unit:06}"),
                members: t.pods.len() as u32,
            });
            for (member, &p) in t.pods.iter().enumerate() {
                let full = mix.durations_ms[p];
                let run = left.map_or(full, |f| ((full as f64 * f).round() as u64).max(1));
                pods.push(PlannedPod {
                    name: format!("{prefix}-{unit:06}-{member}"),
                    pod: p as u32,
                    unit,
                    arrival_ms: at,
                    run_ms: run,
                    full_ms: full.max(run),
                    measured: left.is_none() && at >= measure_from_ms,
                    warm: left.is_some(),
                    queue: tenants.map(|t| t.tree.name(t.queue_of[p]).to_string()),
                    gang: gang.clone(),
                    priority: workload.pods[p].priority,
                });
            }
            unit += 1;
        }
        let queues = timeline
            .options()
            .tenants
            .as_ref()
            .map(|t| parents_first(&t.queues))
            .unwrap_or_default();
        Ok(Plan {
            seed,
            pods,
            end_ms,
            measure_from_ms,
            queues,
        })
    }
}

/// A DNS-label start that leaves room for `-<unit>-<member>-r<n>`.
fn check_prefix(prefix: &str) -> Result<(), PlanError> {
    let ok = (1..=30).contains(&prefix.len())
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !prefix.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(PlanError::Prefix(prefix.to_string()))
    }
}

/// Queues ordered so that each comes after its parent.
fn parents_first(queues: &[TenantQueue]) -> Vec<TenantQueue> {
    let mut out: Vec<TenantQueue> = Vec::with_capacity(queues.len());
    let mut left: Vec<&TenantQueue> = queues.iter().collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|q| {
            let ready = q
                .parent
                .as_ref()
                .is_none_or(|p| out.iter().any(|o| &o.name == p));
            if ready {
                out.push((*q).clone());
            }
            !ready
        });
        if left.len() == before {
            // A parent that is not in the file (the tenants file was checked): keep order.
            out.extend(left.drain(..).cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_sim::builtin_workload;
    use gpuplace_sim::timeline::TimelineOptions;

    fn timeline() -> Timeline {
        Timeline::new(
            builtin_workload(8),
            TimelineOptions {
                arrivals: 200,
                ..TimelineOptions::default()
            },
        )
        .expect("timeline")
    }

    #[test]
    fn the_plan_is_the_simulators_schedule() {
        let t = timeline();
        let plan = Plan::new(&t, 3, "rp3").expect("plan");
        let schedule = t.schedule(3);
        let arrived: usize = schedule
            .arrivals
            .iter()
            .map(|a| t.mix().templates[a.template as usize].pods.len())
            .sum();
        let warm: usize = schedule
            .warm
            .iter()
            .map(|w| t.mix().templates[w.template as usize].pods.len())
            .sum();
        assert_eq!(plan.pods.len(), arrived + warm);
        assert!(
            plan.pods
                .windows(2)
                .all(|w| w[0].arrival_ms <= w[1].arrival_ms)
        );
        assert_eq!(
            plan.end_ms,
            schedule.arrivals.last().expect("arrivals").at.0
        );
        // Warm-start pods exist at 0 and are never measured; arrivals after the warm-up are.
        assert!(
            plan.pods[..warm]
                .iter()
                .all(|p| p.arrival_ms == 0 && !p.measured)
        );
        assert!(plan.pods.iter().any(|p| p.measured));
        assert!(
            plan.pods
                .iter()
                .all(|p| p.run_ms >= 1 && p.run_ms <= p.full_ms)
        );
        let mut names: Vec<&str> = plan.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), plan.pods.len());
        // The same seed, the same plan.
        assert_eq!(Plan::new(&t, 3, "rp3").expect("plan").pods, plan.pods);
    }

    #[test]
    fn bad_prefixes_are_refused() {
        let t = timeline();
        for bad in ["", "Rp", "1rp", "rp_1", "rp-", &"r".repeat(31)] {
            assert!(
                matches!(Plan::new(&t, 1, bad), Err(PlanError::Prefix(_))),
                "{bad:?}"
            );
        }
    }
}
