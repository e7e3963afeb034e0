//! The timeline replay's clock and settings.

use std::ops::Add;
use std::time::Duration;

use gpuplace_core::queue::{Discipline, QueueConfig};
use serde::Serialize;

use super::durations::DurationModel;

/// Simulated time in milliseconds since the replay started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Ms(pub u64);

impl Add<Duration> for Ms {
    type Output = Ms;

    fn add(self, d: Duration) -> Ms {
        Ms(self
            .0
            .saturating_add(d.as_millis().min(u128::from(u64::MAX)) as u64))
    }
}

/// How a timeline replay runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineOptions {
    /// Offered load: GPU-seconds asked per second over GPU capacity (`--load`).
    pub load: f64,
    /// Units arriving after the start (`--arrivals`).
    pub arrivals: usize,
    /// Share of the arrivals whose pods and time are left out of the metrics (`--warmup`).
    pub warmup: f64,
    pub durations: DurationModel,
    /// A pod that fits nowhere evicts lower-priority pods (`--preempt`).
    pub preempt: bool,
    /// Start from the mix's stationary population instead of an empty cluster.
    pub warm_start: bool,
    /// How many times each of the warm start's pods that found no place had been tried
    /// when the clock started (`--warm-attempts`; empty: once).
    pub warm_attempts: WarmAttempts,
    /// The warm start's pods that find no place failed before the clock started
    /// (`--warm-pending-due`): their backoff is over at t=0, so the first event brings them
    /// back at once, as on a live replay, whose warm start is placed with the clock stopped
    /// (over tens of real seconds). Otherwise they fail at t=0 and back off from there.
    pub warm_pending_due: bool,
    /// The scheduler's backoff and parking.
    pub queue: QueueConfig,
    /// Points of the series over time.
    pub series_points: usize,
    /// Moving pods to make room or to rebalance (`--defrag`).
    pub defrag: DefragSim,
    /// Queues the pods are shared among (`--tenants`).
    pub tenants: Option<super::tenants::TenantsFile>,
    /// With tenants: the half-life of the usage of queues that set none (ms; 0: no usage
    /// over time), as the scheduler's `--usage-half-life`.
    pub usage_half_life_ms: u64,
    /// Share of pods that declare their run time (`--declared-share`, 0 to 1): waiting pods
    /// are told an expected start from them, and its error is measured.
    pub declared_share: f64,
    /// With tenants: whether the queues serve (fair order, limits, reclaim) or only measure
    /// (the same arrivals served by priority then arrival, as kube-scheduler does).
    pub queues_serve: bool,
    /// What carrying out a decision costs in time.
    pub costs: Costs,
    /// An evicted or moved pod resumes where it was (nothing lost) instead of running its
    /// whole duration again (`--checkpointed`).
    pub checkpointed: bool,
    /// Whether users give up on pods that wait (`--patience`).
    pub patience: Patience,
    /// Keep every pod's life in each run ([`super::TimelineRun::pods`], `pods.csv`): about
    /// 100 bytes per pod per run, so only when a report will write them (`--out`).
    pub record_pods: bool,
    /// Every GPU pod asks whole GPUs, a share one (`--whole-gpus`): a cluster without GPU
    /// sharing, as stock Kubernetes with a plain device plugin. The arrivals stay those of
    /// the pod list as it is, so the same seed offers the same pods either way.
    pub whole_gpus: bool,
    /// Every pod at one priority (`--no-priorities`): a live replay whose pods carry no
    /// PriorityClass, served in arrival order.
    pub no_priorities: bool,
    /// The placer's tie-break order from this seed instead of the arrival seed
    /// (`--tie-break-seed`): the same arrivals with equal nodes taken in another order, for
    /// how far a figure moves by chance alone.
    pub tie_break_seed: Option<u64>,
    /// The placer's seed itself (`--scheduler-seed`): ties broken exactly as a gpuplace
    /// scheduler started with `--seed` this value breaks them, for a live replay's twin.
    pub scheduler_seed: Option<u64>,
    /// kube-scheduler's `percentageOfNodesToScore` for `kube-default` (0: adaptive, its
    /// default; 100: every node).
    pub percentage_of_nodes_to_score: u32,
    /// For `kube-default`, whose queue is kube-scheduler's: how often that queue moves
    /// backed-off pods to its active queue (a one-second loop in v1.26; pods parked past
    /// the flush interval are looked for every 30 of these) (`--kube-queue-tick`).
    pub kube_queue_tick: Duration,
    /// Whose queue brings waiting pods back (`--queue-model`; `None`: the policy's own
    /// scheduler's, kube-scheduler's for `kube-default`).
    pub queue_model: Option<Discipline>,
}

