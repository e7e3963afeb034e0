//! `gpuplace device-plugin` as a process: registers with a (fake) kubelet, serves, and on
//! SIGTERM removes its socket and exits 0.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuplace_testkit::{FakeKubelet, wait_for_devices};

fn inventory(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/inventories")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_registers_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await;
    let config = dir.path().join("plugin.yaml");
    std::fs::write(&config, "replicas: 2\ndevice-list-strategy: both\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(["device-plugin", "--backend", "file", "--log-format", "json"])
        .arg("--inventory")
        .arg(inventory("pcie-4.yaml"))
        .arg("--plugin-dir")
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        // The environment beats the config file's 2 replicas.
        .env("GPUPLACE_REPLICAS", "3")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Longer than one registration may take (the plugin allows its Register call 15 s, the
    // kubelet's dial-back inside it 10 s): a loaded CI machine once needed over 10 s.
    let reg = kubelet
        .wait_for_registrations(1, Duration::from_secs(40))
        .await
        .expect("the plugin registered");
    let mut devices = reg.devices.clone();
    let list = wait_for_devices(&mut devices, Duration::from_secs(5), |d| !d.is_empty())
        .await
        .unwrap();
    assert_eq!(
        list.len(),
        4 * 3,
        "env GPUPLACE_REPLICAS=3 beats the file's 2"
    );
    let socket = dir.path().join("gpuplace-nvidia.com_gpu.sock");
    assert!(socket.exists());
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exited = None;
    for _ in 0..100 {
        if let Some(code) = child.try_wait().unwrap() {
            exited = Some(code);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let code = exited.expect("exited after SIGTERM");
    assert!(code.success(), "{code:?}");
    assert!(!socket.exists(), "socket removed on SIGTERM");
}

#[test]
fn bad_settings_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(["device-plugin", "--backend", "fake"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs an inventory file"));
    let out = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(["device-plugin", "--device-list-strategy", "cdx"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"cdx\" is not one of: envvar, cdi, both")
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("inv.yaml");
    std::fs::write(
        &bad,
        "gpus:\n  - {uuid: a, index: 0}\n  - {uuid: b, index: 0}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuplace"))
        .args(["device-plugin", "--backend", "file", "--inventory"])
        .arg(&bad)
        .arg("--plugin-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu index 0 appears more than once"), "{err}");
}
