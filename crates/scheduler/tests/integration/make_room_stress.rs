//! Make-room carried out all or nothing, and finished when stopped: a plan whose dry run is
//! refused moves no pod; one whose eviction is refused midway moves no more pods this
//! round, keeps the room made nominated to its pod (the moved pods' replacements keep
//! their places) and is finished there in a later round; with evictions refused at random
//! for whole pods (a budget the scheduler does not see), every pod moved serves the pod it
//! moved for, and no device is ever booked twice. A leader killed mid-plan or after its
//! last move leaves a nomination the next leader adopts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use crate::common::*;
use crate::defrag::{defrag_config, deleting, messages, on, replica, settle};

fn nominated(api: &MemoryApi, name: &str) -> Option<String> {
    api.pod("ml", name)?.status?.nominated_node_name
}

/// n1 holds a and b (1 GPU each, movable), n2 holds c (pinned there): an 8-GPU pod needs
/// both a and b moved to n2.
async fn two_moves_needed(api: &MemoryApi, scheduler: &mut Scheduler<MemoryApi>, t: &mut Instant) {
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(replica("a", "rs-a", 1, true, json!({})));
    api.put_pod(replica("b", "rs-b", 1, true, json!({})));
    settle(scheduler, t).await;
    api.put_node(node("n2", 8, json!({})));
    api.put_pod(replica("c", "rs-c", 1, true, on("n2")));
    settle(scheduler, t).await;
    assert_eq!(bound_node(api, "a").as_deref(), Some("n1"));
    assert_eq!(bound_node(api, "b").as_deref(), Some("n1"));
    assert_eq!(bound_node(api, "c").as_deref(), Some("n2"));
}

