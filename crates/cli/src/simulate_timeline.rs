//! `gpuplace simulate --timeline`: the cluster over time (see `gpuplace_sim::timeline`).

use std::time::Instant;

use anyhow::Context;
use gpuplace_core::Policy;
use gpuplace_core::defrag::Settings;
use gpuplace_core::queue::Discipline;
use gpuplace_sim::Workload;
use gpuplace_sim::report::ClusterSize;
use gpuplace_sim::timeline::options::{Costs, DefragMode, DefragSim, Patience, WarmAttempts};
use gpuplace_sim::timeline::summary::{self, TimelineSummary};
use gpuplace_sim::timeline::{DurationModel, Timeline, TimelineOptions, TimelineRun, run_all};
use gpuplace_sim::timeline::{pods_csv, report};

use clap::Args;

/// The timeline replay: pods arrive at a load, wait in the scheduler's queue, run for
/// their trace duration and leave.
#[derive(Args, Debug)]
pub struct TimelineArgs {
    /// Replay the cluster over time (arrivals, queue, departures) instead of the paper's
    /// fill-up replay.
    #[arg(long)]
    pub(crate) timeline: bool,
    /// Offered load: GPU-seconds asked per second over GPU capacity (0.01 to 10).
    #[arg(long, default_value_t = 0.95, requires = "timeline")]
    pub(crate) load: f64,
    /// Units (pods, or gangs) arriving after the start (10 to 2,000,000; the replay may
    /// cover at most 20,000 simulated hours).
    #[arg(long, default_value_t = 50_000, requires = "timeline")]
    pub(crate) arrivals: usize,
    /// Share of the arrivals left out of the metrics as warm-up (0 to below 1).
    #[arg(long, default_value_t = 0.2, requires = "timeline")]
    pub(crate) warmup: f64,
    /// Multiply every pod's run time by this (above 0, at most 1000).
    #[arg(long, default_value_t = 1.0, requires = "timeline")]
    pub(crate) duration_scale: f64,
    /// Shortest run in seconds (zero and tiny trace durations are raised to it; 1 to
    /// 31,536,000, a year).
    #[arg(long, default_value_t = 60.0, requires = "timeline")]
    pub(crate) min_duration: f64,
    /// Longest run in seconds (longer ones are cut); none by default.
    #[arg(long, requires = "timeline")]
    pub(crate) max_duration: Option<f64>,
    /// Start from an empty cluster instead of the mix's stationary population.
    #[arg(long, requires = "timeline")]
    pub(crate) cold_start: bool,
    /// The warm start's pods that find no place failed before the clock started: their
    /// backoff is over at t=0 and the first departure brings them back at once, as on a live
    /// replay (`gpuplace replay` places its warm start with the clock stopped).
    #[arg(long, requires = "timeline", conflicts_with = "cold_start")]
    pub(crate) warm_pending_due: bool,
    /// How many times the warm start's pods that found no place had been tried when the
    /// clock started, as ATTEMPTS:PODS pairs (`1:95,2:50,3:8`: a live replay's
    /// kube-scheduler log, `scripts/kube-attempt-time.py --warm`); each such pod draws its
    /// count from them. Unset: once each.
    #[arg(long, requires = "timeline", conflicts_with = "cold_start", value_parser = parse_warm_attempts)]
    pub(crate) warm_attempts: Option<WarmAttempts>,
    /// Move pods: `make-room` for a unit that fits nowhere, `rebalance` to lower
    /// fragmentation in the background, `all` for both (the scheduler's words).
    #[arg(long, value_enum, default_value_t = DefragArg::Off, requires = "timeline")]
    pub(crate) defrag: DefragArg,
    /// Share of pods that may be moved (opted in; 0 to 1).
    #[arg(long, default_value_t = 0.5, requires = "timeline")]
    pub(crate) movable: f64,
    /// Evicted and moved pods resume where they were instead of running their whole
    /// duration again (no work lost).
    #[arg(long, requires = "timeline")]
    pub(crate) checkpointed: bool,
    /// Seconds from an eviction until the victim's GPUs are free: its grace period (0 to
    /// 3,600; measured on a real node with Kubernetes' default 30-s grace: 31).
    #[arg(long, default_value_t = 31.0, requires = "timeline")]
    pub(crate) eviction_grace: f64,
    /// Seconds from an eviction until the controller's new pod exists (0 to 3,600; measured:
    /// 0.02).
    #[arg(long, default_value_t = 0.02, requires = "timeline")]
    pub(crate) recreate: f64,
    /// Seconds from a decision until its Binding is written (0 to 3,600; measured: 0.01).
    #[arg(long, default_value_t = 0.01, requires = "timeline")]
    pub(crate) bind_latency: f64,
    /// Seconds from the Binding until the container runs, GPUs held and no work done (0 to
    /// 3,600; measured: 1).
    #[arg(long, default_value_t = 1.0, requires = "timeline")]
    pub(crate) start: f64,
    /// Seconds a failed scheduling attempt keeps the scheduler busy (0 to 3,600): attempts
    /// run one after another and pods that come meanwhile wait their turn. 0 decides a round
    /// at once (gpuplace's scheduler: about 0.3 ms a pod); kube-scheduler's failed attempts
    /// take 14.7 ms on a 2-core test machine, times `--speed` for a live replay's twin.
    #[arg(long, default_value_t = 0.0, requires = "timeline")]
    pub(crate) attempt_cost: f64,
    /// Seconds an attempt that places its pod keeps the scheduler busy (0 to 3,600; default
    /// `--attempt-cost`; kube-scheduler: 4.9 ms there).
    #[arg(long, requires = "timeline")]
    pub(crate) placed_attempt_cost: Option<f64>,
    /// `trace`: users delete pods that wait longer than their patience, drawn from the openb
    /// trace's pods deleted while pending (11%: median 94 s, p90 342 s); `off`: pods wait as
    /// long as it takes.
    #[arg(long, value_enum, default_value_t = PatienceArg::Off, requires = "timeline")]
    pub(crate) patience: PatienceArg,
    /// Seconds a pod must have run before it may move (0 to 2,592,000, 30 days).
    #[arg(long, default_value_t = 300.0, requires = "timeline")]
    pub(crate) defrag_min_age: f64,
    /// Pods one plan may move (1 to 1000; the scheduler's default too).
    #[arg(long, default_value_t = 4, requires = "timeline")]
    pub(crate) defrag_max_moves: usize,
    /// GPUs per hour rebalancing may move (0 to 1,000,000).
    #[arg(long, default_value_t = 16.0, requires = "timeline")]
    pub(crate) defrag_budget: f64,
    /// Share the pods among queues (a YAML or JSON tenants file: queues with guarantees,
    /// limits and weights, and how pods are assigned to them; see docs/queues.md). The same
    /// replay is also run without queues, for what sharing costs.
    #[arg(long, requires = "timeline")]
    pub(crate) tenants: Option<std::path::PathBuf>,
    /// With --tenants: the half-life of the usage over time of queues that set none
    /// (`usageHalfLife`), as the scheduler's flag (`1h`, `30m`; `0`: by the allocation now).
    /// With usage on, the same replay is also run with it off.
    #[arg(long, default_value = "0", requires = "tenants")]
    pub(crate) usage_half_life: String,
    /// Share of pods (0 to 1, by a hash of the name) that declare their run time, as
    /// `gpuplace.io/expected-duration` does: each pod that waits is told when it is
    /// expected to start from them, and the error against its actual start is reported
    /// per class.
    #[arg(long, default_value_t = 0.0, requires = "timeline")]
    pub(crate) declared_share: f64,
    /// Every GPU pod asks whole GPUs, a share one: a cluster without GPU sharing, as stock
    /// Kubernetes with a plain device plugin (with `--policies kube-default`, what users run
    /// today). The arrivals stay those of the pod list, so a seed offers the same pods.
    #[arg(long, requires = "timeline")]
    pub(crate) whole_gpus: bool,
    /// Every pod at one priority, served in arrival order: what `gpuplace replay` gives
    /// pods when it has no `--priority-classes` (a live replay's pods carry none).
    #[arg(long, requires = "timeline")]
    pub(crate) no_priorities: bool,
    /// The scheduler's queue timers, seconds, as its flags of the same names: a failed
    /// pod's first backoff, its longest, and how long a parked pod waits when nothing
    /// happens. A live replay at `--speed K` with a scheduler on its default timers is
    /// predicted with each multiplied by K (kube-scheduler at speed 10: 10, 100, 3000).
    #[arg(long, default_value_t = 1.0, requires = "timeline")]
    pub(crate) pod_initial_backoff: f64,
    #[arg(long, default_value_t = 10.0, requires = "timeline")]
    pub(crate) pod_max_backoff: f64,
    #[arg(long, default_value_t = 300.0, requires = "timeline")]
    pub(crate) unschedulable_flush: f64,
    /// Break ties between equal nodes in the order of this seed instead of each run's
    /// arrival seed: the same arrivals placed by another draw of equals, for how far a
    /// figure moves by chance alone (a live replay's scheduler has its own order).
    #[arg(long, requires = "timeline")]
    pub(crate) tie_break_seed: Option<u64>,
    /// Break ties exactly as a gpuplace scheduler started with `--seed N` does (its default
    /// is 42): the simulated twin of a live replay of that scheduler, whose decisions then
    /// differ from the simulator's only where the two clusters' states do.
    #[arg(long, requires = "timeline", conflicts_with = "tie_break_seed")]
    pub(crate) scheduler_seed: Option<u64>,
    /// kube-scheduler's `percentageOfNodesToScore` for `--policies kube-default`: it stops
    /// filtering once it has found this share of the nodes feasible (0: its adaptive
    /// default, 50% minus 1% per 125 nodes, at least 5% and 100 nodes; 100: every node).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100), requires = "timeline")]
    pub(crate) percentage_of_nodes_to_score: u32,
    /// For `--policies kube-default`, whose queue is kube-scheduler's (v1.26): seconds
    /// between the moves of backed-off pods to its active queue (1 there; pods parked past
    /// `--unschedulable-flush` are looked for every 30 of these). Multiply it by `--speed`
    /// with the other timers to predict a live replay.
    #[arg(long, default_value_t = 1.0, requires = "timeline")]
    pub(crate) kube_queue_tick: f64,
    /// Whose queue brings waiting pods back: by default each policy's own scheduler's
    /// (kube-scheduler's for `kube-default`, gpuplace's for the others); set one for all,
    /// to see what the queue alone changes.
    #[arg(long, value_enum, requires = "timeline")]
    pub(crate) queue_model: Option<QueueModelArg>,
}

