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

/// The benches on the in-memory API live in `gpuplace-bench`; the release binary says so
/// (with the arguments given) instead of "unrecognized subcommand".
#[test]
fn the_release_binary_points_to_gpuplace_bench() {
    for bench in ["scheduler", "extender", "preemption"] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args(["bench", bench, "--nodes", "20"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "cargo run --release -p gpuplace-bench -- {bench} --nodes 20"
            )),
            "{stderr}"
        );
    }
}
