//! A fake kubelet that admits pods the way the real one does, written from the kubelet's
//! device manager (`devicesToAllocate`, `Allocate`) and PodResources server:
//!
//! - pods bound to the node arrive through a watch on the in-memory API, after a random
//!   delay; each batch is admitted in creation-time order, one pod at a time (serial
//!   admission), never in bind order;
//! - per container (init containers first, then app containers): devices recorded for the
//!   container are reused as they are; then devices from the pool of earlier regular init
//!   containers (in random order); then `available` = healthy minus every recorded device,
//!   split by NUMA affinity when alignment is on; GetPreferredAllocation is called unless
//!   the pool or an exactly aligned set covers the need; its answer is used only where it
//!   is free (and aligned), too few are topped up at random; then Allocate, whose error
//!   fails the pod (phase Failed, as UnexpectedAdmissionError);
//! - the record (pod UID -> container -> devices) is its own accounting, like the
//!   checkpoint; a deleted pod keeps its devices while it terminates (optional delay);
//! - PodResources `List` is served from that record over a real unix socket: active pods
//!   (admitting, running, terminating) with their app containers (and sidecars, as 1.28+
//!   kubelets list them), never regular init containers, and no UID.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuplace_kubelet_api::podresources::pod_resources_lister_server::PodResourcesListerServer;
use gpuplace_model::{ASSIGNMENT_ANNOTATION, ContainerKind};
use k8s_openapi::api::core::v1::Pod;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use crate::api::MemoryApi;
use crate::kubelet::FakeKubelet;
pub use crate::kubelet_record::Admission;
use crate::kubelet_record::{Entry, Lister, NodeState, lock};

mod allocate;

/// How the fake node behaves.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub node: String,
    pub resource: String,
    pub seed: u64,
    /// Random delay (ms) between a change in the API and the kubelet acting on it.
    pub admission_delay_ms: (u64, u64),
    /// Random time (ms) a deleted pod keeps its devices while it terminates; `None`: freed
    /// at once.
    pub terminating_ms: Option<(u64, u64)>,
    /// Topology Manager alignment of devices to one NUMA node where possible.
    pub numa_alignment: bool,
    /// `List` shows restartable init containers (kubelets 1.28+).
    pub list_sidecars: bool,
    /// PodResources `Get` is served (kubelets 1.34+); off, it is Unimplemented (1.26).
    pub serve_get: bool,
}

impl NodeOptions {
    pub fn new(node: &str) -> NodeOptions {
        NodeOptions {
            node: node.to_string(),
            resource: "nvidia.com/gpu".into(),
            seed: 1,
            admission_delay_ms: (0, 0),
            terminating_ms: None,
            numa_alignment: false,
            list_sidecars: true,
            serve_get: true,
        }
    }
}

