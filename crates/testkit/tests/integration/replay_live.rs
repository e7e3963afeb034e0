//! `gpuplace replay`'s driver against the in-memory API (strict names and labels, a latency
//! on every request, a late watch) with gpuplace's scheduler binding the pods: every pod
//! created, bound and deleted on the trace's clock; the lives measured as the simulator
//! measures; exactly what the replay made deleted afterwards, whatever stopped it (the
//! end, an interrupt, a server that went away), and nothing else touched.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuplace_core::Policy;
use gpuplace_model::NodeInventory;
use gpuplace_replay::clean;
use gpuplace_replay::driver::{self, DriverConfig, ReplayError};
use gpuplace_replay::objects::PodTemplate;
use gpuplace_replay::pod_base::PodBase;
use gpuplace_replay::{ApiError, Kind, Object, Plan, ReplayApi};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_sim::builtin_workload;
use gpuplace_sim::timeline::{DurationModel, Ms, Timeline, TimelineOptions};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::replay_api::MemoryReplayApi;
use serde_json::json;
use tokio::sync::watch;

const NAMESPACE: &str = "replay";
const RUN: &str = "rp7-test";

fn timeline(arrivals: usize) -> Timeline {
    let mut workload = builtin_workload(64);
    workload.nodes.truncate(6);
    for n in &mut workload.nodes {
        n.name = n.name.to_ascii_lowercase().replace('_', "-");
    }
    Timeline::new(
        workload,
        TimelineOptions {
            load: 0.9,
            arrivals,
            // Runs of 1 to 20 simulated minutes: at speed 600 a run is 0.1 to 2 s.
            durations: DurationModel {
                min_s: 60.0,
                max_s: Some(1_200.0),
                ..DurationModel::default()
            },
            no_priorities: true,
            ..TimelineOptions::default()
        },
    )
    .expect("timeline")
}

fn config(speed: f64) -> DriverConfig {
    DriverConfig {
        speed,
        fake_nodes: true,
        template: PodTemplate {
            run: RUN.into(),
            namespace: NAMESPACE.into(),
            scheduler_name: "gpuplace".into(),
            priority_classes: None,
            base: PodBase::default(),
            dra: false,
        },
        in_flight: 8,
        watch_patience: Duration::from_secs(2),
        heartbeat: Duration::from_millis(300),
        warm_quiet: gpuplace_replay::driver::WARM_QUIET,
    }
}

/// Objects nobody's replay made, which no replay may touch.
fn put_foreign(api: &MemoryApi) {
    api.put_node(
        serde_json::from_value(json!({"metadata": {"name": "someone-elses-node",
            "labels": {"app.kubernetes.io/managed-by": "helm"}}}))
        .expect("node"),
    );
    api.put_pod(
        serde_json::from_value(json!({"metadata": {"name": "someone-elses-pod",
            "namespace": NAMESPACE}, "spec": {"schedulerName": "other",
            "containers": [{"name": "c", "image": "x"}]}}))
        .expect("pod"),
    );
    // A shared cluster's pending pod that gpuplace schedules (or a DaemonSet's): no fake
    // node takes it, their taint keeps it off.
    api.put_pod(
        serde_json::from_value(json!({"metadata": {"name": "someone-elses-gpu-pod",
            "namespace": "lab"}, "spec": {"schedulerName": "gpuplace",
            "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
        .expect("pod"),
    );
}

fn foreign_intact(api: &MemoryApi) {
    assert!(api.node("someone-elses-node").is_some());
    assert!(api.pod(NAMESPACE, "someone-elses-pod").is_some());
    let gpu_pod = api.pod("lab", "someone-elses-gpu-pod").expect("left alone");
    let bound = gpu_pod.spec.and_then(|s| s.node_name);
    assert_eq!(bound, None, "a foreign pod landed on a fake node");
}

/// gpuplace's scheduler running rounds against `api` until `stop`.
fn scheduler(api: MemoryApi, stop: watch::Receiver<bool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let mut s = Scheduler::new(
                api,
                SchedulerConfig {
                    policy: Policy::GPUPLACE,
                    ..Default::default()
                },
            );
            while !*stop.borrow() {
                let _ = s.round(Instant::now()).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    })
}

struct Rig {
    api: MemoryReplayApi,
    timeline: Timeline,
    plan: Plan,
    index: HashMap<String, (usize, NodeInventory)>,
    fakes: Vec<(String, NodeInventory)>,
}

fn rig(arrivals: usize) -> Rig {
    rig_with(arrivals, Duration::from_millis(1))
}

/// A rig whose every request takes `latency`.
fn rig_with(arrivals: usize, latency: Duration) -> Rig {
    let memory = MemoryApi::new();
    put_foreign(&memory);
    let api = MemoryReplayApi::new(memory, NAMESPACE, latency, Duration::from_millis(20));
    let timeline = timeline(arrivals);
    let plan = Plan::new(&timeline, 7, "rp7").expect("plan");
    let nodes = &timeline.workload().nodes;
    let index = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), (i, n.clone())))
        .collect();
    let fakes = nodes.iter().map(|n| (n.name.clone(), n.clone())).collect();
    Rig {
        api,
        timeline,
        plan,
        index,
        fakes,
    }
}

