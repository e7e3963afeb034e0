//! The handshake end to end in one process: the in-memory API, three nodes with different
//! example inventories, a fake kubelet (serial admission, its own accounting, random
//! admission delays and interleavings), gpuplace's device plugin and reconciler per node,
//! and the scheduler. `GPUPLACE_HANDSHAKE_PODS` sets the pod count (default 4,000; the
//! soak in docs/development.md runs 10,000 and more). Each run draws fresh seeds for the
//! cluster's and the workload's randomness and prints them; `GPUPLACE_HANDSHAKE_SEED=N`
//! replays one.

use std::path::PathBuf;
use std::time::Duration;

use gpuplace_testkit::cluster::{ClusterOptions, HandshakeCluster};
use gpuplace_testkit::workload::{self, Deletion, RunReport};

fn inventories() -> Vec<(String, PathBuf)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/inventories");
    vec![
        ("dgx1".into(), dir.join("dgx1-hybrid-cube-mesh.yaml")),
        ("nvswitch".into(), dir.join("nvswitch-8.yaml")),
        ("pcie".into(), dir.join("pcie-4.yaml")),
    ]
}

fn pods() -> usize {
    std::env::var("GPUPLACE_HANDSHAKE_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000)
}

/// This run's seed for one test (printed; shown by `cargo test` when the test fails).
fn seed(test: &str) -> u64 {
    gpuplace_testkit::seed::for_run("GPUPLACE_HANDSHAKE_SEED", test)
}

async fn run(options: ClusterOptions, total: usize, deletion: Deletion, seed: u64) -> RunReport {
    run_mix(options, total, deletion, seed, 0).await
}

async fn run_mix(
    options: ClusterOptions,
    total: usize,
    deletion: Deletion,
    seed: u64,
    share_percent: u32,
) -> RunReport {
    let dir = tempfile::tempdir().unwrap();
    let cluster = HandshakeCluster::start(dir.path(), options).await.unwrap();
    let report = workload::run_mix(
        &cluster,
        total,
        24,
        (0, 20),
        deletion,
        seed,
        Duration::from_secs(600),
        share_percent,
    )
    .await;
    let handshake: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("{}: {}", n.name, n.handshake_counters().join(" ")))
        .collect();
    println!("{report:#?}\n{}", handshake.join("\n"));
    cluster.stop().await;
    report
}

/// Refusals are the kubelet's own ("devices unavailable"), never a failed Allocate of the
/// plugin, and rare: one happens only after a fallback answer (the plugin's pod watch late
/// by more than its 2 s wait, seen when the test machine is starved) put a pod on other
/// devices than planned and the next plan met them before the node's record did.
fn assert_refusals_rare(report: &RunReport) {
    assert!(
        report.refused * 200 <= report.created,
        "more than 0.5% refused: {report:?}"
    );
    assert!(
        report
            .examples
            .iter()
            .filter(|e| e.contains(" refused: "))
            .all(|e| e.contains("requested number of devices unavailable")),
        "{report:?}"
    );
}

fn options(seed: u64) -> ClusterOptions {
    ClusterOptions {
        nodes: inventories(),
        seed,
        admission_delay_ms: (0, 15),
        plugin_watch_delay_ms: (0, 15),
        terminating_ms: None,
        numa_alignment: false,
        pod_resources_get: true,
        round_interval: Duration::from_millis(2),
        policy: None,
        placer_seed: None,
        exact_resources: false,
        workload: None,
    }
}

