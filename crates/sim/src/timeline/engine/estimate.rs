//! How good the expected start a waiting pod is told is: the scheduler's own reckoning
//! (core's [`gpuplace_core::waiting::project`]: the line of waiting units projected forward
//! over the running pods' expected ends), against two baselines a user could reckon alone:
//! "now" (its error is the wait itself) and "when the longest running pod on the best node
//! ends" (the node whose declared ends free soonest).
//!
//! Declarations are drawn as users declare them: a share of pods (`--declared-share`,
//! chosen by a hash of the name) declares its run time as its true run times a factor
//! drawn from a log-normal of median 1.5 (σ 0.6 in log: from about half to four times
//! the true run), not the true run. Where a pod declares nothing, the projection reads its
//! class's run times learnt from the pods that ended before it ([`RunHistory`]), as the
//! scheduler does. As in the scheduler (core's [`gpuplace_core::waiting::told`]), the line
//! is projected at most once every 10 s, in a round where a pod fails, and each pod that
//! waits is told at the first projection that gives it a start to come; when it starts,
//! each reckoning's error against its actual start (its Binding) is kept by class, and
//! whether the stated range held it. Pods that started without being told a start are
//! counted apart as "unknown".

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpuplace_core::waiting::Span;
use gpuplace_core::waiting::history::RunHistory;
use gpuplace_core::waiting::told::FirstTold;
use serde::Serialize;

use super::units::OrderKey;
use crate::timeline::metrics::Class;
use crate::trace::{name_hash, name_hash_on};

/// What a waiting pod was told and could have reckoned, at its first wait.
#[derive(Clone, Copy, Debug)]
pub(super) struct Told {
    /// The start as told, its range from how its estimator's reckonings turned out
    /// (`None`: "now" did best lately, nothing was shown).
    pub estimate: Option<Span>,
    /// The projection's own likeliest start, before the calibration (what it learns from);
    /// `None` for a nominee, told its victims' leaving (core's `told::nominee`).
    pub first: Option<FirstTold>,
    /// The same projection with nothing ahead in the line (`None`: unknown).
    pub alone: Option<i64>,
    /// When the longest running pod on the best node ends (`None`: no node's end known).
    pub longest: Option<i64>,
    /// When it was told (the baseline "now").
    pub at: i64,
}

/// One class's errors.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Errors {
    estimate: Vec<f64>,
    /// Actual start less the estimate (positive: it started later than told).
    signed: Vec<f64>,
    now: Vec<f64>,
    longest: Vec<f64>,
    alone: Vec<f64>,
    /// Per pod, whether the range held its start.
    held: Vec<bool>,
    /// Per pod, whether it was told as a nominee (its victims' leaving), not from the line.
    nominee: Vec<bool>,
}

/// The estimates of one replay.
#[derive(Default)]
pub(crate) struct Estimates {
    /// Share of pods that declare their run time (0: none, no estimates made).
    pub(super) share: f64,
    /// What ran, by class, and declared against actual.
    pub(super) history: RunHistory,
    /// The waiting units in line order.
    pub(super) line: BTreeSet<(OrderKey, u32)>,
    /// By job: what it was told at the first projection that gave it a start to come.
    pub(super) made: HashMap<u32, Told>,
    /// The jobs waiting to be told a start.
    pub(super) untold: BTreeSet<u32>,
    /// When the line was last looked at (projected when a job to tell was within reach).
    pub(super) projected_at: Option<i64>,
    /// Projections of the line made.
    pub(super) projections: u64,
    pub(super) errors: BTreeMap<Class, Errors>,
    pub(super) unknown: BTreeMap<Class, usize>,
}

/// One class's estimates over a replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EstimateRun {
    /// Median absolute error of the expected start against the actual start, seconds.
    pub median_abs_error_s: f64,
    /// Median of the actual start less the expected (positive: later than told), seconds.
    pub median_signed_error_s: f64,
    /// The same for the baseline "starts now" (the median wait).
    pub now_median_abs_error_s: f64,
    /// The same for "when the longest running pod on the best node ends".
    pub longest_median_abs_error_s: f64,
    /// The same for the projection with nothing ahead in the line (running pods' ends
    /// only, as gpuplace told before it projected the line), over the line's pods only.
    pub alone_median_abs_error_s: f64,
    /// Share of pods whose actual start fell within the stated range, in percent.
    pub range_held_pct: f64,
    /// Pods that waited, started and had an estimate.
    pub estimated: usize,
    /// Pods that waited and started with an unknown estimate.
    pub unknown: usize,
    /// The pods told from the line (the projection or the line's pace) alone.
    pub line: PartRun,
    /// The nominees alone (told when their victims are gone).
    pub nominees: PartRun,
    /// Each pod's errors, for figures over several runs' pods together.
    #[serde(skip)]
    pub(crate) errors: Errors,
}

/// The figures of one part of a class's pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PartRun {
    pub estimated: usize,
    pub median_abs_error_s: f64,
    pub now_median_abs_error_s: f64,
    pub longest_median_abs_error_s: f64,
    pub range_held_pct: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A standard normal draw from `hash` (Box-Muller over its two halves).