/// `--queue-model`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum QueueModelArg {
    Gpuplace,
    KubeScheduler,
}

/// Reads a tenants file (YAML, of which JSON is a part).
pub(crate) fn read_tenants(
    path: &std::path::Path,
) -> anyhow::Result<gpuplace_sim::timeline::tenants::TenantsFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the tenants file {}", path.display()))?;
    serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("tenants file {}: {e}", path.display()))
}

/// `--warm-attempts`: ATTEMPTS:PODS pairs, attempts 1 to 1,000, some pods in all.
fn parse_warm_attempts(text: &str) -> Result<WarmAttempts, String> {
    let wrong = |why: &str| {
        format!(
            "--warm-attempts takes ATTEMPTS:PODS pairs separated by commas (1:95,2:50), {why}, got {text:?}"
        )
    };
    let mut weights = Vec::new();
    for pair in text.split(',') {
        let (attempts, pods) = pair
            .split_once(':')
            .ok_or_else(|| wrong(&format!("{pair:?} has no ':'")))?;
        let attempts: u32 = attempts
            .trim()
            .parse()
            .map_err(|_| wrong(&format!("{attempts:?} is not a whole number of attempts")))?;
        let pods: u32 = pods
            .trim()
            .parse()
            .map_err(|_| wrong(&format!("{pods:?} is not a whole number of pods")))?;
        if !(1..=1_000).contains(&attempts) {
            return Err(wrong("attempts must be 1 to 1,000"));
        }
        weights.push((attempts, pods));
    }
    if weights.iter().all(|w| w.1 == 0) {
        return Err(wrong("no pods in any pair"));
    }
    Ok(WarmAttempts { weights })
}

