//! The DRA driver end to end without a kubelet: the plugin watcher's registration and the
//! `v1.DRAPlugin` service over their unix sockets, claims read from an in-memory API,
//! prepared idempotently, kept across a plugin restart (checkpoint), undone; a seeded storm
//! of prepares and unprepares from many tasks leaves the CDI specs equal to the
//! checkpoint; the kubelet's path `:authority`; the health stream. The ResourceSlice
//! publisher: `dra_slices.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuplace_deviceplugin::dra::claim::ClaimRef;
use gpuplace_deviceplugin::dra::prepare::{ClaimSource, PrepareSettings, Preparer, SourceError};
use gpuplace_deviceplugin::dra::server::{self, Sockets};
use gpuplace_deviceplugin::dra::state::CdiSettings;
use gpuplace_deviceplugin::metrics::Metrics;
use gpuplace_kubelet_api::dra::dra_plugin_client::DraPluginClient;
use gpuplace_kubelet_api::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use gpuplace_kubelet_api::pluginregistration::InfoRequest;
use gpuplace_kubelet_api::pluginregistration::registration_client::RegistrationClient;
use gpuplace_kubelet_api::unix_channel;
use gpuplace_model::{Gpu, NodeInventory};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;

pub(crate) const DRIVER: &str = "gpu.gpuplace.io";

pub(crate) fn inventory() -> NodeInventory {
    NodeInventory {
        name: "node-a".into(),
        gpus: (0..4)
            .map(|i| Gpu {
                id: format!("GPU-{i}"),
                index: i,
                minor: None,
                uuid: format!("GPU-{i}"),
                model: "A100".into(),
                memory_mib: 40_000,
                numa_node: Some(0),
                healthy: true,
                milli_capacity: 1000,
            })
            .collect(),
        ..Default::default()
    }
}

/// An in-memory claim API: `(namespace, name)` to the claim.
#[derive(Clone, Default)]
struct Claims(Arc<Mutex<HashMap<(String, String), ResourceClaim>>>);

impl Claims {
    fn put(&self, name: &str, uid: &str, devices: &[&str]) {
        let mut c = ResourceClaim::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ml".into());
        c.metadata.uid = Some(uid.into());
        let results = devices
            .iter()
            .map(|d| DeviceRequestAllocationResult {
                driver: DRIVER.into(),
                pool: "node-a".into(),
                device: d.to_string(),
                request: "gpu".into(),
                ..Default::default()
            })
            .collect();
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.0.lock().unwrap().insert(("ml".into(), name.into()), c);
    }

    fn delete(&self, name: &str) {
        self.0
            .lock()
            .unwrap()
            .remove(&("ml".to_string(), name.to_string()));
    }
}

impl ClaimSource for Claims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        tokio::task::yield_now().await;
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }
}

fn settings(dir: &Path) -> PrepareSettings {
    PrepareSettings {
        driver: DRIVER.into(),
        pool: "node-a".into(),
        checkpoint: dir.join("plugins").join(DRIVER).join("checkpoint.json"),
        cdi: CdiSettings {
            root: dir.join("cdi"),
            vendor: DRIVER.into(),
            device_nodes: true,
            dev_root: dir.join("dev"),
        },
    }
}

fn preparer(dir: &Path, claims: &Claims) -> Arc<Preparer<Claims>> {
    let (_tx, rx) = watch::channel(Arc::new(inventory()));
    Arc::new(Preparer::new(claims.clone(), settings(dir), rx).expect("checkpoint readable"))
}

fn claim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

async fn wait_for(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

fn cdi_env(dir: &Path, uid: &str) -> Vec<String> {
    let path = dir.join("cdi").join(format!("{DRIVER}-claim_{uid}.json"));
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("CDI spec")).expect("JSON");
    assert_eq!(spec["kind"], "gpu.gpuplace.io/claim");
    assert_eq!(spec["devices"][0]["name"], uid);
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect()
}

