//! The differential test: seeded random scenarios through the scheduler stack (its rounds
//! on the in-memory API, the replay writing what kubelets would) and through
//! `gpuplace simulate --timeline`, every pod the same on both sides (start, node, devices,
//! end, evicted). A scenario draws its policy, cluster size, load, priorities, queues with
//! guarantees and limits, gangs, movable pods with make-room and rebalancing (minimum ages
//! and fragmentation thresholds), and costs (grace periods, during which a preemptor waits
//! nominated; re-creation; start times). The test counts each kind of decision it compared
//! and fails when a kind was not exercised enough, and a second test changes one policy
//! constant on the stack's side only and fails unless the comparison notices.
//!
//! `GPUPLACE_DIFF_SEEDS` sets how many scenarios (500 by default), `GPUPLACE_DIFF_FROM` the
//! first seed. To look into a difference: `GPUPLACE_DIFF_OFF=grace,gangs,...` turns
//! features off (grace, recreate, start, gangs, queues, limits, priorities, defrag, age,
//! threshold), `GPUPLACE_DIFF_AT=<ms>` lists the pods around a time, `GPUPLACE_DIFF_NODE`
//! every pod of a node, `GPUPLACE_DIFF_SHOW=<job>,<job>` chosen jobs; `GPUPLACE_DIFF_WHY`
//! prints the first difference of the listed seeds too; `GPUPLACE_DIFF_LOG=<filter>` (e.g.
//! `gpuplace_scheduler=debug`) prints the stack's logs.

use std::time::Duration;

use futures::StreamExt;
use gpuplace_core::Policy;
use gpuplace_testkit::timeline::{StackCosts, StackNodes};
use rand::{RngExt, SeedableRng};

use super::both::{Both, Mutant, Priorities, QueueSetup, Scenario, replay_both};

/// Seeds of the first 500 whose scenario still differs, by cause (see
/// docs/timeline.md, "The differential test"). Every other seed must agree; a seed listed
/// here that agrees is reported, to be taken off.
const KNOWN_DIFFERENT: &[u64] = &[];

/// The scenario of `seed`.
pub fn scenario(seed: u64) -> Scenario {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xd1ff_0000);
    let policies = Policy::ALL;
    let policy = policies[rng.random_range(0..policies.len())];
    let mut s = Scenario::plain(policy, seed);
    s.stack_nodes = StackNodes::Replayed;
    s.nodes = rng.random_range(3..=8);
    s.arrivals = rng.random_range(30..=90);
    s.load = [0.9, 1.1, 1.3][rng.random_range(0..3)];
    // The scheduler always preempts (the simulator's default too).
    s.preempt = true;
    s.priorities = if rng.random_bool(0.6) {
        Priorities::Hashed {
            levels: rng.random_range(2..=3),
            salt: rng.random(),
        }
    } else {
        Priorities::Off
    };
    if rng.random_bool(0.4) {
        s.queues = queues(&mut rng);
    }
    s.gangs = rng.random_bool(0.35);
    s.make_room = rng.random_bool(0.35);
    s.rebalance = rng.random_bool(0.3);
    s.movable = [0.3, 0.5, 0.8][rng.random_range(0..3)];
    s.min_age = Duration::from_secs([0, 60, 600][rng.random_range(0..3)]);
    s.rebalance_threshold = [0.0, 0.02, 0.1][rng.random_range(0..3)];
    s.costs = StackCosts {
        grace_ms: [0, 5_000, 30_000][rng.random_range(0..3)],
        recreate_ms: [0, 1_000, 10_000][rng.random_range(0..3)],
        start_ms: [0, 2_000, 20_000][rng.random_range(0..3)],
    };
    turn_off(
        &mut s,
        &std::env::var("GPUPLACE_DIFF_OFF").unwrap_or_default(),
    );
    s
}