/// A fake kubelet node: device plugin registration (through [`FakeKubelet`]), admission of
/// the pods bound to it, and the PodResources API.
pub struct FakeNode {
    pub kubelet: FakeKubelet,
    state: Arc<Mutex<NodeState>>,
    podres_socket: PathBuf,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl FakeNode {
    /// Serves `kubelet.sock` in `dir` and PodResources on `<dir>/pod-resources.sock`, and
    /// admits the pods `api` binds to `options.node`.
    pub async fn start(dir: &Path, api: MemoryApi, options: NodeOptions) -> FakeNode {
        let kubelet = FakeKubelet::start(dir).await;
        let state: Arc<Mutex<NodeState>> = Arc::default();
        let podres_socket = dir.join("pod-resources.sock");
        let _ = std::fs::remove_file(&podres_socket);
        let listener = UnixListener::bind(&podres_socket).expect("bind pod-resources.sock");
        let (stop, stop_rx) = watch::channel(false);
        let lister = Lister {
            state: state.clone(),
            resource: options.resource.clone(),
            list_sidecars: options.list_sidecars,
            serve_get: options.serve_get,
        };
        let mut server_stop = stop_rx.clone();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(lister))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = server_stop.wait_for(|s| *s).await;
                })
                .await;
        });
        let admitter = Admitter {
            api,
            options,
            state: state.clone(),
            dir: dir.to_path_buf(),
            kubelet_shared: kubelet.handle(),
        };
        let admission = tokio::spawn(admitter.run(stop_rx));
        FakeNode {
            kubelet,
            state,
            podres_socket,
            stop,
            tasks: vec![server, admission],
        }
    }

    pub fn pod_resources_socket(&self) -> &Path {
        &self.podres_socket
    }

    /// Every admission so far.
    pub fn admissions(&self) -> Vec<Admission> {
        lock(&self.state).log.clone()
    }

    /// What `read` makes of every admission so far, read in place (the settle loops poll
    /// it every millisecond: a copy of every node's log each time was most of their CPU).
    pub fn with_admissions<R>(&self, read: impl FnOnce(&[Admission]) -> R) -> R {
        read(&lock(&self.state).log)
    }

    /// Whether a pod admitted under one of `names` still holds devices here.
    pub fn holds_any_of(&self, names: &std::collections::HashSet<&String>) -> bool {
        let state = lock(&self.state);
        let uids: std::collections::HashSet<&str> = (state.log.iter())
            .filter(|a| names.contains(&a.name))
            .map(|a| a.uid.as_str())
            .collect();
        !uids.is_empty() && state.active.values().any(|e| uids.contains(e.uid.as_str()))
    }

    /// Admissions from position `from` of the log on.
    pub fn admissions_since(&self, from: usize) -> Vec<Admission> {
        let state = lock(&self.state);
        state
            .log
            .get(from..)
            .map(<[Admission]>::to_vec)
            .unwrap_or_default()
    }

    /// The record: pod UID -> container -> devices, of active pods.
    pub fn record(&self) -> HashMap<String, HashMap<String, Vec<String>>> {
        lock(&self.state)
            .active
            .values()
            .map(|e| (e.uid.clone(), e.devices.clone()))
            .collect()
    }

    /// Devices found held by two pods at once (0 for a kubelet).
    pub fn double_use(&self) -> usize {
        lock(&self.state).double_use
    }

    /// Milli-GPU per GPU ID by the record: a whole device is 1000, a slice of the share
    /// resource 1 (time-slicing replicas count 1000 each).
    pub fn gpu_milli(&self) -> HashMap<String, u32> {
        let mut out: HashMap<String, u32> = HashMap::new();
        for pod in self.record().values() {
            // A device reused by a later container is the pod's once.
            let ids: std::collections::HashSet<&String> = pod.values().flatten().collect();
            for id in ids {
                match gpuplace_deviceplugin::devices::slice_gpu(id) {
                    Some(gpu) => *out.entry(gpu.to_string()).or_default() += 1,
                    None => {
                        let gpu = id.split("::").next().unwrap_or(id);
                        *out.entry(gpu.to_string()).or_default() += 1000;
                    }
                }
            }
        }
        out
    }

    /// GPUs over 1000 milli by the record (whole use plus shares, or shares beyond 1000).
    pub fn overcommitted(&self) -> Vec<(String, u32)> {
        let mut over: Vec<(String, u32)> = self
            .gpu_milli()
            .into_iter()
            .filter(|(_, m)| *m > 1000)
            .collect();
        over.sort();
        over
    }

    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.kubelet.stop().await;
    }
}

/// A pod stopping: when its devices are released, its UID, and its namespace and name when
/// it was deleted gracefully (the kubelet then deletes it for good).
type Terminating = (tokio::time::Instant, String, Option<(String, String)>);

struct Admitter {
    api: MemoryApi,
    options: NodeOptions,
    state: Arc<Mutex<NodeState>>,
    dir: PathBuf,
    kubelet_shared: crate::kubelet::KubeletHandle,
}

/// What one container asks of each device plugin resource: (resource, devices).
type Asks = Vec<(String, usize)>;

/// The containers of a pod in admission order, with what they ask of `resources`.
fn gpu_containers(pod: &Pod, resources: &[&str]) -> Vec<(String, ContainerKind, Asks)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let count = |c: &k8s_openapi::api::core::v1::Container| -> Asks {
        let r = c.resources.as_ref();
        resources
            .iter()
            .map(|resource| {
                let n = r
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|m| m.get(*resource))
                    .or_else(|| {
                        r.and_then(|r| r.limits.as_ref())
                            .and_then(|m| m.get(*resource))
                    })
                    .and_then(|q| q.0.parse::<usize>().ok())
                    .unwrap_or(0);
                (resource.to_string(), n)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    let mut out = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        let kind = if c.restart_policy.as_deref() == Some("Always") {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        };
        out.push((c.name.clone(), kind, count(c)));
    }
    for c in &spec.containers {
        out.push((c.name.clone(), ContainerKind::App, count(c)));
    }
    out
}