/// The longest `--defrag-min-age`, seconds (30 days).
const MAX_MIN_AGE_S: f64 = 2_592_000.0;
/// The largest `--defrag-budget`, GPUs per hour.
const MAX_BUDGET: f64 = 1_000_000.0;

/// `--patience`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PatienceArg {
    Off,
    Trace,
}

/// The longest cost flag, seconds (an hour).
const MAX_COST_S: f64 = 3_600.0;

/// A cost flag's seconds, refused with the flag's name and bounds when out of them.
fn cost(flag: &str, seconds: f64) -> anyhow::Result<std::time::Duration> {
    anyhow::ensure!(
        seconds.is_finite() && (0.0..=MAX_COST_S).contains(&seconds),
        "--{flag} must be between 0 and {MAX_COST_S} seconds, got {seconds}"
    );
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// `--defrag`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DefragArg {
    Off,
    MakeRoom,
    Rebalance,
    /// Both (the scheduler's word; `both` is taken too).
    #[value(alias = "both")]
    All,
}

impl TimelineArgs {
    /// The replay's options from the flags (`preempt`: `simulate --preempt`).
    pub(crate) fn options(&self, preempt: bool) -> anyhow::Result<TimelineOptions> {
        Ok(TimelineOptions {
            load: self.load,
            arrivals: self.arrivals,
            warmup: self.warmup,
            durations: DurationModel {
                scale: self.duration_scale,
                min_s: self.min_duration,
                max_s: self.max_duration,
            },
            preempt,
            warm_start: !self.cold_start,
            warm_pending_due: self.warm_pending_due,
            warm_attempts: self.warm_attempts.clone().unwrap_or_default(),
            queue: crate::queue_flags::queue_config(
                self.pod_initial_backoff,
                self.pod_max_backoff,
                self.unschedulable_flush,
            )?,
            series_points: 240,
            defrag: self.defrag()?,
            tenants: self.tenants.as_deref().map(read_tenants).transpose()?,
            usage_half_life_ms: gpuplace_core::fairshare::parse_half_life(&self.usage_half_life)
                .map_err(|e| anyhow::anyhow!("--usage-half-life: {e}"))?,
            declared_share: {
                anyhow::ensure!(
                    (0.0..=1.0).contains(&self.declared_share),
                    "--declared-share must be between 0 and 1, got {}",
                    self.declared_share
                );
                self.declared_share
            },
            queues_serve: true,
            costs: self.costs()?,
            checkpointed: self.checkpointed,
            patience: match self.patience {
                PatienceArg::Off => Patience::Off,
                PatienceArg::Trace => Patience::Trace,
            },
            // Set by the run: only a report that writes them keeps every pod's record.
            record_pods: false,
            whole_gpus: self.whole_gpus,
            no_priorities: self.no_priorities,
            tie_break_seed: self.tie_break_seed,
            scheduler_seed: self.scheduler_seed,
            percentage_of_nodes_to_score: self.percentage_of_nodes_to_score,
            kube_queue_tick: {
                anyhow::ensure!(
                    self.kube_queue_tick.is_finite()
                        && (0.001..=MAX_COST_S).contains(&self.kube_queue_tick),
                    "--kube-queue-tick must be between 0.001 and {MAX_COST_S} seconds, got {}",
                    self.kube_queue_tick
                );
                std::time::Duration::from_secs_f64(self.kube_queue_tick)
            },
            queue_model: self.queue_model.map(|m| match m {
                QueueModelArg::Gpuplace => Discipline::Gpuplace,
                QueueModelArg::KubeScheduler => Discipline::KubeScheduler,
            }),
        })
    }

