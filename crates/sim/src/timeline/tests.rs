//! The event loop on hand-made scenarios: the scheduler's queue rules, gangs, preemption,
//! and (in `memo`) the failure memos deciding exactly as a full search.

use std::sync::Arc;

use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_model::{NodeInventory, Request};

use super::arrivals::{Arrival, Mix, Schedule, Warm};
use super::engine::{Engine, Inputs, Job};
use super::options::{Costs, DefragMode, DefragSim, Patience};
use super::{DurationModel, Ms, TimelineOptions};
use crate::trace::TracePod;

fn pod(name: &str, gpus: u32, seconds: u64, priority: i32, gang: Option<&str>) -> TracePod {
    TracePod {
        name: name.into(),
        priority,
        request: Request {
            cpu_milli: 1_000,
            memory_mib: 1_000,
            gpu_count: gpus,
            gpu_milli: 1_000,
            allowed_models: vec![],
            need: Default::default(),
        },
        duration_s: Some(seconds),
        gang: gang.map(str::to_string),
    }
}

mod costs;
mod freeing;
mod memo;
mod quiet;

/// The policies the seeded stresses of a memo or shortcut replay under.
const STRESSED: [Policy; 4] = [
    Policy::Fgd,
    Policy::BestFit,
    Policy::Random,
    Policy::DotProd,
];

