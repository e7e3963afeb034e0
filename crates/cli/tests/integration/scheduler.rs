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

/// Numbers from flags are range-checked where they are read: out of range is refused,
/// naming the flag and its range, never clamped (nor a panic: 2^61 Bindings in flight once
/// overflowed a semaphore).
#[test]
fn scheduler_refuses_numbers_out_of_range_naming_them() {
    for (flag, value, says) in [
        (
            "--max-in-flight",
            "2305843009213693952",
            "--max-in-flight 2305843009213693952 is out of range: from 1 to 4096",
        ),
        ("--max-in-flight", "0", "--max-in-flight 0 is out of range"),
        (
            "--interval-ms",
            "0",
            "--interval-ms 0 is out of range: from 10 to 3600000",
        ),
        (
            "--kube-api-burst",
            "0",
            "--kube-api-burst 0 is out of range",
        ),
        (
            "--kube-api-qps",
            "1e300",
            "kube-api-qps 1e300 is not a number",
        ),
        ("--kube-api-qps", "NaN", "kube-api-qps NaN is not a number"),
    ] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args(["scheduler", flag, value])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The extender serves /bind without authentication: an address off loopback is refused.
#[test]
fn extender_refuses_an_address_off_loopback() {
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .args(["extender", "--listen", "0.0.0.0:8888"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("0.0.0.0:8888 is not a loopback address"),
        "{stderr}"
    );
}

/// A metrics address off loopback is served over TLS: a certificate without its key, or
/// files that do not load, stop the start with a line naming them.
#[test]
fn a_metrics_address_off_loopback_needs_a_certificate_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let out = Command::cargo_bin("gpuplace")
        .unwrap()
        .args(["scheduler", "--tls-cert-file", "/x.crt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tls-private-key-file"), "{stderr}");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for (cert, key, says) in [
        (
            "/nonexistent/tls.crt",
            "/nonexistent/tls.key",
            "cannot read /nonexistent/tls.crt",
        ),
        (
            not_pem.to_str().unwrap(),
            not_pem.to_str().unwrap(),
            "holds no PEM certificate",
        ),
    ] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args(["scheduler", "--metrics-addr", "0.0.0.0:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--tls-cert-file", cert, "--tls-private-key-file", key])
            .timeout(std::time::Duration::from_secs(30))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot set up TLS for the metrics address"),
            "{stderr}"
        );
        assert!(stderr.contains(says), "{stderr}");
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

/// A server that refuses connections is said to be unreachable, not blamed on the optional
/// PodGroup CRD that happened to be read first.
#[test]
fn status_against_a_closed_port_says_the_server_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\nusers: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    for command in [&["status"][..], &["defrag", "--plan"][..]] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args(command)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot reach the API server"),
            "{command:?}: {stderr}"
        );
        assert!(!stderr.contains("podgroups"), "{command:?}: {stderr}");
    }
}

/// Help states each default once, and `crd` says it prints both definitions.
#[test]
fn help_says_each_default_once() {
    for command in [
        "simulate",
        "device-plugin",
        "scheduler",
        "extender",
        "status",
        "defrag",
        "crd",
    ] {
        let out = Command::cargo_bin("gpuplace")
            .unwrap()
            .args([command, "--help"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // One flag's entry runs to the next line that starts a flag.
        let mut entries: Vec<String> = Vec::new();
        for line in text.lines() {
            let indent = line.len() - line.trim_start().len();
            if (line.trim_start().starts_with('-') && indent <= 6) || entries.is_empty() {
                entries.push(String::new());
            }
            if let Some(last) = entries.last_mut() {
                last.push_str(line);
                last.push('\n');
            }
        }
        for entry in &entries {
            assert!(
                entry.matches("[default:").count() <= 1,
                "{command}: {entry}"
            );
        }
        if command == "crd" {
            assert!(text.contains("PodGroup and Queue"), "{text}");
        }
        if command == "device-plugin" {
            assert!(text.contains("nvml, or file"), "{text}");
        }
    }
}
