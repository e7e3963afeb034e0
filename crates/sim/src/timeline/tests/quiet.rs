//! Quiet turns (`engine/quiet.rs`): a flush's attempt counted instead of made only where
//! it would fail, so that the replay starts, evicts and places every pod as the one that
//! makes every attempt, with the same attempt counts (the run's and each pod's), rounds and
//! recorded figures, also where instants with only quiet turns pass without a round.

use crate::timeline::engine::quiet::{QUIET_INSTANTS, QUIET_TURNS};
use crate::timeline::options::Costs;
use crate::timeline::{Timeline, TimelineOptions};

/// Seeded stress: pods of three priorities (so that preemption's room check decides some
/// turns), a backlog, four policies, without preemption, with it and the default costs,
/// and with it and a 20-s bind latency (a victim's Binding landing wakes nobody: a flush
/// then finds a plan where the room check passes, so a turn that skipped that check
/// would be quiet where the attempt evicts).
#[test]
fn quiet_turns_decide_and_count_exactly_as_every_attempt_made() {
    let mut workload = crate::builtin_workload(24);
    for (i, p) in workload.pods.iter_mut().enumerate() {
        p.priority = (i % 3) as i32;
    }
    let (mut cases, mut waited) = (0, 0);
    let before = QUIET_TURNS.with(|c| c.get());
    let instants_before = QUIET_INSTANTS.with(|c| c.get());
    let slow_binds = Costs {
        bind_latency: std::time::Duration::from_secs(20),
        ..Costs::default()
    };
    for (preempt, costs) in [
        (false, Costs::default()),
        (true, Costs::default()),
        (true, slow_binds),
    ] {
        let timeline = Timeline::new(
            workload.clone(),
            TimelineOptions {
                arrivals: 2_000,
                load: 1.3,
                preempt,
                costs,
                ..TimelineOptions::default()
            },
        )
        .expect("timeline");
        for seed in 0..4u64 {
            for policy in super::STRESSED {
                let (with, without) =
                    super::with_and_without(&timeline, policy, seed, 200, |e| e.without_quiet());
                let what = format!("{policy} seed {seed} preempt {preempt} {costs:?}");
                assert_eq!(with.jobs, without.jobs, "{what}");
                assert_eq!(with.attempts, without.attempts, "{what}");
                assert_eq!(with.failed_attempts, without.failed_attempts, "{what}");
                assert_eq!(with.rounds, without.rounds, "{what}");
                assert_eq!(with.preempted_pods, without.preempted_pods, "{what}");
                // The integrals and the series, to the last bit (instants passed without
                // a round still advance the recorder).
                let (a, b) = (
                    format!("{:?}", with.recorder),
                    format!("{:?}", without.recorder),
                );
                assert!(a == b, "{what}: the recorders differ");
                waited += with.jobs.iter().filter(|j| j.failed_attempts > 1).count();
                cases += 1;
            }
        }
    }
    let quiet = QUIET_TURNS.with(|c| c.get()) - before;
    let instants = QUIET_INSTANTS.with(|c| c.get()) - instants_before;
    println!(
        "{cases} cases, {waited} pods tried more than once, {quiet} quiet turns, \
         {instants} instants passed without a round"
    );
    assert!(
        instants >= 10_000,
        "too few instants passed to judge: {instants}"
    );
    assert!(quiet >= 10_000, "too few quiet turns to judge: {quiet}");
    assert!(waited >= 1_000, "too few pods waited long: {waited}");
}