/// `seed`'s arrivals replayed by `policy` twice, measured from arrival `warmup`: as the
/// engine runs, and with `reference` applied to it (a memo or shortcut turned off, which
/// must change nothing).
fn with_and_without(
    timeline: &super::Timeline,
    policy: Policy,
    seed: u64,
    warmup: usize,
    reference: fn(Engine<'_>) -> Engine<'_>,
) -> (super::engine::Outcome, super::engine::Outcome) {
    let schedule = timeline.schedule(seed);
    let run = |plain: bool| {
        let engine = timeline.engine(policy, seed);
        let engine = if plain { engine } else { reference(engine) };
        engine.run(&schedule, warmup, 10)
    };
    (run(true), run(false))
}

struct Scenario {
    pods: Vec<TracePod>,
    nodes: Vec<NodeInventory>,
    preempt: bool,
    costs: Costs,
    checkpointed: bool,
    patience: Patience,
    /// Units running at t=0 (template, share of the run left).
    warm: Vec<(u32, f64)>,
    /// Share of pods that declare their run time.
    declared_share: f64,
    policy: Policy,
    kube_queue_tick: std::time::Duration,
    warm_pending_due: bool,
}

impl Default for Scenario {
    /// No pods and no nodes; every step of carrying a decision out instant.
    fn default() -> Self {
        Scenario {
            pods: Vec::new(),
            nodes: Vec::new(),
            preempt: false,
            costs: Costs::FREE,
            checkpointed: false,
            patience: Patience::Off,
            warm: Vec::new(),
            declared_share: 0.0,
            policy: Policy::BestFit,
            kube_queue_tick: std::time::Duration::from_secs(1),
            warm_pending_due: false,
        }
    }
}

impl Scenario {
    /// Runs arrivals `(second, pod index)` (each pod its own unit unless in a gang).
    fn run(&self, arrivals: &[(u64, u32)]) -> Vec<Job> {
        self.run_with(arrivals, true)
    }

    fn run_with(&self, arrivals: &[(u64, u32)], memo: bool) -> Vec<Job> {
        self.run_options(arrivals, memo, DefragSim::default())
    }

    fn run_options(&self, arrivals: &[(u64, u32)], memo: bool, defrag: DefragSim) -> Vec<Job> {
        self.run_all(arrivals, memo, defrag, None).jobs
    }

    fn run_all(
        &self,
        arrivals: &[(u64, u32)],
        memo: bool,
        defrag: DefragSim,
        tenants: Option<&super::tenants::Tenants>,
    ) -> super::engine::Outcome {
        let model = DurationModel {
            min_s: 1.0,
            ..DurationModel::default()
        };
        let mix = Mix::new(&self.pods, &model);
        let ids: Vec<u32> = (0..self.pods.len() as u32).collect();
        let mut state = ClusterState::new(self.nodes.clone()).expect("cluster");
        state.set_workload(Arc::new(TargetWorkload::from_requests(
            self.pods.iter().map(|p| &p.request),
            0.95,
        )));
        let options = TimelineOptions {
            preempt: self.preempt,
            defrag,
            costs: self.costs,
            checkpointed: self.checkpointed,
            patience: self.patience,
            declared_share: self.declared_share,
            kube_queue_tick: self.kube_queue_tick,
            warm_pending_due: self.warm_pending_due,
            ..TimelineOptions::default()
        };
        let schedule = Schedule {
            warm: self
                .warm
                .iter()
                .map(|&(template, left)| Warm { template, left })
                .collect(),
            arrivals: arrivals
                .iter()
                .map(|&(s, template)| Arrival {
                    at: Ms(s * 1000),
                    template,
                })
                .collect(),
            rate_per_s: 0.0,
        };
        let engine = Engine::new(
            Inputs {
                pods: &self.pods,
                mix: &mix,
                request_ids: &ids,
            },
            state,
            Placer::new(self.policy, 1),
            &options,
            tenants,
            1,
        );
        let engine = if memo { engine } else { engine.without_memo() };
        engine.run(&schedule, 0, 10)
    }
}

/// Two 8-GPU nodes where x and z (4 GPUs, 10,000 s) hold half of each once y (4 GPUs,
/// 50 s) has left, so that big (8 GPUs) fits nowhere; with [`HALVES`]'s arrivals.
fn halves() -> Scenario {
    Scenario {
        pods: vec![
            pod("x", 4, 10_000, 0, None),
            pod("y", 4, 50, 0, None),
            pod("z", 4, 10_000, 0, None),
            pod("big", 8, 100, 0, None),
        ],
        nodes: vec![node("a", 8), node("b", 8)],
        ..Scenario::default()
    }
}

/// Defragmentation `mode` with every pod movable (the other settings the defaults).
fn moving_all(mode: DefragMode) -> DefragSim {
    let mut defrag = DefragSim {
        movable: 1.0,
        ..DefragSim::default()
    };
    defrag.settings.mode = mode;
    defrag
}

/// x and y at 0 s, z at 1 s, big at 400 s, a marker (y again) at 1,000 s.
const HALVES: [(u64, u32); 5] = [(0, 0), (0, 1), (1, 2), (400, 3), (1_000, 1)];

fn node(name: &str, gpus: u32) -> NodeInventory {
    NodeInventory::uniform(name, 64_000, 1 << 20, gpus, "T4")
}

fn secs(ms: Option<Ms>) -> Option<u64> {
    ms.map(|m| m.0 / 1000)
}

#[test]
fn a_pod_that_fits_nowhere_waits_parked_until_something_leaves() {
    let s = Scenario {
        pods: vec![pod("big", 8, 100, 0, None), pod("small", 1, 50, 0, None)],
        nodes: vec![node("n", 8)],
        preempt: false,
        ..Scenario::default()
    };
    // big runs 0..100 s; small arrives at 10 s, fails, is parked (its 1 s backoff ends at
    // 11 s but nothing wakes it), and starts when big leaves; the run ends at the last
    // arrival (a marker at 200 s).
    let jobs = s.run(&[(0, 0), (10, 1), (200, 0)]);
    assert_eq!(secs(jobs[0].start), Some(0));
    assert_eq!(secs(jobs[0].end), Some(100));
    assert_eq!(secs(jobs[1].start), Some(100), "woken by the departure");
    assert_eq!(secs(jobs[1].end), Some(150));
}

#[test]
fn a_woken_pod_is_due_a_second_after_its_last_attempt() {
    let s = Scenario {
        pods: vec![
            pod("a", 8, 2, 0, None),
            pod("b", 8, 1, 0, None),
            pod("small", 1, 50, 0, None),
        ],
        nodes: vec![node("n", 8)],
        preempt: false,
        ..Scenario::default()
    };
    // At 0 s: a starts; b and small fail (backoff 1 s, parked). At 2 s a leaves and wakes
    // both: b starts (first in order), small fails again (second attempt: backoff 2 s, to
    // 4 s). At 3 s b leaves and wakes small: an event that may help cuts its backoff to 1 s
    // after its last attempt (2 s), so it starts at 3 s, not 4 s.
    let jobs = s.run(&[(0, 0), (0, 1), (0, 2), (300, 0)]);
    assert_eq!(secs(jobs[1].start), Some(2));
    assert_eq!(secs(jobs[1].end), Some(3));
    assert_eq!(secs(jobs[2].start), Some(3));
}

#[test]
fn under_kube_default_a_woken_pod_keeps_its_backoff_and_waits_for_the_flush() {
    // kube-default's queue is kube-scheduler's. The same arrivals as above: at 3 s b leaves
    // and wakes small, whose second backoff (2 s from its attempt at 2 s) has not passed:
    // it waits in the backoff queue until 4 s, and starts at the next flush of that queue.
    let mut s = Scenario {
        pods: vec![
            pod("a", 8, 2, 0, None),
            pod("b", 8, 1, 0, None),
            pod("small", 1, 50, 0, None),
        ],
        nodes: vec![node("n", 8)],
        policy: Policy::KubeDefault,
        ..Scenario::default()
    };
    let arrivals = [(0, 0), (0, 1), (0, 2), (300, 0)];
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), None);
    let jobs = outcome.jobs;
    assert_eq!(secs(jobs[1].start), Some(2));
    assert_eq!(
        secs(jobs[2].start),
        Some(4),
        "its whole backoff, flushed at 4 s"
    );
    // b and small at 0 s, small at 2 s: what kube-scheduler counts as unschedulable.
    assert_eq!(outcome.failed_attempts, Some(3));
    // The flush every 3 s (a replay at speed 3): backoff over at 4 s, flushed at 6 s.
    s.kube_queue_tick = std::time::Duration::from_secs(3);
    let jobs = s.run(&arrivals);
    assert_eq!(secs(jobs[2].start), Some(6));
}

