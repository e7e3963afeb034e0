//! `gpuplace defrag --plan`: what defragmentation would do in the live cluster, touching
//! nothing. For each pending GPU pod that fits nowhere, in the scheduler's order (priority,
//! then age, then name), the make-room plan the scheduler would carry out (the same rules,
//! core planner and seed); each plan is applied
//! to a working copy, so later pods see the earlier plans. Then the rebalancing moves on
//! what is left, and the fleet's fragmentation before and after.

use std::collections::HashSet;
use std::sync::Arc;

use gpuplace_core::cycle::place::{self, Quorum, Trial};
use gpuplace_core::cycle::{self, Cycled, Found, Planner, Step, Unit};
use gpuplace_core::defrag::{self, Fleet, Limits, RebalancePace};
use gpuplace_core::{Placer, Policy, ShapeCounts};
use serde::Serialize;

use crate::api::ClusterView;
use crate::framework::filter::VerdictCache;
use crate::framework::volumes::VolumeIndex;
use crate::framework::{Filtering, Profile};
use crate::k8s::pod_info::PodInfo;
use crate::scheduler::Unit as QueueUnit;
use crate::scheduler::defrag::{DefragConfig, Eligibility, movable_set};
use crate::shared::members::Alone;
use crate::snapshot::Snapshot;

/// One pod's move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedMove {
    pub namespace: String,
    pub name: String,
    pub from: String,
    pub to: String,
    /// GPU IDs on `to`, with milli.
    pub gpus: Vec<(String, u32)>,
}

/// The moves that let a pending pod run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoomPlan {
    /// `namespace/name` of the pod it unblocks.
    pub pod: String,
    pub node: String,
    /// The GPUs it would get.
    pub gpus: Vec<String>,
    pub moves: Vec<PlannedMove>,
    pub gpus_moved: f64,
}

/// The whole dry run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DefragPlan {
    /// Pending GPU pods that fit nowhere now.
    pub blocked: Vec<String>,
    /// Make-room plans, in the order they would be made.
    pub make_room: Vec<RoomPlan>,
    /// Blocked pods no plan helps (nothing movable in the way, or no place for the pods
    /// that would move, or a budget).
    pub unhelped: Vec<String>,
    /// Rebalancing moves after the plans (when the fleet's fragmentation is above the
    /// threshold and a pod waits).
    pub rebalance: Vec<PlannedMove>,
    /// Fragmentation of the fleet (GPUs, FGD's measure) now, after the plans, and after
    /// rebalancing too.
    pub frag_before: f64,
    pub frag_after_room: f64,
    pub frag_after: f64,
    pub gpus: usize,
}

/// A pending pod that waits for a node.
fn waits(pod: &PodInfo) -> bool {
    pod.node_name.is_none() && !pod.deleting && pod.phase.as_deref().is_none_or(|p| p == "Pending")
}

