//! The `gpuplace simulate` command as a user runs it.

use std::io::Write;

use assert_cmd::Command;

pub(crate) fn gpuplace() -> Command {
    Command::cargo_bin("gpuplace").unwrap()
}

/// Runs `cmd`, which must succeed, and reads its stdout as one JSON object.
pub(crate) fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// Runs `cmd`, which must fail, and returns what it said on stderr.
pub(crate) fn refusal_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn builtin_json_has_the_stable_shape() {
    let v = json_of(gpuplace().args([
        "simulate",
        "--scale",
        "16",
        "--seeds",
        "2",
        "--policies",
        "fgd,best-fit",
        "--json",
    ]));
    assert!(v["cluster"]["nodes"].as_u64().unwrap() > 50);
    assert!(v["cluster"]["gpus"].as_u64().unwrap() > 300);
    assert_eq!(v["seeds"], serde_json::json!([42, 43]));
    let policies = v["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 2);
    assert_eq!(policies[0]["policy"], "fgd");
    for p in policies {
        assert!(p["unallocated_pct"]["100"]["mean"].is_f64());
        assert!(p["unallocated_pct"]["130"]["sd"].is_f64());
        assert!(p["fragmentation_pct"]["80"]["mean"].is_f64());
        assert_eq!(p["unallocated_curve"].as_array().unwrap().len(), 131);
        assert!(p["elapsed_s"].is_f64());
    }
}

#[test]
fn out_dir_gets_every_report_file() {
    let dir = tempfile::tempdir().unwrap();
    gpuplace()
        .args(["simulate", "--scale", "32", "--seeds", "1", "--out"])
        .arg(dir.path())
        .assert()
        .success();
    for f in [
        "summary.json",
        "curves.csv",
        "unallocated.svg",
        "unallocated.png",
        "unallocated_zoom.svg",
        "unallocated_zoom.png",
        "fragmentation.svg",
        "fragmentation.png",
        "index.html",
    ] {
        let meta = std::fs::metadata(dir.path().join(f)).unwrap_or_else(|_| panic!("{f} missing"));
        assert!(meta.len() > 100, "{f} is too small");
    }
    let csv = std::fs::read_to_string(dir.path().join("curves.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 7 * 131);
    let png = std::fs::read(dir.path().join("unallocated.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

fn csv(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn bad_input_names_file_line_and_column() {
    let nodes = csv("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n");
    let pods =
        csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500\np1,1000,ten,1,500\n");
    let err = refusal_of(
        gpuplace()
            .args(["simulate", "--seeds", "1", "--nodes"])
            .arg(nodes.path())
            .arg("--pods")
            .arg(pods.path()),
    );
    assert!(err.contains(&pods.path().display().to_string()), "{err}");
    assert!(
        err.contains("line 3, column \"memory_mib\": \"ten\" is not a whole number"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_pod_list_without_gpu_pods_fails_at_once() {
    let nodes = csv("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n");
    let pods = csv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,0,0\np1,2000,20,0,0\n");
    let err = refusal_of(
        gpuplace()
            .args(["simulate", "--seeds", "2", "--nodes"])
            .arg(nodes.path())
            .arg("--pods")
            .arg(pods.path())
            .timeout(std::time::Duration::from_secs(60)),
    );
    assert!(
        err.contains("no pod in the pod list asks for a GPU"),
        "{err}"
    );
}

#[test]
fn topology_asks_are_applied_and_reported() {
    let v = json_of(gpuplace().args([
        "simulate",
        "--scale",
        "16",
        "--seeds",
        "1",
        "--policies",
        "fgd",
        "--require-topology",
        "0.5",
        "--prefer-topology",
        "0.2",
        "--json",
    ]));
    let asks = v["topology_asks"].as_str().unwrap_or_default();
    assert!(asks.contains("require nvlink"), "{v}");
    assert!(
        refusal_of(gpuplace().args([
            "simulate",
            "--require-topology",
            "0.8",
            "--prefer-topology",
            "0.5",
        ]))
        .contains("sum to at most 1")
    );
    let out = gpuplace()
        .args([
            "simulate",
            "--require-topology",
            "0.1",
            "--topology",
            "nvswitch",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown value \"nvswitch\""));
}

#[test]
fn bad_arguments_are_refused_clearly() {
    assert!(
        refusal_of(gpuplace().args(["simulate", "--policies", "fgd,magic"]))
            .contains("unknown policy \"magic\"")
    );
    refusal_of(gpuplace().args(["simulate", "--inflate", "-1"]));
    let out = gpuplace()
        .args(["simulate", "--seeds", "0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seeds must be at least 1"));
    let err = refusal_of(gpuplace().args([
        "simulate",
        "--nodes",
        "/nonexistent/nodes.csv",
        "--pods",
        "/nonexistent/pods.csv",
    ]));
    assert!(err.contains("/nonexistent/nodes.csv: cannot read"), "{err}");
    // Each cause once.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // --nodes without --pods is a usage error.
    gpuplace()
        .args(["simulate", "--nodes", "x.csv"])
        .assert()
        .failure();
}

#[test]
fn policies_lists_every_policy() {
    let out = gpuplace().arg("policies").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for p in [
        "fgd",
        "best-fit",
        "random",
        "dotprod",
        "gpu-packing",
        "gpu-clustering",
        "first-fit",
        "worst-fit",
        "binpack",
        "spread",
    ] {
        assert!(text.lines().any(|l| l == p), "{p} missing");
    }
}

#[test]
fn timeline_json_has_the_stable_shape_and_the_report_its_plots() {
    let dir = tempfile::tempdir().unwrap();
    let v = json_of(
        gpuplace()
            .args([
                "simulate",
                "--timeline",
                "--scale",
                "16",
                "--seeds",
                "2",
                "--arrivals",
                "3000",
                "--load",
                "1.0",
                "--policies",
                "fgd,gpuplace",
                "--require-topology",
                "0.5",
                "--json",
                "--out",
            ])
            .arg(dir.path()),
    );
    assert_eq!(v["load"], 1.0);
    assert_eq!(v["arrivals"], 3000);
    let policies = v["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 2);
    for p in policies {
        assert!(p["allocation_pct"]["mean"].is_f64());
        assert!(p["allocation_pct"]["sd"].is_f64());
        for class in ["share", "1", "2-4", "8", "nvlink"] {
            for key in ["p50", "p90", "p99", "max"] {
                assert!(p["wait_s"][class][key].is_f64(), "{class} {key}: {p}");
            }
        }
        assert_eq!(p["series"]["t_s"].as_array().unwrap().len(), 240);
        for key in [
            "goodput_pct",
            "gpu_hours_lost",
            "moves_per_hour",
            "abandoned",
            "failed_attempts",
        ] {
            assert!(p[key]["mean"].is_f64(), "{key}: {p}");
        }
        assert!(p["wait_s"]["8"]["abandoned_pct"].is_f64(), "{p}");
    }
    for key in [
        "eviction_grace_s",
        "recreate_s",
        "start_s",
        "bind_latency_s",
        "attempt_s",
        "placed_attempt_s",
    ] {
        assert!(v["costs"][key].is_f64(), "{key}: {}", v["costs"]);
    }
    assert_eq!(v["costs"]["eviction_grace_s"], 31.0);
    assert_eq!(v["patience"], "off");
    // The timeline preempts as the scheduler does unless --no-preempt.
    assert_eq!(v["preempt"], true);
    for f in [
        "summary.json",
        "series.csv",
        "index.html",
        "allocation.svg",
        "pending.png",
        "fragmentation.svg",
        "wait_cdf_8.svg",
        "wait_cdf_nvlink.png",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    super::simulate_pods::check_pods_csv(&dir.path().join("pods.csv"), &v);
    let nodes = std::fs::read_to_string(dir.path().join("nodes.csv")).expect("nodes.csv");
    assert_eq!(
        nodes.lines().next(),
        Some("node,name,cpu_milli,memory_mib,gpus")
    );
    assert_eq!(
        nodes.lines().count(),
        1 + v["cluster"]["nodes"].as_u64().unwrap() as usize
    );
}

#[test]
fn timeline_flags_are_checked() {
    for (args, expected) in [
        (vec!["--timeline", "--load", "0"], "--load must be between"),
        (
            vec!["--timeline", "--warm-attempts", "1:95,2"],
            "--warm-attempts takes ATTEMPTS:PODS pairs separated by commas (1:95,2:50), \"2\" has no ':'",
        ),
        (
            vec!["--timeline", "--warm-attempts", "0:5"],
            "attempts must be 1 to 1,000",
        ),
        (
            vec!["--timeline", "--warm-attempts", "1:x"],
            "\"x\" is not a whole number of pods",
        ),
        (
            vec!["--timeline", "--warm-attempts", "1:0,2:0"],
            "no pods in any pair",
        ),
        (vec!["--timeline", "--warmup", "1.5"], "--warmup must be"),
        (
            vec!["--timeline", "--duration-scale=-1"],
            "--duration-scale must be above 0 and at most 1000",
        ),
        // A negative number is a value (refused with its bounds), not a flag.
        (
            vec!["--timeline", "--load", "-1"],
            "--load must be between 0.01 and 10, got -1",
        ),
        (
            vec!["--timeline", "--duration-scale", "1e6"],
            "at most 1000, got 1000000",
        ),
        (
            vec!["--timeline", "--min-duration", "1e11"],
            "--min-duration must be between 1 and 31536000 seconds",
        ),
        // Allowed each, but together a clock of years: refused ahead with the estimate.
        (
            vec![
                "--timeline",
                "--min-duration",
                "3e7",
                "--duration-scale",
                "1000",
            ],
            "the replay would simulate about",
        ),
        (
            vec!["--timeline", "--defrag-min-age", "1e20"],
            "--defrag-min-age must be between 0 and 2592000 seconds (30 days), got 100000000000000000000",
        ),
        (
            vec!["--timeline", "--defrag-budget", "inf"],
            "--defrag-budget must be GPUs per hour",
        ),
        (
            vec!["--timeline", "--movable", "-0.5"],
            "--movable must be between 0 and 1",
        ),
        (
            vec![
                "--timeline",
                "--min-duration",
                "100",
                "--max-duration",
                "10",
            ],
            "--max-duration (10) must be at least --min-duration (100)",
        ),
        (vec!["--load", "0.5"], "--timeline"),
        (
            vec!["--timeline", "--eviction-grace", "-1"],
            "--eviction-grace must be between 0 and 3600 seconds, got -1",
        ),
        (
            vec!["--timeline", "--start", "inf"],
            "--start must be between 0 and 3600 seconds, got inf",
        ),
        (
            vec!["--timeline", "--bind-latency", "1e9"],
            "--bind-latency must be between 0 and 3600 seconds",
        ),
        (
            vec!["--timeline", "--attempt-cost", "-0.01"],
            "--attempt-cost must be between 0 and 3600 seconds, got -0.01",
        ),
        (
            vec!["--timeline", "--placed-attempt-cost", "5000"],
            "--placed-attempt-cost must be between 0 and 3600 seconds, got 5000",
        ),
        (
            vec!["--timeline", "--warm-pending-due", "--cold-start"],
            "cannot be used with",
        ),
        (
            vec!["--timeline", "--kube-queue-tick", "0"],
            "--kube-queue-tick must be between 0.001 and 3600 seconds, got 0",
        ),
        (
            vec!["--timeline", "--queue-model", "fifo"],
            "invalid value 'fifo' for '--queue-model",
        ),
        (
            vec!["--timeline", "--recreate", "NaN"],
            "--recreate must be between 0 and 3600 seconds, got NaN",
        ),
        (vec!["--timeline", "--patience", "sometimes"], "--patience"),
        (vec!["--no-preempt"], "--no-preempt is for --timeline"),
        (
            vec!["--timeline", "--preempt", "--no-preempt"],
            "cannot be used with",
        ),
        (
            vec!["--timeline", "--no-preempt", "--high-priority", "0.5"],
            "cannot be used with",
        ),
        (vec!["--high-priority", "0.5"], "add --preempt"),
    ] {
        let out = gpuplace()
            .args(["simulate", "--scale", "32", "--seeds", "1"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn timeline_with_tenants_reports_fairness_and_rejects_bad_files() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/tenants/flood.yaml"
    );
    let v = json_of(gpuplace().args([
        "simulate",
        "--timeline",
        "--scale",
        "16",
        "--seeds",
        "1",
        "--arrivals",
        "1500",
        "--load",
        "1.1",
        "--policies",
        "gpuplace",
        "--json",
        "--tenants",
        example,
    ]));
    let t = &v["policies"][0]["tenants"];
    let jain = t["jain"]["mean"].as_f64().unwrap();
    let without = t["jain_without_queues"]["mean"].as_f64().unwrap();
    // The flood example: the queues serve the small teams what they are entitled to.
    assert!(jain > 0.9 && without < jain - 0.1, "{t}");
    assert_eq!(t["queues"].as_array().unwrap().len(), 4, "{t}");
    assert_eq!(
        t["queues_without_queues"].as_array().unwrap().len(),
        4,
        "{t}"
    );
    assert!(t["queues"][0]["wait_p99_s"]["mean"].is_f64(), "{t}");
    assert!(t["allocation_without_queues_pct"]["mean"].is_f64(), "{t}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "queues: [{name: a, limit: {nvidia.com/gpu: lots}}]\nassign: {by: hash, shares: {a: 1}}\n",
    )
    .unwrap();
    let err = refusal_of(
        gpuplace()
            .args([
                "simulate",
                "--timeline",
                "--scale",
                "32",
                "--seeds",
                "1",
                "--tenants",
            ])
            .arg(&bad),
    );
    assert!(
        err.contains("queue a: limit.nvidia.com/gpu: lots is not a quantity or a percent"),
        "{err}"
    );
}

#[test]
fn defrag_takes_the_schedulers_words_and_the_old_one() {
    for word in ["all", "both", "make-room", "rebalance", "off"] {
        let v = json_of(gpuplace().args([
            "simulate",
            "--timeline",
            "--scale",
            "32",
            "--seeds",
            "1",
            "--arrivals",
            "200",
            "--policies",
            "best-fit",
            "--json",
            "--defrag",
            word,
        ]));
        let label = v["defrag"].as_str().unwrap().to_string();
        let expected = if word == "both" { "all" } else { word };
        assert!(label.starts_with(expected), "{word}: {label}");
    }
}

#[test]
fn pods_that_fit_nowhere_are_named_and_refused_on_request() {
    let nodes =
        csv("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,V100M32\nn2,32000,131072,2,T4\n");
    let pods = csv(concat!(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n",
        "fine,4000,8192,1,1000\n",
        "sixteen,4000,8192,16,1000\n",
        "greedy,999999999,8192,1,1000\n",
    ));
    let args = |extra: &[&str]| {
        let mut cmd = gpuplace();
        cmd.args([
            "simulate",
            "--seeds",
            "1",
            "--policies",
            "best-fit",
            "--json",
            "--nodes",
        ])
        .arg(nodes.path())
        .arg("--pods")
        .arg(pods.path())
        .args(extra);
        cmd
    };
    let out = args(&[]).output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout stays JSON");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 of 3 pods"), "{err}");
    assert!(
        err.contains("pod sixteen (row 2): 0/2 nodes fit: 2 Insufficient nvidia.com/gpu"),
        "{err}"
    );
    assert!(
        err.contains("pod greedy (row 3): 0/2 nodes fit: 2 Insufficient cpu"),
        "{err}"
    );
    let err = refusal_of(&mut args(&["--refuse-unplaceable"]));
    assert!(err.contains("pod sixteen (row 2)"), "{err}");
}

#[test]
fn tenants_guaranteed_past_the_cluster_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("over.yaml");
    std::fs::write(
        &file,
        concat!(
            "queues:\n",
            "  - {name: a, guaranteed: {nvidia.com/gpu: \"80%\"}}\n",
            "  - {name: b, guaranteed: {nvidia.com/gpu: \"80%\"}}\n",
            "assign: {by: hash, shares: {a: 1, b: 1}}\n",
        ),
    )
    .unwrap();
    let err = refusal_of(
        gpuplace()
            .args([
                "simulate",
                "--timeline",
                "--scale",
                "32",
                "--seeds",
                "1",
                "--tenants",
            ])
            .arg(&file),
    );
    assert!(
        err.contains("guarantees of nvidia.com/gpu add up to 160.0% of the cluster (a, b)"),
        "{err}"
    );
}
