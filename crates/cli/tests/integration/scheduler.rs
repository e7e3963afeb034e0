//! `gpuplace crd` and `gpuplace scheduler` start-up errors.

use assert_cmd::Command;

#[test]
fn crd_prints_the_podgroup_and_queue_definitions() {
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    );
    assert!(text.contains("name: podgroups.gpuplace.io"));
    assert!(text.contains("minMember"));
    assert!(text.contains("name: queues.gpuplace.io"));
    assert!(text.contains("scope: Cluster"));
    // The committed manifests are what the command prints, one document each.
    let read = |file: &str| {
        std::fs::read_to_string(format!(
            "{}/../../deploy/base/crd/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let committed = format!(
        "{}---\n{}",
        read("podgroup-crd.yaml"),
        read("queue-crd.yaml")
    );
    assert_eq!(
        text, committed,
        "regenerate deploy/base/crd/podgroup-crd.yaml and queue-crd.yaml with `gpuplace crd`"
    );
}

#[test]
fn scheduler_refuses_bad_settings_clearly() {
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .args(["scheduler", "--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot read kubeconfig /nonexistent/kubeconfig")
    );
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .args(["scheduler", "--policy", "magic"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy \"magic\""));
    for (weights, says) in [
        ("random=1", "cannot be weighted"),
        ("fgd", "is not POLICY=WEIGHT"),
        ("fgd=lots", "is not a whole number"),
        ("fgd=0", "between 1 and 100"),
    ] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args(["scheduler", "--weights", weights])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{weights}: {stderr}");
    }
}

#[cfg(feature = "bench-fakes")]
#[test]
fn bench_scheduler_reports_throughput_phases_and_memory() {
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .args([
            "bench",
            "scheduler",
            "--nodes",
            "20",
            "--pods",
            "300",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bound = report["end_to_end"]["bound"].as_u64().unwrap();
    // 20 nodes x 8 GPUs cannot take 300 pods of this mix; every GPU pod that fits does.
    assert!(bound > 100 && bound < 300, "{report}");
    assert_eq!(report["core_alone"]["placed"].as_u64(), Some(bound));
    assert!(
        report["end_to_end"]["seconds_by_phase"]["core"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        report["memory_mib"]["scheduler_peak_heap"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}