/// Plans as the scheduler would, with `policy` (its ties broken by `seed`, as the
/// scheduler's `--seed`) placing moved pods.
pub fn plan(
    view: &ClusterView,
    gpu_resource: &str,
    policy: Policy,
    seed: u64,
    config: &DefragConfig,
    now: k8s_openapi::jiff::Timestamp,
) -> DefragPlan {
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
    snapshot.state.set_workload(Arc::new(shapes.workload(0.95)));
    let mut pending: Vec<&Arc<PodInfo>> = view
        .pods
        .iter()
        .filter(|p| {
            waits(p)
                && p.demand
                    .as_ref()
                    .is_ok_and(|d| d.request.total_gpu_milli() > 0)
        })
        .collect();
    // The scheduler's order for a pod alone.
    pending.sort_by_cached_key(|p| QueueUnit::Single(p).order());
    let volumes = VolumeIndex::new(&view.claims, &view.volumes);
    let profile = Profile::new(gpu_resource);
    let filtering = Filtering {
        profile: &profile,
        volumes: &volumes,
    };
    let mut placer = Placer::new(policy, seed);
    let mut out = DefragPlan {
        blocked: Vec::new(),
        make_room: Vec::new(),
        unhelped: Vec::new(),
        rebalance: Vec::new(),
        frag_before: snapshot.state.total_frag() / 1e3,
        frag_after_room: 0.0,
        frag_after: 0.0,
        gpus: (0..snapshot.state.len())
            .map(|n| snapshot.state.inventory(n).gpus.len())
            .sum(),
    };
    let mut work = snapshot.state.clone();
    let mut moved: HashSet<String> = HashSet::new();
    let mut verdicts = VerdictCache::default();
    for pod in pending {
        let Some(mask) = pod_mask(&snapshot, filtering, &mut verdicts, pod) else {
            continue;
        };
        if pod.demand.is_err() {
            continue;
        }
        let name = pod.key.to_string();
        let mut dry_run = DryRun {
            snapshot: &snapshot,
            view,
            filtering,
            config,
            now,
            moved: &moved,
            work: &mut work,
            placer: &mut placer,
            pod,
            mask: mask.as_deref(),
        };
        // Core's cycle for the pod alone: one that fits is the scheduler's to place (not
        // reserved here); one that fits nowhere is blocked, and PostFilter's make-room plans.
        let chained = match cycle::schedule(&mut dry_run) {
            Cycled::PostFiltered { chained, .. } => chained,
            Cycled::Allowed(_) | Cycled::MembersMissing(_) => continue,
        };
        out.blocked.push(name.clone());
        match chained.plan.map(|(_, p)| p) {
            Some(plan) => {
                moved.extend(
                    plan.moves
                        .iter()
                        .map(|m| format!("{}/{}", m.namespace, m.name)),
                );
                out.make_room.push(plan);
            }
            None => out.unhelped.push(name),
        }
    }
    out.frag_after_room = work.total_frag() / 1e3;
    out.frag_after = out.frag_after_room;
    // Rebalancing's own rule (core's, as the scheduler looks after a round): one look,
    // pods waiting, fragmentation above the threshold, the hour's whole budget. Listed
    // whichever mode the flags name (a dry run shows what rebalancing would do).
    let settings = defrag::Settings {
        mode: defrag::Mode::Rebalance,
        ..config.settings.clone()
    };
    let fleet = Fleet {
        pending: out.blocked.len(),
        frag_milli: work.total_frag(),
        capacity_milli: work.gpu_capacity_milli(),
        in_flight: 0,
    };
    let look = RebalancePace::<String, std::time::Duration>::default().limits(
        &settings,
        std::time::Duration::ZERO,
        &fleet,
    );
    if let Some(limits) = look {
        // Rebalancing runs on the state after the plans: the pods the plans moved are
        // elsewhere there, so they are not movable again (every move it makes is listed,
        // and the fragmentation after is that of the listed moves).
        let moved_uids: HashSet<&str> = view
            .pods
            .iter()
            .filter(|p| moved.contains(&p.key.to_string()))
            .map(|p| p.key.uid.as_str())
            .collect();
        let skip = |uid: &str| moved_uids.contains(uid);
        let rules = Eligibility {
            min_age: config.settings.min_age,
            now,
            skip: &skip,
        };
        let set = movable_set(&snapshot, view, filtering, &rules);
        let mut fgd = Placer::new(Policy::Fgd, seed);
        let r = defrag::rebalance(
            &mut fgd,
            &work,
            &set.movables,
            limits,
            defrag::REBALANCE_MIN_GAIN_MILLI,
        );
        for m in &r.moves {
            let pod = &set.pods[m.holder];
            let h = &set.movables.candidates.holders[m.holder];
            out.rebalance
                .push(describe(&snapshot, pod, h.node, m.to, &m.gpus));
        }
        out.frag_after = r.frag_after / 1e3;
    }
    out
}

/// `pod`'s filter mask (`Some(None)`: every node), `None` when its filters reject all.
fn pod_mask(
    snapshot: &Snapshot,
    filtering: Filtering<'_>,
    verdicts: &mut VerdictCache,
    pod: &PodInfo,
) -> Option<Option<Vec<bool>>> {
    let v = verdicts.get(snapshot, pod);
    let f = filtering.filter_alone(snapshot, &v, pod).ok()?;
    Some(f.mask().map(<[bool]>::to_vec))
}

/// PostFilter's chain for one blocked pod as the dry run sees it: make-room alone (it
/// shows what defragmentation would do; preemption and reclaim are the scheduler's own),
/// planned on the working copy.
struct DryRun<'a, 'p> {
    snapshot: &'a Snapshot,
    view: &'a ClusterView,
    filtering: Filtering<'p>,
    config: &'a DefragConfig,
    now: k8s_openapi::jiff::Timestamp,
    moved: &'a HashSet<String>,
    work: &'a mut gpuplace_core::ClusterState,
    placer: &'a mut Placer,
    pod: &'a PodInfo,
    mask: Option<&'a [bool]>,
}

impl Planner for DryRun<'_, '_> {
    type Plan = RoomPlan;
    type Why = ();

    fn applies(&self, step: Step) -> bool {
        step == Step::MakeRoom
    }

    fn plan(&mut self, _: Step) -> Found<RoomPlan, ()> {
        room_for(self).map_or(Found::Nothing(()), Found::Plan)
    }
}

impl Unit for DryRun<'_, '_> {
    type Placed = usize;
    type Unfit = ();

