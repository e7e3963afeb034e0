//! Publishing the inventory on the Node, against kube's mock pattern (a `Client` over a
//! tower-test service): a merge patch on start, again on every change, none for an
//! unchanged inventory, retries after the API server fails, and the annotation and labels
//! restored when the Node is deleted and re-created.

use std::sync::Arc;
use std::time::Duration;

use gpuplace_deviceplugin::publish::kube::KubePatcher;
use gpuplace_deviceplugin::publish::{self, NodeSeen};
use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory};
use http::{Request, Response};
use k8s_openapi::api::core::v1::Node;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tower_test::mock;

/// Serves the mock API: the first `failures` patches get a 500, the rest succeed. Every
/// patch is forwarded as (uri, content type, body).
fn api(
    failures: usize,
) -> (
    kube::Client,
    mpsc::UnboundedReceiver<(String, String, Value)>,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        let mut left = failures;
        while let Some((request, send)) = handle.next_request().await {
            let uri = request.uri().to_string();
            let content_type = request
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            let (code, reply) = if left > 0 {
                left -= 1;
                (
                    500,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "etcdserver: request timed out", "code": 500}),
                )
            } else {
                let _ = tx.send((uri, content_type, body.clone()));
                // The API server answers with the patched Node.
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1",
                        "annotations": body["metadata"]["annotations"],
                        "labels": body["metadata"].get("labels").cloned().unwrap_or(json!({}))}}),
                )
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        }
    });
    (kube::Client::new(service, "default"), rx)
}

async fn next(
    rx: &mut mpsc::UnboundedReceiver<(String, String, Value)>,
) -> (String, String, Value) {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a patch in time")
        .expect("server running")
}

fn published(body: &Value) -> NodeInventory {
    NodeInventory::from_json(
        body["metadata"]["annotations"][INVENTORY_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn publishes_on_start_and_on_every_change() {
    let (client, mut patches) = api(0);
    let inventory = NodeInventory::uniform("n1", 0, 0, 2, "A100");
    let (tx, rx) = watch::channel(Arc::new(inventory.clone()));
    let (_events, events_rx) = mpsc::channel::<NodeSeen>(4);
    let task = tokio::spawn(publish::keep_published(
        KubePatcher::new(client),
        "n1".into(),
        rx,
        1,
        events_rx,
    ));

    let (uri, content_type, body) = next(&mut patches).await;
    assert_eq!(uri, "/api/v1/nodes/n1?");
    assert_eq!(content_type, "application/merge-patch+json");
    assert_eq!(published(&body), inventory);
    assert_eq!(body["metadata"]["labels"]["nvidia.com/gpu.product"], "A100");
    assert_eq!(body["metadata"]["labels"]["nvidia.com/gpu.count"], "2");

    // The same inventory again: nothing to write.
    tx.send(Arc::new(inventory.clone())).unwrap();
    // A GPU turns unhealthy: published again.
    let mut sick = inventory.clone();
    sick.gpus[1].healthy = false;
    tx.send(Arc::new(sick.clone())).unwrap();
    let (_, _, body) = next(&mut patches).await;
    assert_eq!(published(&body), sick);

    drop(tx);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("ends when the inventory channel closes")
        .unwrap();
    assert!(
        patches.try_recv().is_err(),
        "no patch for an unchanged inventory"
    );
}

#[tokio::test]
async fn retries_after_the_api_server_fails() {
    let (client, mut patches) = api(2);
    let inventory = NodeInventory::uniform("n1", 0, 0, 8, "H100");
    let (_tx, rx) = watch::channel(Arc::new(inventory.clone()));
    let (_events, events_rx) = mpsc::channel::<NodeSeen>(4);
    tokio::spawn(publish::keep_published(
        KubePatcher::new(client),
        "n1".into(),
        rx,
        1,
        events_rx,
    ));
    let (_, _, body) = next(&mut patches).await;
    assert_eq!(published(&body), inventory);
}

fn node(value: Value) -> Node {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn restores_what_a_recreated_node_lacks_and_leaves_gfd_labels_to_gfd() {
    let (client, mut patches) = api(0);
    let inventory = NodeInventory::uniform("n1", 0, 0, 4, "A100");
    let (_tx, rx) = watch::channel(Arc::new(inventory.clone()));
    let (events, events_rx) = mpsc::channel::<NodeSeen>(4);
    tokio::spawn(publish::keep_published(
        KubePatcher::new(client),
        "n1".into(),
        rx,
        1,
        events_rx,
    ));
    // The watch's first view: a Node without the annotation.
    events
        .send(Some(node(json!({"metadata": {"name": "n1"}}))))
        .await
        .unwrap();
    let (_, _, body) = next(&mut patches).await;
    assert_eq!(published(&body), inventory);
    // The Node as it now is (a null in a merge patch removes the label): nothing to do.
    let mut labels = body["metadata"]["labels"].clone();
    labels.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    let complete = node(json!({"metadata": {"name": "n1",
        "annotations": body["metadata"]["annotations"], "labels": labels}}));
    events.send(Some(complete.clone())).await.unwrap();
    // (The watch's first view may predate the first patch: one idempotent patch more.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    while patches.try_recv().is_ok() {}
    // Deleted: nothing to patch. Re-created by the kubelet without our keys: restored.
    events.send(None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        patches.try_recv().is_err(),
        "no patch for a complete or deleted Node"
    );
    let started = std::time::Instant::now();
    events
        .send(Some(node(json!({"metadata": {"name": "n1",
            "labels": {"kubernetes.io/hostname": "n1"}}}))))
        .await
        .unwrap();
    let (_, _, body) = next(&mut patches).await;
    assert_eq!(published(&body), inventory);
    assert_eq!(body["metadata"]["labels"]["nvidia.com/gpu.count"], "4");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Re-created where GFD runs: only the annotation, GFD's labels stay GFD's.
    events
        .send(Some(node(json!({"metadata": {"name": "n1",
            "labels": {"nvidia.com/gfd.timestamp": "1", "nvidia.com/gpu.product": "NVIDIA-A100-GFD"}}}))))
        .await
        .unwrap();
    let (_, _, body) = next(&mut patches).await;
    assert_eq!(published(&body), inventory);
    assert_eq!(
        body["metadata"]["labels"],
        json!({"gpuplace.io/dra-driver": null}),
        "only the DRA label is gpuplace's: {body}"
    );
}
