//! The kube-rs adapter against kube's mock pattern: a `Client` over a tower-test service,
//! answered by a small API server that speaks the real wire format (paged lists, watches
//! from a resourceVersion, merge patches with a resourceVersion precondition answered 409
//! when stale, the binding subresource, events.k8s.io/v1, the status subresource).
//!
//! Every request the adapter sends is recorded, so the tests check what goes over the wire,
//! not only what comes back, and one test runs the real scheduling loop over it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuplace_scheduler::api::BindRequest;
use gpuplace_scheduler::k8s::gang::PodGroupStatus;
use gpuplace_scheduler::k8s::kube_api::KubeApi;
use gpuplace_scheduler::{ApiError, ClusterApi, EventRecord, PodKey, Scheduler, SchedulerConfig};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    uri: String,
    #[allow(dead_code)]
    content_type: String,
    body: Value,
}

#[derive(Default)]
struct Server {
    seen: Vec<Seen>,
    /// The pod's current resourceVersion; Bindings with another one are refused.
    pod_rv: u64,
    bound_to: Option<String>,
    /// Annotations the Binding merged into the pod.
    annotations: serde_json::Map<String, Value>,
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "resourceVersion": "3",
            "labels": {"nvidia.com/gpu.product": "A100"},
            "annotations": {"gpuplace.io/inventory": inventory(), "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(4000)},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "2", "pods": "110"},
            "images": [{"names": ["registry.example/big:1"], "sizeBytes": 123456789}]
        }
    })
}

fn inventory() -> String {
    json!({
        "name": "n1", "cpu_milli": 0, "memory_mib": 0,
        "gpus": [
            {"id": "GPU-aaaa", "index": 0, "uuid": "GPU-aaaa", "model": "A100"},
            {"id": "GPU-bbbb", "index": 1, "uuid": "GPU-bbbb", "model": "A100"}
        ],
        "links": [{"a": 0, "b": 1, "nvlinks": 12, "pcie": "same-cpu"}]
    })
    .to_string()
}

