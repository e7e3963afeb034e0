//! The failure memos (a request that fits nowhere; preemption's searches node by node,
//! `engine/node_plans.rs`) decide exactly as searching every node on every attempt.

use gpuplace_core::Policy;

use super::{Scenario, node, pod, secs};
use crate::timeline::engine::Job;
use crate::timeline::options::Costs;
use crate::timeline::{Timeline, TimelineOptions};

#[test]
fn the_failure_memo_decides_exactly_as_a_full_search() {
    let workload = crate::builtin_workload(16);
    let timeline = Timeline::new(
        workload,
        TimelineOptions {
            arrivals: 3_000,
            load: 1.1,
            ..TimelineOptions::default()
        },
    )
    .expect("timeline");
    for policy in [Policy::Fgd, Policy::BestFit] {
        let (with, without) = with_and_without_memo(&timeline, policy, 7);
        assert!(with.iter().any(|j| j.start.is_some_and(|s| s > j.arrival)));
        assert_eq!(with, without, "{policy}");
    }
}

/// The replay of `seed`'s arrivals by `policy`, with the failure memos (fits, and
/// preemption's searches node by node) and with every node searched on every attempt.
fn with_and_without_memo(timeline: &Timeline, policy: Policy, seed: u64) -> (Vec<Job>, Vec<Job>) {
    let (with, without) =
        super::with_and_without(timeline, policy, seed, 600, |e| e.without_memo());
    (with.jobs, without.jobs)
}

/// A victim whose Binding has not landed is no candidate yet; once it lands, with
/// nothing else changed on its node, the preemptor's retry (its 5-minute flush; `blip`
/// keeps the replay going past it) must search that node again (`node_plans` does not
/// remember a node with a Binding in flight).
#[test]
fn a_node_whose_pod_was_not_yet_bound_is_searched_again_once_it_is() {
    let s = Scenario {
        pods: vec![
            pod("low", 8, 10_000, 0, None),
            pod("high", 8, 100, 1, None),
            pod("blip", 1, 10, 0, None),
        ],
        nodes: vec![node("a", 8), node("b", 1)],
        preempt: true,
        costs: Costs {
            bind_latency: std::time::Duration::from_secs(5),
            ..Costs::FREE
        },
        ..Scenario::default()
    };
    // low decided at 0 s, bound at 5 s; high arrives at 1 s: low is no victim yet.
    let runs = [true, false].map(|memo| s.run_with(&[(0, 0), (1, 1), (600, 2)], memo));
    assert_eq!(runs[0], runs[1]);
    let jobs = &runs[0];
    assert!(jobs[0].evicted, "{jobs:?}");
    assert!(secs(jobs[1].start).is_some_and(|t| t < 600), "{jobs:?}");
}

/// Seeded stress of preemption's memo (`engine/node_plans.rs`): pods of three priorities
/// on a small sample, under a backlog, every policy; the replay with the memo must start,
/// evict and place every pod as the one that searches every node on every attempt, and
/// the memo must have spared searches and had its kept plans win (both counted).
#[test]
fn preemptions_node_memo_decides_exactly_as_searching_every_node() {
    let mut workload = crate::builtin_workload(24);
    for (i, p) in workload.pods.iter_mut().enumerate() {
        p.priority = (i % 3) as i32;
    }
    let timeline = Timeline::new(
        workload,
        TimelineOptions {
            arrivals: 2_000,
            load: 1.2,
            preempt: true,
            ..TimelineOptions::default()
        },
    )
    .expect("timeline");
    let (mut evicted, mut cases) = (0, 0);
    use crate::timeline::engine::node_plans::{KEPT_WON, SPARED};
    let skipped_before = SPARED.with(|s| s.get());
    let won_before = KEPT_WON.with(|k| k.get());
    for seed in 0..6u64 {
        for policy in super::STRESSED {
            let (with, without) = with_and_without_memo(&timeline, policy, seed);
            // The first job that differs, not two lists of thousands.
            let first = (0..with.len().max(without.len())).find(|&i| with.get(i) != without.get(i));
            assert!(
                first.is_none(),
                "{policy} seed {seed}: job {first:?} with the memo {:?}, without {:?}",
                first.and_then(|i| with.get(i)),
                first.and_then(|i| without.get(i))
            );
            evicted += with.iter().filter(|j| j.evicted).count();
            cases += 1;
        }
    }
    let skipped = SPARED.with(|s| s.get()) - skipped_before;
    let won = KEPT_WON.with(|k| k.get()) - won_before;
    println!(
        "{cases} cases, {evicted} pods evicted, {skipped} node searches spared, \
         {won} won by a kept plan"
    );
    assert!(won >= 100, "kept plans won too rarely to judge: {won}");
    assert!(evicted >= 100, "too few preemptions to judge: {evicted}");
    assert!(
        skipped >= 1_000,
        "the memo spared too little to judge: {skipped}"
    );
}
