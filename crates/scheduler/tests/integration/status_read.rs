//! `gpuplace status`'s one read, against kube's mock pattern answering as a real server
//! does: lists in pages with continue tokens, a cluster without the PodGroup CRD (404), a
//! server that refuses to select Events by reason (400: every Event is read and sorted
//! out here), and a server that fails (the error names what could not be listed).

use std::sync::{Arc, Mutex};

use gpuplace_scheduler::k8s::status_read;
use gpuplace_scheduler::status::{self, Filter};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

#[derive(Clone, Copy)]
struct Behaviour {
    selector_refused: bool,
    pods_fail: bool,
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("response")
}

fn status(code: u16, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "code": code})
}

fn node(name: &str) -> Value {
    let gpus: Vec<Value> = (0..4)
        .map(|i| {
            json!({"id": format!("{name}-g{i}"), "index": i, "model": "A100",
            "memory_mib": 81920, "healthy": true})
        })
        .collect();
    let inventory = json!({"name": name, "cpu_milli": 64000, "memory_mib": 262144, "gpus": gpus});
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"gpuplace.io/inventory": inventory.to_string()}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "4", "pods": "110"}}})
}

fn pod(i: usize) -> Value {
    let bound = i < 3;
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p{i}"), "namespace": "ml", "uid": format!("uid-{i}")},
        "spec": {"schedulerName": "gpuplace", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}});
    if bound {
        p["spec"]["nodeName"] = json!("n1");
        p["metadata"]["annotations"] = json!({"gpuplace.io/assignment": json!({
            "node": "n1", "policy": "gpuplace", "time": "2026-11-26T04:00:00Z",
            "containers": [{"name": "c", "devices": [{"index": i, "id": format!("n1-g{i}"), "milli": 1000}]}]
        }).to_string()});
    }
    p
}

/// Two pages of pods (a continue token between), one of nodes, Events by reason unless
/// refused, no PodGroup CRD.
fn answer(uri: &str, b: Behaviour) -> Response<Body> {
    let list = |kind: &str, items: Vec<Value>, next: &str| {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "9", "continue": next},
            "items": items})
    };
    if uri.starts_with("/api/v1/nodes") {
        return respond(200, &list("NodeList", vec![node("n1")], ""));
    }
    if uri.starts_with("/api/v1/pods") {
        if b.pods_fail {
            return respond(500, &status(500, "etcdserver: request timed out"));
        }
        if uri.contains("continue=page2") {
            return respond(200, &list("PodList", (3..6).map(pod).collect(), ""));
        }
        assert!(uri.contains("limit=500"), "paged: {uri}");
        return respond(200, &list("PodList", (0..3).map(pod).collect(), "page2"));
    }
    if uri.starts_with("/apis/gpuplace.io/") {
        return respond(
            404,
            &status(404, "the server could not find the requested resource"),
        );
    }
    if uri.starts_with("/apis/events.k8s.io/v1/events") {
        if uri.contains("fieldSelector") && b.selector_refused {
            return respond(400, &status(400, "field label not supported: reason"));
        }
        let event = |uid: &str, reason: &str, note: &str| {
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": format!("{uid}.1"), "namespace": "ml"},
                "eventTime": "2026-11-26T04:00:00.000000Z", "reason": reason, "note": note,
                "regarding": {"kind": "Pod", "name": "p", "namespace": "ml", "uid": uid}})
        };
        let mut items = vec![event(
            "uid-4",
            "FailedScheduling",
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        )];
        if !uri.contains("fieldSelector") {
            items.push(event("uid-0", "Scheduled", "bound"));
        }
        return respond(200, &list("EventList", items, ""));
    }
    respond(404, &status(404, "not found"))
}

fn client(b: Behaviour, seen: Arc<Mutex<Vec<String>>>) -> kube::Client {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        while let Some((request, send)) = handle.next_request().await {
            let uri = request.uri().to_string();
            seen.lock().unwrap().push(uri.clone());
            send.send_response(answer(&uri, b));
        }
    });
    kube::Client::new(service, "default")
}

#[tokio::test]
async fn one_read_pages_and_tolerates_what_a_cluster_may_lack() {
    for selector_refused in [false, true] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let b = Behaviour {
            selector_refused,
            pods_fail: false,
        };
        let read = status_read::read(client(b, seen.clone()), "nvidia.com/gpu", None)
            .await
            .expect("read");
        assert_eq!(read.view.pods.len(), 6, "both pages");
        assert!(read.view.groups.is_empty(), "no CRD: no gangs");
        let fleet = status::fleet(
            &read.view,
            "nvidia.com/gpu",
            &status::reasons::from_events(&read.failures),
            &Filter::default(),
        );
        assert_eq!(fleet.totals.allocated_milli, 3000);
        assert_eq!(fleet.pending.len(), 3);
        let p4 = fleet.pending.iter().find(|p| p.name == "p4").unwrap();
        assert!(
            p4.reason
                .as_deref()
                .unwrap_or_default()
                .contains("Insufficient"),
            "{:?}",
            p4.reason
        );
        let events: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|u| u.contains("events"))
            .cloned()
            .collect();
        assert!(
            events[0].contains("fieldSelector=reason%3DFailedScheduling"),
            "{events:?}"
        );
        assert_eq!(events.len(), if selector_refused { 2 } else { 1 });
    }
}

#[tokio::test]
async fn a_failed_list_is_named() {
    let b = Behaviour {
        selector_refused: false,
        pods_fail: true,
    };
    let err = status_read::read(client(b, Arc::default()), "nvidia.com/gpu", None)
        .await
        .err()
        .expect("an error");
    let text = err.to_string();
    assert!(text.starts_with("cannot list pods"), "{text}");
}
