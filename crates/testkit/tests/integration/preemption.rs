//! Priority preemption end to end: the in-memory API, seven DGX-1 nodes with fake kubelets
//! (serial admission, their own device accounting, terminating pods holding their devices
//! for a while) and gpuplace's device plugin, and the scheduler. A full cluster of
//! low-priority pods; then a high-priority 8-GPU pod and a 4 x 8-GPU gang arrive. Each
//! evicts the fewest pods it can, runs on exactly the devices its victims freed, and
//! nothing else is evicted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuplace_scheduler::k8s::gang::{PodGroup, PodGroupSpec};
use gpuplace_testkit::cluster::{ClusterOptions, HandshakeCluster};
use gpuplace_testkit::workload::{Shape, pod_of};
use k8s_openapi::api::core::v1::Pod;

fn options() -> ClusterOptions {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/inventories/dgx1-hybrid-cube-mesh.yaml");
    ClusterOptions {
        nodes: (0..7).map(|i| (format!("n{i}"), file.clone())).collect(),
        seed: 11,
        admission_delay_ms: (0, 10),
        plugin_watch_delay_ms: (0, 10),
        // Victims keep their devices a while after they are deleted.
        terminating_ms: Some((100, 400)),
        numa_alignment: false,
        pod_resources_get: true,
        round_interval: Duration::from_millis(5),
        policy: None,
        placer_seed: None,
        exact_resources: false,
        workload: None,
    }
}

fn with_priority(mut pod: Pod, priority: i32) -> Pod {
    pod.spec.as_mut().expect("spec").priority = Some(priority);
    pod
}