#[test]
fn with_an_attempt_cost_attempts_run_one_after_another_and_newcomers_wait_their_turn() {
    // kube-default, each attempt 2 s. At 0 s a (8 GPUs, 10 s) is tried 0-2 s and bound at
    // 2 s; w (1 GPU) fails 2-4 s. At 3 s p and q (1 GPU) arrive while w is tried: they wait,
    // p fails 4-6 s, q 6-8 s. a leaves at 12 s, when r (1 GPU) arrives: w, p and q are due
    // (their backoffs passed) and go first, by when each last joined the queue (4, 6, 8 s),
    // then r: bound at 14, 16, 18 and 20 s. Without the cost every attempt is at its
    // round's instant.
    let mut s = Scenario {
        pods: vec![pod("a", 8, 10, 0, None), pod("one", 1, 100, 0, None)],
        nodes: vec![node("n", 8)],
        policy: Policy::KubeDefault,
        ..Scenario::default()
    };
    s.costs.attempt = std::time::Duration::from_secs(2);
    s.costs.placed_attempt = std::time::Duration::from_secs(2);
    let arrivals = [(0, 0), (0, 1), (3, 1), (3, 1), (12, 1), (300, 0)];
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), None);
    let starts: Vec<_> = outcome.jobs.iter().map(|j| secs(j.start)).collect();
    assert_eq!(
        starts[..5],
        [Some(2), Some(14), Some(16), Some(18), Some(20)]
    );
    assert_eq!(secs(outcome.jobs[0].end), Some(12));
    assert_eq!(outcome.failed_attempts, Some(3));
    s.costs.attempt = std::time::Duration::ZERO;
    s.costs.placed_attempt = std::time::Duration::ZERO;
    let jobs = s.run(&arrivals);
    let starts: Vec<_> = jobs.iter().map(|j| secs(j.start)).collect();
    assert_eq!(
        starts[..5],
        [Some(0), Some(10), Some(10), Some(10), Some(12)]
    );
}