/// What each step of carrying out a decision costs in simulated time, as on a real node
/// (defaults measured on `../shared/realnode`: docs/timeline.md).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Costs {
    /// From an eviction until the victim's GPUs are free (its grace period; Kubernetes'
    /// default `terminationGracePeriodSeconds` is 30 s, and a container that does not exit
    /// on SIGTERM holds its GPUs that long) (`--eviction-grace`).
    pub eviction_grace: Duration,
    /// From an eviction until the controller's new pod exists (`--recreate`).
    pub recreate: Duration,
    /// From the decision until the Binding is written (`--bind-latency`).
    pub bind_latency: Duration,
    /// From the Binding until the container runs: GPUs held, no work done (`--start`).
    pub start: Duration,
    /// How long a scheduling attempt that fails keeps the scheduler busy
    /// (`--attempt-cost`). Attempts then run one after another: a pod that arrives or
    /// becomes due while the scheduler works waits in its active queue, in queue order, and
    /// each attempt decides on the cluster as it stands when it starts. Zero (the default,
    /// with [`Self::placed_attempt`]) decides a whole round at one instant, as gpuplace's
    /// scheduler nearly does (about 0.3 ms a pod on the real server); kube-scheduler's
    /// failed attempts take 14.7 ms here (docs/replay.md).
    pub attempt: Duration,
    /// The same for an attempt that places its unit (`--placed-attempt-cost`; 4.9 ms for
    /// kube-scheduler here, which binds in the background).
    pub placed_attempt: Duration,
}

impl Costs {
    /// Every step instant (the replay before costs were modelled; the stack equivalence
    /// test, whose simulated clock binds at once).
    pub const FREE: Costs = Costs {
        eviction_grace: Duration::ZERO,
        recreate: Duration::ZERO,
        bind_latency: Duration::ZERO,
        start: Duration::ZERO,
        attempt: Duration::ZERO,
        placed_attempt: Duration::ZERO,
    };
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            eviction_grace: Duration::from_millis(COST_GRACE_MS),
            recreate: Duration::from_millis(COST_RECREATE_MS),
            bind_latency: Duration::from_millis(COST_BIND_MS),
            start: Duration::from_millis(COST_START_MS),
            attempt: Duration::ZERO,
            placed_attempt: Duration::ZERO,
        }
    }
}

// Measured on `../shared/realnode` (a v1.26 kubelet and containerd, gpuplace's scheduler and
// device plugin; docs/timeline.md has every run): a ReplicaSet's 8-GPU pod with the default
// 30-s grace period preempted three times, five 1-GPU pods placed at once.
/// From the eviction until the victim was gone: 31.16, 30.79, 30.97 s.
const COST_GRACE_MS: u64 = 31_000;
/// From the eviction until the ReplicaSet's new pod existed: 15, 17, 36 ms.
const COST_RECREATE_MS: u64 = 20;
/// From a fitting pod's creation until its Binding: 7 to 14 ms (five pods).
const COST_BIND_MS: u64 = 10;
/// From the Binding until the container ran: 0.74 to 1.69 s, median 0.97 s (eight pods).
const COST_START_MS: u64 = 1_000;

/// Whether users delete pods that wait too long.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Patience {
    /// Pods wait as long as it takes.
    #[default]
    Off,
    /// Each arriving unit's patience is drawn from the openb trace's pods deleted while
    /// pending (per class where the trace has enough of them; see [`super::patience`]).
    Trace,
}

/// Which defragmentation runs in a timeline replay: the scheduler's modes (core's).
pub use gpuplace_core::defrag::Mode as DefragMode;

/// Defragmentation's settings in a timeline replay: the scheduler's (core's
/// [`gpuplace_core::defrag::Settings`], the same defaults, off unless asked), and which pods
/// may move.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DefragSim {
    pub settings: gpuplace_core::defrag::Settings,
    /// Share of pods that may move (chosen by a hash of the pod, the same in every run).
    pub movable: f64,
}

impl Default for DefragSim {
    fn default() -> Self {
        DefragSim {
            settings: gpuplace_core::defrag::Settings {
                mode: DefragMode::Off,
                ..gpuplace_core::defrag::Settings::default()
            },
            movable: 0.5,
        }
    }
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            load: 0.95,
            arrivals: 50_000,
            warmup: 0.2,
            durations: DurationModel::default(),
            preempt: false,
            warm_start: true,
            warm_pending_due: false,
            warm_attempts: WarmAttempts::default(),
            queue: QueueConfig::default(),
            series_points: 240,
            defrag: DefragSim::default(),
            tenants: None,
            usage_half_life_ms: 0,
            declared_share: 0.0,
            queues_serve: true,
            costs: Costs::default(),
            checkpointed: false,
            patience: Patience::Off,
            record_pods: false,
            whole_gpus: false,
            no_priorities: false,
            tie_break_seed: None,
            scheduler_seed: None,
            percentage_of_nodes_to_score: 0,
            kube_queue_tick: Duration::from_secs(1),
            queue_model: None,
        }
    }
}

/// How many times the warm start's pods that found no place had been tried when the clock
/// started, as a live replay's scheduler log shows it (`--warm-attempts 1:95,2:50`): a live
/// warm start takes a minute of real time, and kube-scheduler tries such a pod again
/// whenever a Binding it observes overlaps its attempt (v1.26's `moveRequestCycle`), so some
/// start the clock with a longer backoff. Each such pod draws its count from these weights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WarmAttempts {
    /// (attempts, how many pods had that many); attempts at least 1. Empty: once each (the
    /// warm round's own attempt).
    pub weights: Vec<(u32, u32)>,
}

impl WarmAttempts {
    /// The attempts for the pod whose draw is `draw` (uniform over u64).
    pub fn pick(&self, draw: u64) -> u32 {
        let total: u64 = self.weights.iter().map(|w| u64::from(w.1)).sum();
        if total == 0 {
            return 1;
        }
        let mut at = draw % total;
        for &(attempts, count) in &self.weights {
            if at < u64::from(count) {
                return attempts.max(1);
            }
            at -= u64::from(count);
        }
        1
    }
}
