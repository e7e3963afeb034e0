//! The kube adapter's node creation against a mock API server answering request by
//! request: a status write that fails once is tried again, a node an earlier try of this
//! run made is finished (status and taints written) rather than counted as made, and one
//! another run made is refused.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use super::*;

/// What the mock server answers and saw.
#[derive(Default)]
struct Server {
    /// The create answers 409 AlreadyExists, and the node there carries this run label.
    exists_with_run: Option<String>,
    /// Status writes still to fail with a 503.
    failing_status: usize,
    /// (method, path) of each request.
    seen: Vec<(String, String)>,
}

fn respond(code: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).expect("json")))
        .expect("a response")
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        "reason": reason, "message": reason})
}

fn serve(server: Arc<Mutex<Server>>) -> kube::Client {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().to_string();
            let path = request.uri().path().to_string();
            let mut s = server.lock().expect("lock");
            s.seen.push((method.clone(), path.clone()));
            let node = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "rp-n0",
                    "labels": {RUN_LABEL: s.exists_with_run.clone().unwrap_or_else(|| "rp-1".into())}}});
            let answer = match (method.as_str(), path.as_str()) {
                ("POST", "/api/v1/nodes") if s.exists_with_run.is_some() => {
                    respond(409, status(409, "AlreadyExists"))
                }
                ("POST", "/api/v1/nodes") => respond(201, node),
                ("GET", "/api/v1/nodes/rp-n0") => respond(200, node),
                ("PATCH", "/api/v1/nodes/rp-n0/status") if s.failing_status > 0 => {
                    s.failing_status -= 1;
                    respond(503, status(503, "ServiceUnavailable"))
                }
                ("PATCH", _) => respond(200, node),
                _ => respond(404, status(404, "NotFound")),
            };
            send.send_response(answer);
        }
    });
    kube::Client::new(service, "default")
}

fn node(run: &str) -> Node {
    let inv = gpuplace_model::NodeInventory::uniform("n", 8_000, 65_536, 2, "A100");
    crate::objects::fake_node(run, "rp-n0", &inv).expect("a node")
}

fn seen(server: &Arc<Mutex<Server>>) -> Vec<(String, String)> {
    server.lock().expect("lock").seen.clone()
}

#[tokio::test(start_paused = true)]
async fn a_status_write_that_fails_is_tried_again_before_the_node_counts() {
    let server = Arc::new(Mutex::new(Server {
        failing_status: 2,
        ..Server::default()
    }));
    let api = KubeReplayApi::new(serve(Arc::clone(&server)), "default");
    api.create_node(&node("rp-1")).await.expect("made");
    let patches: Vec<_> = seen(&server)
        .into_iter()
        .filter(|(m, _)| m == "PATCH")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        patches,
        [
            "/api/v1/nodes/rp-n0/status",
            "/api/v1/nodes/rp-n0/status",
            "/api/v1/nodes/rp-n0/status",
            "/api/v1/nodes/rp-n0"
        ],
        "two failed status writes, the third, then the taints"
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_an_earlier_try_made_is_finished_and_another_runs_refused() {
    let server = Arc::new(Mutex::new(Server {
        exists_with_run: Some("rp-1".into()),
        ..Server::default()
    }));
    let api = KubeReplayApi::new(serve(Arc::clone(&server)), "default");
    api.create_node(&node("rp-1")).await.expect("finished");
    let methods: Vec<String> = seen(&server).into_iter().map(|(m, _)| m).collect();
    assert_eq!(methods, ["POST", "GET", "PATCH", "PATCH"]);
    let refused = api.create_node(&node("rp-2")).await;
    assert!(
        matches!(refused, Err(ApiError::AlreadyExists(_))),
        "{refused:?}"
    );
}