/// A plan whose second eviction is refused moves no more pods this round; the room made
/// stays the pod's (nominated, in the API too), and a later round finishes the plan there.
#[tokio::test]
async fn a_plan_refused_midway_moves_no_more_and_keeps_its_room() {
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    two_moves_needed(&api, &mut scheduler, &mut t).await;
    // The plan's dry run passes; its second eviction is refused (a budget tightened).
    api.refuse_move_evictions_at(&[1]);
    api.put_pod(pod("big", 8, json!({})));
    t += Duration::from_secs(5);
    scheduler.round(t).await.unwrap();
    let first = if deleting(&api, "a") { "a" } else { "b" };
    let second = if first == "a" { "b" } else { "a" };
    assert!(deleting(&api, first), "the first move was made");
    assert!(!deleting(&api, second), "no move after the refusal");
    assert_eq!(
        nominated(&api, "big").as_deref(),
        Some("n1"),
        "the room made so far stays the pod's"
    );
    assert!(messages(&api, "big", "MakingRoom").is_empty());
    let failed = messages(&api, "big", "FailedScheduling");
    assert!(
        failed
            .last()
            .unwrap()
            .contains("defragmentation: the plan stopped after moving 1 of 2 pod(s): moving ml/"),
        "{failed:?}"
    );
    // The moved pod's controller makes its replacement: it lands where the plan put it
    // (its place was held), and big gets room in later rounds.
    api.delete_pod("ml", first);
    api.put_pod(replica(
        &format!("{first}2"),
        &format!("rs-{first}"),
        1,
        true,
        json!({}),
    ));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(
        bound_node(&api, &format!("{first}2")).as_deref(),
        Some("n2")
    );
    assert!(
        deleting(&api, second),
        "the plan made again moves the other"
    );
    assert_eq!(nominated(&api, "big").as_deref(), Some("n1"));
    api.delete_pod("ml", second);
    api.put_pod(replica(
        &format!("{second}2"),
        &format!("rs-{second}"),
        1,
        true,
        json!({}),
    ));
    settle(&mut scheduler, &mut t).await;
    assert_eq!(bound_node(&api, "big").as_deref(), Some("n1"));
    assert_eq!(
        bound_node(&api, &format!("{second}2")).as_deref(),
        Some("n2")
    );
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_plan_whose_dry_run_is_refused_moves_nothing() {
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    two_moves_needed(&api, &mut scheduler, &mut t).await;
    // Every pod's eviction is refused, dry runs too.
    api.refuse_move_evictions(7, 1.0);
    api.put_pod(pod("big", 8, json!({})));
    settle(&mut scheduler, &mut t).await;
    assert!(!deleting(&api, "a") && !deleting(&api, "b") && !deleting(&api, "c"));
    assert_eq!(nominated(&api, "big"), None);
    let failed = messages(&api, "big", "FailedScheduling");
    assert!(
        failed.last().unwrap().contains("would be refused")
            && failed.last().unwrap().contains("no pod was moved"),
        "{failed:?}"
    );
}

/// A "Moved to make room for NS/POD (from node A to node B)" Event, read back.
struct MovedFor {
    for_pod: String,
    from: String,
}

impl MovedFor {
    fn read(message: &str) -> Option<MovedFor> {
        let rest = message.strip_prefix("Moved to make room for ml/")?;
        let (for_pod, rest) = rest.split_once(' ')?;
        let from = rest.strip_prefix("(from node ")?.split(' ').next()?;
        Some(MovedFor {
            for_pod: for_pod.to_string(),
            from: from.to_string(),
        })
    }
}

/// Seeded, in episodes: each fills 6 nodes of 8 GPUs with 2-3 small movable replicas each
/// (every node in turn the only one open), then two 8-GPU pods arrive, which fit only
/// once pods move. A share of pods refuse eviction (dry runs too: a budget the scheduler
/// does not see), and single evictions are refused at random between a plan's dry run and
/// its eviction, for 12 rounds; 8 more rounds follow without new refusals. The test is
/// every controller: a pod being deleted is removed and its replacement made. At every
/// step no device is booked twice; at the end of each episode every pod moved for a
/// waiting pod moved for nothing only if that pod got no room: it is bound to the node the
/// moved pod left (a plan stopped by a refusal keeps its room nominated to its pod and is
/// finished there in a later round).
#[tokio::test]
async fn refused_evictions_at_every_step_never_leave_a_half_moved_plan() {
    let seed = gpuplace_testkit::seed::for_run("GPUPLACE_MAKE_ROOM_SEED", "make_room_stress");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    api.refuse_move_evictions(seed, 0.2);
    let nodes = 6;
    let mut placed = 0;
    let (mut events_seen, mut moves, mut served) = (0, 0, 0);
    let mut unserved: Vec<String> = Vec::new();
    for episode in 0..12 {
        let mut replicas: BTreeMap<String, (String, u32, u32)> = BTreeMap::new();
        for n in 0..nodes {
            for m in 0..nodes {
                let closed = m != n;
                api.put_node(node(
                    &format!("n{m}"),
                    8,
                    json!({"spec": {"unschedulable": closed}}),
                ));
            }
            for _ in 0..rng.random_range(2..=3) {
                let gpus = rng.random_range(1..=2u32);
                let rs = format!("e{episode}-rs-{}", replicas.len());
                api.put_pod(replica(&format!("{rs}-0"), &rs, gpus, true, json!({})));
                replicas.insert(format!("{rs}-0"), (rs, gpus, 0));
            }
            settle(&mut scheduler, &mut t).await;
        }
        for m in 0..nodes {
            api.put_node(node(&format!("n{m}"), 8, json!({})));
        }
        let bigs = [format!("e{episode}-big-0"), format!("e{episode}-big-1")];
        for big in &bigs {
            api.put_pod(pod(big, 8, json!({})));
        }
        // 12 rounds with refusals drawn, then 8 without new ones: a plan stopped late has
        // its rounds to be finished in.
        for step in 0..20 {
            if step < 12 && rng.random_range(0..3) == 0 {
                api.refuse_move_evictions_at(&[rng.random_range(0..3)]);
            }
            t += Duration::from_secs(5);
            scheduler.round(t).await.unwrap();
            // The controllers: a deleted replica is gone and made again.
            for name in replicas.keys().cloned().collect::<Vec<_>>() {
                if deleting(&api, &name) {
                    let (rs, gpus, generation) = replicas.remove(&name).unwrap();
                    api.delete_pod("ml", &name);
                    let again = format!("{rs}-{}", generation + 1);
                    api.put_pod(replica(&again, &rs, gpus, true, json!({})));
                    replicas.insert(again, (rs, gpus, generation + 1));
                }
            }
            assert_no_double_booking(&api);
        }
        placed += bigs
            .iter()
            .filter(|b| bound_node(&api, b).is_some())
            .count();
        let (events, seen) = api.events_since(events_seen);
        events_seen = seen;
        for moved in events.iter().filter_map(|e| MovedFor::read(&e.message)) {
            moves += 1;
            if bound_node(&api, &moved.for_pod).as_deref() == Some(moved.from.as_str()) {
                served += 1;
            } else {
                unserved.push(format!(
                    "{} (moved from {}, bound to {:?})",
                    moved.for_pod,
                    moved.from,
                    bound_node(&api, &moved.for_pod)
                ));
            }
        }
        for p in api.pods() {
            api.delete_pod("ml", p.metadata.name.as_deref().unwrap_or_default());
        }
        settle(&mut scheduler, &mut t).await;
    }
    // Plans stopped midway and plans refused whole by their dry run, as the pods were told.
    let (mut stopped_plans, mut dry_refused) = (0, 0);
    for e in api
        .events()
        .iter()
        .filter(|e| e.reason == "FailedScheduling")
    {
        stopped_plans += usize::from(e.message.contains("the plan stopped after moving "));
        dry_refused += usize::from(e.message.contains("would be refused"));
    }
    eprintln!(
        "make-room stress seed {seed}: {placed} of 24 8-GPU pods placed within 20 rounds; {moves} pods moved, {served} for a pod that got the room it was moved out of; {dry_refused} plans refused whole by their dry run; {stopped_plans} plans stopped midway by a refusal; {} moves for nothing",
        unserved.len()
    );
    assert!(
        moves > 0 && placed > 0,
        "the stress made no room at all (seed {seed})"
    );
    assert!(
        dry_refused + stopped_plans > 0,
        "no refusal was met (seed {seed})"
    );
    // Every pod moved for a waiting pod served it: a plan stopped by a refusal keeps no
    // move that its pod does not get the room of (it is finished in a later round).
    assert!(
        unserved.is_empty(),
        "seed {seed}: moved for nothing: {unserved:?}"
    );
    assert_no_double_booking(&api);
}

/// The leader killed right after the first eviction of a make-room plan (its round dropped
/// while the second eviction waits on the server, as a process killed there would leave
/// it): the API shows one pod evicted and the waiting pod nominated (written before the
/// first move). The next leader, starting from
/// what the API shows, places the moved pod's replacement and the waiting pod; no device
/// is ever booked twice. Six runs; the seed varies the server's latency (2-6 ms a request).
#[tokio::test]
async fn a_leader_killed_after_the_first_eviction_leaves_nothing_the_next_cannot_finish() {
    let seed = gpuplace_testkit::seed::for_run("GPUPLACE_MAKE_ROOM_SEED", "make_room_kill");
    for run in 0..6u64 {
        let latency = Duration::from_millis(2 + (seed + run) % 5);
        let api = MemoryApi::new().with_costs(gpuplace_testkit::api::ServerCosts {
            latency,
            ..Default::default()
        });
        let mut first = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
        let mut t = Instant::now();
        two_moves_needed(&api, &mut first, &mut t).await;
        api.put_pod(pod("big", 8, json!({})));
        t += Duration::from_secs(5);
        // The leader dies sending the plan's second eviction (it never reaches the server).
        api.stall_move_eviction_at(1);
        let evicted = |api: &MemoryApi| ["a", "b"].iter().filter(|p| deleting(api, p)).count();
        let killed = tokio::select! {
            _ = first.round(t) => false,
            _ = async {
                while !api.stall_reached() {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            } => true,
        };
        drop(first);
        assert!(
            killed,
            "run {run}: the leader was killed sending its second eviction"
        );
        assert_eq!(
            evicted(&api),
            1,
            "run {run}: killed before the second eviction"
        );
        assert_eq!(
            nominated(&api, "big").as_deref(),
            Some("n1"),
            "run {run}: the nomination was written before the moves"
        );
        assert_no_double_booking(&api);

        let (rounds, generation) = the_next_leader_finishes(&api, &mut t, run).await;
        eprintln!(
            "run {run} (latency {latency:?}): the next leader placed big and every replacement within {rounds} rounds; {generation} replacement(s) made, the pod evicted before the kill included"
        );
    }
}

/// The next leader, from what the API shows, until `big` and every replacement are bound
/// (20 rounds at most); the test is the ReplicaSet controller and the kubelet (an evicted
/// pod goes, its replacement is made). Asserts `big` got n1, where the room was made, and
/// no device was ever booked twice; returns the rounds taken and the replacements made.
async fn the_next_leader_finishes(api: &MemoryApi, t: &mut Instant, run: u64) -> (usize, usize) {
    let mut next = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut generation = 1;
    let mut rounds = 0;
    for _ in 0..20 {
        rounds += 1;
        *t += Duration::from_secs(5);
        next.round(*t).await.unwrap();
        for p in api.pods() {
            let name = p.metadata.name.clone().unwrap_or_default();
            if p.metadata.deletion_timestamp.is_some() {
                let rs = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .cloned();
                api.delete_pod("ml", &name);
                if let Some(rs) = rs {
                    generation += 1;
                    let again = format!("{rs}-{generation}");
                    api.put_pod(replica(&again, &rs, 1, true, json!({})));
                }
            }
        }
        assert_no_double_booking(api);
        if bound_node(api, "big").is_some()
            && api
                .pods()
                .iter()
                .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        {
            break;
        }
    }
    assert_eq!(bound_node(api, "big").as_deref(), Some("n1"), "run {run}");
    let pending: Vec<String> = api
        .pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        pending.is_empty(),
        "run {run}: replacements placed: {pending:?}"
    );
    (rounds, generation - 1)
}

/// The leader killed right after the last eviction of a make-room plan (its round dropped
/// once that eviction is answered): the API shows both moved pods terminating and the
/// waiting pod's nomination, written before the first move. The next leader adopts it as
/// a hold, gives the room to the pod it was made for (big on n1), places the replacements
/// elsewhere, and moves no other pod.
/// Six runs; the seed varies the server's latency (2-6 ms a request).
#[tokio::test]
async fn a_leader_killed_after_the_last_eviction_leaves_the_room_to_its_pod() {
    use crate::wrapped::{Hooks, Wrapped};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Hangs once the plan's second (last) move is answered, saying it was reached.
    #[derive(Clone)]
    struct Hang(Arc<AtomicBool>, Arc<std::sync::atomic::AtomicUsize>);
    impl Hooks for Hang {
        fn after_move(&self, dry_run: bool) -> impl std::future::Future<Output = ()> + Send {
            let last = !dry_run && self.1.fetch_add(1, Ordering::SeqCst) == 1;
            let reached = self.0.clone();
            async move {
                if last {
                    reached.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    let seed = gpuplace_testkit::seed::for_run("GPUPLACE_MAKE_ROOM_SEED", "make_room_kill_last");
    for run in 0..6u64 {
        let latency = Duration::from_millis(2 + (seed + run) % 5);
        let api = MemoryApi::new().with_costs(gpuplace_testkit::api::ServerCosts {
            latency,
            ..Default::default()
        });
        let mut t = Instant::now();
        let mut setup = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
        two_moves_needed(&api, &mut setup, &mut t).await;
        drop(setup);
        let reached = Arc::new(AtomicBool::new(false));
        let wrapped = Wrapped {
            inner: api.clone(),
            hooks: Hang(reached.clone(), Arc::default()),
        };
        let mut first = Scheduler::new(wrapped, defrag_config(Duration::ZERO));
        // One round to learn the cluster, then big arrives.
        t += Duration::from_secs(5);
        first.round(t).await.unwrap();
        assert!(
            !reached.load(Ordering::SeqCst),
            "run {run}: nothing to nominate yet"
        );
        api.put_pod(pod("big", 8, json!({})));
        t += Duration::from_secs(5);
        let killed = tokio::select! {
            _ = first.round(t) => false,
            _ = async {
                while !reached.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            } => true,
        };
        drop(first);
        assert!(killed, "run {run}: killed after the last move");
        let evicted = ["a", "b"].iter().filter(|p| deleting(&api, p)).count();
        assert_eq!(evicted, 2, "run {run}: every move of the plan was made");
        assert_eq!(
            nominated(&api, "big").as_deref(),
            Some("n1"),
            "run {run}: the nomination was written before the moves"
        );
        assert!(!deleting(&api, "c"), "run {run}");
        let (rounds, made) = the_next_leader_finishes(&api, &mut t, run).await;
        assert_eq!(made, 2, "run {run}: no pod moved beyond the plan");
        eprintln!(
            "run {run} (latency {latency:?}): the next leader gave n1 to big and placed both replacements within {rounds} rounds"
        );
    }
}

/// A plan that stops before any pod moved puts the pod's nomination back as it was: a pod
/// nominated to n2 (by an earlier run) whose make-room plans n1 writes n1 before the first
/// move, and n2 again when that move is refused.
#[tokio::test]
async fn a_plan_refused_at_its_first_move_puts_the_nomination_back() {
    let api = MemoryApi::new();
    let mut scheduler = Scheduler::new(api.clone(), defrag_config(Duration::ZERO));
    let mut t = Instant::now();
    two_moves_needed(&api, &mut scheduler, &mut t).await;
    api.refuse_move_evictions_at(&[0]);
    api.put_pod(pod(
        "big",
        8,
        json!({"status": {"nominatedNodeName": "n2"}}),
    ));
    t += Duration::from_secs(5);
    scheduler.round(t).await.unwrap();
    assert!(
        !deleting(&api, "a") && !deleting(&api, "b"),
        "nothing moved"
    );
    let failed = messages(&api, "big", "FailedScheduling");
    assert!(
        failed
            .last()
            .is_some_and(|m| m.contains("the plan stopped after moving 0 of 2")),
        "{failed:?}"
    );
    assert_eq!(nominated(&api, "big").as_deref(), Some("n2"), "put back");
}
