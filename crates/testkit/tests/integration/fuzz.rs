//! Every parser of outside input, fed arbitrary bytes and arbitrary values of each field:
//! none panics, each answers (a value or an error) at once. Inputs: annotations and
//! resource quantities on pods, the node inventory annotation and file, the assignment and
//! allocated records, openb CSVs, tenants files, durations, policies (the extender's JSON
//! bodies are fuzzed beside their types, in `gpuplace-scheduler`'s `wire_tests`)
//! and `--defrag` words. A case that takes over a second fails (no input hangs).

use std::time::{Duration, Instant};

use proptest::prelude::*;

/// Runs `f`, failing when it takes more than a second.
fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{what} took {:?}",
        started.elapsed()
    );
    out
}

/// Text that is often almost right: JSON/YAML/CSV punctuation, digits, units, keys.
fn nearly() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "'",
        "\n",
        " ",
        "-",
        ".",
        "e",
        "1",
        "0",
        "9",
        "999999999999999999999",
        "-1",
        "1e308",
        "NaN",
        "inf",
        "m",
        "Mi",
        "Gi",
        "Ki",
        "s",
        "h",
        "null",
        "true",
        "gpus",
        "uuid",
        "index",
        "containers",
        "devices",
        "name",
        "node",
        "milli",
        "nvlink",
        "links",
        "queues",
        "guaranteed",
        "limit",
        "weight",
        "assign",
        "by",
        "hash",
        "shares",
        "nvidia.com/gpu",
        "50%",
        "\u{0}",
        "é",
        "∞",
    ]);
    prop::collection::vec(pieces, 0..40).prop_map(|v| v.concat())
}

/// Mostly plausible numbers, sometimes any at all.
fn num() -> impl Strategy<Value = i64> {
    prop_oneof![3 => 0i64..100_000, 1 => any::<i64>(), 1 => prop::sample::select(vec![0i64, 1, 8, 16, 1000, 1001, -1, i64::MAX])]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), nearly()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn records_and_inventories_never_panic(t in text()) {
        bounded("Assignment", || gpuplace_model::Assignment::from_json(&t).ok());
        bounded("Allocated", || gpuplace_model::Allocated::from_json(&t).ok());
        bounded("NodeInventory", || gpuplace_model::NodeInventory::from_json(&t).ok());
        bounded("inventory file", || {
            gpuplace_deviceplugin::backend::parse_inventory(&t, "inv.yaml", "node-1").ok()
        });
    }

    #[test]
    fn words_and_durations_never_panic(t in text()) {
        bounded("duration", || gpuplace_scheduler::scheduler::defrag::parse_duration(&t).ok());
        bounded("defrag mode", || t.parse::<gpuplace_scheduler::scheduler::defrag::DefragMode>().ok());
        bounded("policies", || gpuplace_core::Policy::parse_list(&t).ok());
    }

    #[test]
    fn pods_with_arbitrary_annotations_and_quantities_never_panic(
        values in prop::collection::vec(text(), 12),
        quantity in text(),
        share in text(),
    ) {
        let keys = [
            gpuplace_model::keys::MODEL_ANNOTATION,
            gpuplace_model::keys::MODEL_EXCLUDE_ANNOTATION,
            gpuplace_model::keys::MEMORY_MIN_ANNOTATION,
            gpuplace_model::keys::GPU_MILLI_ANNOTATION,
            gpuplace_model::keys::TOPOLOGY_ANNOTATION,
            gpuplace_model::keys::TOPOLOGY_PREFERENCE_ANNOTATION,
            gpuplace_model::keys::TOPOLOGY_KEY_ANNOTATION,
            gpuplace_model::keys::NVIDIA_TOPOLOGY_ANNOTATION,
            gpuplace_model::keys::HAMI_USE_ANNOTATION,
            gpuplace_model::keys::HAMI_NOUSE_ANNOTATION,
            gpuplace_model::keys::ASSIGNMENT_ANNOTATION,
            gpuplace_model::keys::DEVICE_IDS_ANNOTATION,
        ];
        let annotations: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone())))
            .collect();
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": annotations,
                "labels": {"gpuplace.io/pod-group": values[0].clone()}},
            "spec": {"schedulerName": "gpuplace", "containers": [{"name": "main", "resources": {
                "requests": {"cpu": quantity.clone(), "memory": quantity.clone()},
                "limits": {"nvidia.com/gpu": quantity.clone(), "gpuplace.io/gpu-milli": share}}}]}
        });
        // Quantities the API server would refuse still reach the parser as strings.
        if let Ok(pod) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(pod) {
            let info = bounded("pod", || gpuplace_scheduler::k8s::pod_info::PodInfo::from_pod(&pod, "nvidia.com/gpu"));
            let _ = info.demand.as_ref().map(|d| d.request.total_gpu_milli());
        }
    }

    #[test]
    fn trace_csvs_never_panic(nodes in text(), pods in text(), header in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let (n, p) = (dir.path().join("nodes.csv"), dir.path().join("pods.csv"));
        let nodes = if header { format!("sn,cpu_milli,memory_mib,gpu,model\n{nodes}") } else { nodes };
        let pods = if header {
            format!("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n{pods}")
        } else {
            pods
        };
        std::fs::write(&n, nodes).unwrap();
        std::fs::write(&p, pods).unwrap();
        if let Ok(w) = bounded("trace", || gpuplace_sim::load_workload(&n, &p)) {
            let _ = bounded("unplaceable", || w.unplaceable().ok());
        }
    }

    #[test]
    fn trace_rows_of_arbitrary_numbers_never_panic(
        rows in prop::collection::vec((num(), num(), num(), num(), num(), num()), 1..20),
        node in (num(), num(), num()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (n, p) = (dir.path().join("nodes.csv"), dir.path().join("pods.csv"));
        std::fs::write(&n, format!("sn,cpu_milli,memory_mib,gpu,model\nn0,{},{},{},V100M32\n", node.0, node.1, node.2)).unwrap();
        let mut text = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n");
        for (i, r) in rows.iter().enumerate() {
            text.push_str(&format!("p{i},{},{},{},{},{},{}\n", r.0, r.1, r.2, r.3, r.4, r.5));
        }
        std::fs::write(&p, text).unwrap();
        if let Ok(w) = bounded("trace", || gpuplace_sim::load_workload(&n, &p)) {
            let _ = bounded("unplaceable", || w.unplaceable().ok());
            let options = gpuplace_sim::timeline::TimelineOptions { arrivals: 50, ..Default::default() };
            let _ = bounded("timeline", || gpuplace_sim::timeline::Timeline::new(w, options).is_ok());
        }
    }

    #[test]
    fn tenants_files_never_panic(t in text(), guaranteed in any::<f64>(), limit in any::<f64>(), weight in any::<f64>()) {
        let capacity = [8_000u64, 64_000, 262_144];
        let pods = gpuplace_sim::builtin_workload(64).pods;
        for doc in [
            t.clone(),
            format!(
                "queues:\n  - {{name: a, guaranteed: {{nvidia.com/gpu: \"{guaranteed}%\"}}, limit: {{nvidia.com/gpu: \"{limit}\"}}, weight: {weight}}}\n  - {{name: b, parent: a}}\nassign: {{by: hash, shares: {{b: {weight}}}}}\n"
            ),
        ] {
            if let Ok(file) = serde_saphyr::from_str::<gpuplace_sim::timeline::tenants::TenantsFile>(&doc) {
                let _ = bounded("tenants", || gpuplace_sim::timeline::tenants::Tenants::new(&file, capacity, &pods).is_ok());
            }
        }
    }
}
