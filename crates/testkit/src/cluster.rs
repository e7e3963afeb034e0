//! A whole cluster in one process for the handshake: the in-memory API, nodes from
//! inventory files, and per node a fake kubelet ([`FakeNode`]), gpuplace's device plugin
//! with its handshake (fed by a lagging watch of the node's pods), and its reconciler; plus
//! the scheduler's loop. Used by the end-to-end tests and the `handshake` example.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_deviceplugin::backend::{Backend, FileBackend};
use gpuplace_deviceplugin::config::{BackendKind, Settings};
use gpuplace_deviceplugin::kubelet::podresources::PodResources;
use gpuplace_deviceplugin::kubelet::{registration, service};
use gpuplace_deviceplugin::metrics::Metrics;
use gpuplace_deviceplugin::plan::handshake::{Handshake, HandshakeConfig};
use gpuplace_deviceplugin::plan::store::NodePods;
use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory};
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::MemoryApi;
use crate::kubelet_node::{FakeNode, NodeOptions};
use crate::node_feed::feed_node_pods;

/// How long one node's device plugin may take to register and list its devices: a bound
/// on a hang, not a speed. 60 s was passed once more (2026-12-05's CI at 3d6ad9e: one of
/// the preempting timeline stack's nodes, beside the openb replay through the whole stack
/// on 2 cores).
const UP_WITHIN: Duration = Duration::from_secs(180);

/// How the cluster behaves.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Node names and their inventory files.
    pub nodes: Vec<(String, PathBuf)>,
    pub seed: u64,
    /// Random delay (ms) before a kubelet acts on an API change.
    pub admission_delay_ms: (u64, u64),
    /// Random delay (ms) of the device plugin's pod watch.
    pub plugin_watch_delay_ms: (u64, u64),
    /// Terminating pods keep their devices this long (ms) on the node.
    pub terminating_ms: Option<(u64, u64)>,
    pub numa_alignment: bool,
    /// The kubelets serve PodResources `Get` (1.34+), else only `List` (1.26-1.33).
    pub pod_resources_get: bool,
    /// Pause between scheduling rounds.
    pub round_interval: Duration,
    /// The scheduler's policy and tie-break seed (`None`: its defaults and `seed`).
    pub policy: Option<gpuplace_core::Policy>,
    pub placer_seed: Option<u64>,
    /// Nodes' allocatable CPU and memory are exactly their inventory's (else at least
    /// 64 cores and 256 GiB, so example inventories without them take any pod).
    pub exact_resources: bool,
    /// FGD's target workload for the scheduler (`None`: the pods it sees).
    pub workload: Option<Arc<gpuplace_core::TargetWorkload>>,
}

/// One node's parts.
pub struct NodeRig {
    pub name: String,
    pub inventory: Arc<NodeInventory>,
    pub fake: FakeNode,
    pub handshake: Arc<Handshake>,
    pub metrics: Metrics,
    _backend: FileBackend,
}

impl NodeRig {
    /// The plugin's handshake counters, one `name{result=..} value` line each.
    /// The plugin's metrics in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        self.metrics.register(&mut registry);
        gpuplace_deviceplugin::metrics::render(&registry)
    }

    pub fn handshake_counters(&self) -> Vec<String> {
        self.metrics_text()
            .lines()
            .filter(|l| l.starts_with("gpuplace_deviceplugin_handshake_total"))
            .map(str::to_string)
            .collect()
    }
}

/// The running cluster.
pub struct HandshakeCluster {
    pub api: MemoryApi,
    pub nodes: Vec<NodeRig>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    scheduler_thread: Option<std::thread::JoinHandle<()>>,
}

/// The Node object a kubelet and the device plugin would make for `inventory`.
pub fn node_object(name: &str, inventory: &NodeInventory) -> Node {
    let mut inventory = inventory.clone();
    inventory.cpu_milli = inventory.cpu_milli.max(64_000);
    inventory.memory_mib = inventory.memory_mib.max(262_144);
    exact_node_object(name, &inventory)
}

/// [`node_object`] with the inventory's CPU and memory as they are.
pub fn exact_node_object(name: &str, inventory: &NodeInventory) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
            "annotations": {INVENTORY_ANNOTATION: inventory.to_json()}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {
                "cpu": format!("{}m", inventory.cpu_milli),
                "memory": format!("{}Mi", inventory.memory_mib),
                "nvidia.com/gpu": inventory.gpus.iter().filter(|g| g.healthy).count().to_string(),
                gpuplace_model::SHARE_RESOURCE: (inventory.gpus.iter().filter(|g| g.healthy).count() * 1000).to_string(),
                "pods": "110"
            }
        }
    }))
    .unwrap_or_default()
}