#[test]
fn a_warm_start_pod_that_waited_before_the_clock_started_is_back_at_the_first_departure() {
    // kube-default: at t=0 a (8 GPUs) runs with half a second left and w (4 GPUs) finds no
    // place. Failed at t=0, w backs off for 1 s: a's departure at 0.5 s puts it in the
    // backoff queue, flushed at 1 s. Failed before the clock started (a live replay's warm
    // start), its backoff is over: the departure brings it back at once.
    let mut s = Scenario {
        pods: vec![pod("a", 8, 1, 0, None), pod("w", 4, 100, 0, None)],
        nodes: vec![node("n", 8)],
        policy: Policy::KubeDefault,
        warm: vec![(0, 0.5), (1, 1.0)],
        ..Scenario::default()
    };
    let arrivals = [(300, 0)];
    let jobs = s.run(&arrivals);
    assert_eq!(jobs[0].end, Some(Ms(500)));
    assert_eq!(jobs[1].start, Some(Ms(1_000)));
    s.warm_pending_due = true;
    let jobs = s.run(&arrivals);
    assert_eq!(jobs[1].start, Some(Ms(500)));
}

#[test]
fn pods_behind_one_that_does_not_fit_pass_it() {
    let s = Scenario {
        pods: vec![
            pod("half", 4, 100, 0, None),
            pod("eight", 8, 10, 0, None),
            pod("one", 1, 10, 0, None),
        ],
        nodes: vec![node("n", 8)],
        preempt: false,
        ..Scenario::default()
    };
    let jobs = s.run(&[(0, 0), (1, 1), (1, 2), (50, 0)]);
    assert_eq!(jobs[1].start, None, "eight does not fit while half runs");
    assert_eq!(secs(jobs[2].start), Some(1), "one passes it");
}

#[test]
fn a_gang_is_placed_whole_or_not_at_all() {
    let s = Scenario {
        pods: vec![
            pod("g0", 4, 100, 0, Some("g")),
            pod("g1", 4, 100, 0, Some("g")),
            pod("blocker", 2, 20, 0, None),
        ],
        nodes: vec![node("a", 4), node("b", 4)],
        preempt: false,
        ..Scenario::default()
    };
    // Templates: 0 = the gang, 1 = blocker. The blocker holds half of one node until 20 s:
    // the gang cannot place its second member, so it places neither, and starts at 20 s.
    let jobs = s.run(&[(0, 1), (1, 0), (400, 1)]);
    let gang: Vec<&Job> = jobs.iter().filter(|j| j.pod < 2).collect();
    assert_eq!(gang.len(), 2);
    assert!(gang.iter().all(|j| secs(j.start) == Some(20)), "{gang:?}");
    assert_ne!(gang[0].node, gang[1].node);
}

#[test]
fn a_gang_with_a_member_the_preemptor_does_not_outrank_is_not_evicted_in_part() {
    let s = Scenario {
        pods: vec![
            pod("g0", 4, 1_000, 0, Some("g")),
            pod("g1", 4, 1_000, 1, Some("g")),
            pod("high", 4, 10, 1, None),
        ],
        nodes: vec![node("a", 8)],
        preempt: true,
        ..Scenario::default()
    };
    // Templates: 0 = the gang (priorities 0 and 1), 1 = high. high outranks g0 but not g1:
    // evicting g0 alone would leave half a gang running, so nothing is evicted and high
    // waits for the gang to leave.
    let jobs = s.run(&[(0, 0), (100, 1), (2_000, 1)]);
    assert!(jobs.iter().all(|j| !j.evicted), "{jobs:?}");
    let high = jobs.iter().find(|j| j.pod == 2).expect("high");
    assert_eq!(secs(high.start), Some(1_000));
}

