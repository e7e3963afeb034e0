//! The device plugin against a fake kubelet over real unix sockets: registration, kubelet
//! restarts, health pushes, preferred allocation on every example topology, Allocate in
//! every strategy, and every kind of bad request.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_deviceplugin::Config;
use gpuplace_deviceplugin::backend::{Backend, FileBackend};
use gpuplace_deviceplugin::config::{DeviceIdStrategy, DeviceListStrategy, Settings};
use gpuplace_deviceplugin::kubelet::registration;
use gpuplace_deviceplugin::kubelet::service::device_tables;
use gpuplace_deviceplugin::metrics::Metrics;
use gpuplace_kubelet_api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreStartContainerRequest, PreferredAllocationRequest,
};
use gpuplace_kubelet_api::{HEALTHY, UNHEALTHY};
use gpuplace_testkit::{FakeKubelet, wait_for_devices};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(5);

fn inventory(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/inventories")
        .join(name)
}

struct Running {
    kubelet: FakeKubelet,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    inventory: PathBuf,
    config: Arc<Config>,
    metrics: Metrics,
    _dir: tempfile::TempDir,
}

async fn start(file: &str, tweak: impl FnOnce(&mut Settings)) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let inv = dir.path().join("inventory.yaml");
    std::fs::copy(inventory(file), &inv).unwrap();
    let kubelet = FakeKubelet::start(&plugin_dir).await;
    let mut settings = Settings {
        plugin_dir: Some(plugin_dir),
        backend: Some(gpuplace_deviceplugin::config::BackendKind::File),
        inventory: Some(inv.clone()),
        node_name: Some("node-1".into()),
        poll_interval_ms: Some(100),
        // One resource unless a test asks for shares (they register a second one).
        shares: Some(false),
        ..Default::default()
    };
    tweak(&mut settings);
    let config = Arc::new(settings.resolve().unwrap());
    let (stop, task, metrics) = spawn_plugin(config.clone(), &inv);
    Running {
        kubelet,
        stop: Some(stop),
        task,
        inventory: inv,
        config,
        metrics,
        _dir: dir,
    }
}

