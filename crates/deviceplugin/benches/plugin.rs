//! Device plugin benchmark: `cargo bench -p gpuplace-deviceplugin --bench plugin`.
//!
//! On the 16-GPU example inventory (8 NVLink pairs), against the fake kubelet over real unix
//! sockets: Allocate and GetPreferredAllocation latency through gRPC, the preferred-set
//! search alone, re-registration after kubelet restarts, and health push after an edit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_core::topology::{LinkMatrix, select};
use gpuplace_deviceplugin::backend::{Backend, FileBackend};
use gpuplace_deviceplugin::config::{BackendKind, Settings};
use gpuplace_deviceplugin::kubelet::registration;
use gpuplace_deviceplugin::kubelet::service::device_tables;
use gpuplace_deviceplugin::metrics::Metrics;
use gpuplace_kubelet_api::UNHEALTHY;
use gpuplace_kubelet_api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreferredAllocationRequest,
};
use gpuplace_testkit::{FakeKubelet, wait_for_devices};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name:<44} n={:<5} p50={:>9.1?} p99={:>9.1?} max={:>9.1?}",
        samples.len(),
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&plugin_dir).expect("dir");
    let inv = dir.path().join("inventory.yaml");
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/inventories/pairs-16.yaml"),
        &inv,
    )
    .expect("inventory");
    let mut kubelet = FakeKubelet::start(&plugin_dir).await;
    let config = Arc::new(
        Settings {
            plugin_dir: Some(plugin_dir),
            backend: Some(BackendKind::File),
            inventory: Some(inv.clone()),
            ..Default::default()
        }
        .resolve()
        .expect("config"),
    );
    let backend = FileBackend::start(&inv, "bench", Duration::from_millis(200)).expect("backend");
    let metrics = Metrics::default();
    let tables = device_tables(backend.watch(), 1, false, metrics.clone());
    let task = tokio::spawn(registration::run(
        config,
        tables,
        metrics,
        std::future::pending::<()>(),
    ));
    let reg = kubelet
        .wait_for_registrations(1, Duration::from_secs(5))
        .await
        .expect("registered");
    let mut devices = reg.devices.clone();
    let list = wait_for_devices(&mut devices, Duration::from_secs(5), |d| d.len() == 16)
        .await
        .expect("devices");
    let ids: Vec<String> = list.iter().map(|d| d.id.clone()).collect();
    let mut client = kubelet.plugin_client().expect("client");
    let mut rng = ChaCha8Rng::seed_from_u64(7);

    // Allocate: 1, 2, 4 or 8 random GPUs.
    let mut samples = Vec::new();
    for _ in 0..2000 {
        let mut pick = ids.clone();
        pick.shuffle(&mut rng);
        pick.truncate([1, 2, 4, 8][rng.random_range(0..4)]);
        let t = Instant::now();
        client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest { devices_ids: pick }],
            })
            .await
            .expect("allocate");
        samples.push(t.elapsed());
    }
    summary("Allocate (gRPC round trip)", samples);

    // Preferred allocation: a random free subset of 8..16 GPUs, sizes 1..=8.
    let mut samples = Vec::new();
    let mut worst = Vec::new();
    for _ in 0..2000 {
        let mut available = ids.clone();
        available.shuffle(&mut rng);
        available.truncate(rng.random_range(8..=16));
        let size = rng.random_range(1..=8);
        let t = Instant::now();
        client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.clone(),
                    must_include_device_i_ds: vec![],
                    allocation_size: size,
                }],
            })
            .await
            .expect("preferred");
        samples.push(t.elapsed());
        if available.len() == 16 && size == 8 {
            worst.push(t.elapsed());
        }
    }
    summary("GetPreferredAllocation (gRPC round trip)", samples);
    if !worst.is_empty() {
        summary("GetPreferredAllocation 8 of 16 (gRPC)", worst);
    }

    // The exact search alone, worst case for 16 GPUs.
    let inventory = backend.watch().borrow().clone();
    let links = LinkMatrix::from_inventory(&inventory);
    let all: Vec<usize> = (0..16).collect();
    for size in [1, 2, 4, 8] {
        let mut samples = Vec::new();
        for _ in 0..500 {
            let t = Instant::now();
            let set = select(&links, &all, &[], size).expect("set");
            samples.push(t.elapsed());
            std::hint::black_box(set);
        }
        summary(&format!("exact search, {size} of 16 GPUs"), samples);
    }

    // Worst case for pruning: 16 GPUs on one NVSwitch, every pair alike, every set ties.
    let mut flat = gpuplace_model::NodeInventory::uniform("flat", 1, 1, 16, "H100");
    for a in 0..16u32 {
        for b in a + 1..16 {
            flat.links.push(gpuplace_model::Link {
                a,
                b,
                nvlinks: 18,
                pcie: gpuplace_model::PcieLevel::SameCpu,
            });
        }
    }
    let flat_links = LinkMatrix::from_inventory(&flat);
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        std::hint::black_box(select(&flat_links, &all, &[], 8).expect("set"));
        samples.push(t.elapsed());
    }
    summary("exact search, 8 of 16, all pairs equal", samples);

    // Re-registration after kubelet restarts.
    let mut samples = Vec::new();
    for round in 2..=21 {
        kubelet.restart().await;
        let back = Instant::now();
        let reg = kubelet
            .wait_for_registrations(round, Duration::from_secs(5))
            .await
            .expect("re-registered");
        samples.push(reg.at.duration_since(back));
    }
    summary("re-registration after kubelet restart", samples);

    // Health push after editing the inventory.
    let reg = kubelet.registrations().pop().expect("registration");
    let mut devices = reg.devices.clone();
    let mut samples = Vec::new();
    let healthy = std::fs::read_to_string(&inv).expect("read");
    let line = healthy
        .lines()
        .find(|l| l.contains("index: 3,"))
        .expect("gpu 3");
    let sick = healthy.replace(line, &line.replace("healthy: true", "healthy: false"));
    for i in 0..10 {
        let (text, want_unhealthy) = if i % 2 == 0 {
            (&sick, true)
        } else {
            (&healthy, false)
        };
        let t = Instant::now();
        std::fs::write(&inv, text).expect("write");
        wait_for_devices(&mut devices, Duration::from_secs(5), |d| {
            d.iter().any(|x| x.health == UNHEALTHY) == want_unhealthy
        })
        .await
        .expect("pushed");
        samples.push(t.elapsed());
    }
    summary("health push after inventory edit", samples);
    task.abort();
}
