//! The fleet at a glance, for `gpuplace status` and the live GPU map (`/ui`): every node's
//! GPUs with their use and holders, the totals, FGD's fragmentation against the current
//! workload, the largest shape that still fits, pending GPU pods with the scheduler's
//! reason, and the gangs. Pure: built from a [`ClusterView`] and the reasons known.
//!
//! - [`reasons`]: the latest scheduling failure per pending pod (the scheduler's own, or
//!   read back from Events);
//! - [`text`]: the terminal rendering;
//! - the live map (`crate::ui`) serves it as JSON.

pub mod queues;
pub mod reasons;
pub mod text;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuplace_core::{ClusterState, ShapeCounts};
use gpuplace_model::NodeInventory;
use serde::Serialize;

use crate::api::ClusterView;
use crate::k8s::pod_info::PodInfo;
pub use reasons::{PendingReasons, Reason};

/// The share of pods FGD's workload covers (the paper's 0.95), as the scheduler uses.
const WORKLOAD_COVERAGE: f64 = 0.95;

/// What the fleet looks like now.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FleetStatus {
    pub totals: Totals,
    pub nodes: Vec<NodeStatus>,
    /// Pending pods asking for GPUs, oldest first.
    pub pending: Vec<PendingPod>,
    pub groups: Vec<GroupStatus>,
    /// The queues as their status says (the leader writes it).
    pub queues: Vec<queues::QueueLine>,
    /// Objects that could not be read (malformed annotations); nothing else was lost.
    pub warnings: Vec<crate::snapshot::Warning>,
}

/// Fleet totals.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Totals {
    pub nodes: usize,
    pub gpus: usize,
    pub unhealthy_gpus: usize,
    /// GPUs nobody holds any part of (healthy ones).
    pub free_gpus: usize,
    /// GPUs partly held by shares.
    pub shared_gpus: usize,
    pub capacity_milli: u64,
    pub allocated_milli: u64,
    /// Allocated over capacity, in percent.
    pub allocation_pct: f64,
    /// FGD's fragmentation of the idle GPUs against the current workload, in GPUs.
    pub fragmentation_gpus: f64,
    /// The same as a percentage of idle GPU capacity.
    pub fragmentation_pct: f64,
    /// The largest request that still fits on some node.
    pub largest_fit: LargestFit,
    pub pending_pods: usize,
}

/// The largest GPU request some node could take now: whole GPUs on one node, else the
/// largest share of one GPU.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LargestFit {
    pub whole_gpus: u32,
    pub share_milli: u32,
    /// A node where it fits.
    pub node: Option<String>,
}

/// One node.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NodeStatus {
    pub name: String,
    pub model: String,
    pub gpus: Vec<GpuStatus>,
    /// GPU indices joined by NVLink (connected groups of two or more).
    pub nvlink_groups: Vec<Vec<u32>>,
    /// NVLink pairs (`a`, `b` GPU indices and the link count), for the topology drawing.
    pub links: Vec<LinkStatus>,
    /// Time-slicing replicas per GPU (1 when not shared that way).
    pub replicas: u32,
    /// FGD's fragmentation of this node, in GPUs.
    pub fragmentation_gpus: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LinkStatus {
    pub a: u32,
    pub b: u32,
    pub nvlinks: u32,
}

/// One GPU.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GpuStatus {
    pub index: u32,
    pub id: String,
    pub model: String,
    pub memory_mib: u64,
    pub healthy: bool,
    pub capacity_milli: u32,
    pub used_milli: u32,
    pub holders: Vec<Holder>,
}

/// A pod holding (part of) a GPU.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Holder {
    pub namespace: String,
    pub name: String,
    pub milli: u32,
    /// The pod's creation time (RFC 3339).
    pub since: Option<String>,
}

/// A pod waiting for GPUs.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    /// GPUs asked for, e.g. `2` or `0.5`.
    pub gpus: String,
    pub group: Option<String>,
    pub scheduler: Option<String>,
    pub since: Option<String>,
    /// The scheduler's latest reason, when one is known.
    pub reason: Option<String>,
    /// The same read into its parts: kube-scheduler's message, what blocks it, its
    /// position, its queue's standing, what would unblock it, its expected start.
    pub waiting: Option<gpuplace_core::waiting::Parsed>,
    /// The scheduler's structured record, typed (served by the scheduler from its memory;
    /// absent when read back from Events).
    pub record: Option<gpuplace_core::waiting::Waiting>,
}

/// A gang (PodGroup).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GroupStatus {
    pub namespace: String,
    pub name: String,
    pub min_member: u32,
    pub phase: String,
    pub scheduled: u32,
    /// Why it waits (its `Unschedulable` condition), when it does.
    pub message: Option<String>,
}

/// What to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only nodes whose name contains this.
    pub node: Option<String>,
    /// Only pods (holders and pending) of this namespace.
    pub namespace: Option<String>,
}

