//! `gpuplace replay`'s own checks: bad inputs refused before the cluster is touched, and a
//! server that is not there named within seconds (the driver's runs against the in-memory
//! API are in the test kit: crates/testkit/tests/integration/replay_live.rs).

use std::time::{Duration, Instant};

use assert_cmd::Command;

/// A kubeconfig for a server that is not there (nothing listens on port 1).
fn nowhere(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .unwrap();
    path
}

fn replay(args: &[&str]) -> (bool, String) {
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .arg("replay")
        .args(args)
        .env_remove("KUBECONFIG")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn bad_inputs_are_refused_before_the_cluster_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = nowhere(dir.path());
    let k = kubeconfig.to_str().unwrap();
    let owned = dir.path().join("owned.yaml");
    std::fs::write(&owned, "spec:\n  nodeName: gpu-1\n").unwrap();
    let classed = dir.path().join("classed.yaml");
    std::fs::write(&classed, "spec:\n  priorityClassName: high\n").unwrap();
    let deployment = dir.path().join("deployment.yaml");
    std::fs::write(&deployment, "kind: Deployment\n").unwrap();
    let (owned, classed, deployment) = (
        owned.to_str().unwrap(),
        classed.to_str().unwrap(),
        deployment.to_str().unwrap(),
    );
    for (args, says) in [
        (vec!["--speed", "0"], "--speed must be above 0"),
        (vec!["--speed", "-3"], "--speed must be above 0"),
        (
            vec!["--in-flight", "0"],
            "--in-flight must be between 1 and 256",
        ),
        (
            vec!["--priority-classes", "low,high"],
            "--priority-classes needs three PriorityClass names",
        ),
        (vec!["--sample-nodes", "5"], "only --fake-nodes creates"),
        (vec!["--policy", "magic"], "unknown policy \"magic\""),
        (
            vec!["--policy", "kube-dra"],
            "--policy kube-dra is kube-scheduler allocating DRA claims: add --dra",
        ),
        (
            vec!["--dra", "--policy", "kube-default"],
            "with --dra kube-scheduler allocates the claims itself",
        ),
        (
            vec![
                "--nodes",
                "/nonexistent/n.csv",
                "--pods",
                "/nonexistent/p.csv",
            ],
            "/nonexistent/n.csv",
        ),
        (
            vec!["--tenants", "/nonexistent/t.yaml"],
            "cannot read the tenants file",
        ),
        (
            vec!["--pod-template", "/nonexistent/pod.yaml"],
            "cannot read the pod template /nonexistent/pod.yaml",
        ),
        (
            vec!["--pod-template", owned],
            "sets spec.nodeName, which the replay sets itself",
        ),
        (
            vec!["--pod-template", deployment],
            "is not a Pod: its kind is \"Deployment\"",
        ),
        (
            vec!["--pod-template", classed, "--priority-classes", "a,b,c"],
            "priorityClassName high and --priority-classes",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--kubeconfig", k, "--fake-nodes"]);
        if args[0] == "--sample-nodes" {
            all.pop();
        }
        let started = Instant::now();
        let (ok, stderr) = replay(&all);
        assert!(!ok, "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        // Refused at once: no connection was tried.
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?}");
    }
}

#[test]
fn a_server_that_is_not_there_is_named_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = nowhere(dir.path());
    let k = kubeconfig.to_str().unwrap();
    let started = Instant::now();
    let (ok, stderr) = replay(&["--kubeconfig", k, "--fake-nodes", "--arrivals", "10"]);
    assert!(!ok);
    assert!(stderr.contains("unavailable"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(45));
    let (ok, stderr) = replay(&["--kubeconfig", k, "--clean"]);
    assert!(!ok);
    assert!(stderr.contains("cannot clean up"), "{stderr}");
}
