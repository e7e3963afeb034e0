use super::*;
use gpuplace_model::{NodeInventory, Request};

fn gpus(n: u32) -> Request {
    Request {
        cpu_milli: 1000,
        memory_mib: 1024,
        gpu_count: n,
        gpu_milli: 1000,
        allowed_models: Vec::new(),
        need: Default::default(),
    }
}

fn standing() -> QueueStanding {
    QueueStanding {
        name: "team-a".into(),
        allocated: "8".into(),
        fair_share: "8".into(),
        guaranteed: "4".into(),
        limit: "none".into(),
        decayed: Some(("7.5".into(), "1h".into())),
    }
}

#[test]
fn the_blocker_and_the_start_come_first_and_read_back() {
    let w = Waiting {
        blocker: Blocker::Fragmentation,
        gang: None,
        position: Some(Position {
            in_cluster: Place { at: 3, of: 9 },
            in_queue: Some(Place { at: 2, of: 4 }),
        }),
        queue: Some(standing()),
        unblock: Some("make-room: no pod that opted in to moving frees a block of 4".into()),
        start: Some(Start::At(Span {
            earliest_ms: 600_000,
            at_ms: 1_500_000,
            latest_ms: 3_600_000,
        })),
    };
    let time = |ms: i64| format!("t{ms}");
    let text = w.render(
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        0,
        &time,
    );
    assert_eq!(
        text,
        "blocked by: fragmentation | expected start: t1500000 (in 25m; 10m to 1h) | 0/2 nodes are available: 2 Insufficient nvidia.com/gpu. | position: 3 of 9 in the cluster, 2 of 4 in queue team-a | queue team-a: allocated 8, fair share 8, guarantee 4, limit none, decayed use 7.5 (half-life 1h) GPUs | unblocked by: make-room: no pod that opted in to moving frees a block of 4"
    );
    let p = Waiting::parse(&text);
    assert_eq!(
        p.message,
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    );
    assert_eq!(p.blocked_by.as_deref(), Some("fragmentation"));
    assert_eq!(
        p.position.as_deref(),
        Some("3 of 9 in the cluster, 2 of 4 in queue team-a")
    );
    assert!(p.queue.unwrap().starts_with("queue team-a: allocated 8"));
    assert_eq!(
        p.expected_start.as_deref(),
        Some("t1500000 (in 25m; 10m to 1h)")
    );
    assert_eq!(Waiting::parse("plain").message, "plain");
    for b in Blocker::ALL {
        assert!(!b.label().contains(" | "));
    }
    // A message of an earlier version (segments after kube-scheduler's part) reads too.
    let old = "0/2 nodes are available. | blocked by: capacity | position: 1 of 1 in the cluster";
    let p = Waiting::parse(old);
    assert_eq!(p.message, "0/2 nodes are available.");
    assert_eq!(p.blocked_by.as_deref(), Some("capacity"));
    // A cut at 1 KiB keeps the blocker and the start.
    let long = w.render(&"x".repeat(2_000), 0, &time);
    let cut = Waiting::parse(&long[..1024]);
    assert_eq!(cut.blocked_by.as_deref(), Some("fragmentation"));
    assert!(cut.expected_start.is_some());
}

#[test]
fn a_gang_says_how_many_members_wait_and_how_many_fit() {
    let mut w = Waiting::blocked(Blocker::QueueLimit);
    w.gang = Some(GangStanding {
        name: "ml/train".into(),
        waiting: 4,
        min_member: 4,
        fit: None,
    });
    let text = w.render(
        "0/3 nodes are available: queue a is at its limit.",
        0,
        &|_| String::new(),
    );
    assert_eq!(
        text,
        "blocked by: queue limit | 0/3 nodes are available: queue a is at its limit. | gang: ml/train, 4 member(s) waiting of 4 needed"
    );
    assert_eq!(
        Waiting::parse(&text).gang.as_deref(),
        Some("ml/train, 4 member(s) waiting of 4 needed")
    );
    w.gang.as_mut().unwrap().fit = Some(2);
    assert!(
        w.render("", 0, &|_| String::new())
            .ends_with(", 2 fit at once")
    );
}

