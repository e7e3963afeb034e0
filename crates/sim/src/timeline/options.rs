//! The timeline replay's clock and settings.

use std::ops::Add;
use std::time::Duration;

use gpuplace_core::queue::QueueConfig;
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
    /// The scheduler's backoff and parking.
    pub queue: QueueConfig,
    /// Points of the series over time.
    pub series_points: usize,
    /// Moving pods to make room or to rebalance (`--defrag`).
    pub defrag: DefragSim,
    /// Queues the pods are shared among (`--tenants`).
    pub tenants: Option<super::tenants::TenantsFile>,
}

/// Which defragmentation runs in a timeline replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefragMode {
    #[default]
    Off,
    /// A unit that fits nowhere moves movable pods out of its way.
    MakeRoom,
    /// Movable pods are moved in the background to lower fragmentation.
    Rebalance,
    /// Both (`--defrag all`, as the scheduler names it).
    All,
}

impl DefragMode {
    pub fn makes_room(self) -> bool {
        matches!(self, DefragMode::MakeRoom | DefragMode::All)
    }

    pub fn rebalances(self) -> bool {
        matches!(self, DefragMode::Rebalance | DefragMode::All)
    }
}

/// Defragmentation's settings in a timeline replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DefragSim {
    pub mode: DefragMode,
    /// Share of pods that may move (chosen by a hash of the pod, the same in every run).
    pub movable: f64,
    /// A moved pod resumes where it was (nothing lost) instead of starting over.
    pub checkpointed: bool,
    /// A pod moves only after running this long.
    pub min_age: Duration,
    /// Pods one plan may move.
    pub max_moves: usize,
    /// Rebalancing moves at most this many GPUs per hour.
    pub budget_gpus_per_hour: f64,
    /// How often rebalancing looks at the fleet.
    pub rebalance_every: Duration,
    /// A rebalancing move must lower fragmentation by at least this many GPUs.
    pub min_gain_gpus: f64,
}

impl Default for DefragSim {
    fn default() -> Self {
        DefragSim {
            mode: DefragMode::Off,
            movable: 0.5,
            checkpointed: false,
            min_age: Duration::from_secs(300),
            max_moves: 8,
            budget_gpus_per_hour: 16.0,
            rebalance_every: Duration::from_secs(60),
            min_gain_gpus: 1.0,
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
            queue: QueueConfig::default(),
            series_points: 240,
            defrag: DefragSim::default(),
            tenants: None,
        }
    }
}