fn wait(what: &str, timeout: Duration, check: &dyn Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pod name -> (node, devices) as the kubelets admitted them, for pods still in the API.
fn running(cluster: &HandshakeCluster) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let live: BTreeMap<String, String> = cluster
        .api
        .pods()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect();
    let mut out = BTreeMap::new();
    for node in &cluster.nodes {
        for a in node.fake.admissions() {
            if a.error.is_none() && live.get(&a.name) == Some(&a.uid) {
                let devices = a.containers.iter().flat_map(|c| c.2.clone()).collect();
                out.insert(a.name.clone(), (node.name.clone(), devices));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_and_gang_take_exactly_what_their_victims_free() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = HandshakeCluster::start(dir.path(), options())
        .await
        .unwrap();
    // 56 GPUs: ten 4-GPU pods and sixteen 1-GPU pods, all priority 0.
    let mut low = Vec::new();
    for i in 0..10 {
        low.push(format!("low4-{i}"));
        cluster.api.put_pod(with_priority(
            pod_of(&low[low.len() - 1], Shape::Whole(4), None),
            0,
        ));
    }
    for i in 0..16 {
        low.push(format!("low1-{i}"));
        cluster.api.put_pod(with_priority(
            pod_of(&low[low.len() - 1], Shape::Whole(1), None),
            0,
        ));
    }
    wait(
        "the low-priority pods run",
        Duration::from_secs(60),
        &|| running(&cluster).len() == low.len(),
    );
    let before = running(&cluster);
    let pods_on = |state: &BTreeMap<String, (String, BTreeSet<String>)>, node: &str| {
        state
            .iter()
            .filter(|(_, (n, _))| n == node)
            .map(|(name, _)| name.clone())
            .collect::<BTreeSet<String>>()
    };
    let count_on = |node: &str| pods_on(&before, node).len();

    // A high-priority 8-GPU pod.
    cluster
        .api
        .put_pod(with_priority(pod_of("hi8", Shape::Whole(8), None), 1000));
    wait("hi8 runs", Duration::from_secs(60), &|| {
        running(&cluster).contains_key("hi8")
    });
    let after_one = running(&cluster);
    let (node8, devices8) = after_one["hi8"].clone();
    let victims8 = pods_on(&before, &node8);
    let freed: BTreeSet<String> = victims8
        .iter()
        .flat_map(|v| before[v].1.iter().cloned())
        .collect();
    assert_eq!(devices8, freed, "hi8 got exactly what its victims held");
    println!(
        "low pods per node: {:?}; hi8 on {node8} evicting {victims8:?}",
        cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), count_on(&n.name)))
            .collect::<Vec<_>>()
    );
    let fewest = cluster
        .nodes
        .iter()
        .map(|n| count_on(&n.name))
        .min()
        .unwrap();
    assert_eq!(victims8.len(), fewest, "the node with the fewest victims");
    for name in &low {
        let evicted = !after_one.contains_key(name);
        assert_eq!(
            evicted,
            victims8.contains(name),
            "{name}: only hi8's victims go"
        );
    }
    // (Its nominatedNodeName is not checked here: a real kubelet's first status write drops
    // it once the pod runs; the Event below names the nominated node.)

    // A gang of four 8-GPU members, priority 1000.
    let mut group = PodGroup::new(
        "train",
        PodGroupSpec {
            min_member: 4,
            ..Default::default()
        },
    );
    group.metadata.namespace = Some("ml".into());
    cluster.api.put_group(group);
    let members: Vec<String> = (0..4).map(|i| format!("train-{i}")).collect();
    for m in &members {
        cluster.api.put_pod(with_priority(
            pod_of(m, Shape::Whole(8), Some("train")),
            1000,
        ));
    }
    wait("the gang runs", Duration::from_secs(90), &|| {
        let r = running(&cluster);
        members.iter().all(|m| r.contains_key(m))
    });
    let after_gang = running(&cluster);
    let gang_nodes: BTreeSet<String> = members.iter().map(|m| after_gang[m].0.clone()).collect();
    assert_eq!(gang_nodes.len(), 4, "one member per node");
    assert!(!gang_nodes.contains(&node8));
    let mut counts: Vec<usize> = cluster
        .nodes
        .iter()
        .filter(|n| n.name != node8)
        .map(|n| count_on(&n.name))
        .collect();
    counts.sort();
    println!("gang on {gang_nodes:?}");
    let gang_victims: usize = gang_nodes.iter().map(|n| count_on(n)).sum();
    assert_eq!(
        gang_victims,
        counts[..4].iter().sum::<usize>(),
        "the four nodes with the fewest victims"
    );
    for m in &members {
        let (node, devices) = &after_gang[m];
        let freed: BTreeSet<String> = pods_on(&before, node)
            .iter()
            .flat_map(|v| before[v].1.iter().cloned())
            .collect();
        assert_eq!(devices, &freed, "{m} got exactly what its victims held");
    }
    // Survivors: every low pod on the two untouched nodes, never deleted.
    let untouched: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .filter(|n| *n != node8 && !gang_nodes.contains(n))
        .collect();
    assert_eq!(untouched.len(), 2);
    for name in &low {
        let node = &before[name].0;
        assert_eq!(
            after_gang.contains_key(name),
            untouched.contains(node),
            "{name} on {node}"
        );
    }
    // Events in kube-scheduler's words, one per victim.
    let events = cluster.api.events();
    let preempted: HashMap<String, String> = events
        .iter()
        .filter(|e| e.reason == "Preempted")
        .map(|e| (e.pod.name.clone(), e.message.clone()))
        .collect();
    for v in &victims8 {
        assert_eq!(
            preempted.get(v).map(String::as_str),
            Some(format!("Preempted by ml/hi8 on node {node8}").as_str())
        );
    }
    assert_eq!(
        preempted.len(),
        low.len() - untouched.iter().map(|n| count_on(n)).sum::<usize>()
    );
    assert!(events.iter().any(|e| {
        e.pod.name == "hi8"
            && e.reason == "FailedScheduling"
            && e.message
                .contains(&format!("preemption: nominated node {node8}"))
    }));
    for node in &cluster.nodes {
        assert_eq!(node.fake.double_use(), 0, "{}", node.name);
    }
    cluster.stop().await;
}