#[test]
fn cpu_or_memory_short_where_the_gpus_are_is_capacity() {
    use crate::fit::{FitFailure, Unschedulable};
    let mut why = Unschedulable::new(3);
    why.add(FitFailure::InsufficientCpu);
    why.add(FitFailure::InsufficientGpus);
    why.add(FitFailure::ModelNotAllowed);
    assert_eq!(short_of(&why), Some(Resource::Cpu));
    why.add(FitFailure::InsufficientMemory);
    why.add(FitFailure::InsufficientMemory);
    assert_eq!(short_of(&why), Some(Resource::Memory));
    let mut only_rules = Unschedulable::new(1);
    only_rules.add(FitFailure::ModelNotAllowed);
    assert_eq!(short_of(&only_rules), None);
    assert_eq!(Blocker::Capacity(Resource::Cpu).label(), "capacity (cpu)");
}

/// Two 4-GPU nodes, each half held by two 1-GPU pods (ends 10, 40 on a; 20, 30 on b).
fn half_held() -> (ClusterState, Request, Vec<Vec<(usize, u32)>>) {
    let mut state = ClusterState::new(vec![
        NodeInventory::uniform("a", 64_000, 1 << 20, 4, "A100"),
        NodeInventory::uniform("b", 64_000, 1 << 20, 4, "A100"),
    ])
    .unwrap();
    let one = gpus(1);
    let gpu_sets: Vec<Vec<(usize, u32)>> =
        PLACES.iter().map(|&(_, g, _)| vec![(g, 1000)]).collect();
    for (&(n, _, _), g) in PLACES.iter().zip(&gpu_sets) {
        state.apply(n, &one, g).unwrap();
    }
    (state, one, gpu_sets)
}

/// The pod projected: `request` on the nodes of `allowed`, priority 0.
fn own<'a>(request: &'a Request, allowed: Option<&'a [bool]>) -> Ahead<'a> {
    Ahead {
        request,
        allowed,
        priority: 0,
        runs: None,
    }
}

const PLACES: [(usize, usize, i64); 4] = [(0, 0, 10), (0, 1, 40), (1, 0, 20), (1, 1, 30)];

use crate::state::ClusterState;

/// The pods of [`PLACES`] ending at their time, each spread by `spread` either way.
fn endings<'a>(
    one: &'a Request,
    gpu_sets: &'a [Vec<(usize, u32)>],
    spread: i64,
) -> Vec<Ending<'a>> {
    PLACES
        .iter()
        .zip(gpu_sets)
        .map(|(&(node, _, end), g)| Ending {
            node,
            request: one,
            gpus: g,
            priority: 0,
            end: Span {
                earliest_ms: end - spread,
                at_ms: end,
                latest_ms: end + spread,
            },
        })
        .collect()
}

#[test]
fn the_start_is_the_first_end_that_frees_a_place_of_its_shape() {
    let (state, one, gpu_sets) = half_held();
    let endings = endings(&one, &gpu_sets, 0);
    let at = |ms| Start::At(Span::exactly(ms));
    // A 4-GPU pod starts when one node is whole again, at 30 (b's last), not 10.
    assert_eq!(
        project(&state, own(&gpus(4), None), &[], &endings, 0),
        at(30)
    );
    // Only node a allowed: at 40.
    let only_a = [true, false];
    assert_eq!(
        project(&state, own(&gpus(4), Some(&only_a)), &[], &endings, 0),
        at(40)
    );
    // Fits now: now.
    assert_eq!(
        project(&state, own(&gpus(2), None), &[], &endings, 5),
        at(5)
    );
    // Nothing ends: unknown. Eight GPUs never fit on four-GPU nodes.
    assert_eq!(
        project(&state, own(&gpus(4), None), &[], &[], 0),
        Start::Unknown
    );
    assert_eq!(
        project(&state, own(&gpus(8), None), &[], &endings, 0),
        Start::Unknown
    );
}

