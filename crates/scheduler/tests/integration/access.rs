//! The metrics and the GPU map off loopback: over TLS, every request reviewed by the API
//! server (here the in-memory one, which answers TokenReview and SubjectAccessReview with
//! RBAC's rules and the deploy's ClusterRoles). Who has no token gets 401, who has no right
//! 403, and a map viewer sees cluster-wide totals but only the pods of the namespaces they
//! may `list pods` in.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use axum::Router;
use axum::routing::get;
use gpuplace_scheduler::Scheduler;
use gpuplace_scheduler::access::tls::{CertSource, server_config};
use gpuplace_scheduler::access::{self, Exposure, Guard};
use gpuplace_scheduler::ui::{self, Ui};
use gpuplace_testkit::MemoryApi;
use http_body_util::BodyExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// The deploy's ClusterRole `name` (deploy/base/access/rbac.yaml).
fn deploy_role(name: &str) -> ClusterRole {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/access/rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/base/access/rbac.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("valid YAML");
    let doc = docs
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} in the deploy"));
    serde_json::from_value(doc).expect("a ClusterRole")
}

fn sa(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": namespace})
}

fn cluster_binding(name: &str, role: &str, subject: Value) -> ClusterRoleBinding {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject]
    }))
    .expect("a ClusterRoleBinding")
}

/// Tokens of: nobody (no rights), prom (metrics), ml (the map, pods of `ml`), admin (the
/// map, pods everywhere).
pub struct Tokens {
    pub nobody: String,
    pub prom: String,
    pub ml: String,
    pub admin: String,
}

pub fn grant(api: &MemoryApi) -> Tokens {
    api.put_cluster_role(deploy_role("gpuplace-metrics-reader"));
    api.put_cluster_role(deploy_role("gpuplace-map-viewer"));
    api.put_cluster_role(
        serde_json::from_value(json!({"metadata": {"name": "pod-lister"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}))
        .expect("a ClusterRole"),
    );
    let role: Role =
        serde_json::from_value(json!({"metadata": {"name": "pods", "namespace": "ml"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}))
        .expect("a Role");
    api.put_role(role);
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "ml-pods", "namespace": "ml"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [sa("team-ml", "viewer")]
    }))
    .expect("a RoleBinding");
    api.put_role_binding(binding);
    api.put_cluster_role_binding(cluster_binding(
        "prom",
        "gpuplace-metrics-reader",
        sa("monitoring", "prometheus"),
    ));
    for (name, who) in [
        ("ml-map", sa("team-ml", "viewer")),
        ("admin-map", sa("ops", "admin")),
    ] {
        api.put_cluster_role_binding(cluster_binding(name, "gpuplace-map-viewer", who));
    }
    api.put_cluster_role_binding(cluster_binding(
        "admin-pods",
        "pod-lister",
        sa("ops", "admin"),
    ));
    Tokens {
        nobody: api.service_account_token("default", "nobody"),
        prom: api.service_account_token("monitoring", "prometheus"),
        ml: api.service_account_token("team-ml", "viewer"),
        admin: api.service_account_token("ops", "admin"),
    }
}

/// A certificate for `localhost` in PEM files; its DER for the client to trust.
pub fn certificate(dir: &Path) -> (CertSource, CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("a cert");
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, made.cert.pem()).expect("written");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("written");
    (CertSource::Files { cert, key }, made.cert.der().clone())
}

/// A TLS client trusting `cert` only.
fn client(cert: &CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTPS request to `addr` (as `localhost`).
async fn send(
    addr: std::net::SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
    let name = ServerName::try_from("localhost").expect("a name");
    let stream = connector.connect(name, tcp).await.expect("a TLS handshake");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1");
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    for (k, v) in headers {
        request = request.header(*k, v.as_str());
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    }
}

fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {token}"))]
}