impl Rig {
    /// The fake nodes made, then the whole plan at speed 600 with gpuplace's scheduler
    /// binding the pods, the replay's watch made to start over `relists` times 30 ms apart
    /// once the nodes are there; the scheduler stopped after.
    async fn run_whole(&self, relists: usize) -> driver::ReplayOutcome {
        let (stop_scheduler, stopped) = watch::channel(false);
        let thread = scheduler(self.api.api.clone(), stopped);
        let (_keep, cancel) = watch::channel(false);
        driver::prepare(&self.api, RUN, &self.fakes, &[], false)
            .await
            .expect("nodes");
        let api = self.api.clone();
        let relisting = tokio::spawn(async move {
            for _ in 0..relists {
                tokio::time::sleep(Duration::from_millis(30)).await;
                api.relist();
            }
        });
        let outcome = self.run(600.0, cancel).await.expect("replay");
        relisting.abort();
        let _ = stop_scheduler.send(true);
        let _ = thread.join();
        outcome
    }

    /// The driver on this rig at `speed`, until `cancel` or the plan's end.
    async fn run(
        &self,
        speed: f64,
        cancel: watch::Receiver<bool>,
    ) -> Result<driver::ReplayOutcome, ReplayError> {
        driver::run(
            &self.api,
            &self.plan,
            &self.timeline.workload().pods,
            &self.index,
            &config(speed),
            cancel,
            &|_| {},
        )
        .await
    }
}