fn spawn_plugin(
    config: Arc<Config>,
    inv: &Path,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>, Metrics) {
    let backend = FileBackend::start(inv, "node-a", Duration::from_millis(50)).unwrap();
    let metrics = Metrics::default();
    let tables = device_tables(
        backend.watch(),
        config.replicas,
        config.shares,
        metrics.clone(),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let _backend = backend;
        registration::run(config, tables, m, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (stop, task, metrics)
}

impl Running {
    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn uuid(box_id: u32, i: u32) -> String {
    format!(
        "GPU-{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        0x6b1d_0000 + box_id,
        i,
        box_id,
        i,
        0x1000 + i
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_lists_devices_with_numa() {
    let run = start("dgx1-hybrid-cube-mesh.yaml", |_| {}).await;
    let reg = run
        .kubelet
        .wait_for_registrations(1, WAIT)
        .await
        .expect("registered");
    assert_eq!(reg.request.version, "v1beta1");
    assert_eq!(reg.request.resource_name, "nvidia.com/gpu");
    assert_eq!(reg.request.endpoint, "gpuplace-nvidia.com_gpu.sock");
    assert!(reg.options.get_preferred_allocation_available);
    assert!(!reg.options.pre_start_required);
    let mut devices = reg.devices.clone();
    let list = wait_for_devices(&mut devices, WAIT, |d| d.len() == 8)
        .await
        .unwrap();
    assert!(list.iter().all(|d| d.health == HEALTHY));
    assert_eq!(list[0].id, uuid(1, 0));
    assert_eq!(list[5].topology.as_ref().unwrap().nodes[0].id, 1);
    run.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_is_followed_by_a_new_registration() {
    let mut run = start("pcie-4.yaml", |_| {}).await;
    run.kubelet
        .wait_for_registrations(1, WAIT)
        .await
        .expect("registered");
    for round in 2..=4 {
        run.kubelet.restart().await;
        let restarted = Instant::now();
        let reg = run
            .kubelet
            .wait_for_registrations(round, WAIT)
            .await
            .expect("registered again");
        let took = reg.at.duration_since(restarted);
        println!(
            "re-registered {} ms after kubelet.sock reappeared",
            took.as_millis()
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        // The new registration comes with a working socket and a fresh device list.
        let mut devices = reg.devices.clone();
        wait_for_devices(&mut devices, WAIT, |d| d.len() == 4)
            .await
            .unwrap();
        let mut client = run.kubelet.plugin_client().unwrap();
        let reply = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids(&[&uuid(3, 0)]),
                }],
            })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().container_responses.len(), 1);
    }
    let socket = run.config.plugin_dir.join("gpuplace-nvidia.com_gpu.sock");
    assert!(socket.exists());
    run.shutdown().await;
    assert!(!socket.exists(), "socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_an_absent_kubelet_then_registers() {
    let mut run = start("two-gpu.yaml", |_| {}).await;
    run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    run.kubelet.stop().await;
    run.kubelet.delete_sockets();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(run.kubelet.registrations().len(), 1);
    run.kubelet.start_again();
    let back = Instant::now();
    let reg = run
        .kubelet
        .wait_for_registrations(2, WAIT)
        .await
        .expect("registered");
    println!(
        "registered {} ms after the kubelet came back",
        reg.at.duration_since(back).as_millis()
    );
    assert!(run.metrics.registration_failures.get() >= 1);
    run.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_are_pushed_on_list_and_watch() {
    let run = start("nvswitch-8.yaml", |_| {}).await;
    let reg = run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let mut devices = reg.devices.clone();
    wait_for_devices(&mut devices, WAIT, |d| d.len() == 8)
        .await
        .unwrap();
    let text = std::fs::read_to_string(&run.inventory).unwrap();
    let target = format!("uuid: {}, index: 5", uuid(2, 5));
    let line = text.lines().find(|l| l.contains(&target)).unwrap();
    let edited = text.replace(line, &line.replace("healthy: true", "healthy: false"));
    let flipped = Instant::now();
    std::fs::write(&run.inventory, edited).unwrap();
    let list = wait_for_devices(&mut devices, WAIT, |d| {
        d.iter().any(|x| x.health == UNHEALTHY)
    })
    .await
    .unwrap();
    println!(
        "health pushed {} ms after the edit",
        flipped.elapsed().as_millis()
    );
    assert!(flipped.elapsed() < Duration::from_secs(2));
    let bad: Vec<&str> = list
        .iter()
        .filter(|d| d.health == UNHEALTHY)
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(bad, vec![uuid(2, 5).as_str()]);
    // Allocate refuses the unhealthy device by name.
    let mut client = run.kubelet.plugin_client().unwrap();
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&[&uuid(2, 5)]),
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains(&uuid(2, 5)), "{}", err.message());
    assert!(err.message().contains("unhealthy"));
    run.shutdown().await;
}

async fn prefer(run: &Running, available: &[String], must: &[String], size: i32) -> Vec<String> {
    let mut client = run.kubelet.plugin_client().unwrap();
    client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.to_vec(),
                allocation_size: size,
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0)
        .device_i_ds
}

/// Expected answers were checked by brute force over every subset with the same
/// objective (largest pair score, then the fewest good links broken, then lowest indexes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_on_every_example_topology() {
    /// (inventory, box number in its UUIDs, available, must include, size, expected).
    type Case = (&'static str, u32, Vec<u32>, Vec<u32>, i32, Vec<u32>);
    let cases: [Case; 10] = [
        (
            "dgx1-hybrid-cube-mesh.yaml",
            1,
            (0..8).collect(),
            vec![],
            2,
            vec![2, 3],
        ),
        (
            "dgx1-hybrid-cube-mesh.yaml",
            1,
            (0..8).collect(),
            vec![],
            4,
            vec![0, 1, 2, 3],
        ),
        (
            "dgx1-hybrid-cube-mesh.yaml",
            1,
            vec![1, 2, 3],
            vec![],
            1,
            vec![1],
        ),
        (
            "dgx1-hybrid-cube-mesh.yaml",
            1,
            (0..8).collect(),
            vec![7],
            2,
            vec![6, 7],
        ),
        (
            "nvswitch-8.yaml",
            2,
            (0..8).collect(),
            vec![],
            4,
            vec![0, 1, 2, 3],
        ),
        ("pcie-4.yaml", 3, (0..4).collect(), vec![], 2, vec![0, 1]),
        ("pcie-4.yaml", 3, vec![0, 2, 3], vec![], 1, vec![0]),
        ("two-gpu.yaml", 4, vec![0, 1], vec![], 1, vec![0]),
        (
            "pairs-16.yaml",
            5,
            (0..16).collect(),
            vec![],
            8,
            (0..8).collect(),
        ),
        (
            "pairs-16.yaml",
            5,
            (1..16).filter(|&x| x != 5).collect(),
            vec![],
            2,
            vec![2, 3],
        ),
    ];
    for (file, box_id, available, must, size, want) in cases {
        let run = start(file, |_| {}).await;
        run.kubelet
            .wait_for_registrations(1, WAIT)
            .await
            .unwrap_or_else(|| panic!("{file}: no registration"));
        let available: Vec<String> = available.iter().map(|&i| uuid(box_id, i)).collect();
        let must: Vec<String> = must.iter().map(|&i| uuid(box_id, i)).collect();
        let mut got = prefer(&run, &available, &must, size).await;
        got.sort();
        let want: Vec<String> = want.iter().map(|&i| uuid(box_id, i)).collect();
        assert_eq!(got, want, "{file} size {size}");
        run.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_in_every_strategy() {
    // Default: envvar with UUIDs, device specs for the GPU and the control nodes that
    // exist on the host (here nvidia-uvm-tools does not: no spec for it).
    let dev = tempfile::tempdir().unwrap();
    // Character devices standing in for the GPUs' device nodes; a regular file is not one.
    for f in ["nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"] {
        std::os::unix::fs::symlink("/dev/null", dev.path().join(f)).unwrap();
    }
    std::fs::write(dev.path().join("nvidia-uvm-tools"), b"not a device").unwrap();
    let root = dev.path().to_path_buf();
    let run = start("dgx1-hybrid-cube-mesh.yaml", |s| {
        s.dev_root = Some(root.clone())
    })
    .await;
    run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let mut client = run.kubelet.plugin_client().unwrap();
    let reply = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&[&uuid(1, 2), &uuid(1, 3)]),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &reply.container_responses[0];
    assert_eq!(
        c.envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", uuid(1, 2), uuid(1, 3))
    );
    let paths: Vec<(&str, &str, &str)> = c
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    let host = |f: &str| root.join(f).display().to_string();
    let (h2, h3, hctl, huvm) = (
        host("nvidia2"),
        host("nvidia3"),
        host("nvidiactl"),
        host("nvidia-uvm"),
    );
    assert_eq!(
        paths,
        vec![
            ("/dev/nvidia2", h2.as_str(), "rw"),
            ("/dev/nvidia3", h3.as_str(), "rw"),
            ("/dev/nvidiactl", hctl.as_str(), "rw"),
            ("/dev/nvidia-uvm", huvm.as_str(), "rw"),
        ]
    );
    assert!(c.cdi_devices.is_empty());
    assert_eq!(
        c.annotations["gpuplace.io/device-ids"],
        format!("{},{}", uuid(1, 2), uuid(1, 3))
    );
    let pre = client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: ids(&[&uuid(1, 2)]),
        })
        .await;
    assert!(pre.is_ok());
    // The kubelet records a registration before the plugin hears the reply and counts
    // it: wait for the plugin's side rather than race it.
    let render = || {
        let mut registry = prometheus_client::registry::Registry::default();
        run.metrics.register(&mut registry);
        gpuplace_deviceplugin::metrics::render(&registry)
    };
    let deadline = Instant::now() + WAIT;
    let mut metrics = render();
    while !metrics.contains("gpuplace_deviceplugin_registrations_total 1")
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        metrics = render();
    }
    assert!(
        metrics.contains("gpuplace_deviceplugin_allocations_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuplace_deviceplugin_registrations_total 1"),
        "{metrics}"
    );
    run.shutdown().await;

    // CDI and env with indices, a custom device root.
    let host_dev = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/null", host_dev.path().join("nvidia1")).unwrap();
    let host_root = host_dev.path().to_path_buf();
    let run = start("pcie-4.yaml", |s| {
        s.device_list_strategy = Some(DeviceListStrategy::Both);
        s.device_id_strategy = Some(DeviceIdStrategy::Index);
        s.dev_root = Some(host_root.clone());
    })
    .await;
    run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let mut client = run.kubelet.plugin_client().unwrap();
    let c = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&[&uuid(3, 1)]),
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "1");
    assert_eq!(c.cdi_devices[0].name, "nvidia.com/gpu=1");
    assert_eq!(
        c.devices[0].host_path,
        host_root.join("nvidia1").display().to_string()
    );
    assert_eq!(
        c.devices.len(),
        1,
        "no specs for absent control device files"
    );
    assert_eq!(c.devices[0].container_path, "/dev/nvidia1");
    run.shutdown().await;

    // CDI only with UUIDs: the legacy hook gets "void".
    let run = start("two-gpu.yaml", |s| {
        s.device_list_strategy = Some(DeviceListStrategy::Cdi);
    })
    .await;
    run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let mut client = run.kubelet.plugin_client().unwrap();
    let c = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids(&[&uuid(4, 0)]),
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "void");
    assert_eq!(
        c.cdi_devices[0].name,
        format!("nvidia.com/gpu={}", uuid(4, 0))
    );
    run.shutdown().await;
}