    fn costs(&self) -> anyhow::Result<Costs> {
        Ok(Costs {
            eviction_grace: cost("eviction-grace", self.eviction_grace)?,
            recreate: cost("recreate", self.recreate)?,
            bind_latency: cost("bind-latency", self.bind_latency)?,
            start: cost("start", self.start)?,
            attempt: cost("attempt-cost", self.attempt_cost)?,
            placed_attempt: cost(
                "placed-attempt-cost",
                self.placed_attempt_cost.unwrap_or(self.attempt_cost),
            )?,
        })
    }

    fn defrag(&self) -> anyhow::Result<DefragSim> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.movable),
            "--movable must be between 0 and 1, got {}",
            self.movable
        );
        anyhow::ensure!(
            self.defrag_min_age.is_finite() && (0.0..=MAX_MIN_AGE_S).contains(&self.defrag_min_age),
            "--defrag-min-age must be between 0 and {MAX_MIN_AGE_S} seconds (30 days), got {}",
            self.defrag_min_age
        );
        anyhow::ensure!(
            self.defrag_budget.is_finite() && (0.0..=MAX_BUDGET).contains(&self.defrag_budget),
            "--defrag-budget must be GPUs per hour, between 0 and {MAX_BUDGET}, got {}",
            self.defrag_budget
        );
        anyhow::ensure!(
            (1..=1000).contains(&self.defrag_max_moves),
            "--defrag-max-moves must be between 1 and 1000, got {}",
            self.defrag_max_moves
        );
        let mode = match self.defrag {
            DefragArg::Off => DefragMode::Off,
            DefragArg::MakeRoom => DefragMode::MakeRoom,
            DefragArg::Rebalance => DefragMode::Rebalance,
            DefragArg::All => DefragMode::All,
        };
        let defaults = DefragSim::default();
        Ok(DefragSim {
            settings: Settings {
                mode,
                min_age: std::time::Duration::from_secs_f64(self.defrag_min_age),
                max_moves: self.defrag_max_moves,
                budget_gpus_per_hour: self.defrag_budget,
                ..defaults.settings
            },
            movable: self.movable,
        })
    }

    /// How the summary names the defragmentation settings.
    fn defrag_label(&self, d: &DefragSim, checkpointed: bool) -> String {
        if d.settings.mode == DefragMode::Off {
            return "off".to_string();
        }
        let mode = match d.settings.mode {
            DefragMode::MakeRoom => "make-room",
            DefragMode::Rebalance => "rebalance",
            _ => "all",
        };
        format!(
            "{mode} ({:.0}% movable, min age {:.0}s, {})",
            d.movable * 100.0,
            self.defrag_min_age,
            if checkpointed {
                "checkpointed"
            } else {
                "moved pods start over"
            }
        )
    }
}