#[test]
fn make_room_moves_a_pod_so_that_an_eight_gpu_pod_starts_in_the_next_cycle() {
    let s = halves();
    let arrivals = HALVES;
    let defrag = moving_all(DefragMode::MakeRoom);
    // Without moves the 8-GPU pod waits for x or z to finish (10,000 s).
    let jobs = s.run(&arrivals);
    assert!(jobs[3].start.is_none_or(|t| t.0 >= 10_000_000), "{jobs:?}");
    for checkpointed in [false, true] {
        let s = Scenario {
            checkpointed,
            pods: s.pods.clone(),
            nodes: s.nodes.clone(),
            ..Scenario::default()
        };
        let jobs = s.run_options(&arrivals, true, defrag.clone());
        // Bound in the cycle after the plan (the queue's initial backoff, 1 s).
        assert_eq!(secs(jobs[3].start), Some(401), "{jobs:?}");
        let moved: Vec<&Job> = jobs.iter().filter(|j| j.evicted).collect();
        assert_eq!(moved.len(), 1, "{jobs:?}");
        assert_eq!(secs(moved[0].end), Some(400));
        // Its replacement starts at once elsewhere, unmeasured, with its run again or
        // what was left of it.
        let again = jobs
            .iter()
            .find(|j| j.pod == moved[0].pod && j.start == moved[0].end && !j.measured)
            .expect("replacement");
        assert_ne!(again.node, jobs[3].node);
        let ran = 400 - secs(moved[0].start).unwrap_or(0);
        let expected = if checkpointed { 10_000 - ran } else { 10_000 };
        assert_eq!(again.run_ms, expected * 1000);
    }
}

#[test]
fn a_tenant_below_its_guarantee_reclaims_exactly_what_it_is_owed() {
    let mut pods: Vec<TracePod> = (0..8)
        .map(|i| pod(&format!("a{i}"), 1, 10_000, 0, None))
        .collect();
    pods.extend((0..4).map(|i| pod(&format!("b{i}"), 1, 10_000, 0, None)));
    let s = Scenario {
        pods,
        nodes: vec![node("n", 8)],
        preempt: false,
        ..Scenario::default()
    };
    let file: super::tenants::TenantsFile = serde_json::from_value(serde_json::json!({
        "queues": [
            {"name": "a", "guaranteed": {"nvidia.com/gpu": "50%"}},
            {"name": "b", "guaranteed": {"nvidia.com/gpu": "50%"}}
        ],
        "assign": {"by": "shape", "rules": [], "default": "a"}
    }))
    .unwrap();
    let mut tenants =
        super::tenants::Tenants::new(&file, [8000, 64_000, 1 << 20], &s.pods).unwrap();
    let b = tenants.tree.index("b").unwrap();
    for q in tenants.queue_of.iter_mut().skip(8) {
        *q = b;
    }
    let mut arrivals: Vec<(u64, u32)> = (0..8).map(|i| (0, i)).collect();
    arrivals.extend((8..12).map(|i| (100, i)));
    arrivals.push((200, 0));
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), Some(&tenants));
    let jobs = &outcome.jobs;
    // b's four pods are bound in the next cycle (1 s on), four of a's are evicted (a keeps
    // its guarantee).
    for j in jobs.iter().filter(|j| j.pod >= 8) {
        assert_eq!(secs(j.start), Some(101), "{jobs:?}");
    }
    assert_eq!(jobs.iter().filter(|j| j.evicted).count(), 4);
    let report = outcome.tenants.expect("tenants measured");
    let reclaimed: u64 = report.queues.iter().map(|q| q.reclaimed_pods).sum();
    assert_eq!(reclaimed, 4);
    // Afterwards a and b each hold their fair share: Jain's index is near 1.
    assert!(report.jain.is_some_and(|j| j > 0.9), "{report:?}");
}