/// With shares on, a second endpoint registers `gpuplace.io/gpu-milli` with 1000 slices per
/// GPU; Allocate of 300 slices of one GPU hands out that GPU with the share's hints, and
/// each endpoint refuses the other's devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_register_as_a_second_resource_of_slices() {
    let run = start("two-gpu.yaml", |s| s.shares = Some(true)).await;
    run.kubelet.wait_for_registrations(2, WAIT).await.unwrap();
    let regs = run.kubelet.registrations();
    let share = regs
        .iter()
        .find(|r| r.request.resource_name == "gpuplace.io/gpu-milli")
        .expect("share resource registered");
    assert_eq!(
        share.request.endpoint,
        "gpuplace-gpuplace.io_gpu-milli.sock"
    );
    assert!(
        regs.iter()
            .any(|r| r.request.resource_name == "nvidia.com/gpu")
    );
    let mut devices = share.devices.clone();
    let list = wait_for_devices(&mut devices, WAIT, |d| d.len() == 2000)
        .await
        .unwrap();
    assert_eq!(list[1001].id, format!("{}::m1", uuid(4, 1)));
    let mut client = gpuplace_kubelet_api::v1beta1::device_plugin_client::DevicePluginClient::new(
        gpuplace_kubelet_api::unix_channel(run.config.plugin_dir.join(&share.request.endpoint)),
    );
    let slices: Vec<String> = (0..300).map(|k| format!("{}::m{k}", uuid(4, 1))).collect();
    let c = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: slices,
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], uuid(4, 1));
    assert_eq!(c.envs["GPUPLACE_GPU_MILLI"], "300");
    assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    let wrong = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid(4, 0)],
            }],
        })
        .await
        .unwrap_err();
    assert!(
        wrong.message().contains("other resource"),
        "{}",
        wrong.message()
    );
    run.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_advertised_and_allocated_to_physical_gpus() {
    let run = start("two-gpu.yaml", |s| s.replicas = Some(3)).await;
    let reg = run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let mut devices = reg.devices.clone();
    let list = wait_for_devices(&mut devices, WAIT, |d| d.len() == 6)
        .await
        .unwrap();
    assert_eq!(list[4].id, format!("{}::1", uuid(4, 1)));
    let mut client = run.kubelet.plugin_client().unwrap();
    let c = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{}::0", uuid(4, 1)), format!("{}::2", uuid(4, 1))],
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0);
    // Two replicas of one GPU: that GPU once.
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], uuid(4, 1));
    assert!(
        c.devices.is_empty(),
        "no /dev/nvidia* on this host: no device specs"
    );
    let all: Vec<String> = list.iter().map(|d| d.id.clone()).collect();
    let got = prefer(&run, &all, &[], 2).await;
    assert_eq!(
        got,
        vec![format!("{}::0", uuid(4, 0)), format!("{}::0", uuid(4, 1))]
    );
    run.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_is_refused_with_its_reason() {
    let run = start("pcie-4.yaml", |s| s.pre_start_required = Some(true)).await;
    let reg = run.kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    assert!(reg.options.pre_start_required);
    let mut client = run.kubelet.plugin_client().unwrap();
    let allocate = |devices: Vec<String>| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: devices,
        }],
    };
    let cases = [
        (
            allocate(ids(&["GPU-nope"])),
            "unknown device ID \"GPU-nope\"",
        ),
        (
            allocate(ids(&[&uuid(3, 0), &uuid(3, 0)])),
            "listed more than once",
        ),
        (allocate(vec![]), "no device IDs"),
        (
            AllocateRequest {
                container_requests: vec![],
            },
            "no container requests",
        ),
    ];
    for (request, want) in cases {
        let err = client.allocate(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(want), "{} vs {want}", err.message());
    }
    let prefer_err =
        |available: Vec<String>, must: Vec<String>, size: i32| PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must,
                allocation_size: size,
            }],
        };
    let all: Vec<String> = (0..4).map(|i| uuid(3, i)).collect();
    let cases = [
        (
            prefer_err(all.clone(), vec![], 5),
            "allocation size 5 is out of range",
        ),
        (
            prefer_err(all.clone(), vec![], -1),
            "allocation size -1 is out of range",
        ),
        (
            prefer_err(ids(&["GPU-x"]), vec![], 1),
            "unknown device ID \"GPU-x\"",
        ),
        (
            prefer_err(all[..2].to_vec(), vec![all[3].clone()], 2),
            "is not among the available devices",
        ),
        (
            prefer_err(all.clone(), all[..3].to_vec(), 2),
            "exceed the allocation size",
        ),
    ];
    // One unknown ID among known ones is left out, not a failure of the whole answer.
    let mut with_unknown = all.clone();
    with_unknown.insert(1, "GPU-gone".into());
    let ok = client
        .get_preferred_allocation(prefer_err(with_unknown, vec![], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.container_responses[0].device_i_ds.len(), 2);
    assert!(
        !ok.container_responses[0]
            .device_i_ds
            .contains(&"GPU-gone".to_string())
    );
    for (request, want) in cases {
        let err = client.get_preferred_allocation(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(want), "{} vs {want}", err.message());
    }
    let err = client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: ids(&["GPU-zzz"]),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // The plugin still serves after all that.
    assert!(client.allocate(allocate(ids(&[&uuid(3, 2)]))).await.is_ok());
    run.shutdown().await;
}