impl Admitter {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.options.seed);
        let mut since = 0u64;
        // Pods this kubelet knows: UID by (namespace, name).
        let mut known: HashMap<(String, String), String> = HashMap::new();
        let mut terminating: Vec<Terminating> = Vec::new();
        loop {
            let next_release = terminating.iter().map(|(t, _, _)| *t).min();
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = self.api.wait_node_pod_change(&self.options.node, since) => {}
                _ = async {
                    match next_release {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            let now = tokio::time::Instant::now();
            terminating.retain(|(t, uid, graceful)| {
                if *t <= now {
                    self.release(uid);
                    if let Some((ns, name)) = graceful {
                        self.api.delete_pod(ns, name);
                    }
                    false
                } else {
                    true
                }
            });
            let (lo, hi) = self.options.admission_delay_ms;
            if hi > 0 {
                tokio::time::sleep(Duration::from_millis(rng.random_range(lo..=hi))).await;
            }
            let (changes, reached) = self.api.node_pod_changes_since(&self.options.node, since);
            if reached == since {
                continue;
            }
            since = reached;
            let mut adds: Vec<Arc<Pod>> = Vec::new();
            for (key, pod) in changes {
                let here = pod.as_ref().filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(self.options.node.as_str())
                });
                let gone = match here {
                    None => true,
                    Some(p) => {
                        p.metadata.deletion_timestamp.is_some()
                            || known
                                .get(&key)
                                .is_some_and(|uid| p.metadata.uid.as_deref() != Some(uid.as_str()))
                    }
                };
                if gone {
                    // Deleted gracefully (still in the API with a deletionTimestamp): the
                    // kubelet stops it, then deletes it for good.
                    let graceful = here
                        .filter(|p| p.metadata.deletion_timestamp.is_some())
                        .map(|_| key.clone());
                    if let Some(uid) = known.remove(&key) {
                        match self.options.terminating_ms {
                            Some((lo, hi)) => terminating.push((
                                now + Duration::from_millis(rng.random_range(lo..=hi)),
                                uid,
                                graceful,
                            )),
                            None => {
                                self.release(&uid);
                                if let Some((ns, name)) = graceful {
                                    self.api.delete_pod(&ns, &name);
                                }
                            }
                        }
                    } else if let Some((ns, name)) = graceful
                        && !terminating.iter().any(|(_, _, g)| g.as_ref() == Some(&key))
                    {
                        // Never admitted: nothing to stop. A pod already stopping (seen
                        // again as its record is written) is deleted when it has stopped.
                        self.api.delete_pod(&ns, &name);
                    }
                    continue;
                }
                if let Some(p) = here
                    && !known.contains_key(&key)
                    && !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
                {
                    known.insert(key, p.metadata.uid.clone().unwrap_or_default());
                    adds.push(p.clone());
                }
            }
            // A batch is sorted by creation time, as the kubelet's config source does.
            adds.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
            for pod in adds {
                self.admit(&pod, &mut rng).await;
            }
        }
    }

    fn release(&self, uid: &str) {
        lock(&self.state).active.retain(|_, e| e.uid != uid);
    }

    /// The resource a device ID belongs to: slices are the share resource's.
    fn resource_of(&self, id: &str) -> &str {
        if gpuplace_deviceplugin::devices::slice_gpu(id).is_some() {
            gpuplace_model::SHARE_RESOURCE
        } else {
            &self.options.resource
        }
    }

    async fn admit(&self, pod: &Pod, rng: &mut ChaCha8Rng) {
        let meta = &pod.metadata;
        let mut containers = gpu_containers(
            pod,
            &[&self.options.resource, gpuplace_model::SHARE_RESOURCE],
        );
        // Several extended resources of one container are visited in random order.
        for (_, _, asks) in &mut containers {
            asks.shuffle(rng);
        }
        let mut admission = Admission {
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            assignment: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
                .cloned(),
            containers: Vec::new(),
            error: None,
            preferred_calls: 0,
            preferred_latency: Vec::new(),
        };
        let seq = {
            let mut state = lock(&self.state);
            let seq = state.next;
            state.next += 1;
            state.active.insert(
                seq,
                Entry {
                    namespace: admission.namespace.clone(),
                    name: admission.name.clone(),
                    uid: admission.uid.clone(),
                    kinds: containers
                        .iter()
                        .filter(|(_, _, asks)| !asks.is_empty())
                        .map(|(n, k, _)| (n.clone(), *k))
                        .collect(),
                    devices: HashMap::new(),
                },
            );
            seq
        };
        let mut reuse: Vec<String> = Vec::new();
        'containers: for (name, kind, asks) in &containers {
            let mut got: Vec<String> = Vec::new();
            for (resource, count) in asks {
                let pool: Vec<String> = reuse
                    .iter()
                    .filter(|d| self.resource_of(d) == resource)
                    .cloned()
                    .collect();
                match self
                    .allocate_container(seq, name, resource, *count, &pool, rng, &mut admission)
                    .await
                {
                    Ok(ids) => got.extend(ids),
                    Err(e) => {
                        admission.error = Some(e);
                        break 'containers;
                    }
                }
            }
            if got.is_empty() {
                continue;
            }
            match kind {
                ContainerKind::Init => {
                    for d in &got {
                        if !reuse.contains(d) {
                            reuse.push(d.clone());
                        }
                    }
                }
                _ => reuse.retain(|d| !got.contains(d)),
            }
            admission.containers.push((name.clone(), *kind, got));
        }
        if admission.error.is_some() {
            // Refused: the pod is Failed and its devices are freed at the next cleanup.
            lock(&self.state).active.remove(&seq);
            self.api
                .set_phase(&admission.namespace, &admission.name, "Failed");
        }
        lock(&self.state).log.push(admission);
    }
}