/// What the rest of `simulate`'s flags say to a timeline replay.
pub struct Run<'a> {
    pub preempt: bool,
    /// What `--dra` read as claims, for the report.
    pub claims: Option<String>,
    pub out: Option<&'a std::path::Path>,
    pub json: bool,
}

pub fn run(
    t: &TimelineArgs,
    args: Run<'_>,
    workload: Workload,
    policies: &[Policy],
    seeds: Vec<u64>,
) -> anyhow::Result<()> {
    let options = TimelineOptions {
        // Every pod's life only for the report that writes it.
        record_pods: args.out.is_some(),
        ..t.options(args.preempt)?
    };
    let durations = options.durations;
    // The same arrivals with the queues measuring only (served as kube-scheduler would).
    let baseline_options = options.tenants.is_some().then(|| TimelineOptions {
        queues_serve: false,
        record_pods: false,
        ..options.clone()
    });
    // With usage over time: the same replay with it off.
    let no_decay_options = decays(&options).then(|| {
        let mut o = options.clone();
        o.usage_half_life_ms = 0;
        o.record_pods = false;
        if let Some(t) = &mut o.tenants {
            t.queues.iter_mut().for_each(|q| q.usage_half_life = None);
        }
        o
    });
    let defrag = t.defrag_label(&options.defrag, options.checkpointed);
    let costs = options.costs.into();
    let patience = match options.patience {
        Patience::Off => "off",
        Patience::Trace => "trace",
    };
    let timed = workload
        .pods
        .iter()
        .filter(|p| p.duration_s.is_some())
        .count();
    let timeline = Timeline::new(workload, options).context("cannot replay this workload")?;
    let bar = crate::progress::bar((policies.len() * seeds.len()) as u64);
    let started = Instant::now();
    let done = |r: &TimelineRun| {
        bar.set_message(format!("{} seed {}", r.policy, r.seed));
        bar.inc(1);
    };
    let runs = run_all(&timeline, policies, &seeds, &done)?;
    // Without queues, for what sharing costs in allocation.
    let baseline = match baseline_options {
        Some(options) => {
            let plain = Timeline::new(timeline.workload().clone(), options)?;
            Some(run_all(&plain, policies, &seeds, &|_| {})?)
        }
        None => None,
    };
    let no_decay = match no_decay_options {
        Some(options) => {
            let plain = Timeline::new(timeline.workload().clone(), options)?;
            Some(run_all(&plain, policies, &seeds, &|_| {})?)
        }
        None => None,
    };
    bar.finish_and_clear();
    let workload = timeline.workload();
    let mean =
        |f: fn(&TimelineRun) -> f64| runs.iter().map(f).sum::<f64>() / runs.len().max(1) as f64;
    let summary = TimelineSummary {
        workload: workload.name.clone(),
        cluster: ClusterSize {
            nodes: workload.nodes.len(),
            gpus: timeline.gpu_count(),
        },
        pods: workload.pods.len(),
        load: t.load,
        arrivals: t.arrivals,
        warmup: t.warmup,
        durations: describe(&durations, timed, workload.pods.len()),
        warm_start: !t.cold_start,
        preempt: args.preempt,
        defrag,
        costs,
        checkpointed: t.checkpointed,
        patience: patience.to_string(),
        whole_gpus: t.whole_gpus,
        claims: args.claims,
        seeds,
        arrivals_per_s: mean(|r| r.arrivals_per_s),
        simulated_h: mean(|r| r.simulated_s) / 3_600.0,
        window_h: mean(|r| r.window_s) / 3_600.0,
        policies: summary::summarize(policies, &runs),
        wall_s: started.elapsed().as_secs_f64(),
    };
    let mut summary = summary;
    if let Some(baseline) = baseline {
        add_baseline(&mut summary, policies, &baseline);
    }
    if let Some(no_decay) = no_decay {
        let plain = summary::summarize(policies, &no_decay);
        for (p, off) in summary.policies.iter_mut().zip(plain) {
            if let (Some(t), Some(o)) = (&mut p.tenants, off.tenants) {
                t.jain_hourly_without_decay = o.jain_hourly;
            }
        }
    }
    if let Some(dir) = args.out {
        let mut files = report::write_report(&summary, dir)?;
        files.extend(pods_csv::write_pods(
            &runs,
            &timeline.workload().nodes,
            dir,
        )?);
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
        print!("{}", summary::table(&summary));
    }
    Ok(())
}

