//! How good the expected start a waiting pod is told is (core's
//! [`gpuplace_core::waiting::expected_start`], the scheduler's own reckoning): when a share
//! of pods declares its run time (`--declared-share`, chosen by a hash of the pod's name),
//! each measured pod that waits is given, at its first failed attempt, the earliest end of
//! a running declaring pod after which a place of its shape frees; when it starts, the
//! estimate's error against its actual start (its Binding) is kept by class. Pods whose
//! estimate is "unknown" (no declaring pod frees a place) are counted apart.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::timeline::metrics::Class;
use crate::trace::name_hash;

/// The estimates of one replay.
#[derive(Default)]
pub(crate) struct Estimates {
    /// Share of pods that declare their run time (0: none, no estimates made).
    pub(super) share: f64,
    /// By job: the estimate made at its first wait (ms; `None`: unknown).
    pub(super) made: HashMap<u32, Option<u64>>,
    pub(super) errors: BTreeMap<Class, Vec<f64>>,
    pub(super) unknown: BTreeMap<Class, usize>,
}

/// One class's estimates over a replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EstimateRun {
    /// Median absolute error of the expected start against the actual start, seconds.
    pub median_abs_error_s: f64,
    /// Pods that waited, started and had an estimate.
    pub estimated: usize,
    /// Pods that waited and started with an unknown estimate.
    pub unknown: usize,
}

impl Estimates {
    pub(crate) fn new(share: f64) -> Estimates {
        Estimates {
            share: share.clamp(0.0, 1.0),
            ..Estimates::default()
        }
    }

    /// Whether pod `name` declares its run time.
    pub(super) fn declares(&self, name: &str) -> bool {
        self.share > 0.0 && (name_hash(name) % 10_000) as f64 / 10_000.0 < self.share
    }

    /// Per class, what the replay's estimates came to.
    pub(crate) fn report(&self) -> BTreeMap<Class, EstimateRun> {
        let mut out = BTreeMap::new();
        for class in Class::ALL {
            let mut errors = self.errors.get(&class).cloned().unwrap_or_default();
            let unknown = self.unknown.get(&class).copied().unwrap_or(0);
            if errors.is_empty() && unknown == 0 {
                continue;
            }
            errors.sort_by(f64::total_cmp);
            let median = errors.get(errors.len() / 2).copied().unwrap_or(0.0);
            out.insert(
                class,
                EstimateRun {
                    median_abs_error_s: median,
                    estimated: errors.len(),
                    unknown,
                },
            );
        }
        out
    }
}