fn pod(rv: u64, node: Option<&str>, annotations: &serde_json::Map<String, Value>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-train-0",
            "resourceVersion": rv.to_string(), "creationTimestamp": "2026-11-01T00:00:00Z",
            "annotations": annotations},
        "spec": {"schedulerName": "gpuplace", "nodeName": node,
            "containers": [{"name": "main", "image": "trainer:1", "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("response")
}

/// A DNS-1123 subdomain, as the API server requires of most object names.
fn dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Why the API server would refuse this events.k8s.io/v1 Event (its name, or a
/// `generateName` checked as a name prefix with a trailing dash allowed; the required
/// fields and their sizes), if it would.
fn event_invalid(body: &Value) -> Option<String> {
    let meta = &body["metadata"];
    match (meta["name"].as_str(), meta["generateName"].as_str()) {
        (Some(name), _) if !dns_subdomain(name) => {
            return Some(format!("metadata.name: Invalid value: {name:?}"));
        }
        (None, Some(prefix)) => {
            let masked = match prefix.strip_suffix('-') {
                Some(rest) => format!("{rest}a"),
                None => prefix.to_string(),
            };
            if !dns_subdomain(&masked) {
                return Some(format!(
                    "metadata.generateName: Invalid value: {prefix:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ));
            }
        }
        (None, None) => return Some("metadata.name: Required value".into()),
        _ => {}
    }
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if body[field].as_str().is_none_or(str::is_empty) {
            return Some(format!("{field}: Required value"));
        }
    }
    for field in ["reportingInstance", "action", "reason"] {
        if body[field].as_str().is_some_and(|v| v.len() > 128) {
            return Some(format!("{field}: Too long: may not be more than 128 bytes"));
        }
    }
    if body["note"].as_str().is_some_and(|n| n.len() > 1024) {
        return Some("note: Too long: may not be more than 1024 bytes".into());
    }
    if !matches!(body["type"].as_str(), Some("Normal" | "Warning")) {
        return Some("type: Unsupported value".into());
    }
    if body["regarding"].is_null() {
        return Some("regarding: Required value".into());
    }
    None
}

/// Answers what the adapter asks, as an API server would.
async fn answer(server: &Mutex<Server>, method: &str, uri: &str, body: &Value) -> (u16, Value) {
    let path = uri.split('?').next().unwrap_or("");
    let watch = uri.contains("watch=true");
    let mut s = server.lock().unwrap();
    match (method, path) {
        ("GET", "/api/v1/nodes") if !watch => (
            200,
            json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}, "items": [node()]}),
        ),
        ("GET", "/api/v1/pods") if !watch => {
            let items = vec![pod(s.pod_rv, s.bound_to.as_deref(), &s.annotations)];
            (
                200,
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}, "items": items}),
            )
        }
        ("GET", "/api/v1/persistentvolumeclaims") if !watch => (
            200,
            json!({"kind": "PersistentVolumeClaimList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"},
                "items": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "namespace": "ml", "resourceVersion": "4",
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                    "spec": {"volumeName": "nvme-n1", "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "100Gi"}}},
                    "status": {"phase": "Bound"}}]}),
        ),
        ("GET", "/api/v1/persistentvolumes") if !watch => (
            200,
            json!({"kind": "PersistentVolumeList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"},
                "items": [{"apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": "nvme-n1", "resourceVersion": "4"},
                    "spec": {"capacity": {"storage": "100Gi"}, "local": {"path": "/mnt/nvme"},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}},
                    "status": {"phase": "Bound"}}]}),
        ),
        ("GET", "/apis/gpuplace.io/v1alpha1/podgroups") if !watch => (
            200,
            json!({"kind": "PodGroupList", "apiVersion": "gpuplace.io/v1alpha1", "metadata": {"resourceVersion": "10"}, "items": []}),
        ),
        ("PATCH", "/api/v1/namespaces/ml/pods/train-0") => {
            let wanted = body["metadata"]["resourceVersion"].as_str();
            if wanted.is_some_and(|rv| rv != s.pod_rv.to_string()) {
                return (
                    409,
                    status(
                        409,
                        "Conflict",
                        "Operation cannot be fulfilled on pods \"train-0\": the object has been modified; please apply your changes to the latest version and try again",
                    ),
                );
            }
            s.pod_rv += 1;
            (200, pod(s.pod_rv, s.bound_to.as_deref(), &s.annotations))
        }
        ("GET", "/api/v1/namespaces/ml/pods/train-0") => {
            (200, pod(s.pod_rv, s.bound_to.as_deref(), &s.annotations))
        }
        ("POST", "/api/v1/namespaces/ml/pods/train-0/binding") => {
            // kube-apiserver's BindingREST: the resourceVersion is a precondition (the UID
            // is not checked: measured on a real server); annotations are merged into the
            // pod in the same update that sets spec.nodeName.
            if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                && rv != s.pod_rv.to_string()
            {
                return (
                    409,
                    status(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on pods \"train-0\": StorageError: invalid object, Code: 4, AdditionalErrorMsg: Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            s.pod_rv
                        ),
                    ),
                );
            }
            if s.bound_to.is_some() {
                return (
                    409,
                    status(409, "Conflict", "pod train-0 is already assigned to node"),
                );
            }
            if let Some(a) = body["metadata"]["annotations"].as_object() {
                s.annotations.extend(a.clone());
            }
            s.pod_rv += 1;
            s.bound_to = body["target"]["name"].as_str().map(String::from);
            (
                201,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            )
        }
        ("POST", "/api/v1/namespaces/ml/pods/gone/binding") => {
            (404, status(404, "NotFound", "pods \"gone\" not found"))
        }
        ("POST", "/apis/events.k8s.io/v1/namespaces/ml/events") => match event_invalid(body) {
            Some(why) => (422, status(422, "Invalid", &why)),
            None => {
                let mut event = body.clone();
                if event["metadata"]["name"].is_null() {
                    let prefix = event["metadata"]["generateName"].as_str().unwrap_or("");
                    event["metadata"]["name"] = json!(format!("{prefix}x7k2p"));
                }
                (201, event)
            }
        },
        ("PATCH", p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/ml/events/") => {
            (200, body.clone())
        }
        ("PATCH", "/apis/gpuplace.io/v1alpha1/namespaces/ml/podgroups/g/status") => (
            200,
            json!({"apiVersion": "gpuplace.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": 2},
                "status": body["status"].clone()}),
        ),
        _ => (404, status(404, "NotFound", &format!("{method} {uri}"))),
    }
}

