//! What a waiting pod is told of its start, one decision for the scheduler and the timeline
//! alike: the line (its first [`PROJECTED`] pods) is projected at most once every
//! [`PROJECT_EVERY_MS`], a pod is told from the projection that covers it ([`tell`]), and
//! when it starts, how its first projection turned out is learnt ([`FirstTold::learn`]). A
//! nominee is told when its victims are gone instead ([`nominee`]).

use super::Start;
use super::history::{Estimator, RunHistory};
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

/// A pod's first reckoned start: when, the projection's likeliest start and the drained
/// line's (before calibration), and its wait class ([`super::history::wait_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstTold {
    pub told_ms: i64,
    pub projected_ms: i64,
    pub drained_ms: Option<i64>,
    pub class: usize,
}

impl FirstTold {
    /// What the run history learns from it, the pod bound at `bound_ms`: how each
    /// estimator's wait turned out, and that a pod of its class left the line.
    pub fn learn(&self, runs: &mut RunHistory, bound_ms: i64) {
        let waited = |at: i64| (at - self.told_ms).max(0) as u64;
        let actual = waited(bound_ms);
        runs.waited(
            self.class,
            Estimator::Projected,
            waited(self.projected_ms),
            actual,
        );
        if let Some(d) = self.drained_ms {
            runs.waited(self.class, Estimator::Drained, waited(d), actual);
        }
        runs.waited(self.class, Estimator::Now, 0, actual);
        runs.left_line(self.class, bound_ms);
    }
}

/// What a pod is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Telling {
    /// The start as told (the earlier of the projection and the line's pace, its range
    /// holding both as their reckonings of the pod's class turned out); `None` where
    /// "now" did better lately: nothing is shown.
    pub span: Option<Span>,
    /// What to learn from when it starts.
    pub first: FirstTold,
}

/// What a pod of wait class `class`, whose start the line's projection put at `projected`,
/// with `ahead` pods of its class before it in the line, is told at `now_ms`: nothing to
/// learn from when the projected start is unknown or not after `now_ms` (room is not what
/// it waits for after all); else the earlier of the projection and the line's pace
/// ([`RunHistory::drained`], once known), each with the range [`RunHistory::calibrated`]
/// gives it, the range told holding both; nothing shown where "now" reckoned the class's
/// waits better lately than both ([`RunHistory::now_does_best`]).
pub fn tell(
    runs: &RunHistory,
    class: usize,
    projected: &Start,
    ahead: usize,
    now_ms: i64,
) -> Option<Telling> {
    let Start::At(span) = projected else {
        return None;
    };
    if span.at_ms <= now_ms {
        return None;
    }
    let drained = runs.drained(class, ahead, now_ms);
    let reckonings: &[Estimator] = match drained {
        Some(_) => &[Estimator::Projected, Estimator::Drained],
        None => &[Estimator::Projected],
    };
    let projection = runs.calibrated(class, Estimator::Projected, span.shifted(-now_ms));
    let told = match drained {
        Some(d) => earlier(projection, runs.calibrated(class, Estimator::Drained, d)),
        None => projection,
    };
    let shown = !runs.now_does_best(class, reckonings);
    Some(Telling {
        span: shown.then(|| told.shifted(now_ms)),
        first: FirstTold {
            told_ms: now_ms,
            projected_ms: span.at_ms,
            drained_ms: drained.map(|d| now_ms + d.at_ms),
            class,
        },
    })
}

/// After its victims are gone, how long a nominee takes at most to be decided again and
/// bound (ms): the deletion seen by the watch, the next attempt, the Binding on a loaded
/// server.
pub const NOMINEE_BIND_MS: i64 = 10_000;

