//! `gpuplace-bench` end to end, at small sizes: each bench runs and reports what it measured.

use assert_cmd::Command;

fn json_of(args: &[&str]) -> serde_json::Value {
    let out = Command::cargo_bin("gpuplace-bench")
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_scheduler_reports_throughput_phases_and_memory() {
    let report = json_of(&["scheduler", "--nodes", "20", "--pods", "300", "--json"]);
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

#[test]
fn bench_scheduler_streams_pods_through_the_production_loop() {
    let report = json_of(&[
        "scheduler",
        "--nodes",
        "20",
        "--pods",
        "120",
        "--one-gpu",
        "--stream-rate",
        "2000",
        "--queues",
        "3",
        "--json",
    ]);
    // 160 GPUs take every one-GPU pod, created while the loop runs.
    assert_eq!(report["created"].as_u64(), Some(120), "{report}");
    assert_eq!(report["bound"].as_u64(), Some(120), "{report}");
    assert!(report["busy_rounds"].as_u64().unwrap() > 1, "{report}");
    // CPU is counted in 10 ms ticks (a run this small may show none): reported, as a number.
    assert!(report["cpu_ms_per_pod"].is_f64(), "{report}");
    assert!(report["cpu_s"].is_f64(), "{report}");
}

#[test]
fn bench_scheduler_refuses_a_stream_rate_that_is_not_a_rate() {
    let out = Command::cargo_bin("gpuplace-bench")
        .unwrap()
        .args([
            "scheduler",
            "--nodes",
            "2",
            "--pods",
            "2",
            "--stream-rate",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--stream-rate"), "{err}");
}

#[test]
fn bench_extender_times_filter_prioritize_and_bind() {
    let report = json_of(&[
        "extender",
        "--nodes",
        "20",
        "--prefill",
        "40",
        "--pods",
        "30",
        "--json",
    ]);
    assert_eq!(report["pods"].as_u64(), Some(30), "{report}");
    for verb in ["filter", "prioritize", "bind"] {
        assert!(report[verb]["p50_ms"].as_f64().unwrap() > 0.0, "{report}");
    }
}

#[test]
fn bench_preemption_evicts_for_every_preemptor_it_can() {
    let report = json_of(&[
        "preemption",
        "--nodes",
        "10",
        "--fill",
        "200",
        "--preemptors",
        "5",
        "--json",
    ]);
    assert_eq!(report["preemptors"].as_u64(), Some(5), "{report}");
    assert!(report["searches"].as_u64().unwrap() > 0, "{report}");
    assert!(report["preemptors_bound"].as_u64().unwrap() > 0, "{report}");
}