/// Starts the mock API server; watches are answered with an empty stream after a pause
/// (the watcher then watches again from the same resourceVersion).
fn serve(server: Arc<Mutex<Server>>) -> kube::Client {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().to_string();
            let uri = request.uri().to_string();
            let content_type = request
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if uri.contains("watch=true") {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    send.send_response(
                        Response::builder()
                            .status(200)
                            .body(Body::from(Vec::new()))
                            .expect("response"),
                    );
                });
                continue;
            }
            let (code, reply) = answer(&server, &method, &uri, &body).await;
            server.lock().unwrap().seen.push(Seen {
                method,
                uri,
                content_type,
                body,
            });
            send.send_response(respond(code, &reply));
        }
    });
    kube::Client::new(service, "default")
}

fn writes(server: &Mutex<Server>) -> Vec<Seen> {
    server
        .lock()
        .unwrap()
        .seen
        .iter()
        .filter(|s| s.method != "GET")
        .cloned()
        .collect()
}

fn key() -> PodKey {
    PodKey {
        namespace: "ml".into(),
        name: "train-0".into(),
        uid: "uid-train-0".into(),
    }
}

async fn started(server: &Arc<Mutex<Server>>) -> KubeApi {
    let client = serve(Arc::clone(server));
    tokio::time::timeout(
        Duration::from_secs(10),
        KubeApi::start(client, "test-instance".into(), "nvidia.com/gpu"),
    )
    .await
    .expect("caches listed in time")
    .expect("caches start")
}

#[tokio::test]
async fn view_holds_compact_pods_and_stripped_nodes() {
    let server = Arc::new(Mutex::new(Server {
        pod_rv: 5,
        ..Server::default()
    }));
    let api = started(&server).await;
    let view = api.view().await.unwrap();
    assert_eq!(view.nodes.len(), 1);
    let node = &view.nodes[0];
    let annotations = node.metadata.annotations.as_ref().unwrap();
    assert!(annotations.contains_key("gpuplace.io/inventory"));
    assert!(
        !annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"),
        "other tools' annotations are not kept"
    );
    assert!(node.metadata.managed_fields.is_none());
    assert!(node.status.as_ref().unwrap().images.is_none());
    assert_eq!(view.pods.len(), 1);
    let pod = &view.pods[0];
    assert_eq!(pod.key, key());
    assert_eq!(pod.resource_version, "5");
    assert_eq!(pod.demand.as_ref().unwrap().request.gpu_count, 1);
    assert!(pod.is_pending_for("gpuplace"));
    // Claims and volumes, stripped to what volume checks read.
    assert_eq!(view.claims.len(), 1);
    let claim = &view.claims[0];
    assert!(claim.metadata.annotations.is_none() && claim.status.is_none());
    assert_eq!(
        claim.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("nvme-n1")
    );
    let volume = view.volumes[0].spec.as_ref().unwrap();
    assert!(volume.local.is_none() && volume.node_affinity.is_some());
}