/// Nothing labelled as a replay's is left.
async fn nothing_left(api: &MemoryReplayApi) {
    for kind in Kind::CLEAN_ORDER {
        assert_eq!(
            api.list_labelled(kind, gpuplace_replay::MANAGED_SELECTOR)
                .await
                .expect("list"),
            Vec::<String>::new(),
            "{kind:?} left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_runs_every_pod_through_the_scheduler_and_leaves_nothing() {
    let rig = rig(120);
    let outcome = rig.run_whole(0).await;
    // Every fake node's heartbeat was renewed while the replay ran (a second or more).
    let beats = rig.api.heartbeats();
    assert_eq!(beats.len(), rig.fakes.len());
    assert!(beats.values().all(|&n| n >= 2), "{beats:?}");
    let lives = &outcome.lives;
    assert_eq!(lives.len(), rig.plan.pods.len(), "every planned pod made");
    // The warm start was placed with the clock stopped: its pods bound then count as bound
    // at time 0 (the simulator places them in one round there), and the arrivals did not
    // queue behind its creations.
    let [warm_bound, warm_pods] = outcome.warm_bound;
    println!(
        "warm start: {warm_bound} of {warm_pods} bound in {:?}",
        outcome.warm_wall
    );
    assert!(warm_pods > 0 && warm_bound * 10 >= warm_pods * 9);
    let at_zero = lives.iter().filter(|l| l.bound == Some(Ms(0))).count();
    assert!(at_zero >= warm_bound, "{at_zero} bound at 0");
    let bound = lives.iter().filter(|l| l.bound.is_some()).count();
    assert!(
        bound * 10 >= lives.len() * 8,
        "{bound} of {} bound",
        lives.len()
    );
    for l in lives {
        if let Some(b) = l.bound {
            assert!(b >= l.arrival);
            // gpuplace records the exact GPUs; the replay reads them back.
            assert!(l.node.is_some() && l.gpus.is_some(), "{l:?}");
        }
        if let (Some(b), Some(e)) = (l.bound, l.end) {
            assert!(e >= b);
        }
    }
    let run = rig
        .timeline
        .measure_lives(Policy::GPUPLACE, 7, lives, outcome.counts, outcome.wall);
    assert!(run.means.allocation_pct > 10.0, "{:?}", run.means);
    let sim = rig.timeline.run(Policy::GPUPLACE, 7);
    for (class, w) in &run.waits {
        let sw = &sim.waits[class];
        println!(
            "{class:?}: live p50 {:.0} p90 {:.0} never {} / sim p50 {:.0} p90 {:.0} never {}",
            w.p50, w.p90, w.never_started, sw.p50, sw.p90, sw.never_started
        );
    }
    println!(
        "allocation live {:.1}% / simulated {:.1}%; requests {}; creation lag {:?} ms, deletion lag {:?} ms",
        run.means.allocation_pct,
        sim.means.allocation_pct,
        outcome.requests,
        outcome.creation_lag_ms,
        outcome.deletion_lag_ms
    );
    let cleaned = clean::delete_run(&rig.api, RUN).await.expect("clean");
    assert!(cleaned.total() > 0);
    nothing_left(&rig.api).await;
    foreign_intact(&rig.api.api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_on_a_server_without_dra_cleans_up_what_it_made() {
    // A v1.26 server serves no `resource.k8s.io`: the clean-up's lists of ResourceSlices and
    // ResourceClaimTemplates are answered 404. On the real 1.26 server that 404 stopped the
    // whole clean-up ("the replay ran, but cleaning up failed"), leaving the fake nodes for
    // the next replay to trip on; a kind the server does not serve has nothing to delete.
    let rig = rig(60);
    rig.api.serve_no_dra();
    rig.run_whole(0).await;
    let cleaned = clean::delete_run(&rig.api, RUN).await.expect("clean");
    let of = |kind: Kind| cleaned.deleted.iter().find(|d| d.0 == kind).map(|d| d.1);
    assert_eq!(of(Kind::ResourceSlice), Some(0));
    assert_eq!(of(Kind::ClaimTemplate), Some(0));
    assert_eq!(of(Kind::Node), Some(rig.fakes.len()));
    assert!(of(Kind::Pod).is_some_and(|n| n > 0), "{cleaned:?}");
    for kind in Kind::CLEAN_ORDER {
        let left = rig
            .api
            .list_labelled(kind, gpuplace_replay::MANAGED_SELECTOR)
            .await;
        match kind {
            Kind::ResourceSlice | Kind::ClaimTemplate => {
                assert!(matches!(left, Err(ApiError::NotFound(_))), "{left:?}");
            }
            _ => assert_eq!(left.expect("list"), Vec::<String>::new(), "{kind:?} left"),
        }
    }
    foreign_intact(&rig.api.api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_at_any_moment_leaves_nothing_after_the_clean_up() {
    for after_ms in [0u64, 30, 150, 400] {
        let rig = rig(400);
        let (stop_scheduler, stopped) = watch::channel(false);
        let thread = scheduler(rig.api.api.clone(), stopped);
        let (interrupt, cancel) = watch::channel(false);
        let work = async {
            driver::prepare(&rig.api, RUN, &rig.fakes, &[], false).await?;
            rig.run(600.0, cancel).await
        };
        let trip = async {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            let _ = interrupt.send(true);
        };
        tokio::pin!(work);
        let result = tokio::select! {
            r = &mut work => r,
            () = trip => work.await,
        };
        assert!(
            matches!(result, Err(ReplayError::Interrupted)),
            "{after_ms} ms: {result:?}"
        );
        clean::delete_run(&rig.api, RUN).await.expect("clean");
        let _ = stop_scheduler.send(true);
        let _ = thread.join();
        nothing_left(&rig.api).await;
        foreign_intact(&rig.api.api);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_stops_the_replay_with_a_clear_error_and_clean_finds_the_rest() {
    let rig = rig(400);
    let (_keep, cancel) = watch::channel(false);
    driver::prepare(&rig.api, RUN, &rig.fakes, &[], false)
        .await
        .expect("nodes");
    let api = rig.api.clone();
    let away = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        api.set_down(true);
    });
    let started = Instant::now();
    let result = rig.run(600.0, cancel).await;
    let _ = away.await;
    let error = result.expect_err("the server went away").to_string();
    assert!(
        error.contains("unavailable") || error.contains("watch"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "gave up in time"
    );
    // The run's clean-up fails while the server is away, with the server's words.
    let refused = clean::delete_run(&rig.api, RUN).await;
    assert!(refused.is_err());
    // Back: `--clean` finds everything by its label.
    rig.api.set_down(false);
    let cleaned = clean::delete_labelled(&rig.api).await.expect("clean");
    assert!(cleaned.total() > 0);
    nothing_left(&rig.api).await;
    foreign_intact(&rig.api.api);
}

#[tokio::test]
async fn leftovers_of_an_earlier_replay_are_named_and_bad_speeds_refused() {
    let rig = rig(50);
    driver::prepare(&rig.api, RUN, &rig.fakes, &[], false)
        .await
        .expect("nodes");
    // The same nodes again (a replay that was not cleaned), by another run.
    let error = driver::prepare(&rig.api, "rp7-other", &rig.fakes, &[], false)
        .await
        .expect_err("exists")
        .to_string();
    assert!(error.contains("already exists"), "{error}");
    // The second run's clean-up deletes nothing of the first's (found on the real server:
    // a clean-up by the names a run had asked for deleted another run's nodes, which the
    // server had refused to it as existing).
    let cleaned = clean::delete_run(&rig.api, "rp7-other")
        .await
        .expect("clean");
    assert_eq!(cleaned.total(), 0);
    assert!(rig.fakes.iter().all(|(n, _)| rig.api.api.node(n).is_some()));
    let (_keep, cancel) = watch::channel(false);
    for speed in [0.0, -1.0, f64::NAN, 1e9] {
        let result = rig.run(speed, cancel.clone()).await;
        assert!(matches!(result, Err(ReplayError::Speed(_))), "{speed}");
    }
    let cleaned = clean::delete_labelled(&rig.api).await.expect("clean");
    // The nodes and their heartbeats' Leases.
    assert_eq!(cleaned.total(), 2 * rig.fakes.len());
    foreign_intact(&rig.api.api);
}

/// A watch that starts over mid-run (a dropped watch, an API server restart) lists the
/// pods there are: those whose creation is still in flight are not in it, and are not
/// taken for evicted (their controller's pod would be made while the first comes, and the
/// first never leave on schedule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_mid_run_makes_no_pod_twice() {
    let rig = rig_with(200, Duration::from_millis(15));
    let outcome = rig.run_whole(40).await;
    let again: Vec<_> = outcome.lives.iter().filter(|l| l.by_controller).collect();
    assert!(
        again.is_empty(),
        "{} pods made again: {again:?}",
        again.len()
    );
    assert!(outcome.lives.iter().all(|l| !l.evicted));
    assert_eq!(outcome.lives.len(), rig.plan.pods.len());
    clean::delete_run(&rig.api, RUN).await.expect("clean");
    nothing_left(&rig.api).await;
    foreign_intact(&rig.api.api);
}

/// A busy server answers 429 with `Retry-After`: the replay's creations and its clean-up
/// wait as asked and go on (they once gave up after five tries, about 6 s, and a
/// clean-up at the first refusal).
#[tokio::test]
async fn throttled_requests_wait_as_the_server_asks_and_go_on() {
    let rig = rig(50);
    let asked = Duration::from_millis(100);
    rig.api.throttle(60, asked);
    let started = Instant::now();
    driver::prepare(&rig.api, RUN, &rig.fakes, &[], false)
        .await
        .expect("the nodes, once the server lets them through");
    // 60 answers of 429 over 6 nodes' creations and heartbeats, each waited out.
    assert!(started.elapsed() >= asked * 5, "{:?}", started.elapsed());
    assert!(rig.fakes.iter().all(|(n, _)| rig.api.api.node(n).is_some()));
    rig.api.throttle(60, asked);
    let cleaned = clean::delete_run(&rig.api, RUN).await.expect("clean");
    // Each fake node and its heartbeat Lease.
    assert_eq!(cleaned.total(), 2 * rig.fakes.len());
    nothing_left(&rig.api).await;
    foreign_intact(&rig.api.api);
}

#[tokio::test]
async fn a_dra_replay_makes_slices_and_templates_and_its_clean_up_deletes_them() {
    let rig = rig(50);
    let pods = &rig.timeline.workload().pods;
    let asked = rig.plan.pods.iter().map(|p| &pods[p.pod as usize].request);
    let templates: Vec<Object> = gpuplace_replay::claims::claim_templates(RUN, NAMESPACE, asked)
        .expect("templates")
        .into_iter()
        .map(|t| Object::ClaimTemplate(Box::new(t)))
        .collect();
    assert!(!templates.is_empty());
    driver::prepare(&rig.api, RUN, &rig.fakes, &templates, true)
        .await
        .expect("nodes");
    let selector = gpuplace_replay::run_selector(RUN);
    let listed = |kind| rig.api.list_labelled(kind, &selector);
    let with_gpus = rig.fakes.iter().filter(|(_, n)| !n.gpus.is_empty()).count();
    assert_eq!(
        listed(Kind::ResourceSlice).await.expect("list").len(),
        with_gpus
    );
    assert_eq!(
        listed(Kind::ClaimTemplate).await.expect("list").len(),
        templates.len()
    );
    for (name, _) in &rig.fakes {
        let node = rig.api.api.node(name).expect("node");
        let allocatable = node
            .status
            .and_then(|s| s.allocatable)
            .expect("allocatable");
        assert!(
            !allocatable.contains_key(gpuplace_model::keys::GPU_RESOURCE),
            "{name}"
        );
    }
    clean::delete_run(&rig.api, RUN).await.expect("clean");
    nothing_left(&rig.api).await;
    foreign_intact(&rig.api.api);
}