/// What a nominee is told, its victims (the pods it preempted or reclaimed) gone by
/// `gone_by_ms` (the latest end of their grace periods, after which the kubelet kills
/// them): it starts then, sooner where they exit sooner, later by at most
/// [`NOMINEE_BIND_MS`]. Its wait is not the line's: nothing is learnt from it. `None` when
/// they are gone already (it is decided again at once).
pub fn nominee(gone_by_ms: i64, now_ms: i64) -> Option<Span> {
    (gone_by_ms > now_ms).then_some(Span {
        earliest_ms: now_ms,
        at_ms: gone_by_ms,
        latest_ms: gone_by_ms + NOMINEE_BIND_MS,
    })
}

/// The earlier of two reckonings, with a range that holds both: each has a known reason
/// to come late (the projection sees no eviction or arrival that frees room; the pace
/// counts every pod of the class ahead, those that will pass to other nodes too), and
/// what each could not know widens the range.
fn earlier(a: Span, b: Span) -> Span {
    Span {
        earliest_ms: a.earliest_ms.min(b.earliest_ms),
        at_ms: a.at_ms.min(b.at_ms),
        latest_ms: a.latest_ms.max(b.latest_ms),
    }
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
        assert_eq!(tell(&runs, 1, &Start::Unknown, 0, now), None);
        assert_eq!(tell(&runs, 1, &Start::At(Span::exactly(now)), 0, now), None);
        let told = tell(&runs, 1, &Start::At(Span::exactly(now + 60_000)), 0, now).unwrap();
        assert_eq!(told.span.map(|s| s.at_ms), Some(now + 60_000));
        assert_eq!(told.first.drained_ms, None);
        assert_eq!(told.first.projected_ms, now + 60_000);
        assert_eq!(told.first.told_ms, now);
        assert!(fresh(Some(now), now + PROJECT_EVERY_MS as i64 - 1));
        assert!(!fresh(Some(now), now + PROJECT_EVERY_MS as i64));
        assert!(!fresh(None, now));
    }

    #[test]
    fn a_nominee_is_told_its_victims_leaving() {
        let now = 5_000_000;
        let span = nominee(now + 30_000, now).unwrap();
        assert_eq!(span.at_ms, now + 30_000);
        assert!(span.holds(now + 1_000), "its victims may exit at once");
        assert!(span.holds(now + 30_000 + NOMINEE_BIND_MS));
        assert!(!span.holds(now + 30_000 + NOMINEE_BIND_MS + 1));
        assert_eq!(
            nominee(now, now),
            None,
            "gone already: decided again at once"
        );
    }

    #[test]
    fn the_earlier_of_projection_and_pace_is_told_with_a_range_holding_both() {
        let mut runs = RunHistory::default();
        let class = 3;
        let now = 10 * 3_600_000;
        // Eight 8-GPU pods left the line in the last 8 hours: one an hour.
        for h in 2..10 {
            runs.left_line(class, h * 3_600_000);
        }
        // Projected 20 hours out; two ahead: the pace says 3 hours, which is told.
        let projected = Start::At(Span::exactly(now + 20 * 3_600_000));
        let told = tell(&runs, class, &projected, 2, now).unwrap();
        let span = told.span.unwrap();
        assert_eq!(span.at_ms, now + 3 * 3_600_000);
        assert!(span.earliest_ms < span.at_ms);
        assert_eq!(
            span.latest_ms,
            now + 20 * 3_600_000,
            "the projection's in the range"
        );
        assert_eq!(told.first.drained_ms, Some(now + 3 * 3_600_000));
        assert_eq!(told.first.projected_ms, now + 20 * 3_600_000);
        // Projected sooner than the pace: the projection is told.
        let soon = Start::At(Span::exactly(now + 3_600_000));
        let told = tell(&runs, class, &soon, 2, now).unwrap();
        assert_eq!(told.span.unwrap().at_ms, now + 3_600_000);
        // Where pods of the class started at once, "now" did best: nothing is shown, and
        // what it was told is still learnt from.
        for _ in 0..10 {
            told.first.learn(&mut runs, now);
        }
        let told = tell(&runs, class, &projected, 2, now).unwrap();
        assert_eq!(told.span, None);
    }
}