/// The driver serving both sockets under `dir` until `stop` is sent.
struct Serving {
    sockets: Sockets,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(dir: &Path, prep: Arc<Preparer<Claims>>) -> Serving {
    let sockets = Sockets::new(&dir.join("registry"), &dir.join("plugins"), DRIVER);
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(server::serve(
        sockets.clone(),
        DRIVER.into(),
        prep,
        Metrics::default(),
        stopped,
    ));
    wait_for(&sockets.registration).await;
    wait_for(&sockets.plugin).await;
    Serving {
        sockets,
        stop,
        task,
    }
}

impl Serving {
    async fn end(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().expect("served");
    }
}

#[tokio::test]
async fn the_kubelet_registers_prepares_and_unprepares_over_the_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    claims.put("a", "uid-a", &["gpu-1", "gpu-3"]);
    let serving = serve(dir.path(), preparer(dir.path(), &claims)).await;
    let sockets = serving.sockets.clone();
    let mut reg = RegistrationClient::new(unix_channel(&sockets.registration));
    let info = reg
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, sockets.plugin.display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);

    let mut dra = DraPluginClient::new(unix_channel(&sockets.plugin));
    let ask = NodePrepareResourcesRequest {
        claims: vec![claim("a", "uid-a"), claim("gone", "uid-gone")],
    };
    let answer = dra
        .node_prepare_resources(ask.clone())
        .await
        .expect("prepare")
        .into_inner();
    let a = &answer.claims["uid-a"];
    assert_eq!(a.error, "");
    let names: Vec<&str> = a.devices.iter().map(|d| d.device_name.as_str()).collect();
    assert_eq!(names, ["gpu-1", "gpu-3"]);
    assert!(a.devices.iter().all(|d| d.pool_name == "node-a"
        && d.cdi_device_ids == ["gpu.gpuplace.io/claim=uid-a"]
        && d.request_names == ["gpu"]));
    assert!(answer.claims["uid-gone"].error.contains("not in the API"));
    assert!(
        cdi_env(dir.path(), "uid-a").contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-3".to_string())
    );

    // Asked again (a kubelet restart): the same answer, from the checkpoint.
    let again = dra
        .node_prepare_resources(ask)
        .await
        .expect("prepare")
        .into_inner();
    assert_eq!(again.claims["uid-a"], *a);

    // A bad call is refused whole, with the reason.
    let bad = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim("", "uid-x")],
        })
        .await
        .expect_err("refused");
    assert!(bad.message().contains("required"), "{}", bad.message());

    let undone = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim("a", "uid-a"), claim("never", "uid-never")],
        })
        .await
        .expect("unprepare")
        .into_inner();
    assert!(undone.claims.values().all(|c| c.error.is_empty()));
    assert!(
        !dir.path()
            .join("cdi")
            .join(format!("{DRIVER}-claim_uid-a.json"))
            .exists()
    );

    serving.end().await;
    assert!(
        !sockets.registration.exists(),
        "the kubelet unregisters the driver"
    );
}

#[tokio::test]
async fn a_restarted_plugin_answers_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    claims.put("a", "uid-a", &["gpu-0"]);
    let first = preparer(dir.path(), &claims);
    let asked = ClaimRef {
        namespace: "ml".into(),
        name: "a".into(),
        uid: "uid-a".into(),
    };
    let prepared = first.prepare(&asked).await.expect("prepared");
    drop(first);
    // The claim is gone from the API and the CDI directory was emptied (a reboot): the
    // restarted plugin still answers as before and writes the spec again.
    claims.delete("a");
    std::fs::remove_dir_all(dir.path().join("cdi")).unwrap();
    let second = preparer(dir.path(), &claims);
    assert_eq!(
        second.prepare(&asked).await.expect("from checkpoint"),
        prepared
    );
    assert!(cdi_env(dir.path(), "uid-a").contains(&"GPUPLACE_DEVICE_IDS=GPU-0".to_string()));
    second.unprepare(&asked).await.expect("unprepared");
    assert!(preparer(dir.path(), &claims).prepared().await.is_empty());
    // A corrupt checkpoint is an error that names it, not an empty state.
    let path = settings(dir.path()).checkpoint;
    std::fs::write(&path, "{not json").unwrap();
    let (_tx, rx) = watch::channel(Arc::new(inventory()));
    let err = Preparer::new(claims.clone(), settings(dir.path()), rx)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("checkpoint"), "{err}");
}

/// Many tasks prepare and unprepare claims in a seeded order while claims appear and
/// vanish in the API; afterwards the CDI specs on disk are exactly the checkpoint's claims,
/// and every prepared claim has the devices its allocation named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_storm_leaves_cdi_specs_equal_to_the_checkpoint() {
    let seeds: u64 = std::env::var("GPUPLACE_DRA_STORM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut operations = 0usize;
    for seed in 0..seeds {
        let dir = tempfile::tempdir().unwrap();
        let claims = Claims::default();
        let prep = preparer(dir.path(), &claims);
        let mut tasks = Vec::new();
        for worker in 0..4u64 {
            let prep = prep.clone();
            let claims = claims.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 16 + worker);
                let mut done = 0;
                for _ in 0..50 {
                    let k = rng.random_range(0..6u32);
                    let name = format!("c{k}");
                    let uid = format!("uid-{k}");
                    let asked = ClaimRef {
                        namespace: "ml".into(),
                        name: name.clone(),
                        uid: uid.clone(),
                    };
                    match rng.random_range(0..4u32) {
                        0 => claims.put(&name, &uid, &[&format!("gpu-{}", k % 4)]),
                        1 => claims.delete(&name),
                        2 => {
                            if let Ok(p) = prep.prepare(&asked).await {
                                assert_eq!(p.devices[0].device, format!("gpu-{}", k % 4));
                            }
                        }
                        _ => prep
                            .unprepare(&asked)
                            .await
                            .expect("unprepare never fails here"),
                    }
                    done += 1;
                }
                done
            }));
        }
        for t in tasks {
            operations += t.await.unwrap();
        }
        let checkpoint: BTreeSet<String> = prep
            .prepared()
            .await
            .into_iter()
            .map(|c| c.claim.uid)
            .collect();
        let specs: BTreeSet<String> = std::fs::read_dir(dir.path().join("cdi"))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json"))
                    .map(|n| {
                        n.trim_start_matches("gpu.gpuplace.io-claim_")
                            .trim_end_matches(".json")
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(checkpoint, specs, "seed {seed}");
        let reread = preparer(dir.path(), &claims).prepared().await;
        assert_eq!(
            reread.len(),
            checkpoint.len(),
            "seed {seed}: the checkpoint on disk"
        );
    }
    println!("dra storm: {seeds} seeds, {operations} operations");
}