    /// Filter was the profile's (`mask`); Score on the working copy, nothing reserved.
    fn place(&mut self) -> Trial<usize, ()> {
        let Ok(demand) = &self.pod.demand else {
            return Trial::failed(None);
        };
        let mut alone = Alone {
            state: self.work,
            request: &demand.request,
            mask: self.mask,
        };
        place::trial(&mut alone, self.placer, None)
    }

    fn quorum(&self) -> Quorum {
        Quorum::ONE
    }

    fn unreserve(&mut self, _: &Trial<usize, ()>) {}
}

/// The make-room plan for the dry run's pod on its working copy (applied to it when
/// found).
fn room_for(d: &mut DryRun<'_, '_>) -> Option<RoomPlan> {
    let DryRun {
        snapshot,
        view,
        filtering,
        config,
        now,
        moved,
        pod,
        mask,
        ..
    } = *d;
    let (work, placer) = (&mut *d.work, &mut *d.placer);
    let demand = pod.demand.as_ref().ok()?;
    let skip = |uid: &str| {
        view.pods
            .iter()
            .any(|p| p.key.uid == uid && moved.contains(&p.key.to_string()))
    };
    let rules = Eligibility {
        min_age: config.settings.min_age,
        now,
        skip: &skip,
    };
    let set = movable_set(snapshot, view, filtering, &rules);
    let limits = Limits {
        max_pods: config.settings.max_moves,
        max_milli: u64::MAX,
    };
    let plan = defrag::make_room(placer, work, &demand.request, mask, &set.movables, limits)?;
    defrag::apply_plan(work, &[&demand.request], &set.movables, &plan).ok()?;
    let place = &plan.placements[0];
    let inventory = snapshot.state.inventory(place.node);
    Some(RoomPlan {
        pod: pod.key.to_string(),
        node: inventory.name.clone(),
        gpus: place
            .gpus
            .iter()
            .map(|&(g, _)| inventory.gpus[g].id.clone())
            .collect(),
        moves: plan
            .moves
            .iter()
            .map(|m| {
                let h = &set.movables.candidates.holders[m.holder];
                describe(snapshot, &set.pods[m.holder], h.node, m.to, &m.gpus)
            })
            .collect(),
        gpus_moved: plan.cost.milli_moved as f64 / 1e3,
    })
}

fn describe(
    snapshot: &Snapshot,
    pod: &PodInfo,
    from: usize,
    to: usize,
    gpus: &[(usize, u32)],
) -> PlannedMove {
    let inventory = snapshot.state.inventory(to);
    PlannedMove {
        namespace: pod.key.namespace.clone(),
        name: pod.key.name.clone(),
        from: snapshot.state.inventory(from).name.clone(),
        to: inventory.name.clone(),
        gpus: gpus
            .iter()
            .map(|&(g, m)| (inventory.gpus[g].id.clone(), m))
            .collect(),
    }
}

/// The plan as text.
pub fn text(plan: &DefragPlan) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} pending GPU pod(s) fit nowhere; {} make-room plan(s), {} without one.",
        plan.blocked.len(),
        plan.make_room.len(),
        plan.unhelped.len()
    );
    for p in &plan.make_room {
        let _ = writeln!(
            out,
            "\nmake room for {} on {} (GPUs {}): move {} pod(s), {:.1} GPU(s)",
            p.pod,
            p.node,
            p.gpus.join(","),
            p.moves.len(),
            p.gpus_moved
        );
        for m in &p.moves {
            let _ = writeln!(out, "  {}", move_line(m));
        }
    }
    for name in &plan.unhelped {
        let _ = writeln!(
            out,
            "\nno plan for {name}: nothing that may move makes room"
        );
    }
    if !plan.rebalance.is_empty() {
        let _ = writeln!(out, "\nrebalance: {} move(s)", plan.rebalance.len());
        for m in &plan.rebalance {
            let _ = writeln!(out, "  {}", move_line(m));
        }
    }
    let _ = writeln!(
        out,
        "\nfragmentation (FGD, GPUs of {}): {:.2} now, {:.2} after making room, {:.2} after rebalancing",
        plan.gpus, plan.frag_before, plan.frag_after_room, plan.frag_after
    );
    out
}

fn move_line(m: &PlannedMove) -> String {
    let gpus: Vec<String> = m
        .gpus
        .iter()
        .map(|(id, milli)| {
            if *milli >= 1000 {
                id.clone()
            } else {
                format!("{id} ({milli}m)")
            }
        })
        .collect();
    format!(
        "{}/{}: {} -> {} (GPUs {})",
        m.namespace,
        m.name,
        m.from,
        m.to,
        gpus.join(",")
    )
}
