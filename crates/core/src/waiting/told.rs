//! What a waiting pod is told of its start, one decision for the scheduler and the timeline
//! alike: the line (its first [`PROJECTED`] pods) is projected at most once every
//! [`PROJECT_EVERY_MS`], a pod is told from the projection that covers it ([`tell`]), and
//! when it starts, how its first projection turned out is learnt ([`FirstTold::learn`]).

use super::Start;
use super::history::RunHistory;
use super::start::Span;

/// Pods of the line projected at most (pods further back are told nothing).
pub const PROJECTED: usize = 2_048;
/// Pods ahead a pod projected on its own nodes is put behind at most.
pub const AHEAD_OF_MASKED: usize = 256;
/// How long a projection of the line is kept before the line is projected again (ms):
/// projecting reads every running pod and plays the line out
/// [`super::start::PLAYS`] times, and an estimate of minutes to hours does not need it
/// more often. A pod that joins the line in between is told at the next projection.
pub const PROJECT_EVERY_MS: u64 = 10_000;

/// A pod's first projected start: when it was told, the projection's likeliest start
/// (before calibration), and its wait class ([`super::history::wait_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstTold {
    pub told_ms: i64,
    pub projected_ms: i64,
    pub class: usize,
}

impl FirstTold {
    /// What the run history learns from it, the pod bound at `bound_ms`: the projected
    /// wait and the actual one.
    pub fn learn(&self, runs: &mut RunHistory, bound_ms: i64) {
        let waited = |at: i64| (at - self.told_ms).max(0) as u64;
        runs.waited(self.class, waited(self.projected_ms), waited(bound_ms));
    }
}

/// What a pod is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Telling {
    /// The start as told: the projection, its range from how projections of the pod's
    /// class turned out.
    pub span: Span,
    /// What to learn from when it starts.
    pub first: FirstTold,
}

/// What a pod of wait class `class`, whose start the line's projection put at `projected`,
/// is told at `now_ms`: nothing when the start is unknown (it cannot beat "unknown") or not
/// after `now_ms` (room is not what it waits for after all); else the projection, with the
/// range [`RunHistory::calibrated`] gives it.
pub fn tell(runs: &RunHistory, class: usize, projected: &Start, now_ms: i64) -> Option<Telling> {
    let Start::At(span) = projected else {
        return None;
    };
    if span.at_ms <= now_ms {
        return None;
    }
    let wait = span.shifted(-now_ms);
    Some(Telling {
        span: runs.calibrated(class, wait).shifted(now_ms),
        first: FirstTold {
            told_ms: now_ms,
            projected_ms: span.at_ms,
            class,
        },
    })
}

/// Whether a projection made at `made_ms` is still kept at `now_ms`.
pub fn fresh(made_ms: Option<i64>, now_ms: i64) -> bool {
    made_ms.is_some_and(|m| kept_after(now_ms.saturating_sub(m).max(0) as u64))
}

/// Whether a projection made `elapsed_ms` ago is still kept (for a driver on a monotonic
/// clock).
pub fn kept_after(elapsed_ms: u64) -> bool {
    elapsed_ms < PROJECT_EVERY_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_told_only_a_start_to_come() {
        let runs = RunHistory::default();
        let now = 1_000_000;
        assert_eq!(tell(&runs, 1, &Start::Unknown, now), None);
        assert_eq!(tell(&runs, 1, &Start::At(Span::exactly(now)), now), None);
        let told = tell(&runs, 1, &Start::At(Span::exactly(now + 60_000)), now).unwrap();
        assert_eq!(told.span.at_ms, now + 60_000);
        assert_eq!(told.first.projected_ms, now + 60_000);
        assert_eq!(told.first.told_ms, now);
        assert!(fresh(Some(now), now + PROJECT_EVERY_MS as i64 - 1));
        assert!(!fresh(Some(now), now + PROJECT_EVERY_MS as i64));
        assert!(!fresh(None, now));
    }
}