#[tokio::test]
async fn writes_go_over_the_wire_as_the_api_server_expects() {
    let server = Arc::new(Mutex::new(Server {
        pod_rv: 5,
        ..Server::default()
    }));
    let api = started(&server).await;

    // A stale resourceVersion is a conflict, not a silent overwrite.
    let request = |rv: &str, pod: PodKey| BindRequest {
        pod,
        resource_version: rv.into(),
        inputs: 0,
        node: "n1".into(),
        annotations: [(
            "gpuplace.io/assignment".to_string(),
            "{\"node\":\"n1\"}".to_string(),
        )]
        .into(),
        claims: Vec::new(),
        extended: None,
    };
    let stale = api.bind(&request("4", key())).await;
    assert!(
        matches!(&stale, Err(ApiError::Conflict(m)) if m.contains("Precondition failed")),
        "{stale:?}"
    );
    api.bind(&request("5", key())).await.unwrap();
    let twice = api.bind(&request("6", key())).await;
    assert!(matches!(twice, Err(ApiError::Conflict(_))));
    let gone = PodKey {
        name: "gone".into(),
        ..key()
    };
    assert!(matches!(
        api.bind(&request("", gone)).await,
        Err(ApiError::NotFound(_))
    ));
    // A fresh read settles an ambiguous write: bound, with our assignment.
    let state = api.get_pod(&key()).await.unwrap().unwrap();
    assert_eq!(state.node_name.as_deref(), Some("n1"));
    assert_eq!(state.assignment.as_deref(), Some("{\"node\":\"n1\"}"));
    api.event(EventRecord {
        pod: key(),
        kind: "Normal".into(),
        reason: "Scheduled".into(),
        message: "Successfully assigned ml/train-0 to n1".into(),
        at: k8s_openapi::jiff::Timestamp::now(),
    })
    .await
    .unwrap();
    // A long note of multi-byte characters is cut to the API server's 1 KiB, and a
    // repeat of the same event becomes a series (a PATCH), not a second Event.
    let failed = EventRecord {
        pod: key(),
        kind: "Warning".into(),
        reason: "FailedScheduling".into(),
        message: "0/3 nodes are available: ".to_string() + &"é".repeat(900),
        at: k8s_openapi::jiff::Timestamp::now(),
    };
    api.event(failed.clone()).await.unwrap();
    api.event(failed).await.unwrap();
    api.group_status(
        "ml",
        "g",
        PodGroupStatus {
            phase: "Scheduled".into(),
            scheduled: 2,
            conditions: Vec::new(),
        },
    )
    .await
    .unwrap();

    let seen = writes(&server);
    let binding = &seen[1];
    assert_eq!(binding.uri, "/api/v1/namespaces/ml/pods/train-0/binding?");
    assert_eq!(binding.body["kind"], "Binding");
    assert_eq!(binding.body["metadata"]["uid"], "uid-train-0");
    assert_eq!(binding.body["metadata"]["resourceVersion"], "5");
    assert_eq!(
        binding.body["metadata"]["annotations"]["gpuplace.io/assignment"],
        "{\"node\":\"n1\"}"
    );
    assert_eq!(
        binding.body["target"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "n1"})
    );
    let event = seen
        .iter()
        .find(|s| s.uri.starts_with("/apis/events.k8s.io/v1/"))
        .unwrap();
    assert_eq!(event.body["reason"], "Scheduled");
    assert_eq!(event.body["action"], "Binding");
    assert_eq!(event.body["type"], "Normal");
    assert_eq!(event.body["regarding"]["uid"], "uid-train-0");
    assert_eq!(event.body["reportingController"], "gpuplace.io/scheduler");
    assert_eq!(event.body["reportingInstance"], "test-instance");
    let name = event.body["metadata"]["name"].as_str().unwrap();
    assert!(
        name.starts_with("train-0.") && dns_subdomain(name),
        "{name}"
    );
    let events: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.uri.starts_with("/apis/events.k8s.io/v1/"))
        .collect();
    assert_eq!(
        events.len(),
        3,
        "Scheduled, FailedScheduling, then its series"
    );
    assert!(events[1].body["note"].as_str().unwrap().len() <= 1024);
    assert_eq!(events[2].method, "PATCH");
    assert_eq!(events[2].body["series"]["count"], 2);
    let status = seen.last().unwrap();
    assert_eq!(
        status.uri,
        "/apis/gpuplace.io/v1alpha1/namespaces/ml/podgroups/g/status?"
    );
    assert_eq!(status.body["status"]["phase"], "Scheduled");
    assert_eq!(status.body["status"]["scheduled"], 2);
}

#[tokio::test]
async fn the_scheduling_loop_runs_over_the_kube_adapter() {
    let server = Arc::new(Mutex::new(Server {
        pod_rv: 5,
        ..Server::default()
    }));
    let api = started(&server).await;
    let mut scheduler = Scheduler::new(api, SchedulerConfig::default());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 1, "{report:?}");
    let seen = writes(&server);
    let order: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.uri.split('?').next().unwrap_or("")))
        .collect();
    assert_eq!(
        order,
        vec![
            ("POST", "/api/v1/namespaces/ml/pods/train-0/binding"),
            ("POST", "/apis/events.k8s.io/v1/namespaces/ml/events"),
        ],
        "one write per pod (the Binding carries the assignment), then the Event"
    );
    // The assignment names exact devices from the published inventory, guarded by the
    // resourceVersion the cache saw.
    assert_eq!(seen[0].body["metadata"]["resourceVersion"], "5");
    let assignment: Value = serde_json::from_str(
        seen[0].body["metadata"]["annotations"]["gpuplace.io/assignment"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(assignment["node"], "n1");
    let device = assignment["containers"][0]["devices"][0]["id"]
        .as_str()
        .unwrap();
    assert!(device == "GPU-aaaa" || device == "GPU-bbbb", "{assignment}");
    assert_eq!(server.lock().unwrap().bound_to.as_deref(), Some("n1"));
}
