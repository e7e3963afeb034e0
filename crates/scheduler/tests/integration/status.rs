//! `gpuplace status` and the map's data, from a cluster the real loop scheduled on the
//! in-memory API: holders on exactly the GPUs their assignments name, totals, pending
//! pods with the scheduler's reasons, gangs with theirs at once, and text that reads well.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::common::*;
use gpuplace_scheduler::status::{self, Filter, FleetStatus, text};
use gpuplace_scheduler::{ClusterApi, Scheduler};
use gpuplace_testkit::MemoryApi;
use serde_json::json;

async fn scheduled_cluster() -> (MemoryApi, FleetStatus) {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("dgx-a"));
    api.put_node(node("plain-b", 4, json!({})));
    api.put_pod(pod("train-2", 2, json!({})));
    api.put_pod(pod("nb-half", 0, share("500")));
    api.put_pod(pod("huge-16", 16, json!({})));
    api.put_group(group("gang", 3, 60));
    for i in 0..3 {
        api.put_pod(pod(
            &format!("g{i}"),
            8,
            json!({"metadata": {"labels": {"gpuplace.io/pod-group": "gang"}}}),
        ));
    }
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let view = api.view().await.unwrap();
    let reasons = scheduler.reasons().snapshot();
    let fleet = status::fleet(&view, "nvidia.com/gpu", &reasons, &Filter::default());
    (api, fleet)
}

#[tokio::test]
async fn holders_are_on_the_gpus_their_assignments_name() {
    let (api, fleet) = scheduled_cluster().await;
    let mut shown: BTreeMap<(String, String), Vec<(String, u32)>> = BTreeMap::new();
    for node in &fleet.nodes {
        for g in &node.gpus {
            for h in &g.holders {
                shown
                    .entry((h.name.clone(), node.name.clone()))
                    .or_default()
                    .push((g.id.clone(), h.milli));
            }
        }
    }
    for name in ["train-2", "nb-half"] {
        let a = assignment(&api, name).expect("bound with an assignment");
        let mut want: Vec<(String, u32)> = a.devices().map(|d| (d.id.clone(), d.milli)).collect();
        want.sort();
        want.dedup();
        let mut got = shown
            .remove(&(name.to_string(), a.node.clone()))
            .unwrap_or_default();
        got.sort();
        assert_eq!(got, want, "{name} on {}", a.node);
    }
    assert!(shown.is_empty(), "no other holders: {shown:?}");
    let t = &fleet.totals;
    assert_eq!((t.nodes, t.gpus, t.unhealthy_gpus), (2, 12, 0));
    assert_eq!(t.capacity_milli, 12_000);
    assert_eq!(t.allocated_milli, 2_500);
    assert_eq!((t.free_gpus, t.shared_gpus), (9, 1));
    assert!(t.largest_fit.whole_gpus >= 4, "{:?}", t.largest_fit);
    let dgx = fleet.nodes.iter().find(|n| n.name == "dgx-a").unwrap();
    assert_eq!(
        dgx.nvlink_groups,
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    );
    assert_eq!(dgx.links.len(), 4);
}

#[tokio::test]
async fn pending_pods_and_gangs_say_why_at_once() {
    let (api, fleet) = scheduled_cluster().await;
    let pending: HashMap<&str, &status::PendingPod> =
        fleet.pending.iter().map(|p| (p.name.as_str(), p)).collect();
    let huge = pending["huge-16"];
    assert_eq!(huge.gpus, "16");
    let reason = huge.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("nodes are available"), "{reason}");
    for i in 0..3 {
        let member = pending[format!("g{i}").as_str()];
        let reason = member.reason.as_deref().unwrap_or_default();
        assert!(reason.contains("pod group ml/gang"), "{reason}");
        assert!(!reason.contains(".."), "one period: {reason}");
    }
    let gang = &fleet.groups[0];
    assert_eq!(
        (gang.name.as_str(), gang.phase.as_str()),
        ("gang", "Pending")
    );
    let message = gang.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("only 1 of 3 members fit at once"),
        "{message}"
    );
    let written = api.group("ml", "gang").unwrap().status.unwrap();
    let condition = &written.conditions[0];
    assert_eq!(
        (condition.type_.as_str(), condition.status.as_str()),
        ("Unschedulable", "True")
    );
    assert_eq!(condition.reason, "NotEnoughResources");
    assert!(condition.last_transition_time.is_some());
}

#[tokio::test]
async fn text_fits_a_terminal_and_reads_without_colour() {
    let (_, fleet) = scheduled_cluster().await;
    let plain = text::render(
        &fleet,
        text::Style {
            wide: false,
            colour: false,
            width: 80,
        },
    );
    assert!(plain.lines().all(|l| l.chars().count() <= 80), "{plain}");
    assert!(!plain.contains('\x1b'), "no colour codes");
    assert!(plain.contains(text::LEGEND));
    let train = plain.lines().find(|l| l.contains("ml/train-2")).unwrap();
    assert_eq!(train.matches('#').count(), 2, "two whole GPUs: {train}");
    let half = plain.lines().find(|l| l.contains("ml/nb-half")).unwrap();
    assert!(half.contains('5'), "half of one GPU: {half}");
    let idle = plain.lines().find(|l| l.starts_with("dgx-a")).unwrap();
    assert!(
        idle.contains(" ........ ") && idle.ends_with(" -"),
        "{idle}"
    );
    assert!(plain.contains("PENDING GPU PODS (4)"), "{plain}");
    assert!(plain.contains("GANGS (1)"));
    let wide = text::render(
        &fleet,
        text::Style {
            wide: true,
            colour: false,
            width: 80,
        },
    );
    assert!(wide.contains("nvlink [0,1] [2,3] [4,5] [6,7]"), "{wide}");
    assert!(wide.contains("ml/nb-half 0.5 since"), "{wide}");
    let coloured = text::render(
        &fleet,
        text::Style {
            wide: false,
            colour: true,
            width: 80,
        },
    );
    assert!(coloured.contains("\x1b[31m#\x1b[0m"));
}

#[tokio::test]
async fn filters_and_json() {
    let api = MemoryApi::new();
    api.put_node(nvlink_node("dgx-a"));
    api.put_node(nvlink_node("dgx-b"));
    api.put_pod(pod("mine", 8, json!({})));
    api.put_pod(pod(
        "theirs",
        8,
        json!({"metadata": {"namespace": "other"}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    scheduler.round(Instant::now()).await.unwrap();
    let view = api.view().await.unwrap();
    let filter = Filter {
        node: Some("dgx-b".into()),
        namespace: Some("ml".into()),
    };
    let fleet = status::fleet(&view, "nvidia.com/gpu", &HashMap::new(), &filter);
    assert_eq!(fleet.nodes.len(), 1);
    assert_eq!(fleet.totals.nodes, 1);
    let holders: Vec<&str> = fleet.nodes[0]
        .gpus
        .iter()
        .flat_map(|g| g.holders.iter().map(|h| h.namespace.as_str()))
        .collect();
    assert!(holders.iter().all(|ns| *ns == "ml"), "{holders:?}");
    let value = serde_json::to_value(&fleet).unwrap();
    assert_eq!(value["nodes"][0]["name"], "dgx-b");
    assert!(value["totals"]["largest_fit"].is_object());
}

#[test]
fn gpus_read_as_people_write_them() {
    assert_eq!(status::gpus_text(1, 1000), "1");
    assert_eq!(status::gpus_text(4, 1000), "4");
    assert_eq!(status::gpus_text(1, 500), "0.5");
    assert_eq!(status::gpus_text(2, 250), "2x0.25");
}
