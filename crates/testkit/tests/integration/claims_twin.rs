//! gpuplace places a pod whose GPUs come through DRA claims exactly where, and on exactly
//! the GPUs, it places the same pod asking the device plugin's resources: seeded
//! sequences of openb shapes (whole GPUs, shares, allowed models, NVLink asked), arriving one per round
//! with departures between, through the scheduler twice on the in-memory API, once on
//! device-plugin nodes and once on DRA nodes with each pod's claim made from the
//! ResourceClaimTemplate `replay --dra` makes for its shape. This is what lets
//! `simulate --dra` replay claim pods with the device-plugin pods' decisions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuplace_core::Policy;
use gpuplace_model::device_attributes::device_index;
use gpuplace_model::{Assignment, GpuNeed, GpuTopology, Link, NodeInventory, PcieLevel, Request};
use gpuplace_replay::claims::{claim_template, dra_node};
use gpuplace_replay::objects::{PodTemplate, fake_node, pod};
use gpuplace_replay::plan::PlannedPod;
use gpuplace_scheduler::{Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::resource::v1::ResourceClaim;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NS: &str = "trace";

fn cluster() -> Vec<NodeInventory> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(quads(&format!("v{i}")));
    }
    for i in 0..3 {
        nodes.push(NodeInventory::uniform(
            &format!("t{i}"),
            32_000,
            131_072,
            4,
            "T4",
        ));
    }
    nodes.push(NodeInventory::uniform("a0", 48_000, 196_608, 2, "A10"));
    nodes.push(NodeInventory::uniform("c0", 64_000, 262_144, 0, ""));
    nodes
}

/// An 8-GPU V100 node of two NVLink quads (0-3, 4-7).
fn quads(name: &str) -> NodeInventory {
    let mut node = NodeInventory::uniform(name, 64_000, 262_144, 8, "V100M16");
    for a in 0..8u32 {
        for b in a + 1..8 {
            node.links.push(Link {
                a,
                b,
                nvlinks: if a / 4 == b / 4 { 12 } else { 0 },
                pcie: PcieLevel::CrossCpu,
            });
        }
    }
    node
}

/// An openb-like shape drawn from `rng`.
fn shape(rng: &mut ChaCha8Rng) -> Request {
    let (gpu_count, gpu_milli) = match rng.random_range(0..10) {
        0 => (0, 0),
        1..=3 => (1, 1000),
        4 => (2, 1000),
        5 => (4, 1000),
        6 => (8, 1000),
        7 => (1, 250),
        _ => (1, 500),
    };
    let allowed_models = match rng.random_range(0..6) {
        0 if gpu_count > 0 => vec!["T4".to_string()],
        1 if gpu_count > 0 => vec!["V100M16".to_string(), "A10".to_string()],
        _ => Vec::new(),
    };
    // Some multi-GPU pods must have their GPUs linked by NVLink (a matchAttribute
    // constraint with claims, the topology annotation without).
    let mut need = GpuNeed::default();
    if gpu_count > 1 && rng.random_range(0..2) == 0 {
        need.topology = GpuTopology::Nvlink;
    }
    Request {
        cpu_milli: 1000 * rng.random_range(1..=12),
        memory_mib: 4096 * rng.random_range(1..=12),
        gpu_count,
        gpu_milli,
        allowed_models,
        need,
    }
}

/// Where a pod went: its node and its GPUs (index, milli), or nothing yet.
type Placed = Option<(String, Vec<(u32, u32)>)>;

/// One side: the API, its scheduler, and whether its GPUs are claimed.
struct Side {
    api: MemoryApi,
    scheduler: Scheduler<MemoryApi>,
    dra: bool,
}

impl Side {
    fn new(dra: bool, policy: Policy, seed: u64) -> Side {
        let api = MemoryApi::new();
        for inv in cluster() {
            let node = if dra {
                dra_node("twin", &inv.name, &inv)
            } else {
                fake_node("twin", &inv.name, &inv)
            };
            api.put_node(node.unwrap());
        }
        let scheduler = Scheduler::new(
            api.clone(),
            SchedulerConfig {
                policy,
                seed,
                ..SchedulerConfig::default()
            },
        );
        Side {
            api,
            scheduler,
            dra,
        }
    }