/// Every record ends true. The one known exception, bounded: under heavy churn (pods
/// refused and force-deleted around it) a regular init container's Allocate is sometimes
/// attributed to another pod or none, so the pod's record misses that container, whose
/// devices its app containers hold. The stale-answer mend (21973e6) made it rarer, not
/// gone: one record in the first full local run of the twenty-sixth session (seed 502972,
/// not reproduced on replay); the cause is still open (its records are listed in
/// `untrue_examples`).
fn assert_records_true(report: &RunReport) {
    assert_eq!(report.untrue_records, 0, "{report:?}");
    assert!(
        report.init_unrecorded * 100 <= report.admitted.max(100),
        "more than 1% of admitted pods' records miss an init container: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_container_gets_the_scheduled_devices_under_random_admission_order() {
    let seed = seed("every_container_gets_the_scheduled_devices_under_random_admission_order");
    let total = pods();
    let report = run(options(seed), total, Deletion::Graceful, seed).await;
    assert!(report.created >= total, "{report:?}");
    assert_eq!(
        report.admitted + report.refused,
        report.created,
        "every pod admitted or refused: {report:?}"
    );
    assert_eq!(report.refused, 0, "{report:?}");
    assert_eq!(report.double_use, 0);
    // Only the kubelet's own random split of one init container's devices between two app
    // containers (it calls no GetPreferredAllocation there) may differ, and the node's
    // record then tells the truth.
    assert_eq!(
        report.mismatches, report.mismatches_random_reuse,
        "mismatches outside the kubelet's random reuse: {report:?}"
    );
    assert_records_true(&report);
    assert_eq!(report.overlapping_records, 0, "{report:?}");
}

/// Shares mixed in (30% of the pods ask 100-900 milli of one GPU as `gpuplace.io/gpu-milli`,
/// some with two containers sharing it): the kubelets admit every pod the scheduler
/// placed, no GPU ever holds more than 1000 milli by a kubelet's record (checked after
/// every admission), and each container gets the GPU the scheduler chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_run_on_the_planned_gpu_and_no_gpu_goes_over_1000_milli() {
    let seed = seed("shares_run_on_the_planned_gpu_and_no_gpu_goes_over_1000_milli");
    let total = pods();
    let report = run_mix(options(seed), total, Deletion::Graceful, seed, 30).await;
    assert!(report.created >= total, "{report:?}");
    assert_eq!(
        report.admitted + report.refused,
        report.created,
        "{report:?}"
    );
    assert_eq!(report.refused, 0, "{report:?}");
    assert!(report.shares_admitted * 5 >= report.created, "{report:?}");
    assert_eq!(report.overcommitted, 0, "{report:?}");
    assert_eq!(report.double_use, 0);
    assert_eq!(
        report.mismatches, report.mismatches_random_reuse,
        "mismatches outside the kubelet's random reuse: {report:?}"
    );
    assert_records_true(&report);
    assert_eq!(report.overlapping_records, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_pods_keep_their_devices_and_the_scheduler_waits_for_them() {
    let seed = seed("terminating_pods_keep_their_devices_and_the_scheduler_waits_for_them");
    // Graceful deletion: the pod stays (deletionTimestamp) while the kubelet stops it and
    // holds its devices; the scheduler counts it until it is gone, so plans stay true.
    // Kubelets without PodResources Get (1.26-1.33): identification by List alone.
    let total = (pods() / 2).max(200);
    let mut o = options(seed);
    o.terminating_ms = Some((5, 60));
    o.pod_resources_get = false;
    let report = run(o, total, Deletion::Graceful, seed).await;
    // The scheduler counts a stopping pod until the kubelet deletes it, so no plan lands on
    // devices the kubelet still holds: nothing refused, nothing differs but what the
    // kubelet's random reuse makes differ. (Refusals and mismatches seen here before were
    // the fake kubelet's: it deleted a stopping pod at once when a later change of it, such
    // as its record being written, came in.)
    assert_eq!(report.refused, 0, "{report:?}");
    assert_eq!(report.double_use, 0);
    assert_eq!(
        report.mismatches, report.mismatches_random_reuse,
        "mismatches outside the kubelet's random reuse: {report:?}"
    );
    assert_records_true(&report);
    assert_eq!(report.overlapping_records, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_pods_still_holding_devices_are_reported_and_records_end_true() {
    let seed = seed("force_deleted_pods_still_holding_devices_are_reported_and_records_end_true");
    // Force deletion: gone from the API at once while the kubelet still holds the devices
    // for a while. Plans onto them cannot be honoured: the kubelet picks other devices
    // (reported, recorded) or refuses the pod when too few are free; no GPU is ever used
    // twice and every record ends true.
    let total = (pods() / 2).max(200);
    let mut o = options(seed);
    o.terminating_ms = Some((5, 60));
    let report = run(o, total, Deletion::Force, seed).await;
    assert_eq!(report.double_use, 0);
    assert_records_true(&report);
    assert_eq!(report.overlapping_records, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numa_aligned_kubelets_override_plans_across_their_hint_and_records_end_true() {
    let seed = seed("numa_aligned_kubelets_override_plans_across_their_hint_and_records_end_true");
    // With the Topology Manager aligning devices to one NUMA node, the kubelet offers only
    // the aligned devices (or takes an exactly aligned set without asking): a plan on
    // another NUMA node cannot be honoured. The scheduler does not yet plan by the node's
    // NUMA hint, so containers differ; they run, are reported, and every record ends true.
    let total = (pods() / 2).max(200);
    let mut o = options(seed);
    o.numa_alignment = true;
    let report = run(o, total, Deletion::Graceful, seed).await;
    assert_refusals_rare(&report);
    assert_eq!(report.double_use, 0);
    assert_records_true(&report);
    assert_eq!(report.overlapping_records, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_bound_without_gpuplace_is_recorded_and_later_pods_avoid_its_gpus() {
    use gpuplace_model::{ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Allocated, Assignment};
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(3);
    o.nodes.truncate(1);
    let cluster = HandshakeCluster::start(dir.path(), o).await.unwrap();
    // Another scheduler's pod: bound by nodeName, two GPUs, no assignment.
    let mut foreign = workload::pod_of("foreign", workload::Shape::Whole(2), None);
    let spec = foreign.spec.as_mut().unwrap();
    spec.node_name = Some("dgx1".into());
    spec.scheduler_name = Some("default-scheduler".into());
    cluster.api.put_pod(foreign);
    let wait = |what: &'static str, check: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let annotation = |name: &str, key: &str| {
        cluster
            .api
            .pod("ml", name)
            .and_then(|p| p.metadata.annotations)
            .and_then(|a| a.get(key).cloned())
    };
    wait("the node records the foreign pod's devices", &|| {
        annotation("foreign", ALLOCATED_ANNOTATION).is_some()
    });
    let recorded =
        Allocated::from_json(&annotation("foreign", ALLOCATED_ANNOTATION).unwrap()).unwrap();
    let node = &cluster.nodes[0];
    let kubelet = node.fake.admissions()[0].containers[0].2.clone();
    let held: HashSet<String> = recorded.devices().iter().map(|d| d.id.clone()).collect();
    assert_eq!(held, kubelet.iter().cloned().collect::<HashSet<_>>());
    // A gpuplace pod for the other six GPUs gets exactly them, as planned.
    cluster
        .api
        .put_pod(workload::pod_of("six", workload::Shape::Whole(6), None));
    wait("the 6-GPU pod is admitted", &|| {
        node.fake.admissions().len() == 2
    });
    let plan = Assignment::from_json(&annotation("six", ASSIGNMENT_ANNOTATION).unwrap()).unwrap();
    let planned: HashSet<String> = plan.devices().map(|d| d.id.clone()).collect();
    let got: HashSet<String> = node.fake.admissions()[1].containers[0]
        .2
        .iter()
        .cloned()
        .collect();
    assert_eq!(planned, got, "the kubelet gave the planned GPUs");
    assert!(
        planned.is_disjoint(&held),
        "no GPU of the foreign pod planned"
    );
    // The plan was honoured: nothing to correct, no Warning.
    std::thread::sleep(Duration::from_millis(800));
    assert!(annotation("six", ALLOCATED_ANNOTATION).is_none());
    assert!(
        cluster
            .api
            .events()
            .iter()
            .all(|e| e.reason != "GPUAllocationDiffers")
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_node_gets_its_inventory_back_from_the_plugin() {
    use gpuplace_deviceplugin::publish::{self, NodeSeen};
    use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory};
    use std::sync::Arc;
    let api = gpuplace_testkit::MemoryApi::new();
    let fresh = |labels: serde_json::Value| -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "labels": labels}}))
            .unwrap()
    };
    api.put_node(fresh(serde_json::json!({"kubernetes.io/hostname": "n1"})));
    let inventory = NodeInventory::uniform("n1", 0, 0, 4, "A100");
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(Arc::new(inventory.clone()));
    let (tx, rx) = tokio::sync::mpsc::channel::<NodeSeen>(16);
    let feed = tokio::spawn(gpuplace_testkit::node_feed::feed_node(
        api.clone(),
        "n1".into(),
        tx,
    ));
    let publisher = tokio::spawn(publish::keep_published(
        api.clone(),
        "n1".into(),
        inv_rx,
        1,
        rx,
    ));
    let has_inventory = |api: &gpuplace_testkit::MemoryApi| {
        api.node("n1")
            .and_then(|n| n.metadata.annotations)
            .and_then(|a| a.get(INVENTORY_ANNOTATION).cloned())
            .is_some_and(|t| NodeInventory::from_json(&t).ok() == Some(inventory.clone()))
    };
    let wait = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait("published on start", &|| has_inventory(&api));
    // `kubectl delete node`, then the kubelet registers it again: a fresh Node.
    api.delete_node("n1");
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    api.put_node(fresh(serde_json::json!({"kubernetes.io/hostname": "n1"})));
    wait("restored after re-creation", &|| has_inventory(&api));
    let labels = api.node("n1").unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.count"], "4");
    assert_eq!(
        labels["kubernetes.io/hostname"], "n1",
        "other writers' labels kept"
    );
    println!(
        "inventory back {:?} after the Node was re-created",
        started.elapsed()
    );
    // Re-created where GFD runs: its labels stay GFD's.
    api.delete_node("n1");
    api.put_node(fresh(serde_json::json!({
        "nvidia.com/gfd.timestamp": "1", "nvidia.com/gpu.product": "NVIDIA-A100-GFD"})));
    wait("restored where GFD runs", &|| has_inventory(&api));
    let labels = api.node("n1").unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-GFD");
    assert!(!labels.contains_key("nvidia.com/gpu.count"));
    publisher.abort();
    feed.abort();
}
