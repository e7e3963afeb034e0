//! The in-memory API's own behaviour: its cache follows the watch and relists only after a
//! gap longer than the history (the lib's one unit test, moved here so the lib is not
//! compiled a second time for it).

use gpuplace_scheduler::{ClusterApi, ClusterView};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"schedulerName": "gpuplace", "containers": []}
    }))
    .unwrap()
}

fn names(view: &ClusterView) -> Vec<String> {
    view.pods.iter().map(|p| p.key.name.clone()).collect()
}

#[tokio::test]
async fn the_cache_follows_the_watch_and_relists_after_compaction() {
    let api = MemoryApi::new();
    api.put_pod(pod("a"));
    api.put_pod(pod("b"));
    assert_eq!(names(&api.view().await.unwrap()), ["a", "b"]);
    assert_eq!(api.relists(), 1, "the first view lists");

    // Changes arrive as watch events: no relist.
    api.delete_pod("ns", "a");
    api.put_pod(pod("c"));
    let uid = api.pod("ns", "b").unwrap().metadata.uid.unwrap();
    api.set_annotation("ns", "b", &uid, "gpuplace.io/assignment", "{}")
        .unwrap();
    let view = api.view().await.unwrap();
    assert_eq!(names(&view), ["b", "c"]);
    assert_eq!(view.pods[0].assignment.as_deref(), Some("{}"));
    assert_eq!(api.relists(), 1);

    // A gap longer than the history: 410 Gone, so the cache lists again, and a pod
    // deleted during the gap is gone from it.
    api.delete_pod("ns", "c");
    api.compact_history();
    assert_eq!(names(&api.view().await.unwrap()), ["b"]);
    assert_eq!(api.relists(), 2);
}
