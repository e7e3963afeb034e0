//! `pods.csv` as `simulate --timeline --out` writes it, checked against the figures.

/// One run's rows in `pods.csv`: its last arrival, and when each measured pod was bound.
#[derive(Default)]
struct RunPods {
    last_arrival: f64,
    measured_bound: Vec<Option<f64>>,
}

/// `pods.csv`: every pod of every (policy, seed) run, its wait as the figures count it.
pub(crate) fn check_pods_csv(path: &std::path::Path, summary: &serde_json::Value) {
    let text = std::fs::read_to_string(path).expect("pods.csv");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "policy,seed,pod,unit,cpu_milli,memory_mib,gpus,gpu_milli,measured,by_controller,arrival_s,bound_s,end_s,node,evicted,abandoned,failed_attempts"
        )
    );
    // Per (policy, seed): the last arrival, and the measured pods not bound by then.
    let mut runs: std::collections::BTreeMap<(String, String), RunPods> = Default::default();
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), 17, "{line}");
        assert!(
            cells[16].parse::<u32>().is_ok(),
            "a simulation counts attempts: {line}"
        );
        let number = |i: usize| cells[i].parse::<f64>().ok();
        let arrival = number(10).expect("arrival_s");
        let bound = number(11);
        if let Some(bound) = bound {
            assert!(bound >= arrival, "bound before its arrival: {line}");
            assert!(!cells[13].is_empty(), "bound without a node: {line}");
            if let Some(end) = number(12) {
                assert!(end >= bound, "gone before its Binding: {line}");
            }
        } else {
            assert!(cells[13].is_empty(), "a node without a Binding: {line}");
        }
        let run = runs
            .entry((cells[0].to_string(), cells[1].to_string()))
            .or_default();
        run.last_arrival = run.last_arrival.max(arrival);
        if cells[8] == "true" && cells[15] == "false" {
            run.measured_bound.push(bound);
        }
    }
    // Two policies, two seeds; each policy's never-started figure is the mean of its runs'.
    assert_eq!(runs.len(), 4, "{:?}", runs.keys());
    for p in summary["policies"].as_array().unwrap() {
        let name = p["policy"].as_str().unwrap();
        let never: Vec<usize> = runs
            .iter()
            .filter(|((policy, _), _)| policy == name)
            .map(|(_, run)| {
                let end = run.last_arrival;
                run.measured_bound
                    .iter()
                    .filter(|b| b.is_none_or(|b| b > end))
                    .count()
            })
            .collect();
        let mean = never.iter().sum::<usize>() as f64 / never.len() as f64;
        assert_eq!(Some(mean), p["never_started"]["mean"].as_f64(), "{name}");
    }
}
