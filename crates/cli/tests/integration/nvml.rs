//! The NVML backend on a machine with NVIDIA GPUs: `--discover` sees what `nvidia-smi`
//! sees, and the plugin serves those GPUs to a (fake) kubelet, whole and as shares, with the
//! device files that exist on this host. They need an NVIDIA driver, so they are ignored
//! (the test run says so) unless asked for: `cargo test -p gpuplace --test integration --
//! --ignored nvml::` on a GPU machine, as `scripts/device-nvml-check.sh` runs them. Asked
//! for without a driver, they fail saying why.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuplace_kubelet_api::v1beta1::{AllocateRequest, ContainerAllocateRequest};
use gpuplace_testkit::FakeKubelet;
use serde_json::Value;

fn gpuplace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(args)
        .output()
        .expect("gpuplace runs")
}

/// Why NVML tests are not run by default.
const NEEDS_A_GPU: &str = "needs an NVIDIA driver and GPU: run with --ignored on a GPU machine";

/// The discovery report; fails, saying why, where NVML cannot load (the tests that call it
/// are asked for by name, on a GPU machine).
fn discover() -> Value {
    let out = gpuplace(&["device-plugin", "--discover", "--backend", "nvml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "NVML did not load, so this machine cannot run the NVML tests ({NEEDS_A_GPU}): {}",
        err.trim()
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("--discover prints JSON");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    report
}

/// (uuid, index, memory MiB) of each GPU as nvidia-smi reports it, when it is installed.
fn nvidia_smi() -> Option<Vec<(String, u64, u64)>> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=uuid,index,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').map(str::trim).collect();
                Some((
                    f.first()?.to_string(),
                    f.get(1)?.parse().ok()?,
                    f.get(2)?.parse().ok()?,
                ))
            })
            .collect(),
    )
}

#[test]
#[ignore = "needs an NVIDIA driver and GPU: run with --ignored on a GPU machine"]
fn discovery_matches_nvidia_smi() {
    let report = discover();
    let gpus = report["inventory"]["gpus"].as_array().expect("gpus");
    assert!(!gpus.is_empty(), "NVML loaded but no GPU was found");
    assert_eq!(report["gpus"].as_array().map(Vec::len), Some(gpus.len()));
    let n = gpus.len();
    let links = report["inventory"]["links"].as_array().expect("links");
    assert_eq!(links.len(), n * (n - 1) / 2, "one link entry per GPU pair");
    for (gpu, facts) in gpus.iter().zip(report["gpus"].as_array().unwrap()) {
        assert_eq!(gpu["uuid"], facts["uuid"]);
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"), "{gpu}");
        assert_eq!(facts["answers"], true, "{facts}");
        assert_eq!(gpu["healthy"], facts["device_file"], "{gpu} {facts}");
    }
    let Some(smi) = nvidia_smi() else {
        println!("nvidia-smi absent: discovery not compared");
        return;
    };
    assert_eq!(smi.len(), n, "nvidia-smi and NVML count the same GPUs");
    for (uuid, index, memory) in smi {
        let gpu = gpus
            .iter()
            .find(|g| g["uuid"] == uuid.as_str())
            .unwrap_or_else(|| panic!("{uuid} from nvidia-smi is discovered"));
        assert_eq!(gpu["index"].as_u64(), Some(index));
        // nvidia-smi's memory.total is MiB; NVML's total bytes >> 20 is the same figure.
        let discovered = gpu["memory_mib"].as_u64().unwrap();
        assert!(discovered.abs_diff(memory) <= 1, "{discovered} vs {memory}");
    }
}

#[test]
#[ignore = "needs an NVIDIA driver and GPU: run with --ignored on a GPU machine"]
fn a_missing_device_file_makes_a_gpu_unhealthy() {
    discover();
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args([
            "device-plugin",
            "--discover",
            "--backend",
            "nvml",
            "--dev-root",
        ])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    for gpu in report["inventory"]["gpus"].as_array().unwrap() {
        assert_eq!(gpu["healthy"], false, "{gpu}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA driver and GPU: run with --ignored on a GPU machine"]
async fn the_plugin_serves_this_machines_gpus() {
    let report = discover();
    let gpus = report["inventory"]["gpus"].as_array().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(["device-plugin", "--backend", "nvml"])
        .args(["--publish-inventory", "false", "--handshake", "false"])
        .arg("--plugin-dir")
        .arg(dir.path())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let handle = kubelet.handle();
    let mut whole = None;
    for _ in 0..400 {
        if handle.serves("nvidia.com/gpu") && handle.serves("gpuplace.io/gpu-milli") {
            whole = Some(handle.devices("nvidia.com/gpu"));
            if whole.as_ref().is_some_and(|d| d.len() == gpus.len()) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let whole = whole.expect("both resources registered");
    assert_eq!(whole.len(), gpus.len());
    let shares = handle.devices("gpuplace.io/gpu-milli");
    assert_eq!(shares.len(), gpus.len() * 1000, "1000 slices per GPU");
    let uuid = gpus[0]["uuid"].as_str().unwrap().to_string();
    let minor = gpus[0]["minor"]
        .as_u64()
        .or(gpus[0]["index"].as_u64())
        .unwrap();
    let mut client = handle
        .client(dir.path(), "nvidia.com/gpu")
        .expect("a client");
    let reply = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid.clone()],
            }],
        })
        .await
        .expect("Allocate answers")
        .into_inner();
    let c = &reply.container_responses[0];
    println!("Allocate({uuid}) -> {c:?}");
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], uuid);
    let gpu_file = format!("/dev/nvidia{minor}");
    assert!(
        c.devices.iter().any(|d| d.host_path == gpu_file),
        "{gpu_file} handed to the container"
    );
    for d in &c.devices {
        assert!(
            std::path::Path::new(&d.host_path).exists(),
            "{} exists on this host",
            d.host_path
        );
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let code = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(code.success(), "{code:?}");
}