/// Features of `s` named in `off` (comma-separated) turned off, to find what a difference
/// turns on.
fn turn_off(s: &mut Scenario, off: &str) {
    for what in off.split(',') {
        match what {
            "grace" => s.costs.grace_ms = 0,
            "recreate" => s.costs.recreate_ms = 0,
            "start" => s.costs.start_ms = 0,
            "gangs" => s.gangs = false,
            "queues" => s.queues.clear(),
            "limits" => s.queues.iter_mut().for_each(|q| q.limit_pct = None),
            "priorities" => s.priorities = Priorities::Off,
            "defrag" => (s.make_room, s.rebalance) = (false, false),
            "age" => s.min_age = Duration::ZERO,
            "threshold" => s.rebalance_threshold = 0.0,
            _ => {}
        }
    }
}

/// Two or three queues: guarantees that may add up to less than all, a limit on some.
fn queues(rng: &mut impl RngExt) -> Vec<QueueSetup> {
    let names = ["busy", "quiet", "batch"];
    let count = rng.random_range(2..=3);
    let shares = [0.6, 0.3, 0.1];
    (0..count)
        .map(|q| {
            let guaranteed_pct =
                [20, 30, 50][rng.random_range(0..3)] / if count == 3 { 2 } else { 1 };
            QueueSetup {
                name: names[q],
                guaranteed_pct,
                limit_pct: rng
                    .random_bool(0.4)
                    .then(|| guaranteed_pct + [10, 30, 50][rng.random_range(0..3)]),
                share: if count == 2 { [0.8, 0.2][q] } else { shares[q] },
            }
        })
        .collect()
}

/// How many of each kind of decision the comparisons held the same.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub scenarios: usize,
    pub pods: usize,
    pub placed: usize,
    pub waited: usize,
    /// Pods evicted for a higher-priority pod or reclaimed for another queue.
    pub preempted: usize,
    /// Evictions in scenarios with queues (reclaim is among the steps that made them).
    pub evicted_with_queues: usize,
    /// Pods moved (make-room or rebalancing).
    pub moved: usize,
    /// Pods placed the moment an evicted pod's grace period ended (a nominee's start).
    pub placed_after_grace: usize,
    /// Gang members placed.
    pub gang_members_placed: usize,
    /// Pods placed in a scenario whose queues have a limit.
    pub placed_under_limits: usize,
    /// Replacements (a controller's new pod) placed.
    pub replacements_placed: usize,
}

impl Counts {
    fn add(&mut self, s: &Scenario, both: &Both) {
        let jobs = &both.jobs;
        let within =
            |t: Option<gpuplace_sim::timeline::options::Ms>| t.is_some_and(|t| t.0 <= both.end_ms);
        self.scenarios += 1;
        self.pods += jobs.len();
        let placed: Vec<_> = jobs.iter().filter(|j| within(j.start)).collect();
        self.placed += placed.len();
        self.waited += placed.iter().filter(|j| j.start > Some(j.arrival)).count();
        self.preempted += both.run.preempted_pods;
        if !s.queues.is_empty() {
            self.evicted_with_queues += jobs.iter().filter(|j| j.evicted).count();
        }
        self.moved += both.run.moved_pods as usize;
        let grace_ends: std::collections::HashSet<u64> = jobs
            .iter()
            .filter(|j| j.evicted && s.costs.grace_ms > 0)
            .filter_map(|j| j.end.map(|e| e.0 + s.costs.grace_ms))
            .collect();
        self.placed_after_grace += placed
            .iter()
            .filter(|j| j.start.is_some_and(|t| grace_ends.contains(&t.0)))
            .count();
        self.gang_members_placed += placed
            .iter()
            .filter(|j| both.pods[j.pod as usize].gang.is_some())
            .count();
        if s.queues.iter().any(|q| q.limit_pct.is_some()) {
            self.placed_under_limits += placed.len();
        }
        self.replacements_placed += placed.iter().filter(|j| j.replaces.is_some()).count();
    }