/// The kubelet's plugin watcher (grpc-go dialing a bare socket path) sends the path as
/// `:authority`; h2 refuses that as malformed unless the registration socket rewrites it.
/// Two calls on one connection, the second naming the authority by its dynamic-table
/// index, as grpc-go's encoder does.
#[tokio::test]
async fn registration_answers_a_kubelet_that_sends_the_socket_path_as_authority() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let serving = serve(dir.path(), preparer(dir.path(), &Claims::default())).await;
    let sockets = serving.sockets.clone();
    let mut conn = tokio::net::UnixStream::connect(&sockets.registration)
        .await
        .unwrap();
    let path = sockets.registration.display().to_string().into_bytes();
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let headers = |first: bool, method: &str| {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        if first {
            b.push(0x41); // :authority, literal with incremental indexing
            b.push(path.len() as u8);
            b.extend_from_slice(&path);
        } else {
            b.push(0x80 | 62); // the dynamic entry the first request added
        }
        let p = format!("/pluginregistration.Registration/{method}").into_bytes();
        b.push(0x04); // :path, literal without indexing
        b.push(p.len() as u8);
        b.extend_from_slice(&p);
        for (name, value) in [("content-type", "application/grpc"), ("te", "trailers")] {
            b.push(0x00);
            b.push(name.len() as u8);
            b.extend_from_slice(name.as_bytes());
            b.push(value.len() as u8);
            b.extend_from_slice(value.as_bytes());
        }
        b
    };
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &headers(true, "GetInfo")));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    out.extend(frame(0x1, 0x4, 3, &headers(false, "GetInfo")));
    out.extend(frame(0x0, 0x1, 3, &[0, 0, 0, 0, 0]));
    conn.write_all(&out).await.unwrap();
    // Read frames until both streams answered with data (or one was reset).
    let mut buf = Vec::new();
    let mut answers: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while answers.len() < 2 {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, conn.read(&mut chunk))
            .await
            .expect("answered within 5 s")
            .unwrap();
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let f: Vec<u8> = buf.drain(..9 + len).collect();
            let stream = u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff;
            match f[3] {
                0x3 => panic!("stream {stream} reset: {:?}", &f[9..]),
                0x4 if f[4] & 1 == 0 => conn.write_all(&frame(0x4, 1, 0, &[])).await.unwrap(),
                0x0 if f.len() > 9 + 5 => {
                    answers.insert(stream, f[9 + 5..].to_vec());
                }
                _ => {}
            }
        }
    }
    for (stream, message) in answers {
        let info =
            <gpuplace_kubelet_api::pluginregistration::PluginInfo as prost::Message>::decode(
                message.as_slice(),
            )
            .expect("PluginInfo");
        assert_eq!(
            (info.r#type.as_str(), info.name.as_str()),
            ("DRAPlugin", DRIVER),
            "stream {stream}"
        );
    }
    drop(conn);
    serving.end().await;
}

/// The kubelet 1.36 asks the plugin socket for device health: every GPU at first, then a
/// new report when one turns unhealthy.
#[tokio::test]
async fn the_health_stream_reports_every_gpu_then_each_change() {
    use gpuplace_kubelet_api::drahealth::NodeWatchResourcesRequest;
    use gpuplace_kubelet_api::drahealth::dra_resource_health_client::DraResourceHealthClient;
    let dir = tempfile::tempdir().unwrap();
    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory()));
    let prep = Arc::new(
        Preparer::new(Claims::default(), settings(dir.path()), inventory_rx).expect("preparer"),
    );
    let serving = serve(dir.path(), prep).await;
    let sockets = serving.sockets.clone();
    let mut client = DraResourceHealthClient::new(unix_channel(&sockets.plugin));
    let mut reports = client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .expect("stream")
        .into_inner();
    let first = reports.message().await.unwrap().expect("a first report");
    assert_eq!(first.devices.len(), 4);
    assert!(first.devices.iter().all(|d| d.health == 1));
    let mut sick = inventory();
    sick.gpus[1].healthy = false;
    inventory_tx.send(Arc::new(sick)).unwrap();
    let second = reports
        .message()
        .await
        .unwrap()
        .expect("a report on the change");
    let d = &second.devices[1];
    assert_eq!(
        d.device.as_ref().map(|i| i.device_name.as_str()),
        Some("gpu-1")
    );
    assert_eq!(d.health, 2, "unhealthy");
    assert!(d.message.contains("unhealthy"));
    drop(reports);
    drop(client);
    serving.end().await;
}
