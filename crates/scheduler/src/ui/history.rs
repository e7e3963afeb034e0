//! The last hour of the fleet's allocation and fragmentation, for the map's charts: one
//! point every 10 s from the scheduler's rounds (an idle stretch repeats the last values).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Seconds between two points.
pub const STEP_SECONDS: u64 = 10;
/// Points kept (an hour).
pub const POINTS: usize = 360;

/// One moment of the fleet.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Point {
    /// Seconds since the Unix epoch.
    pub t: u64,
    pub allocation_pct: f64,
    pub fragmentation_pct: f64,
    pub pending: usize,
}

/// What a round saw (taken from its report).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub capacity_milli: u64,
    pub allocated_milli: u64,
    pub fragmentation_milli: u64,
    pub pending: usize,
}

#[derive(Debug, Default)]
struct Inner {
    points: VecDeque<Point>,
    latest: Option<Sample>,
}

/// Shared between the loop's observer (writer) and the map (reader).
#[derive(Clone, Debug, Default)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
}

impl History {
    /// A round at `now` (epoch seconds) saw `sample` (`None`: an idle look, nothing new).
    pub fn record(&self, now: u64, sample: Option<Sample>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if sample.is_some() {
            inner.latest = sample;
        }
        let Some(s) = inner.latest else {
            return;
        };
        if inner
            .points
            .back()
            .is_some_and(|p| now < p.t + STEP_SECONDS)
        {
            return;
        }
        let idle = s.capacity_milli.saturating_sub(s.allocated_milli);
        let pct = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                (10_000.0 * part as f64 / whole as f64).round() / 100.0
            }
        };
        inner.points.push_back(Point {
            t: now,
            allocation_pct: pct(s.allocated_milli, s.capacity_milli),
            fragmentation_pct: pct(s.fragmentation_milli.min(idle), idle),
            pending: s.pending,
        });
        while inner.points.len() > POINTS {
            inner.points.pop_front();
        }
    }

    /// A round of the loop ended (now, by the wall clock).
    pub fn record_round(&self, report: &crate::RoundReport, took: std::time::Duration) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // An idle look or settled writes: no new picture (as the metrics take it).
        let sample = (!report.idle && !took.is_zero()).then_some(Sample {
            capacity_milli: report.gpu_capacity_milli,
            allocated_milli: report.gpu_allocated_milli,
            fragmentation_milli: report.fragmentation_milli,
            pending: report.pending,
        });
        self.record(now, sample);
    }

    pub fn points(&self) -> Vec<Point> {
        self.inner
            .lock()
            .map(|i| i.points.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_point_per_step_for_an_hour() {
        let h = History::default();
        h.record(0, None);
        assert!(h.points().is_empty(), "nothing seen yet");
        let s = Sample {
            capacity_milli: 8000,
            allocated_milli: 2000,
            fragmentation_milli: 600,
            pending: 3,
        };
        for t in 0..(2 * 3600) {
            h.record(t, if t % 7 == 0 { Some(s) } else { None });
        }
        let points = h.points();
        assert_eq!(points.len(), POINTS);
        assert!(points.windows(2).all(|w| w[1].t - w[0].t == STEP_SECONDS));
        assert_eq!(points[0].allocation_pct, 25.0);
        assert_eq!(points[0].fragmentation_pct, 10.0);
    }
}