    /// The kinds with fewer than `floor` decisions.
    fn short_of(&self, floor: usize) -> Vec<(&'static str, usize)> {
        [
            ("waited", self.waited),
            ("preempted", self.preempted),
            ("evicted_with_queues", self.evicted_with_queues),
            ("moved", self.moved),
            ("placed_after_grace", self.placed_after_grace),
            ("gang_members_placed", self.gang_members_placed),
            ("placed_under_limits", self.placed_under_limits),
            ("replacements_placed", self.replacements_placed),
        ]
        .into_iter()
        .filter(|(_, n)| *n < floor)
        .collect()
    }
}

/// Scenario `s` on both sides: the first difference, if any.
async fn compare(s: &Scenario) -> (Both, Option<String>) {
    if std::env::var_os("GPUPLACE_DIFF_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::from_env("GPUPLACE_DIFF_LOG");
        let logs = tracing_subscriber::fmt().with_env_filter(filter);
        let _ = logs.with_writer(std::io::stderr).try_init();
    }
    let both = replay_both(s).await;
    let Some((at, what)) = both.first_difference() else {
        return (both, None);
    };
    let mut more = format!("\naround it:\n{}", both.around(at));
    if let Ok(node) = std::env::var("GPUPLACE_DIFF_NODE") {
        more += &format!("\non {node}:\n{}", both.on_node(&node, 0));
    }
    if let Some(t) = env_u64("GPUPLACE_DIFF_AT") {
        more += &format!("\nat {t}:\n{}", both.around(t));
    }
    if let Ok(show) = std::env::var("GPUPLACE_DIFF_SHOW") {
        for k in show.split(',').filter_map(|k| k.parse::<usize>().ok()) {
            if let Some(j) = both.jobs.get(k) {
                more += &format!(
                    "\njob {k} (unit {}, arrived {}, replaces {:?}): simulator {:?}, stack {:?}",
                    j.unit,
                    j.arrival.0,
                    j.replaces,
                    both.sim(k),
                    both.stack(k)
                );
            }
        }
    }
    let why = format!(
        "seed {} ({s:?}): first difference at {at} ms: {what}{more}",
        s.seed
    );
    (both, Some(why))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The scenarios `seeds`, one after the other (the test binary runs other tests beside this
/// one: two at a time starved the openb replay's device plugins past their 180-s
/// registration bound in CI): each seed's scenario and what the comparison found.
async fn compare_seeds(
    seeds: impl Iterator<Item = u64>,
    make: impl Fn(u64) -> Scenario,
) -> Vec<(Scenario, Both, Option<String>)> {
    let scenarios: Vec<Scenario> = seeds.map(make).collect();
    let mut out: Vec<(Scenario, Both, Option<String>)> =
        futures::stream::iter(scenarios.into_iter().map(|s| async move {
            let (both, diff) = compare(&s).await;
            (s, both, diff)
        }))
        .buffered(1)
        .collect()
        .await;
    out.sort_by_key(|(s, _, _)| s.seed);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_and_the_timeline_decide_the_same_in_every_seeded_scenario() {
    let from = env_u64("GPUPLACE_DIFF_FROM").unwrap_or(0);
    let seeds = env_u64("GPUPLACE_DIFF_SEEDS").unwrap_or(500);
    let started = std::time::Instant::now();
    let results = compare_seeds(from..from + seeds, scenario).await;
    let mut counts = Counts::default();
    let (mut differ, mut known, mut now_same) = (Vec::new(), Vec::new(), Vec::new());
    for (s, both, diff) in &results {
        let listed = KNOWN_DIFFERENT.contains(&s.seed);
        match diff {
            None if listed => now_same.push(s.seed),
            None => counts.add(s, both),
            Some(why) if listed => {
                if std::env::var_os("GPUPLACE_DIFF_WHY").is_some() {
                    println!("{why}\n");
                }
                known.push(s.seed);
            }
            Some(why) => {
                println!("{why}\n");
                differ.push(s.seed);
            }
        }
    }
    println!(
        "{seeds} scenarios from seed {from} in {:.1} s; the same in {}: {counts:?}",
        started.elapsed().as_secs_f64(),
        counts.scenarios
    );
    println!("known to differ, still: {known:?}; now the same (take off the list): {now_same:?}");
    assert!(differ.is_empty(), "{} differ: {differ:?}", differ.len());
    if seeds >= 500 {
        let short = counts.short_of(100);
        assert!(
            short.is_empty(),
            "kinds of decision compared fewer than 100 times: {short:?}"
        );
    }
}

/// Seeds past the CI's 500 that differed until a mend of theirs (2026-12-07): a moved
/// pod's replacement held to its queue's limit (842, 1418, 1836), a moved gang's
/// replacements bound one by one (2269), a replacement bound only after its leaving pods'
/// grace period where something else freed its place first (1044, 2051), its place's
/// owed part counted apart from the nominee's on the same node (665, 1710), and a
/// replacement bound past the replay's end (1524, 2518), its move then not counted in
/// flight or in its queue (1613, 7521); and (2026-12-08) a pod decided in a round not
/// offered as a victim in a second round at the same instant, where the scheduler's next
/// round sees its Binding landed (1076, 3178, 3350, 8007, 8544, 10339, 11599, 13839,
/// 15466); and the scheduler skipping rebalancing's look in a round where nothing changed,
/// which the timeline makes (2023, 2786, 4385, 4432, 4689, 4704, 4727, 5661, 6996, 7368,
/// 7458, 8133, 9677, 10297, 10516, 12326, 13828, 14064, 15957, 16372, 16534, 16849, 17850,
/// 18297, 19085).
const MENDED: &[u64] = &[
    665, 842, 1044, 1076, 1418, 1524, 1613, 1710, 1836, 2023, 2051, 2269, 2518, 2786, 3178, 3350,
    4385, 4432, 4689, 4704, 4727, 5661, 6996, 7368, 7458, 7521, 8007, 8133, 8544, 9677, 10297,
    10339, 10516, 11599, 12326, 13828, 13839, 14064, 15466, 15957, 16372, 16534, 16849, 17850,
    18297, 19085,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_mended_past_the_ci_range_decide_the_same() {
    let results = compare_seeds(MENDED.iter().copied(), scenario).await;
    let differ: Vec<String> = results
        .into_iter()
        .filter_map(|(_, _, diff)| diff)
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
}

/// What a mutant needs of a scenario to be noticed at all.
type Wanted = fn(&Scenario) -> bool;

/// Seeds from 0 whose scenario has what `wanted` asks, `count` of them.
fn seeds_with(count: usize, wanted: impl Fn(&Scenario) -> bool) -> Vec<u64> {
    (0..)
        .filter(|&seed| !KNOWN_DIFFERENT.contains(&seed) && wanted(&scenario(seed)))
        .take(count)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_constant_changed_on_one_side_is_noticed() {
    let mutants: [(Mutant, Wanted); 3] = [
        (Mutant::RebalanceThreshold(1.0), |s| s.rebalance),
        (Mutant::MinAge(Duration::from_secs(120)), |s| {
            s.make_room || s.rebalance
        }),
        (Mutant::QueueLimit(20), |s| {
            s.queues.iter().any(|q| q.limit_pct.is_some())
        }),
    ];
    for (mutant, wanted) in mutants {
        let seeds = seeds_with(40, wanted);
        let results = compare_seeds(seeds.iter().copied(), |seed| Scenario {
            mutant: Some(mutant),
            ..scenario(seed)
        })
        .await;
        let noticed: Vec<u64> = results
            .iter()
            .filter(|(_, _, diff)| diff.is_some())
            .map(|(s, _, _)| s.seed)
            .collect();
        println!(
            "{mutant:?} on the stack's side: {} of {} scenarios differ (seeds {noticed:?})",
            noticed.len(),
            seeds.len()
        );
        assert!(
            !noticed.is_empty(),
            "{mutant:?} went unnoticed in {seeds:?}"
        );
    }
}