/// Whether some queue keeps usage over time (the flag, or a queue's own half-life).
fn decays(options: &TimelineOptions) -> bool {
    options.tenants.as_ref().is_some_and(|t| {
        options.usage_half_life_ms > 0
            || t.queues.iter().any(|q| {
                q.usage_half_life.as_deref().is_some_and(|h| {
                    gpuplace_core::fairshare::parse_half_life(h).is_ok_and(|ms| ms > 0)
                })
            })
    })
}

/// The same arrivals with the queues measuring only, beside each policy's tenants: the
/// allocation, Jain's index and each queue's figures without queues.
fn add_baseline(summary: &mut TimelineSummary, policies: &[Policy], baseline: &[TimelineRun]) {
    let plain = summary::summarize(policies, baseline);
    for (p, off) in summary.policies.iter_mut().zip(plain) {
        if let (Some(t), Some(o)) = (&mut p.tenants, off.tenants) {
            t.allocation_without_queues_pct = Some(off.allocation_pct);
            t.jain_without_queues = o.jain;
            t.jain_hourly_without_queues = o.jain_hourly;
            t.contended_seeds_without_queues = Some(o.contended_seeds);
            t.queues_without_queues = Some(o.queues);
        }
    }
}

/// Where the run times came from and what was done to them, for the report.
pub(crate) fn describe(model: &DurationModel, timed: usize, pods: usize) -> String {
    let source = if timed == pods {
        "deletion_time - creation_time of each pod".to_string()
    } else if timed == 0 {
        "drawn per pod (by name) from the openb default list's duration quantiles".to_string()
    } else {
        format!(
            "deletion_time - creation_time for {timed} of {pods} pods, the others drawn from the openb duration quantiles"
        )
    };
    let cap = model
        .max_s
        .map(|m| format!(", at most {m} s"))
        .unwrap_or_default();
    format!(
        "{source}, times {}, at least {} s{cap}",
        model.scale, model.min_s
    )
}