/// The map and a `/metrics` over the in-memory cluster: ml/train-2 and lab/secret-2 bound,
/// ml/huge-16 and lab/lab-huge-16 pending.
async fn cluster() -> (MemoryApi, Router) {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("dgx-a"));
    api.put_pod(pod("train-2", 2, json!({})));
    api.put_pod(pod(
        "secret-2",
        2,
        json!({"metadata": {"namespace": "lab"}}),
    ));
    api.put_pod(pod("huge-16", 16, json!({})));
    api.put_pod(pod(
        "lab-huge-16",
        16,
        json!({"metadata": {"namespace": "lab"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let map = Arc::new(Ui::new("nvidia.com/gpu"));
    map.attach(api.clone(), scheduler.reasons());
    scheduler
        .round(tokio::time::Instant::now().into_std())
        .await
        .expect("a round");
    let app = ui::router(map)
        .route("/metrics", get(|| async { "gpuplace_up 1\n" }))
        .route("/healthz", get(|| async { "ok" }));
    (api, app)
}

pub async fn serve(api: &MemoryApi, app: Router, source: &CertSource) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let guard = Guard::new(api.clone()).with_sign_in(Arc::new(ui::sign_in_page));
    let exposure = Exposure::Guarded {
        tls: server_config(source).expect("TLS settings"),
        guard,
    };
    tokio::spawn(access::serve(listener, app, exposure));
    addr
}

/// The cluster served over TLS, its tokens, and a client trusting its certificate.
struct Site {
    dir: tempfile::TempDir,
    api: MemoryApi,
    tokens: Tokens,
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Site {
    async fn start() -> Site {
        let dir = tempfile::tempdir().expect("a dir");
        let (source, cert) = certificate(dir.path());
        let (api, app) = cluster().await;
        let tokens = grant(&api);
        let addr = serve(&api, app, &source).await;
        Site {
            dir,
            api,
            tokens,
            addr,
            tls: client(&cert),
        }
    }

    /// GET `path`, with `token` as a bearer token when given.
    async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        let headers = token.map(bearer).unwrap_or_default();
        send(self.addr, &self.tls, "GET", path, &headers, "").await
    }

    async fn post(&self, path: &str, headers: &[(&str, String)], body: &str) -> Answer {
        send(self.addr, &self.tls, "POST", path, headers, body).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_or_a_right_nothing_but_the_probes_answers() {
    let site = Site::start().await;
    let t = &site.tokens;
    let paths = [
        "/ui",
        "/ui/",
        "/ui/app.js",
        "/ui/api/fleet",
        "/ui/api/node?name=dgx-a",
        "/metrics",
    ];
    assert_eq!(site.get("/healthz", None).await.status, 200);
    for path in paths {
        let a = site.get(path, None).await;
        assert_eq!(a.status, 401, "{path} without a token: {}", a.body);
        assert!(a.headers.contains_key("www-authenticate"), "{path}");
        let a = site.get(path, Some("forged")).await;
        assert_eq!(a.status, 401, "{path} with a token the server refuses");
        let a = site.get(path, Some(&t.nobody)).await;
        assert_eq!(a.status, 403, "{path} for a ServiceAccount without rights");
        assert!(
            a.body.contains("system:serviceaccount:default:nobody") && !a.body.contains("train-2"),
            "{path}: {}",
            a.body
        );
    }
    // The page itself answers a browser with its sign-in form, and nothing of the cluster.
    let page = site.get("/ui", None).await;
    assert!(page.body.contains("action=\"/ui/login\""), "{}", page.body);
    assert!(!page.body.contains("dgx-a"));

    let metrics = site.get("/metrics", Some(&t.prom)).await;
    assert_eq!(
        (metrics.status, metrics.body.as_str()),
        (200, "gpuplace_up 1\n")
    );
    for path in ["/ui", "/ui/api/fleet"] {
        let a = site.get(path, Some(&t.prom)).await;
        assert_eq!(a.status, 403, "metrics readers do not see the map: {path}");
    }
    let a = site.get("/metrics", Some(&t.ml)).await;
    assert_eq!(a.status, 403, "map viewers do not read the metrics");

    // Plain HTTP to the TLS port gets no HTTP answer.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(site.addr)
        .await
        .expect("connects");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("sent");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).contains("gpuplace_up"));
}

fn holders(fleet: &Value) -> Vec<String> {
    fleet["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["tips"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect()
}

fn pending(fleet: &Value) -> Vec<String> {
    fleet["pending"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let text = |k: &str| p[k].as_str().unwrap_or_default().to_string();
            format!("{}/{}", text("namespace"), text("name"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_totals_and_only_the_pods_of_namespaces_they_may_list() {
    let site = Site::start().await;
    let t = &site.tokens;
    let admin = site.get("/ui/api/fleet", Some(&t.admin)).await;
    assert_eq!(admin.status, 200, "{}", admin.body);
    let admin = admin.json();
    let ml = site.get("/ui/api/fleet", Some(&t.ml)).await.json();
    assert_eq!(admin["totals"], ml["totals"], "totals are cluster-wide");
    assert_eq!(admin["viewer"]["namespaces"], Value::Null, "admin sees all");
    assert_eq!(ml["viewer"]["namespaces"], json!(["ml"]));
    assert_eq!(ml["viewer"]["user"], "system:serviceaccount:team-ml:viewer");

    assert_eq!(pending(&admin), ["lab/lab-huge-16", "ml/huge-16"]);
    assert_eq!(
        pending(&ml),
        ["ml/huge-16"],
        "lab's pending pod is not named"
    );
    assert_eq!(ml["pending_total"], 1);

    let (admin_tips, ml_tips) = (holders(&admin).join(" "), holders(&ml).join(" "));
    assert!(
        admin_tips.contains("ml/train-2") && admin_tips.contains("lab/secret-2"),
        "{admin_tips}"
    );
    assert!(ml_tips.contains("ml/train-2"), "{ml_tips}");
    assert!(
        !ml_tips.contains("secret-2") && !ml_tips.contains("lab/"),
        "{ml_tips}"
    );
    assert!(
        ml_tips.contains("a pod of another namespace ("),
        "{ml_tips}"
    );

    // Search matches only what the viewer sees.
    let found = site.get("/ui/api/fleet?q=secret", Some(&t.ml)).await.json();
    assert_eq!(found["matched"], 0, "a hidden pod's name finds nothing");
    let found = site
        .get("/ui/api/fleet?q=secret", Some(&t.admin))
        .await
        .json();
    assert_eq!(found["matched"], 1);

    // One node's detail hides the other namespace's holder, keeping its share.
    let node = site.get("/ui/api/node?name=dgx-a", Some(&t.ml)).await;
    assert_eq!(node.status, 200, "{}", node.body);
    assert!(
        !node.body.contains("secret-2") && !node.body.contains("\"lab\""),
        "{}",
        node.body
    );
    let shares: u64 = node.json()["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["holders"].as_array().cloned().unwrap_or_default())
        .map(|h| h["milli"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(shares, 4000, "both pods' GPUs still counted");

    // The reviews are cached: twenty more polls cost the API server nothing new.
    let before = site.api.reviews();
    for _ in 0..20 {
        assert_eq!(site.get("/ui/api/fleet", Some(&t.ml)).await.status, 200);
    }
    assert_eq!(site.api.reviews(), before, "answers reused within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_form_sets_a_cookie_the_map_accepts() {
    let site = Site::start().await;
    let t = &site.tokens;
    let form = [(
        "content-type",
        "application/x-www-form-urlencoded".to_string(),
    )];
    let sign_in = |token: &str| format!("token={token}");

    let refused = site.post("/ui/login", &form, &sign_in(&t.nobody)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("may not get /ui"), "{}", refused.body);
    assert!(!refused.headers.contains_key("set-cookie"));
    assert_eq!(
        site.post("/ui/login", &form, "token=forged").await.status,
        401
    );
    let empty = site.post("/ui/login", &form, "nothing=here").await;
    assert_eq!(empty.status, 401, "a form without a token is refused");

    let signed = site.post("/ui/login", &form, &sign_in(&t.ml)).await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    assert_eq!(signed.headers["location"], "/ui");
    let cookie = signed.headers["set-cookie"]
        .to_str()
        .expect("text")
        .to_string();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let pair = cookie.split(';').next().expect("name=value").to_string();
    let with_cookie = [("cookie", pair)];
    let get = |path: &'static str| send(site.addr, &site.tls, "GET", path, &with_cookie, "");
    let page = get("/ui").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"nodes\""), "the map itself");
    let fleet = get("/ui/api/fleet").await;
    assert_eq!(fleet.json()["viewer"]["namespaces"], json!(["ml"]));
    assert_eq!(
        get("/metrics").await.status,
        401,
        "the cookie is the map's only"
    );

    let out = site.post("/ui/logout", &with_cookie, "").await;
    assert_eq!(out.status, 303);
    let cleared = out.headers["set-cookie"].to_str().expect("text");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_within_ten_seconds() {
    let mut site = Site::start().await;
    let prom = site.tokens.prom.clone();
    assert_eq!(site.get("/metrics", Some(&prom)).await.status, 200);
    std::thread::sleep(Duration::from_millis(20));
    let (_, second) = certificate(site.dir.path());
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    site.tls = client(&second);
    let a = site.get("/metrics", Some(&prom)).await;
    assert_eq!(a.status, 200, "the new certificate is served");
}

/// Connections that never speak do not keep the probes waiting: the accept loop only
/// accepts, and past 256 handshakes the oldest is cut (it once held one of 64 permits for
/// up to 10 s each, and /healthz timed out behind them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_the_probes_waiting() {
    let site = Site::start().await;
    let mut idle = Vec::new();
    for _ in 0..600 {
        idle.push(
            tokio::net::TcpStream::connect(site.addr)
                .await
                .expect("connects"),
        );
    }
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let answer = site.get("/healthz", None).await;
        assert_eq!(answer.status, 200);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "/healthz took {:?} beside 600 idle connections",
            started.elapsed()
        );
        let started = std::time::Instant::now();
        let metrics = site.get("/metrics", Some(&site.tokens.prom)).await;
        assert_eq!(metrics.status, 200, "{}", metrics.body);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    drop(idle);
}

/// A client that finishes its handshake and then sends nothing is closed once the header
/// read time (5 s) has passed, not held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_is_closed() {
    use tokio::io::AsyncReadExt;
    let site = Site::start().await;
    let tcp = tokio::net::TcpStream::connect(site.addr)
        .await
        .expect("connects");
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&site.tls));
    let name = ServerName::try_from("localhost").expect("a name");
    let mut stream = connector.connect(name, tcp).await.expect("a handshake");
    let started = std::time::Instant::now();
    let mut buf = [0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut buf)).await;
    assert!(read.is_ok(), "still open after 15 s");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "closed too soon: {:?}",
        started.elapsed()
    );
}

/// A token over 16 KiB is refused before any review; a request head over 64 KiB is
/// refused before it is read whole; neither costs the API server a TokenReview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_tokens_are_refused_without_a_review() {
    let site = Site::start().await;
    let before = site.api.reviews();
    let long = "a".repeat(20 * 1024);
    let answer = site.get("/metrics", Some(&long)).await;
    assert_eq!(answer.status, 401);
    assert!(
        answer.body.contains("longer than 16 KiB"),
        "{}",
        answer.body
    );
    let huge = "b".repeat(300 * 1024);
    let tcp = tokio::net::TcpStream::connect(site.addr)
        .await
        .expect("connects");
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&site.tls));
    let name = ServerName::try_from("localhost").expect("a name");
    let stream = connector.connect(name, tcp).await.expect("a handshake");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1");
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("/metrics")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {huge}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a request");
    match sender.send_request(request).await {
        Ok(response) => assert_eq!(response.status().as_u16(), 431),
        // The server may close before the client has written the whole head.
        Err(e) => assert!(
            e.is_closed() || e.is_incomplete_message() || e.to_string().contains("connection"),
            "{e}"
        ),
    }
    assert_eq!(site.api.reviews(), before, "no review for either");
}

/// A warning about a pod is shown to who sees its namespace, by the warning's field: a
/// viewer of `ml` does not see one about `lab`'s pod (the text once said only `pod NAME:`,
/// which every viewer saw).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_about_a_pod_is_shown_only_to_who_sees_its_namespace() {
    let site = Site::start().await;
    site.api.put_pod(pod(
        "lab-broken-record",
        1,
        json!({"metadata": {"namespace": "lab",
            "annotations": {"gpuplace.io/assignment": "{not json"}},
            "spec": {"nodeName": "dgx-a"}}),
    ));
    let t = &site.tokens;
    let mut admin = Value::Null;
    for _ in 0..40 {
        admin = site.get("/ui/api/fleet", Some(&t.admin)).await.json();
        if admin["warnings"].to_string().contains("lab-broken-record") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let warnings = admin["warnings"].as_array().cloned().unwrap_or_default();
    let about = warnings
        .iter()
        .find(|w| {
            w["message"]
                .as_str()
                .unwrap_or_default()
                .contains("lab-broken-record")
        })
        .unwrap_or_else(|| panic!("no warning about the record: {warnings:?}"));
    assert_eq!(about["namespace"], "lab");
    assert!(
        about["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("pod lab/lab-broken-record:")
    );
    let ml = site.get("/ui/api/fleet", Some(&t.ml)).await;
    assert!(!ml.body.contains("lab-broken-record"), "{}", ml.body);
}
