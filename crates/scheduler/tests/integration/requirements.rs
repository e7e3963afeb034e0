//! Pods' GPU requirements through the real scheduling loop on the in-memory API: topology,
//! models (with HAMi's aliases), memory, impossible requirements explained, and a gang
//! confined to one rack.

use std::time::Instant;

use gpuplace_model::{Link, NodeInventory, PcieLevel};
use gpuplace_scheduler::Scheduler;
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use crate::common::*;

/// A DGX-1 (V100) hybrid cube mesh: GPUs 0-3 and 4-7 fully NVLinked, plus i <-> i+4.
fn dgx1(name: &str, model: &str, memory_mib: u64, labels: serde_json::Value) -> Node {
    let mut inv = NodeInventory::uniform(name, 0, 0, 8, model);
    for g in &mut inv.gpus {
        g.id = format!("GPU-{name}-{}", g.index);
        g.uuid = g.id.clone();
        g.memory_mib = memory_mib;
        g.numa_node = Some(g.index / 4);
    }
    for a in 0..8u32 {
        for b in a + 1..8 {
            let linked = a / 4 == b / 4 || b == a + 4;
            inv.links.push(Link {
                a,
                b,
                nvlinks: u32::from(linked),
                pcie: if a / 4 == b / 4 {
                    PcieLevel::SameCpu
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    node(
        name,
        8,
        json!({"metadata": {"labels": labels, "annotations": {"gpuplace.io/inventory": inv.to_json()}}}),
    )
}

fn annotated(
    name: &str,
    gpus: u32,
    annotations: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    pod(
        name,
        gpus,
        json!({"metadata": {"annotations": annotations}}),
    )
}

fn devices(api: &MemoryApi, name: &str) -> Vec<u32> {
    let mut d: Vec<u32> = assignment(api, name)
        .map(|a| a.devices().map(|d| d.index).collect())
        .unwrap_or_default();
    d.sort_unstable();
    d
}

#[tokio::test]
async fn requirements_are_met_or_explained() {
    let api = MemoryApi::new();
    api.put_node(dgx1("v100-32", "Tesla-V100-SXM2-32GB", 32_768, json!({})));
    api.put_node(dgx1("a100-80", "NVIDIA-A100-SXM4-80GB", 81_920, json!({})));
    // Pods already running on GPU 0 and 5 of the V100 box: six GPUs free, no NVLink quad.
    for (name, gpu) in [("pin-0", 0), ("pin-5", 5)] {
        let plan = json!({"node": "v100-32", "policy": "fgd", "time": "2026-11-23T00:00:00Z",
            "containers": [{"name": "main", "devices": [
                {"index": gpu, "id": format!("GPU-v100-32-{gpu}"), "milli": 1000}]}]});
        api.put_pod(pod(
            name,
            1,
            json!({"metadata": {"annotations": {"gpuplace.io/assignment": plan.to_string()}},
                "spec": {"nodeName": "v100-32"}, "status": {"phase": "Running"}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    // HAMi's form of a model requirement lands on the V100s.
    api.put_pod(annotated(
        "pair-v100",
        2,
        json!({"nvidia.com/use-gputype": "v100"}),
    ));
    scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(bound_node(&api, "pair-v100").as_deref(), Some("v100-32"));

    // A 4-GPU NVLink pod only for V100s cannot fit; explained in kube's words.
    api.put_pod(annotated(
        "quad-v100",
        4,
        json!({"gpuplace.io/topology": "nvlink", "gpuplace.io/gpu-model": "V100"}),
    ));
    scheduler.round(Instant::now()).await.unwrap();
    // The same on any model lands on an A100 quad whose pairs are all NVLinked.
    api.put_pod(annotated(
        "quad",
        4,
        json!({"gpuplace.io/topology": "nvlink"}),
    ));
    // HAMi's exclusion, memory minimum, preference in NVIDIA's form.
    api.put_pod(annotated(
        "no-a100",
        1,
        json!({"nvidia.com/nouse-gputype": "A100"}),
    ));
    api.put_pod(annotated(
        "big-memory",
        1,
        json!({"gpuplace.io/gpu-memory-min": "40Gi"}),
    ));
    api.put_pod(annotated(
        "too-big",
        1,
        json!({"gpuplace.io/gpu-memory-min": "100Gi"}),
    ));
    api.put_pod(annotated(
        "numa-pair",
        2,
        json!({"nvidia.com/gpu-topology": "numa"}),
    ));
    // Bad input: named annotation, pod stays Pending, nobody else affected.
    api.put_pod(annotated(
        "typo",
        2,
        json!({"gpuplace.io/topology": "nvswtich"}),
    ));
    api.put_pod(annotated(
        "both",
        1,
        json!({"gpuplace.io/gpu-model": "A100", "gpuplace.io/gpu-model-exclude": "a100"}),
    ));
    scheduler.round(Instant::now()).await.unwrap();

    assert_eq!(bound_node(&api, "quad").as_deref(), Some("a100-80"));
    let quad = devices(&api, "quad");
    assert!(
        quad == vec![0, 1, 2, 3] || quad == vec![4, 5, 6, 7],
        "{quad:?}"
    );
    assert_eq!(bound_node(&api, "no-a100").as_deref(), Some("v100-32"));
    assert_eq!(bound_node(&api, "big-memory").as_deref(), Some("a100-80"));
    let numa = devices(&api, "numa-pair");
    assert_eq!(numa[0] / 4, numa[1] / 4, "{numa:?}");
    for pending in ["quad-v100", "too-big", "typo", "both"] {
        assert_eq!(bound_node(&api, pending), None, "{pending} stays Pending");
    }
    let message = |pod: &str| {
        api.events()
            .into_iter()
            .rev()
            .find(|e| e.pod.name == pod && e.reason == "FailedScheduling")
            .map(|e| e.message)
            .unwrap_or_default()
    };
    assert!(message("quad-v100").starts_with("blocked by: its own constraints | "));
    assert_eq!(
        kube_part(&message("quad-v100")),
        "0/2 nodes are available: 1 node(s) had a GPU model the pod does not allow, 1 node(s) had no 4 GPUs linked by NVLink. \
         preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    );
    assert_eq!(
        kube_part(&message("too-big")),
        "0/2 nodes are available: 2 node(s) had no GPU with 100Gi of memory. \
         preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    );
    assert_eq!(
        kube_part(&message("typo")),
        "annotation gpuplace.io/topology: unknown value \"nvswtich\"; expected one of any, nvlink, pcie-switch, numa"
    );
    assert_eq!(
        kube_part(&message("both")),
        "annotation gpuplace.io/gpu-model-exclude: model \"A100\" is both allowed and excluded"
    );
    // Each pending pod carries PodScheduled=False with the same words as its latest Event,
    // as kube-scheduler writes it; a bound pod's condition is True (the Binding sets it).
    for pending in ["quad-v100", "too-big", "typo", "both"] {
        let pod = api.pod("ml", pending).unwrap();
        let condition = pod
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
            .unwrap_or_else(|| panic!("{pending} has no PodScheduled condition"));
        assert_eq!(condition.status, "False");
        assert_eq!(condition.reason.as_deref(), Some("Unschedulable"));
        assert_eq!(condition.message.unwrap_or_default(), message(pending));
    }
    let quad = api.pod("ml", "quad").unwrap();
    let scheduled = quad
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .unwrap();
    assert_eq!(scheduled.status, "True");
    assert_no_double_booking(&api);
}

#[tokio::test]
async fn a_gang_with_a_topology_key_stays_in_one_rack() {
    let api = MemoryApi::new();
    // Rack a: two nodes of 4 GPUs; rack b: one node of 8 (less fragmented after the gang);
    // a node without the label is never used.
    api.put_node(node(
        "a1",
        4,
        json!({"metadata": {"labels": {"example.com/rack": "a"}}}),
    ));
    api.put_node(node(
        "a2",
        4,
        json!({"metadata": {"labels": {"example.com/rack": "a"}}}),
    ));
    api.put_node(node(
        "b1",
        8,
        json!({"metadata": {"labels": {"example.com/rack": "b"}}}),
    ));
    api.put_node(node("loose", 8, json!({})));
    let mut g = group("train", 3, 30);
    g.spec.topology_key = Some("example.com/rack".into());
    api.put_group(g);
    for i in 0..3 {
        api.put_pod(pod(
            &format!("w{i}"),
            2,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "train"}}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    let report = scheduler.round(Instant::now()).await.unwrap();
    assert_eq!(report.bound, 3, "{report:?}");
    let racks: std::collections::BTreeSet<String> = (0..3)
        .map(|i| bound_node(&api, &format!("w{i}")).unwrap())
        .map(|n| n[..1].to_string())
        .collect();
    assert_eq!(racks.len(), 1, "one rack: {racks:?}");
    assert!(!racks.contains("l"));

    // A gang too big for any rack (3 x 4 GPUs; racks have 8 and 8 minus what w* took)
    // binds nothing although the cluster as a whole could hold it; the annotation form.
    let mut g = group("wide", 3, 0);
    g.spec.topology_key = None;
    api.put_group(g);
    for i in 0..3 {
        api.put_pod(pod(
            &format!("x{i}"),
            4,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "wide"},
                "annotations": {"gpuplace.io/topology-key": "example.com/rack"}}}),
        ));
    }
    scheduler.round(Instant::now()).await.unwrap();
    for i in 0..3 {
        assert_eq!(bound_node(&api, &format!("x{i}")), None);
    }
    assert_no_double_booking(&api);
}

/// Seeded stress: random racks, random gangs with a topology key; no gang ever spans two
/// values of the key, and no GPU is booked twice.
#[tokio::test]
async fn gangs_never_span_two_racks() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut bound = 0;
    for seed in 0..12 {
        let api = MemoryApi::new();
        let nodes = 3 + next(6);
        for i in 0..nodes {
            let rack = ["r0", "r1", "r2"][next(3) as usize];
            let gpus = [2, 4, 8][next(3) as usize] as u32;
            api.put_node(node(
                &format!("n{i}"),
                gpus,
                json!({"metadata": {"labels": {"example.com/rack": rack}}}),
            ));
        }
        let gangs = 1 + next(4);
        for g in 0..gangs {
            let size = 2 + next(3) as u32;
            let mut group = group(&format!("g{g}"), size, 30);
            group.spec.topology_key = Some("example.com/rack".into());
            api.put_group(group);
            for m in 0..size {
                api.put_pod(pod(
                    &format!("g{g}-m{m}"),
                    1 + next(4) as u32,
                    json!({"metadata": {"labels": {"gpuplace.io/pod-group": format!("g{g}")}}}),
                ));
            }
        }
        let mut scheduler = Scheduler::new(api.clone(), config());
        for _ in 0..3 {
            scheduler.round(Instant::now()).await.unwrap();
        }
        let rack_of = |node: &str| -> String {
            api.node(node)
                .and_then(|n| n.metadata.labels)
                .and_then(|l| l.get("example.com/rack").cloned())
                .unwrap_or_default()
        };
        for g in 0..gangs {
            let racks: std::collections::BTreeSet<String> = api
                .pods()
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .unwrap_or("")
                        .starts_with(&format!("g{g}-"))
                })
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .map(|n| rack_of(&n))
                .collect();
            assert!(racks.len() <= 1, "seed {seed}: gang g{g} spans {racks:?}");
        }
        bound += api.bindings().len();
        assert_no_double_booking(&api);
    }
    assert!(bound > 20, "the stress binds gangs: {bound}");
}