    fn create(&self, name: &str, request: &Request) {
        let template = PodTemplate {
            run: "twin".into(),
            namespace: NS.into(),
            scheduler_name: "gpuplace".into(),
            priority_classes: None,
            base: Default::default(),
            dra: self.dra,
        };
        let planned = PlannedPod {
            name: name.into(),
            pod: 0,
            unit: 0,
            arrival_ms: 0,
            run_ms: 1,
            full_ms: 1,
            measured: true,
            warm: false,
            queue: None,
            gang: None,
            priority: 0,
        };
        let mut made = pod(&template, &planned, name, request).unwrap();
        if self.dra && request.gpu_count > 0 {
            // The resource claim controller's part: the pod's claim made from its template.
            let claim_name = format!("{name}-gpu");
            let t = claim_template("twin", NS, request).unwrap();
            let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
                "metadata": {"name": claim_name, "namespace": NS},
                "spec": t.spec.spec,
            }))
            .unwrap();
            self.api.put_resource_claim(claim);
            let refs = made
                .spec
                .as_mut()
                .unwrap()
                .resource_claims
                .as_mut()
                .unwrap();
            refs[0].resource_claim_template_name = None;
            refs[0].resource_claim_name = Some(claim_name);
        }
        self.api.put_pod(made);
    }

    async fn round(&mut self, now: Instant) {
        loop {
            let report = self.scheduler.round(now).await.unwrap();
            if !report.more {
                break;
            }
        }
        self.scheduler.drain_writes(now).await;
    }

    fn placed(&self, name: &str) -> Placed {
        let p = self.api.pod(NS, name)?;
        let node = p.spec.as_ref()?.node_name.clone()?;
        let mut gpus: Vec<(u32, u32)> = if self.dra {
            let claim = self.api.resource_claim(NS, &format!("{name}-gpu"));
            claim
                .and_then(|c| c.status)
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default()
                .into_iter()
                .map(|r| {
                    let milli =
                        gpuplace_scheduler::k8s::dra::consumed_milli(r.consumed_capacity.as_ref());
                    (device_index(&r.device).expect("a gpuplace device"), milli)
                })
                .collect()
        } else {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(gpuplace_model::ASSIGNMENT_ANNOTATION))
                .and_then(|a| Assignment::from_json(a).ok())
                .map(|a| a.devices().map(|d| (d.index, d.milli)).collect())
                .unwrap_or_default()
        };
        gpus.sort_unstable();
        Some((node, gpus))
    }
}

/// Counts of what one sequence exercised.
#[derive(Default)]
struct Seen {
    placed_whole: usize,
    placed_shares: usize,
    with_models: usize,
    linked: usize,
    waited: usize,
    departed: usize,
}

async fn one_sequence(policy: Policy, seed: u64, seen: &mut Seen) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut plain = Side::new(false, policy, seed);
    let mut claimed = Side::new(true, policy, seed);
    let mut names: Vec<(String, Request)> = Vec::new();
    let mut gone = Vec::new();
    let t0 = Instant::now();
    for step in 0..70u64 {
        let name = format!("p{step}");
        let request = shape(&mut rng);
        plain.create(&name, &request);
        claimed.create(&name, &request);
        names.push((name, request));
        // A departure every third step, the same pod on both sides.
        if step % 3 == 2 {
            let bound: Vec<&String> = names
                .iter()
                .map(|(n, _)| n)
                .filter(|n| !gone.contains(*n) && plain.placed(n).is_some())
                .collect();
            if !bound.is_empty() {
                let pick = bound[rng.random_range(0..bound.len())].clone();
                plain.api.delete_pod(NS, &pick);
                claimed.api.delete_pod(NS, &pick);
                gone.push(pick);
                seen.departed += 1;
            }
        }
        let now = t0 + Duration::from_secs(70 * (step + 1));
        tokio::time::advance(Duration::from_secs(70)).await;
        plain.round(now).await;
        claimed.round(now).await;
        let mut mine = BTreeMap::new();
        for (n, _) in names.iter().filter(|(n, _)| !gone.contains(n)) {
            mine.insert(n.clone(), (plain.placed(n), claimed.placed(n)));
        }
        for (n, (a, b)) in &mine {
            assert_eq!(a, b, "{policy} seed {seed} step {step}: pod {n}");
        }
    }
    for (n, r) in names.iter().filter(|(n, _)| !gone.contains(n)) {
        match plain.placed(n) {
            None => seen.waited += 1,
            Some(_) if r.gpu_count == 0 => {}
            Some(_) if r.gpu_milli < 1000 => seen.placed_shares += 1,
            Some(_) => seen.placed_whole += 1,
        }
        if !r.allowed_models.is_empty() && plain.placed(n).is_some() {
            seen.with_models += 1;
        }
        if r.need.topology != GpuTopology::Any && plain.placed(n).is_some() {
            seen.linked += 1;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn claim_pods_go_where_and_on_the_gpus_device_plugin_pods_go() {
    let mut seen = Seen::default();
    for policy in [Policy::GPUPLACE, Policy::Fgd, Policy::BestFit] {
        for seed in 0..6 {
            one_sequence(policy, seed, &mut seen).await;
        }
    }
    println!(
        "claim twins: {} whole-GPU pods and {} shares placed alike ({} with allowed models, {} NVLink-linked), {} left waiting alike, {} departures",
        seen.placed_whole,
        seen.placed_shares,
        seen.with_models,
        seen.linked,
        seen.waited,
        seen.departed
    );
    assert!(seen.placed_whole >= 100 && seen.placed_shares >= 50 && seen.with_models >= 30);
    assert!(seen.linked >= 30);
    assert!(seen.waited >= 20 && seen.departed >= 100);
}
