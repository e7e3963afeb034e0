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

use gpuplace_kubelet_api::HEALTHY;
use gpuplace_kubelet_api::podresources::pod_resources_lister_server::PodResourcesListerServer;
use gpuplace_kubelet_api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Device,
    PreferredAllocationRequest,
};
use gpuplace_model::{ASSIGNMENT_ANNOTATION, ContainerKind};
use k8s_openapi::api::core::v1::Pod;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

pub use crate::kubelet_record::Admission;
use crate::kubelet_record::{Entry, Lister, NodeState, lock};
use crate::{FakeKubelet, MemoryApi};

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
    kubelet_shared: crate::KubeletHandle,
}

/// The GPU containers of a pod in admission order.
fn gpu_containers(pod: &Pod, resource: &str) -> Vec<(String, ContainerKind, usize)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let count = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(resource))
            .or_else(|| {
                r.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get(resource))
            })
            .and_then(|q| q.0.parse::<usize>().ok())
            .unwrap_or(0)
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
                _ = self.api.wait_pod_change(since) => {}
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
            let (changes, reached) = self.api.pod_changes_since(since);
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
                    } else if let Some((ns, name)) = graceful {
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

    async fn admit(&self, pod: &Pod, rng: &mut ChaCha8Rng) {
        let meta = &pod.metadata;
        let containers = gpu_containers(pod, &self.options.resource);
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
                    kinds: containers.iter().map(|(n, k, _)| (n.clone(), *k)).collect(),
                    devices: HashMap::new(),
                },
            );
            seq
        };
        let mut reuse: Vec<String> = Vec::new();
        for (name, kind, count) in &containers {
            if *count == 0 {
                continue;
            }
            match self
                .allocate_container(seq, name, *count, &reuse, rng, &mut admission)
                .await
            {
                Ok(ids) => {
                    match kind {
                        ContainerKind::Init => {
                            for d in &ids {
                                if !reuse.contains(d) {
                                    reuse.push(d.clone());
                                }
                            }
                        }
                        _ => reuse.retain(|d| !ids.contains(d)),
                    }
                    admission.containers.push((name.clone(), *kind, ids));
                }
                Err(e) => {
                    admission.error = Some(e);
                    break;
                }
            }
        }
        if admission.error.is_some() {
            // Refused: the pod is Failed and its devices are freed at the next cleanup.
            lock(&self.state).active.remove(&seq);
            self.api
                .set_phase(&admission.namespace, &admission.name, "Failed");
        }
        lock(&self.state).log.push(admission);
    }

    /// `devicesToAllocate` and Allocate for one container.
    async fn allocate_container(
        &self,
        seq: u64,
        container: &str,
        needed: usize,
        reuse: &[String],
        rng: &mut ChaCha8Rng,
        admission: &mut Admission,
    ) -> Result<Vec<String>, String> {
        let resource = &self.options.resource;
        let mut allocated: Vec<String> = Vec::new();
        let take = |allocated: &mut Vec<String>, from: &[String], rng: &mut ChaCha8Rng| {
            let mut pool: Vec<String> = from
                .iter()
                .filter(|d| !allocated.contains(d))
                .cloned()
                .collect();
            pool.shuffle(rng);
            for d in pool {
                if allocated.len() >= needed {
                    break;
                }
                allocated.push(d);
            }
            allocated.len() == needed
        };
        let done = take(&mut allocated, reuse, rng);
        if !done {
            let devices: Vec<Device> = self.kubelet_shared.devices();
            let in_use = lock(&self.state).in_use();
            let available: Vec<&Device> = devices
                .iter()
                .filter(|d| d.health == HEALTHY && !in_use.contains(&d.id))
                .collect();
            let remaining = needed - allocated.len();
            if available.len() < remaining {
                return Err(format!(
                    "UnexpectedAdmissionError: requested number of devices unavailable for {resource}. Requested: {remaining}, Available: {}",
                    available.len()
                ));
            }
            let ids = |v: &[&Device]| v.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
            let numa = |d: &Device| {
                d.topology
                    .as_ref()
                    .and_then(|t| t.nodes.first())
                    .map(|n| n.id)
            };
            let (aligned, unaligned, no_affinity): (Vec<&Device>, Vec<&Device>, Vec<&Device>) =
                if self.options.numa_alignment {
                    // The narrowest mask: the lowest NUMA node that can hold the rest alone,
                    // else every node.
                    let mut nodes: Vec<i64> = available.iter().filter_map(|d| numa(d)).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    let one = nodes.iter().copied().find(|n| {
                        available.iter().filter(|d| numa(d) == Some(*n)).count() >= remaining
                    });
                    let in_mask = |d: &Device| match (one, numa(d)) {
                        (Some(n), Some(m)) => n == m,
                        (None, Some(_)) => true,
                        _ => false,
                    };
                    (
                        available.iter().copied().filter(|d| in_mask(d)).collect(),
                        available
                            .iter()
                            .copied()
                            .filter(|d| numa(d).is_some() && !in_mask(d))
                            .collect(),
                        available
                            .iter()
                            .copied()
                            .filter(|d| numa(d).is_none())
                            .collect(),
                    )
                } else {
                    (Vec::new(), Vec::new(), available.clone())
                };
            let aligned_ids = ids(&aligned);
            let available_ids = ids(&available);
            let full = if remaining < aligned.len() {
                let preferred = self
                    .preferred(&aligned_ids, &allocated, needed, admission)
                    .await?;
                let offered: Vec<String> = preferred
                    .into_iter()
                    .filter(|d| aligned_ids.contains(d))
                    .collect();
                take(&mut allocated, &offered, rng) || take(&mut allocated, &aligned_ids, rng)
            } else if take(&mut allocated, &aligned_ids, rng) {
                true
            } else {
                let preferred = self
                    .preferred(&available_ids, &allocated, needed, admission)
                    .await?;
                let offered: Vec<String> = preferred
                    .into_iter()
                    .filter(|d| available_ids.contains(d))
                    .collect();
                take(&mut allocated, &offered, rng)
                    || take(&mut allocated, &ids(&unaligned), rng)
                    || take(&mut allocated, &ids(&no_affinity), rng)
            };
            if !full {
                return Err(format!(
                    "unexpectedly allocated less resources than required. Requested: {needed}, Got: {}",
                    allocated.len()
                ));
            }
        }
        let mut client = self
            .kubelet_shared
            .client(&self.dir)
            .ok_or("no device plugin registered")?;
        let reply = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: allocated.clone(),
                }],
            })
            .await
            .map_err(|s| format!("UnexpectedAdmissionError: Allocate failed: {}", s.message()))?;
        if reply.into_inner().container_responses.is_empty() {
            return Err("UnexpectedAdmissionError: empty Allocate response".into());
        }
        // The record and the checkpoint: the devices show in List from now on.
        let mut state = lock(&self.state);
        let others = state.in_use();
        if allocated.iter().any(|d| {
            others.contains(d)
                && !state
                    .active
                    .get(&seq)
                    .is_some_and(|e| e.devices.values().flatten().any(|x| x == d))
        }) {
            state.double_use += 1;
        }
        if let Some(e) = state.active.get_mut(&seq) {
            e.devices.insert(container.to_string(), allocated.clone());
        }
        Ok(allocated)
    }

    async fn preferred(
        &self,
        available: &[String],
        must: &[String],
        size: usize,
        admission: &mut Admission,
    ) -> Result<Vec<String>, String> {
        let mut client = self
            .kubelet_shared
            .client(&self.dir)
            .ok_or("no device plugin registered")?;
        admission.preferred_calls += 1;
        let mut offered: Vec<String> = available.to_vec();
        for m in must {
            if !offered.contains(m) {
                offered.push(m.clone());
            }
        }
        let started = std::time::Instant::now();
        let reply = client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: offered,
                    must_include_device_i_ds: must.to_vec(),
                    allocation_size: size as i32,
                }],
            })
            .await
            .map_err(|s| {
                format!(
                    "UnexpectedAdmissionError: GetPreferredAllocation failed: {}",
                    s.message()
                )
            })?;
        admission.preferred_latency.push(started.elapsed());
        Ok(reply
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }
}
