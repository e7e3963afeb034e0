//! Leaving pods as room that frees itself: a pod evicted for a preemptor that then started
//! elsewhere is, until its grace period ends, room a later preemptor waits for instead of
//! evicting another pod, as the scheduler's preemption counts a terminating pod promised to
//! no nominee.

use std::time::Duration;

use super::{Scenario, node, pod, secs};
use crate::timeline::options::Costs;

/// Three 4-GPU nodes: `blocker` (priority 9, leaves at 105 s), `low3` and `low1`
/// (priority 0, `low1` the newer); `high1` (priority 5) at 100 s evicts `low1` and, once
/// `blocker` leaves at 105 s, starts on its node while `low1` still has 25 s of grace;
/// `high2` (priority 5) arrives at 110 s; a last pod at 600 s keeps the replay going.
fn scenario() -> (Scenario, Vec<(u64, u32)>) {
    let s = Scenario {
        pods: vec![
            pod("blocker", 4, 105, 9, None),
            pod("low1", 4, 1_000, 0, None),
            pod("low3", 4, 1_000, 0, None),
            pod("high1", 4, 50, 5, None),
            pod("high2", 4, 50, 5, None),
        ],
        nodes: vec![node("a", 4), node("c", 4), node("d", 4)],
        preempt: true,
        costs: Costs {
            eviction_grace: Duration::from_secs(30),
            ..Costs::FREE
        },
        ..Scenario::default()
    };
    (
        s,
        vec![(0, 0), (0, 2), (1, 1), (100, 3), (110, 4), (600, 3)],
    )
}

#[test]
fn a_preemptor_waits_for_a_pod_leaving_for_no_one_instead_of_evicting_another() {
    let (s, arrivals) = scenario();
    for memo in [true, false] {
        let jobs = s.run_with(&arrivals, memo);
        let of = |pod: u32| jobs.iter().filter(move |j| j.pod == pod);
        let first = |pod: u32| of(pod).next().expect("a job of the pod");
        assert!(first(1).evicted, "low1 is high1's victim: {jobs:?}");
        assert_eq!(secs(first(3).start), Some(105), "high1 starts elsewhere");
        // low1 leaves at 130 s, promised to no one since 105 s: high2 waits for it.
        let high2 = first(4);
        assert_eq!(secs(high2.start), Some(130), "{jobs:?}");
        assert_eq!(high2.node, first(1).node, "on low1's node");
        assert!(of(2).all(|j| !j.evicted), "low3 keeps running: {jobs:?}");
    }
}