#[test]
fn a_queue_at_its_per_model_limit_is_placed_on_other_models_as_the_scheduler_narrows() {
    // One A100 node and one T4 node, best-fit; a's limit allows 2 A100 GPUs. Best-fit
    // would put all four pods on the A100 node first (it sorts first); the limit sends the
    // last two to the T4 node.
    let pods: Vec<TracePod> = (0..4)
        .map(|i| pod(&format!("a{i}"), 1, 10_000, 0, None))
        .collect();
    let s = Scenario {
        pods,
        nodes: vec![
            NodeInventory::uniform("a100", 64_000, 1 << 20, 4, "A100"),
            NodeInventory::uniform("t4", 64_000, 1 << 20, 4, "T4"),
        ],
        ..Scenario::default()
    };
    let file: super::tenants::TenantsFile = serde_json::from_value(serde_json::json!({
        "queues": [{"name": "a", "limit": {"nvidia.com/gpu.A100": "2"}}],
        "assign": {"by": "shape", "rules": [], "default": "a"}
    }))
    .unwrap();
    let tenants = super::tenants::Tenants::new(&file, [8000, 128_000, 2 << 20], &s.pods).unwrap();
    let arrivals: Vec<(u64, u32)> = (0..4).map(|i| (i, i as u32)).collect();
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), Some(&tenants));
    let on_a100 = outcome.jobs.iter().filter(|j| j.node == 0).count();
    assert_eq!(on_a100, 2, "{:?}", outcome.jobs);
    assert!(outcome.jobs.iter().all(|j| j.start.is_some()));
}

/// One 4-GPU node; a runs four pods for 3,000 s alone; at 2,900 s a and b (a's first) each
/// ask for four more. Who starts at 3,000 s, with the queues' half-life `half_life`.
fn after_a_ran_alone(half_life: &str) -> (usize, usize, super::engine::TenantRun) {
    let mut pods: Vec<TracePod> = (0..8)
        .map(|i| pod(&format!("a{i}"), 1, 3_000, 0, None))
        .collect();
    // b4 arrives at 4,000 s: the replay runs to the last arrival.
    pods.extend((0..5).map(|i| pod(&format!("b{i}"), 1, 3_000, 0, None)));
    let s = Scenario {
        pods,
        nodes: vec![node("n", 4)],
        preempt: false,
        ..Scenario::default()
    };
    let file: super::tenants::TenantsFile = serde_json::from_value(serde_json::json!({
        "queues": [
            {"name": "a", "usageHalfLife": half_life},
            {"name": "b", "usageHalfLife": half_life}
        ],
        "assign": {"by": "shape", "rules": [], "default": "a"}
    }))
    .unwrap();
    let mut tenants =
        super::tenants::Tenants::new(&file, [4000, 64_000, 1 << 20], &s.pods).unwrap();
    let b = tenants.tree.index("b").unwrap();
    for q in tenants.queue_of.iter_mut().skip(8) {
        *q = b;
    }
    let mut arrivals: Vec<(u64, u32)> = (0..4).map(|i| (0, i)).collect();
    arrivals.extend((4..12).map(|i| (2_900, i)));
    arrivals.push((4_000, 12));
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), Some(&tenants));
    // The first four end a little after 3,000 s (their start took the costs' time): what
    // starts within the next minute took their places.
    let first_end = outcome
        .jobs
        .iter()
        .filter(|j| j.pod < 4)
        .filter_map(|j| secs(j.end))
        .min();
    let started = |range: std::ops::Range<u32>| {
        outcome
            .jobs
            .iter()
            .filter(|j| range.contains(&j.pod))
            .filter(|j| {
                secs(j.start)
                    .zip(first_end)
                    .is_some_and(|(s, e)| s >= e && s < e + 60)
            })
            .count()
    };
    let a = started(4..8);
    let b = started(8..12);
    (a, b, outcome.tenants.expect("tenants measured"))
}