impl HandshakeCluster {
    /// Starts the API and every node (kubelet, device plugin, handshake) but no scheduler:
    /// the caller drives its own (the timeline replay runs rounds at simulated times).
    pub async fn start_without_scheduler(
        dir: &Path,
        options: &ClusterOptions,
    ) -> Result<HandshakeCluster, String> {
        let api = MemoryApi::new();
        let (stop, stop_rx) = watch::channel(false);
        let stopped = |rx: &watch::Receiver<bool>| {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut nodes = Vec::new();
        let mut tasks = Vec::new();
        for (i, (name, file)) in options.nodes.iter().enumerate() {
            let node_dir = dir.join(name);
            std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
            // Each node polls files and lists its kubelet on its own: on a large cluster
            // in one process they poll less often, or the polling is all the machine does.
            let big = options.nodes.len() > 100;
            let slow = |fast: u64, slow: u64| Duration::from_millis(if big { slow } else { fast });
            let backend =
                FileBackend::start(file, name, slow(200, 10_000)).map_err(|e| e.to_string())?;
            let inventory = backend.watch().borrow().clone();
            api.put_node(if options.exact_resources {
                exact_node_object(name, &inventory)
            } else {
                node_object(name, &inventory)
            });
            let mut node_options = NodeOptions::new(name);
            node_options.seed = options.seed.wrapping_add(i as u64 * 1000 + 1);
            node_options.admission_delay_ms = options.admission_delay_ms;
            node_options.terminating_ms = options.terminating_ms;
            node_options.numa_alignment = options.numa_alignment;
            node_options.serve_get = options.pod_resources_get;
            let fake = FakeNode::start(&node_dir, api.clone(), node_options).await;
            let config = Arc::new(
                Settings {
                    plugin_dir: Some(node_dir.clone()),
                    backend: Some(BackendKind::File),
                    inventory: Some(file.clone()),
                    node_name: Some(name.clone()),
                    pass_device_specs: Some(false),
                    publish_inventory: Some(false),
                    handshake: Some(true),
                    pod_resources_socket: Some(fake.pod_resources_socket().to_path_buf()),
                    poll_interval_ms: Some(slow(100, 5_000).as_millis() as u64),
                    ..Settings::default()
                }
                .resolve()
                .map_err(|e| e.to_string())?,
            );
            let metrics = Metrics::default();
            let tables = service::device_tables(backend.watch(), 1, config.shares, metrics.clone());
            let pods = NodePods::new(&config.resource, name);
            let handshake = Handshake::new(
                HandshakeConfig {
                    node: name.clone(),
                    // Longer than production's 2 s: test machines run five clusters on 2 cores.
                    wait_for_watch: Duration::from_secs(5),
                    resync: slow(500, 10_000),
                },
                pods.clone(),
                PodResources::new(fake.pod_resources_socket(), &config.resource),
                tables.clone(),
                metrics.clone(),
            );
            tasks.push(tokio::spawn(feed_node_pods(
                api.clone(),
                name.clone(),
                pods,
                options.plugin_watch_delay_ms,
                options.seed.wrapping_add(i as u64 * 1000 + 2),
                stop_rx.clone(),
            )));
            tasks.push(tokio::spawn(
                handshake
                    .clone()
                    .reconcile_loop(api.clone(), stopped(&stop_rx)),
            ));
            let plugin_run = registration::run_with_handshake(
                config,
                tables,
                metrics.clone(),
                Some(handshake.clone()),
                stopped(&stop_rx),
            );
            tasks.push(tokio::spawn(async move {
                let _ = plugin_run.await;
            }));
            // Bounds a hang, not a speed: a CI machine running other tests beside a
            // cluster of hundreds of nodes took over 10 s to register one (30a059f's CI).
            if fake
                .kubelet
                .wait_for_registrations(2, UP_WITHIN)
                .await
                .is_none()
            {
                return Err(format!("the device plugin of {name} did not register"));
            }
            // The kubelet admits a pod to a resource only once the plugin's ListAndWatch has
            // sent its devices (and only then does the real Node's allocatable show them); a
            // pod admitted before is refused with "Available: 0". The Node put above stands
            // for that later state, so the cluster is up when every resource has devices.
            for mut registered in fake.kubelet.registrations() {
                let resource = registered.request.resource_name.clone();
                let listed = crate::kubelet::wait_for_devices(
                    &mut registered.devices,
                    UP_WITHIN,
                    |devices| !devices.is_empty(),
                )
                .await;
                if listed.is_none() {
                    return Err(format!("the device plugin of {name} listed no {resource}"));
                }
            }
            nodes.push(NodeRig {
                name: name.clone(),
                inventory,
                fake,
                handshake,
                metrics,
                _backend: backend,
            });
        }
        Ok(HandshakeCluster {
            api,
            nodes,
            stop,
            tasks,
            scheduler_thread: None,
        })
    }

    /// Starts every part, the scheduler's loop included; sockets live under `dir` (one
    /// folder per node).
    pub async fn start(dir: &Path, options: ClusterOptions) -> Result<HandshakeCluster, String> {
        let mut cluster = Self::start_without_scheduler(dir, &options).await?;
        let mut scheduler = Scheduler::new(
            cluster.api.clone(),
            SchedulerConfig {
                seed: options.placer_seed.unwrap_or(options.seed),
                policy: options.policy.unwrap_or(SchedulerConfig::default().policy),
                workload: options.workload.clone(),
                queue: gpuplace_scheduler::scheduler::QueueConfig {
                    initial_backoff: Duration::from_millis(5),
                    max_backoff: Duration::from_millis(20),
                    ..Default::default()
                },
                ..SchedulerConfig::default()
            },
        );
        // The scheduler's round is not Send (it keeps Rc'd filters): it gets a thread and a
        // current-thread runtime of its own, as the binary runs it.
        let mut rx = cluster.stop.subscribe();
        let interval = options.round_interval;
        let scheduler_thread = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                loop {
                    let _ = scheduler.round(Instant::now()).await;
                    tokio::select! {
                        _ = rx.wait_for(|s| *s) => return,
                        _ = tokio::time::sleep(interval) => {}
                    }
                }
            });
        });
        cluster.scheduler_thread = Some(scheduler_thread);
        Ok(cluster)
    }

    /// Stops every task and node.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        if let Some(thread) = self.scheduler_thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        for n in self.nodes {
            n.fake.stop().await;
        }
    }
}