/// GPUs as text: `2`, `0.5`, `2x0.25`.
pub fn gpus_text(count: u32, milli: u32) -> String {
    let share = if milli.is_multiple_of(1000) {
        format!("{}", milli / 1000)
    } else {
        let text = format!("{:.3}", f64::from(milli) / 1000.0);
        text.trim_end_matches('0').to_string()
    };
    match (count, milli) {
        (1, _) => share,
        (n, 1000) => n.to_string(),
        (n, _) => format!("{n}x{share}"),
    }
}

/// The fleet as `view` shows it, with `reasons` for pending pods.
pub fn fleet(
    view: &ClusterView,
    gpu_resource: &str,
    reasons: &HashMap<String, Reason>,
    filter: &Filter,
) -> FleetStatus {
    let mut snapshot = crate::snapshot::build(&view.nodes, &view.pods, gpu_resource);
    snapshot.follow_claims(&[], view);
    let mut shapes = ShapeCounts::default();
    for pod in view.pods.iter() {
        if let Ok(d) = &pod.demand
            && (pod.is_active_bound() || waits(pod))
        {
            shapes.add(&d.request);
        }
    }
    snapshot
        .state
        .set_workload(Arc::new(shapes.workload(WORKLOAD_COVERAGE)));
    let by_uid: HashMap<&str, &Arc<PodInfo>> =
        view.pods.iter().map(|p| (p.key.uid.as_str(), p)).collect();
    let mut holders: Vec<Vec<Vec<Holder>>> = (0..snapshot.state.len())
        .map(|n| vec![Vec::new(); snapshot.state.inventory(n).gpus.len()])
        .collect();
    for (uid, held) in &snapshot.held {
        let Some(pod) = by_uid.get(uid.as_str()) else {
            continue;
        };
        for &(pos, milli) in &held.gpus {
            if let Some(slot) = holders.get_mut(held.node).and_then(|g| g.get_mut(pos)) {
                slot.push(Holder {
                    namespace: pod.key.namespace.clone(),
                    name: pod.key.name.clone(),
                    milli,
                    since: pod.created.as_ref().map(timestamp),
                });
            }
        }
    }
    let state = &snapshot.state;
    let mut nodes = Vec::new();
    for (n, gpu_holders) in holders.into_iter().enumerate() {
        let inv = state.inventory(n);
        if filter.node.as_ref().is_some_and(|f| !inv.name.contains(f)) {
            continue;
        }
        nodes.push(node_status(state, n, gpu_holders, filter));
    }
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let groups = groups(view, filter);
    let mut pending = pending_pods(view, reasons, filter);
    // Without the scheduler's record, a gang member's freshest reason is its PodGroup's (a
    // member in backoff missed the latest Event).
    for p in pending.iter_mut().filter(|p| p.record.is_none()) {
        if let Some(message) = p.group.as_ref().and_then(|g| {
            groups
                .iter()
                .find(|s| s.namespace == p.namespace && &s.name == g)
                .and_then(|s| s.message.clone())
        }) {
            p.waiting = Some(gpuplace_core::waiting::Waiting::parse(&message));
            p.reason = Some(message);
        }
    }
    FleetStatus {
        totals: totals(state, &nodes, pending.len()),
        nodes,
        pending,
        groups,
        queues: queues::lines(view),
        warnings: snapshot.warnings,
    }
}

/// A pod not bound, not finished, not being deleted: waiting for a node.
fn waits(pod: &PodInfo) -> bool {
    pod.node_name.is_none() && !pod.deleting && pod.phase.as_deref().is_none_or(|p| p == "Pending")
}

fn node_status(
    state: &ClusterState,
    n: usize,
    mut holders: Vec<Vec<Holder>>,
    filter: &Filter,
) -> NodeStatus {
    let inv = state.inventory(n);
    let s = state.node(n);
    let gpus = inv
        .gpus
        .iter()
        .enumerate()
        .map(|(pos, g)| {
            let mut held = std::mem::take(&mut holders[pos]);
            let used: u32 = held.iter().map(|h| h.milli).sum();
            if let Some(ns) = &filter.namespace {
                held.retain(|h| &h.namespace == ns);
            }
            held.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            GpuStatus {
                index: g.index,
                id: g.id.clone(),
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                healthy: g.healthy,
                capacity_milli: g.milli_capacity,
                used_milli: used.min(g.milli_capacity),
                holders: held,
            }
        })
        .collect();
    let links: Vec<LinkStatus> = inv
        .links
        .iter()
        .filter(|l| l.nvlinks > 0)
        .map(|l| LinkStatus {
            a: l.a,
            b: l.b,
            nvlinks: l.nvlinks,
        })
        .collect();
    NodeStatus {
        name: inv.name.clone(),
        model: match inv.gpu_model() {
            "" => "unknown".to_string(),
            m => m.to_string(),
        },
        gpus,
        nvlink_groups: nvlink_groups(inv),
        links,
        replicas: inv.replicas.max(1),
        fragmentation_gpus: round2(s.frag / 1000.0),
    }
}

