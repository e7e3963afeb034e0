//! Which running pods may move: one rule for the scheduler and the timeline replay.
//!
//! A pod may move when it opted in, a controller re-creates it once evicted, it is bound
//! and not leaving (no Binding in flight, not deleting, not promised to a preemptor as a
//! victim), and it has run at least the minimum age (a pod whose start is unknown only
//! when there is no minimum). A gang moves only whole: every member running and each
//! allowed. The drivers say what they know of each pod; this decides.

use std::time::Duration;

/// What a driver knows of one running pod, to decide whether it may move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveCandidate {
    /// The pod opted in to being moved.
    pub opted_in: bool,
    /// A controller re-creates the pod once evicted.
    pub controlled: bool,
    /// Bound and running: its Binding is not in flight.
    pub bound: bool,
    /// Deleting, or promised to a preemptor as a victim.
    pub leaving: bool,
    /// How long it has run (`None`: its start is not known).
    pub age: Option<Duration>,
}

/// Whether `pod` itself may move (its gang aside) with `min_age` as the minimum age.
pub fn may_move(pod: &MoveCandidate, min_age: Duration) -> bool {
    let old_enough = min_age.is_zero() || pod.age.is_some_and(|age| age >= min_age);
    pod.opted_in && pod.controlled && pod.bound && !pod.leaving && old_enough
}

/// Whether a unit (one pod, or a gang) may move: its running members (`running` yields
/// whether each may move) are at least `min_member` (a gang's minimum; 1 for a pod), and
/// each may. A gang with fewer members running than its minimum (some finished) stays:
/// its replacements could never be scheduled together again.
pub fn unit_may_move(running: impl IntoIterator<Item = bool>, min_member: usize) -> bool {
    let mut count = 0;
    // The same whole-unit rule as a victim's.
    let whole = crate::preempt::unit_may_be_evicted(running.into_iter().inspect(|_| count += 1));
    whole && count >= min_member
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> MoveCandidate {
        MoveCandidate {
            opted_in: true,
            controlled: true,
            bound: true,
            leaving: false,
            age: Some(Duration::from_secs(60)),
        }
    }

    #[test]
    fn a_pod_moves_only_when_every_condition_holds() {
        let min = Duration::from_secs(30);
        assert!(may_move(&pod(), min));
        for changed in [
            MoveCandidate {
                opted_in: false,
                ..pod()
            },
            MoveCandidate {
                controlled: false,
                ..pod()
            },
            MoveCandidate {
                bound: false,
                ..pod()
            },
            MoveCandidate {
                leaving: true,
                ..pod()
            },
            MoveCandidate {
                age: Some(Duration::from_secs(29)),
                ..pod()
            },
            MoveCandidate { age: None, ..pod() },
        ] {
            assert!(!may_move(&changed, min), "{changed:?}");
        }
        assert!(may_move(
            &MoveCandidate { age: None, ..pod() },
            Duration::ZERO
        ));
    }

    #[test]
    fn a_unit_moves_only_whole_and_never_empty() {
        assert!(unit_may_move([true, true], 2));
        assert!(!unit_may_move([true, false], 2));
        assert!(!unit_may_move([], 0));
        // One member of a gang of two finished: the other stays.
        assert!(!unit_may_move([true], 2));
        assert!(unit_may_move([true], 1));
    }
}
