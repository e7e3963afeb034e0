//! Replays a slice of the real openb trace. Skips, saying why, when the trace is absent.

use std::path::PathBuf;

use gpuplace_core::Policy;
use gpuplace_sim::{Prepared, Workload, load_nodes, load_pods};

fn trace_dir() -> Option<PathBuf> {
    gpuplace_sim::trace::shared_openb_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
        .map_err(|why| println!("skipped: {why}"))
        .ok()
}

#[test]
fn every_shared_pod_list_loads() {
    let Some(dir) = trace_dir() else { return };
    let nodes = load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    assert_eq!(nodes.len(), 1213);
    assert_eq!(nodes.iter().map(|n| n.gpus.len()).sum::<usize>(), 6212);
    let all = load_nodes(&dir.join("openb_node_list_all_node.csv")).unwrap();
    assert_eq!(all.len(), 1523);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("openb_pod_list_") && name.ends_with(".csv") {
            let pods = load_pods(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(pods.len() > 7000, "{name}: {}", pods.len());
        }
    }
    let default = load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    assert_eq!(default.len(), 8152);
    let total: u64 = default.iter().map(|p| p.request.total_gpu_milli()).sum();
    assert_eq!(total, 6_086_800);
}

/// A slice (every fourth node, first 2,000 pods) keeps the suite fast; the full numbers come
/// from `gpuplace simulate` (see docs/simulate.md).
#[test]
fn slice_replay_ranks_fgd_above_random() {
    let Some(dir) = trace_dir() else { return };
    let nodes: Vec<_> = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))
        .unwrap()
        .into_iter()
        .step_by(4)
        .collect();
    let pods = load_pods(&dir.join("openb_pod_list_default.csv"))
        .unwrap()
        .into_iter()
        .take(2000)
        .collect();
    let prepared = Prepared::new(Workload {
        name: "slice".into(),
        nodes,
        pods,
    })
    .unwrap();
    let fgd = prepared.run(Policy::Fgd, 42, 1.3);
    let random = prepared.run(Policy::Random, 42, 1.3);
    assert!(fgd.curves.unallocated[100] < random.curves.unallocated[100]);
    assert!(fgd.curves.frag_capacity[80] < random.curves.frag_capacity[80]);
}

/// On the real trace the node-class index decides exactly as a scan of every node (node
/// and GPUs), FGD's shares included: a class holds nodes whose interchangeable GPUs have
/// the same shares in other positions, and a share's GPU is found on the chosen node.
#[test]
fn the_index_decides_as_the_scan_on_the_trace() {
    use gpuplace_core::{ClusterState, Placer, TargetWorkload};
    use gpuplace_sim::replay::arrival_order;
    let Some(dir) = trace_dir() else { return };
    let nodes = load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    let requests: Vec<_> = pods.iter().map(|p| p.request.clone()).collect();
    for policy in [Policy::Fgd, Policy::BestFit, Policy::GPUPLACE] {
        let mut state = ClusterState::new(nodes.clone()).unwrap();
        state.set_workload(std::sync::Arc::new(TargetWorkload::from_requests(
            &requests, 0.95,
        )));
        let order = arrival_order(&pods, state.gpu_capacity_milli(), 42, 1.3);
        let mut indexed = Placer::new(policy, 42);
        let mut scan = Placer::new(policy, 42).with_index(false);
        for (i, &p) in order.iter().take(6000).enumerate() {
            let request = &pods[p].request;
            let a = indexed.choose(&state, request, None).ok();
            let b = scan.choose(&state, request, None).ok();
            assert_eq!(a, b, "{policy}: arrival {i}");
            if let Some(d) = a {
                state.apply(d.node, request, &d.gpus).unwrap();
            }
        }
    }
}

/// gpuplace's claim on the trace it is measured on: lower unallocated GPU than FGD at
/// arrived 100% and 130% and less fragmentation at 80%, on three seeds of the default trace
/// and of `gpushare40` (docs/results.md has ten seeds and every trace).
#[test]
fn gpuplace_beats_fgd_on_the_trace() {
    let Some(dir) = trace_dir() else { return };
    let nodes = load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    for trace in ["default", "gpushare40"] {
        let pods = load_pods(&dir.join(format!("openb_pod_list_{trace}.csv"))).unwrap();
        let prepared = Prepared::new(Workload {
            name: trace.into(),
            nodes: nodes.clone(),
            pods,
        })
        .unwrap();
        let mean = |policy: Policy, at: usize, frag: bool| {
            (42..45)
                .map(|seed| {
                    let curves = prepared.run(policy, seed, 1.3).curves;
                    if frag {
                        curves.frag_capacity[at]
                    } else {
                        curves.unallocated[at]
                    }
                })
                .sum::<f64>()
                / 3.0
        };
        let (ours, fgd) = (
            mean(Policy::GPUPLACE, 100, false),
            mean(Policy::Fgd, 100, false),
        );
        println!("{trace}: unallocated at 100%: gpuplace {ours:.2}, fgd {fgd:.2}");
        // Ten seeds: -12.4% on default, -7.3% on gpushare40 (docs/results.md); three seeds vary more.
        assert!(ours < 0.95 * fgd, "{trace}: {ours} vs {fgd}");
        assert!(mean(Policy::GPUPLACE, 130, false) < mean(Policy::Fgd, 130, false));
        assert!(mean(Policy::GPUPLACE, 80, true) < mean(Policy::Fgd, 80, true));
    }
}

/// gpuplace also beats FGD on small clusters of the trace's own nodes: 64 nodes drawn at
/// random (five samples, three seeds each, default trace). docs/results.md has 8 to 128
/// nodes on every trace.
#[test]
fn gpuplace_beats_fgd_on_small_clusters() {
    let Some(dir) = trace_dir() else { return };
    let nodes = load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = load_pods(&dir.join("openb_pod_list_default.csv")).unwrap();
    let (mut ours, mut fgd, mut wins) = (0.0, 0.0, 0);
    for sample in 0..5 {
        let mut workload = Workload {
            name: "default".into(),
            nodes: nodes.clone(),
            pods: pods.clone(),
        };
        workload.sample_nodes(64, sample).unwrap();
        let prepared = Prepared::new(workload).unwrap();
        let mean = |policy: Policy| {
            (42..45)
                .map(|seed| prepared.run(policy, seed, 1.3).curves.unallocated[100])
                .sum::<f64>()
                / 3.0
        };
        let (a, b) = (mean(Policy::GPUPLACE), mean(Policy::Fgd));
        println!("sample {sample}: unallocated at 100%: gpuplace {a:.2}, fgd {b:.2}");
        ours += a;
        fgd += b;
        wins += usize::from(a < b);
    }
    assert!(
        ours < fgd,
        "gpuplace {ours} vs fgd {fgd} (sums over samples)"
    );
    assert!(wins >= 3, "gpuplace better on only {wins} of 5 samples");
}
