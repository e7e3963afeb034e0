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
        }
    }
}
