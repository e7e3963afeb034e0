//! Pods with PersistentVolumeClaims, end to end on the in-memory API: a claim that is
//! missing or not bound (e.g. waiting for its first consumer) gives a FailedScheduling
//! Event that says so, never a silent placement; the pod is tried again when the claim
//! binds; a bound volume's node affinity limits the nodes.

use std::time::{Duration, Instant};

use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use crate::common::*;

fn claim(name: &str, volume: Option<&str>) -> PersistentVolumeClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"storageClassName": "local-nvme", "volumeName": volume}}))
    .unwrap()
}

fn local_volume(name: &str, node: &str) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"storageClassName": "local-nvme", "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
    .unwrap()
}

fn with_claim(name: &str, gpus: u32, claim: &str) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        gpus,
        json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}),
    )
}

fn failures(api: &MemoryApi, pod: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.pod.name == pod && e.reason == "FailedScheduling")
        .map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn an_unbound_claim_is_said_and_the_pod_runs_where_its_volume_is_once_bound() {
    let api = MemoryApi::new();
    for i in 0..3 {
        api.put_node(node(&format!("n{i}"), 8, json!({})));
    }
    api.put_claim(claim("data", None));
    api.put_pod(with_claim("train", 2, "data"));
    api.put_pod(with_claim("orphan", 1, "nope"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!((report.bound, report.unschedulable), (0, 2), "{report:?}");
    let said = failures(&api, "train");
    assert_eq!(said.len(), 1);
    assert!(
        kube_part(&said[0])
            .starts_with("0/3 nodes are available: persistentvolumeclaim \"data\" is not bound")
            && said[0].contains("WaitForFirstConsumer"),
        "{}",
        said[0]
    );
    assert_eq!(
        failures(&api, "orphan")
            .iter()
            .map(|m| kube_part(m))
            .collect::<Vec<_>>(),
        ["0/3 nodes are available: persistentvolumeclaim \"nope\" not found."]
    );
    // Nothing changed: the pods stay parked (no new attempt, no new Event).
    scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(failures(&api, "train").len(), 1);

    // Past its backoff but parked: still nothing without a change.
    let later = Instant::now() + Duration::from_secs(2);
    scheduler.round(later).await.unwrap();
    assert_eq!(failures(&api, "train").len(), 1);
    // The claim binds to a local volume on n2: the pod is tried again and lands there.
    api.put_volume(local_volume("nvme-n2", "n2"));
    api.put_claim(claim("data", Some("nvme-n2")));
    let report = scheduler.round(later).await.unwrap();
    assert_eq!(report.bound, 1, "{report:?}");
    assert_eq!(bound_node(&api, "train").as_deref(), Some("n2"));
    assert!(bound_node(&api, "orphan").is_none());
}

#[tokio::test]
async fn a_volume_on_a_full_node_is_a_node_affinity_conflict() {
    let api = MemoryApi::new();
    api.put_node(node("n0", 8, json!({})));
    api.put_node(node("n1", 8, json!({})));
    api.put_pod(pod(
        "big",
        8,
        json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}),
    ));
    api.put_volume(local_volume("nvme-n1", "n1"));
    api.put_claim(claim("data", Some("nvme-n1")));
    api.put_pod(with_claim("train", 1, "data"));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.unschedulable, 1, "{report:?}");
    let said = failures(&api, "train");
    assert!(
        said[0].contains("1 node(s) had volume node affinity conflict"),
        "{}",
        said[0]
    );
    assert!(
        said[0].contains("Insufficient nvidia.com/gpu"),
        "{}",
        said[0]
    );
}