/// Connected groups of GPUs over NVLink (groups of one left out), each sorted.
fn nvlink_groups(inv: &NodeInventory) -> Vec<Vec<u32>> {
    let mut group: BTreeMap<u32, u32> = inv.gpus.iter().map(|g| (g.index, g.index)).collect();
    fn root(group: &BTreeMap<u32, u32>, mut i: u32) -> u32 {
        while let Some(&p) = group.get(&i) {
            if p == i {
                break;
            }
            i = p;
        }
        i
    }
    for link in inv.links.iter().filter(|l| l.nvlinks > 0) {
        let (a, b) = (root(&group, link.a), root(&group, link.b));
        if a != b && group.contains_key(&a) && group.contains_key(&b) {
            group.insert(a.max(b), a.min(b));
        }
    }
    let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &i in group.keys() {
        out.entry(root(&group, i)).or_default().push(i);
    }
    out.into_values().filter(|g| g.len() > 1).collect()
}

fn totals(state: &ClusterState, nodes: &[NodeStatus], pending: usize) -> Totals {
    let mut t = Totals {
        nodes: nodes.len(),
        pending_pods: pending,
        ..Totals::default()
    };
    let mut frag = 0.0;
    let mut idle = 0u64;
    for node in nodes {
        frag += node.fragmentation_gpus;
        for g in &node.gpus {
            t.gpus += 1;
            if !g.healthy {
                t.unhealthy_gpus += 1;
                continue;
            }
            t.capacity_milli += u64::from(g.capacity_milli);
            t.allocated_milli += u64::from(g.used_milli);
            idle += u64::from(g.capacity_milli - g.used_milli);
            match g.used_milli {
                0 => t.free_gpus += 1,
                u if u < g.capacity_milli => t.shared_gpus += 1,
                _ => {}
            }
        }
    }
    t.allocation_pct = percent(t.allocated_milli as f64, t.capacity_milli as f64);
    t.fragmentation_gpus = round2(frag);
    t.fragmentation_pct = percent(frag * 1000.0, idle as f64);
    t.largest_fit = largest_fit(state, nodes);
    t
}

fn percent(part: f64, whole: f64) -> f64 {
    if whole <= 0.0 {
        0.0
    } else {
        round2(100.0 * part / whole)
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The most whole GPUs free on one node (healthy, nobody's share on them), else the
/// largest free share of one GPU, among the nodes shown.
fn largest_fit(state: &ClusterState, nodes: &[NodeStatus]) -> LargestFit {
    let mut best = LargestFit::default();
    for node in nodes {
        let Some(n) = state.find(&node.name) else {
            continue;
        };
        let s = state.node(n);
        let whole = s.fully_free_gpus() as u32;
        let share = s.gpu_free.iter().copied().max().unwrap_or(0).min(1000);
        if (whole, share) > (best.whole_gpus, best.share_milli) {
            best = LargestFit {
                whole_gpus: whole,
                share_milli: share,
                node: Some(node.name.clone()),
            };
        }
    }
    if best.whole_gpus > 0 {
        best.share_milli = 0;
    }
    best
}

fn pending_pods(
    view: &ClusterView,
    reasons: &HashMap<String, Reason>,
    filter: &Filter,
) -> Vec<PendingPod> {
    let mut out: Vec<PendingPod> = view
        .pods
        .iter()
        .filter(|p| waits(p))
        .filter(|p| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| &p.key.namespace == ns)
        })
        .filter_map(|p| {
            let gpus = match &p.demand {
                Ok(d) if d.request.gpu_count > 0 => {
                    gpus_text(d.request.gpu_count, d.request.gpu_milli)
                }
                Ok(_) => return None,
                Err(e) => format!("? ({e})"),
            };
            let since = p.created.as_ref().map(timestamp);
            Some(PendingPod {
                namespace: p.key.namespace.clone(),
                name: p.key.name.clone(),
                gpus,
                group: p.group.clone(),
                scheduler: p.scheduler_name.clone(),
                since,
                reason: reasons.get(&p.key.uid).map(|r| r.message.clone()),
                waiting: reasons
                    .get(&p.key.uid)
                    .map(|r| gpuplace_core::waiting::Waiting::parse(&r.message)),
                record: reasons
                    .get(&p.key.uid)
                    .and_then(|r| r.record.as_deref().cloned()),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.since, &a.namespace, &a.name).cmp(&(&b.since, &b.namespace, &b.name)));
    out
}

fn groups(view: &ClusterView, filter: &Filter) -> Vec<GroupStatus> {
    view.groups
        .iter()
        .filter(|g| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| g.metadata.namespace.as_ref() == Some(ns))
        })
        .map(|g| {
            let status = g.status.clone().unwrap_or_default();
            GroupStatus {
                namespace: g.metadata.namespace.clone().unwrap_or_default(),
                name: g.metadata.name.clone().unwrap_or_default(),
                min_member: g.spec.min_member,
                phase: status.phase.clone(),
                scheduled: status.scheduled,
                message: status.unschedulable_message().map(str::to_string),
            }
        })
        .collect()
}

/// RFC 3339 UTC, seconds precision.
fn timestamp(t: &k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
