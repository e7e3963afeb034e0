//! `gpuplace crd` and `gpuplace scheduler` start-up errors.

use assert_cmd::Command;

#[test]
fn crd_prints_the_podgroup_definition() {
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
    // The committed manifest is what the command prints.
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/podgroup-crd.yaml"
    ))
    .unwrap();
    assert_eq!(
        text, committed,
        "regenerate deploy/podgroup-crd.yaml with `gpuplace crd`"
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
}