#[test]
fn with_usage_over_time_a_queue_that_ran_alone_waits_behind_an_idle_one() {
    // Half-life 20 minutes: after 50 minutes at 4 GPUs a stands at 3.3 GPUs, so b is
    // served all four (with 1 h a would stand at 1.75, and b be served first only twice).
    let (a, b, report) = after_a_ran_alone("20m");
    assert_eq!((a, b), (0, 4), "b, idle, is served first");
    let (a, b, _) = after_a_ran_alone("1h");
    assert_eq!((a, b), (1, 3));
    assert!(!report.jain_hourly.is_empty(), "contended hours measured");
    // Without usage over time (as the scheduler without a half-life) they share.
    let (a, b, _) = after_a_ran_alone("0");
    assert_eq!((a, b), (2, 2));
    // A half-life that is not one is refused with the queue's name.
    let file: super::tenants::TenantsFile = serde_json::from_value(serde_json::json!({
        "queues": [{"name": "a", "usageHalfLife": "-1h"}],
        "assign": {"by": "shape", "rules": [], "default": "a"}
    }))
    .unwrap();
    let err = super::tenants::Tenants::new(&file, [4000, 0, 0], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue a: usageHalfLife: \"-1h\" is negative"
    );
}

#[test]
fn a_waiting_pod_is_told_when_a_declared_end_frees_its_place_and_the_error_is_measured() {
    // One 4-GPU node: a 3-GPU pod (3,000 s) and a 1-GPU pod (1,000 s) from t=0; a 2-GPU pod
    // arrives at 10 s and waits for the 1-GPU pod's end... which frees only 1: it starts
    // when the 3-GPU pod ends. Every pod declares its run, as users do (not its true run):
    // the estimate is that pod's declared end, nearer the truth than "now".
    let pods = vec![
        pod("big", 3, 3_000, 0, None),
        pod("small", 1, 1_000, 0, None),
        pod("two", 2, 100, 0, None),
        pod("late", 1, 100, 0, None),
    ];
    let s = Scenario {
        pods,
        nodes: vec![node("n", 4)],
        preempt: false,
        declared_share: 1.0,
        ..Scenario::default()
    };
    let arrivals = [(0, 0), (0, 1), (10, 2), (5_000, 3)];
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), None);
    let two = &outcome.jobs[2];
    assert_eq!(secs(two.start), Some(3_000), "{:?}", outcome.jobs);
    let e = &outcome.estimates[&super::metrics::Class::TwoToFour];
    assert_eq!((e.estimated, e.unknown), (1, 0));
    assert!(
        e.median_abs_error_s < e.now_median_abs_error_s / 2.0,
        "{e:?}"
    );
    assert_eq!(e.now_median_abs_error_s, 2_990.0, "it waited 2,990 s");
    // Nobody declares: unknown.
    let s = Scenario {
        declared_share: 0.0,
        ..s
    };
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), None);
    assert!(
        outcome.estimates.is_empty(),
        "no estimates without declarations"
    );
}

#[test]
fn the_line_is_projected_once_a_period_and_a_pod_that_joins_between_is_told_at_the_next() {
    // A 4-GPU pod holds the one node for 3,000 s; five 1-GPU pods join at 10-18 s. The
    // first is told at the projection of its first failure (10 s); those joining within
    // the period are told at the next one: two projections, five pods told.
    let mut pods = vec![pod("big", 4, 3_000, 0, None)];
    pods.extend((0..5).map(|i| pod(&format!("one-{i}"), 1, 100, 0, None)));
    // The run lasts until the last arrival.
    pods.push(pod("late", 1, 100, 0, None));
    let s = Scenario {
        pods,
        nodes: vec![node("n", 4)],
        declared_share: 1.0,
        ..Scenario::default()
    };
    let arrivals = [
        (0, 0),
        (10, 1),
        (12, 2),
        (14, 3),
        (16, 4),
        (18, 5),
        (5_000, 6),
    ];
    let outcome = s.run_all(&arrivals, true, DefragSim::default(), None);
    let one = &outcome.estimates[&super::metrics::Class::One];
    assert_eq!((one.estimated, one.unknown), (5, 0), "{one:?}");
    assert_eq!(outcome.projections, 2);
    // Told at the second projection, a pod's wait from then is shorter than from its
    // arrival (2,990 s at the most).
    assert!(one.now_median_abs_error_s < 2_980.0, "{one:?}");
}