#[test]
fn units_ahead_in_line_take_the_room_first() {
    let (state, one, gpu_sets) = half_held();
    let endings = endings(&one, &gpu_sets, 5);
    // A 4-GPU pod ahead takes b at 30 and runs 100: ours gets a at 40.
    let four = gpus(4);
    let ahead = [Ahead {
        request: &four,
        allowed: None,
        priority: 0,
        runs: Some(Span::exactly(100)),
    }];
    let Start::At(span) = project(&state, own(&four, None), &ahead, &endings, 0) else {
        panic!("unknown");
    };
    // Each end drawn within its spread (a quarter past it at most): about 40, between
    // the plays' tenth and ninetieth.
    assert!((36..=44).contains(&span.at_ms), "{span:?}");
    assert!(
        span.earliest_ms < span.at_ms && span.at_ms < span.latest_ms,
        "{span:?}"
    );
    assert!(span.earliest_ms >= 33 && span.latest_ms <= 47, "{span:?}");
    // One that never ends and holds every node: unknown behind it... unless it fits
    // nowhere, when it is passed over (as the scheduler passes over it).
    let eight = gpus(8);
    let blocked = [Ahead {
        request: &eight,
        allowed: None,
        priority: 0,
        runs: None,
    }];
    let Start::At(span) = project(&state, own(&four, None), &blocked, &endings, 0) else {
        panic!("unknown");
    };
    assert!((27..=33).contains(&span.at_ms), "{span:?}");
    assert!(span.earliest_ms >= 23 && span.latest_ms <= 37, "{span:?}");
}

/// Waiting for the first of many nodes to empty, the pod starts with the first of their
/// uncertain ends: sooner than the first of their medians, and the range says so.
#[test]
fn the_first_of_many_uncertain_ends_comes_before_the_first_median() {
    let nodes = 20;
    let mut state = ClusterState::new(
        (0..nodes)
            .map(|i| NodeInventory::uniform(&format!("n{i}"), 64_000, 1 << 20, 1, "A100"))
            .collect(),
    )
    .unwrap();
    let one = gpus(1);
    let sets: Vec<Vec<(usize, u32)>> = (0..nodes).map(|_| vec![(0, 1000)]).collect();
    for (n, set) in sets.iter().enumerate() {
        state.apply(n, &one, set).unwrap();
    }
    // Every pod ends at 100 likeliest, between 20 and 180.
    let endings: Vec<Ending<'_>> = (0..nodes)
        .map(|n| Ending {
            node: n,
            request: &one,
            gpus: &sets[n],
            priority: 0,
            end: Span {
                earliest_ms: 20,
                at_ms: 100,
                latest_ms: 180,
            },
        })
        .collect();
    let Start::At(span) = project(&state, own(&one, None), &[], &endings, 0) else {
        panic!("unknown");
    };
    assert!(
        span.at_ms < 40,
        "the first of 20 ends, not their median: {span:?}"
    );
    assert!(span.earliest_ms <= span.at_ms && span.at_ms <= span.latest_ms);
}

/// As the scheduler preempts: once the pod of higher priority on a node ends, a pod that
/// outranks the rest there evicts them, where one of their priority waits for their ends.
#[test]
fn an_end_that_leaves_only_lower_priorities_lets_a_higher_pod_preempt() {
    let mut state = ClusterState::new(vec![NodeInventory::uniform(
        "a",
        64_000,
        1 << 20,
        4,
        "A100",
    )])
    .unwrap();
    let one = gpus(1);
    let sets: Vec<Vec<(usize, u32)>> = (0..4).map(|g| vec![(g, 1000)]).collect();
    for set in &sets {
        state.apply(0, &one, set).unwrap();
    }
    // GPU 0's pod (priority 5) ends at 10; the other three (priority 0) at 1,000.
    let endings: Vec<Ending<'_>> = (sets.iter().enumerate())
        .map(|(g, set)| Ending {
            node: 0,
            request: &one,
            gpus: set,
            priority: if g == 0 { 5 } else { 0 },
            end: Span::exactly(if g == 0 { 10 } else { 1_000 }),
        })
        .collect();
    let four = gpus(4);
    let at = |ms| Start::At(Span::exactly(ms));
    let with = |priority| Ahead {
        priority,
        ..own(&four, None)
    };
    // Priority 1 outranks the three left at 10; priority 0 waits for them.
    assert_eq!(project(&state, with(1), &[], &endings, 0), at(10));
    assert_eq!(project(&state, with(0), &[], &endings, 0), at(1_000));
    // Nothing is evicted now: the priority-5 pod stands in the way until it ends.
    assert_eq!(project(&state, with(9), &[], &endings, 0), at(10));
    // Two 4-GPU pods of priority 1: the first evicts at 10 and runs 50 (never evicted by
    // the second, its equal), the second starts at its end.
    let ahead = [Ahead {
        runs: Some(Span::exactly(50)),
        ..with(1)
    }];
    assert_eq!(project(&state, with(1), &ahead, &endings, 0), at(60));
}