fn normal(hash: u64) -> f64 {
    let u1 = ((hash >> 32) as f64 + 1.0) / (u32::MAX as f64 + 2.0);
    let u2 = ((hash & 0xffff_ffff) as f64 + 1.0) / (u32::MAX as f64 + 2.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl Estimates {
    pub(crate) fn new(share: f64) -> Estimates {
        Estimates {
            share: share.clamp(0.0, 1.0),
            ..Estimates::default()
        }
    }

    /// Whether the pod whose name's hash is `hash` declares its run time.
    fn declares_hash(&self, hash: u64) -> bool {
        self.share > 0.0 && (hash % 10_000) as f64 / 10_000.0 < self.share
    }

    /// What pod `name` whose whole run is `full_ms` declares (`None`: nothing): its true
    /// run times its user's factor.
    pub(super) fn declared(&self, name: &str, full_ms: u64) -> Option<u64> {
        let hash = name_hash(name);
        if !self.declares_hash(hash) {
            return None;
        }
        let z = normal(name_hash_on(hash, "/declared"));
        let factor = (1.5f64.ln() + 0.6 * z).exp();
        Some(((full_ms as f64) * factor).max(1_000.0) as u64)
    }

    /// A measured job of `classes` told `told` started at `bound`.
    pub(super) fn started(&mut self, classes: &[Class], told: Option<Told>, bound: i64) {
        let err = |at: i64| (bound - at).abs() as f64 / 1e3;
        for &class in classes {
            let Some((told, span)) = told.and_then(|t| Some((t, t.estimate?))) else {
                *self.unknown.entry(class).or_default() += 1;
                continue;
            };
            let e = self.errors.entry(class).or_default();
            e.estimate.push(err(span.at_ms));
            e.signed.push((bound - span.at_ms) as f64 / 1e3);
            e.now.push(err(told.at));
            e.longest.push(err(told.longest.unwrap_or(told.at)));
            let nominee = told.first.is_none();
            if !nominee {
                e.alone.push(err(told.alone.unwrap_or(told.at)));
            }
            e.nominee.push(nominee);
            e.held.push(span.holds(bound));
        }
    }

    /// Per class, what the replay's estimates came to.
    pub(crate) fn report(&self) -> BTreeMap<Class, EstimateRun> {
        let mut out = BTreeMap::new();
        for class in Class::ALL {
            let errors = self.errors.get(&class).cloned().unwrap_or_default();
            let unknown = self.unknown.get(&class).copied().unwrap_or(0);
            if errors.estimate.is_empty() && unknown == 0 {
                continue;
            }
            out.insert(class, errors.run(unknown));
        }
        out
    }
}

impl Errors {
    /// The errors of `all` together.
    pub(crate) fn merged<'a>(all: impl Iterator<Item = &'a Errors>) -> Errors {
        let mut out = Errors::default();
        for e in all {
            out.estimate.extend(&e.estimate);
            out.signed.extend(&e.signed);
            out.now.extend(&e.now);
            out.longest.extend(&e.longest);
            out.alone.extend(&e.alone);
            out.held.extend(&e.held);
            out.nominee.extend(&e.nominee);
        }
        out
    }

    /// The figures of the pods told as nominees (`nominees`) or from the line.
    fn part(&self, nominees: bool) -> PartRun {
        let of = |v: &[f64]| -> Vec<f64> {
            (v.iter().zip(&self.nominee))
                .filter(|&(_, &n)| n == nominees)
                .map(|(&x, _)| x)
                .collect()
        };
        let estimated = self.nominee.iter().filter(|&&n| n == nominees).count();
        let held = (self.held.iter().zip(&self.nominee))
            .filter(|&(&h, &n)| h && n == nominees)
            .count();
        PartRun {
            estimated,
            median_abs_error_s: median(of(&self.estimate)),
            now_median_abs_error_s: median(of(&self.now)),
            longest_median_abs_error_s: median(of(&self.longest)),
            range_held_pct: match estimated {
                0 => 0.0,
                n => 100.0 * held as f64 / n as f64,
            },
        }
    }

    /// What they come to, with `unknown` pods never told a start.
    pub(crate) fn run(self, unknown: usize) -> EstimateRun {
        let estimated = self.estimate.len();
        let (line, nominees) = (self.part(false), self.part(true));
        EstimateRun {
            range_held_pct: if estimated == 0 {
                0.0
            } else {
                100.0 * self.held.iter().filter(|&&h| h).count() as f64 / estimated as f64
            },
            median_abs_error_s: median(self.estimate.clone()),
            median_signed_error_s: median(self.signed.clone()),
            now_median_abs_error_s: median(self.now.clone()),
            longest_median_abs_error_s: median(self.longest.clone()),
            alone_median_abs_error_s: median(self.alone.clone()),
            estimated,
            unknown,
            line,
            nominees,
            errors: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_noisy_and_mostly_over() {
        let e = Estimates::new(1.0);
        let factors: Vec<f64> = (0..2_000)
            .map(|i| e.declared(&format!("pod-{i}"), 100_000).unwrap() as f64 / 100_000.0)
            .collect();
        let over = factors.iter().filter(|f| **f > 1.0).count();
        assert!((1_400..1_700).contains(&over), "{over} of 2000 over");
        assert!(median(factors.clone()) > 1.3 && median(factors) < 1.7);
        assert_eq!(Estimates::new(0.0).declared("p", 1), None);
    }
}
