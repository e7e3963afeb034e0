//! One scenario replayed by `gpuplace simulate --timeline` and through the scheduler stack,
//! and what the two said of each pod.

use std::sync::Arc;
use std::time::Duration;

use gpuplace_core::{Policy, TargetWorkload};
use gpuplace_scheduler::k8s::queue::QueueSpec;
use gpuplace_sim::timeline::engine::{Job, movable_pod};
use gpuplace_sim::timeline::options::{Costs, DefragSim, Ms};
use gpuplace_sim::timeline::tenants::{Tenants, TenantsFile};
use gpuplace_sim::timeline::{DurationModel, Timeline, TimelineOptions};
use gpuplace_testkit::timeline::{
    StackCosts, StackJob, StackNodes, StackOutcome, TimelineStackOptions, replay_timeline,
};

/// Which pods get which priority.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Priorities {
    /// All 0.
    #[default]
    Off,
    /// Every third pod of the mix gets 1.
    EveryThird,
    /// Each pod of the mix gets 0 to `levels - 1`, by a hash of its index and `salt`.
    Hashed { levels: u32, salt: u64 },
}

impl Priorities {
    fn of(self, i: usize) -> i32 {
        match self {
            Priorities::Off => 0,
            Priorities::EveryThird => i32::from(i.is_multiple_of(3)),
            Priorities::Hashed { levels, salt } => {
                let h = (i as u64 ^ salt)
                    .wrapping_add(1)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15);
                ((h >> 33) % u64::from(levels.max(1))) as i32
            }
        }
    }
}

/// One queue of a scenario: its name, guarantee and limit (percent of the cluster's GPUs)
/// and its share of the pods.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSetup {
    pub name: &'static str,
    pub guaranteed_pct: u32,
    pub limit_pct: Option<u32>,
    pub share: f64,
}

/// Everything one comparison turns on; both sides get the same.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub policy: Policy,
    pub seed: u64,
    /// Nodes sampled from the built-in cluster.
    pub nodes: usize,
    pub arrivals: usize,
    pub load: f64,
    pub priorities: Priorities,
    /// Preemption on both sides (the scheduler always preempts; the simulator's
    /// `--no-preempt` is the other setting).
    pub preempt: bool,
    /// Queues sharing the cluster (both sides serve them and reclaim).
    pub queues: Vec<QueueSetup>,
    /// A third of the pairs of whole-GPU pods of the mix are gangs of two.
    pub gangs: bool,
    pub make_room: bool,
    pub rebalance: bool,
    /// The share of pods that may move (the simulator's `--movable` hash).
    pub movable: f64,
    /// Defragmentation's minimum age and rebalancing's fragmentation threshold.
    pub min_age: Duration,
    pub rebalance_threshold: f64,
    pub costs: StackCosts,
    /// Who plays the nodes on the stack's side.
    pub stack_nodes: StackNodes,
    /// A policy constant changed on the stack's side only (the differential test's check
    /// that it notices).
    pub mutant: Option<Mutant>,
}

/// One policy constant the stack is given differently from the simulator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mutant {
    /// Rebalancing's fragmentation threshold, this much higher.
    RebalanceThreshold(f64),
    /// Defragmentation's minimum age, this much longer.
    MinAge(Duration),
    /// Every queue's GPU limit (where it has one), this many percent of the cluster higher.
    QueueLimit(u32),
}

impl Scenario {
    /// The built-in mix on 10 nodes, 250 arrivals, nothing else on (the fixed cases' base).
    pub fn plain(policy: Policy, seed: u64) -> Scenario {
        Scenario {
            policy,
            seed,
            nodes: 10,
            arrivals: 250,
            load: 1.0,
            priorities: Priorities::Off,
            preempt: false,
            queues: Vec::new(),
            gangs: false,
            make_room: false,
            rebalance: false,
            movable: 0.5,
            min_age: Duration::ZERO,
            rebalance_threshold: 0.0,
            costs: StackCosts::default(),
            stack_nodes: StackNodes::Kubelets,
            mutant: None,
        }
    }

    /// The scenario as the stack is given it: the same, but for its mutant.
    fn stack_side(&self) -> Scenario {
        let mut s = self.clone();
        match self.mutant {
            None => {}
            Some(Mutant::RebalanceThreshold(more)) => s.rebalance_threshold += more,
            Some(Mutant::MinAge(more)) => s.min_age += more,
            Some(Mutant::QueueLimit(more)) => {
                for q in &mut s.queues {
                    q.limit_pct = q.limit_pct.map(|l| l + more);
                }
            }
        }
        s
    }

    /// Its queues as the simulator builds them on `nodes` for `pods` (none without).
    fn tenants(
        &self,
        nodes: &[gpuplace_model::NodeInventory],
        pods: &[gpuplace_sim::trace::TracePod],
    ) -> Option<Tenants> {
        let file = self.tenants_file()?;
        let capacity = [
            nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum(),
            nodes.iter().map(|n| n.cpu_milli).sum(),
            nodes.iter().map(|n| n.memory_mib).sum(),
        ];
        Some(Tenants::new(&file, capacity, pods).expect("tenants"))
    }

    /// Defragmentation's settings, the same on both sides.
    pub fn defrag(&self) -> gpuplace_core::defrag::Settings {
        use gpuplace_core::defrag::Mode;
        gpuplace_core::defrag::Settings {
            mode: match (self.make_room, self.rebalance) {
                (true, true) => Mode::All,
                (true, false) => Mode::MakeRoom,
                (false, true) => Mode::Rebalance,
                (false, false) => Mode::Off,
            },
            min_age: self.min_age,
            rebalance_threshold: self.rebalance_threshold,
            ..gpuplace_core::defrag::Settings::default()
        }
    }

    fn sim_costs(&self) -> Costs {
        Costs {
            eviction_grace: Duration::from_millis(self.costs.grace_ms),
            recreate: Duration::from_millis(self.costs.recreate_ms),
            start: Duration::from_millis(self.costs.start_ms),
            ..Costs::FREE
        }
    }

    /// The queues as the simulator reads them.
    fn tenants_file(&self) -> Option<TenantsFile> {
        if self.queues.is_empty() {
            return None;
        }
        let queues: Vec<serde_json::Value> = self
            .queues
            .iter()
            .map(|q| {
                let mut v = serde_json::json!({
                    "name": q.name,
                    "guaranteed": {"nvidia.com/gpu": format!("{}%", q.guaranteed_pct)}
                });
                if let Some(limit) = q.limit_pct {
                    v["limit"] = serde_json::json!({"nvidia.com/gpu": format!("{limit}%")});
                }
                v
            })
            .collect();
        let shares: serde_json::Map<String, serde_json::Value> = self
            .queues
            .iter()
            .map(|q| (q.name.to_string(), serde_json::json!(q.share)))
            .collect();
        Some(
            serde_json::from_value(serde_json::json!({
                "queues": queues,
                "assign": {"by": "hash", "shares": shares}
            }))
            .expect("tenants file"),
        )
    }
}

/// The same queues as the scheduler reads them (Queue objects: a Queue's amounts are
/// quantities, so the simulator's percents as the milli-GPU they came to).
fn queue_objects(tenants: &Tenants) -> Vec<(String, QueueSpec)> {
    (1..tenants.tree.len())
        .map(|q| {
            let node = &tenants.tree.nodes[q];
            let amount = |dims: Option<u64>| dims.map(|m| format!("{m}m"));
            let mut spec = serde_json::json!({
                "guaranteed": {"nvidia.com/gpu": amount(node.spec.guaranteed.dims[0]).unwrap_or("0m".into())}
            });
            if let Some(limit) = amount(node.spec.limit.dims[0]) {
                spec["limit"] = serde_json::json!({"nvidia.com/gpu": limit});
            }
            let spec: QueueSpec = serde_json::from_value(spec).expect("queue spec");
            (node.spec.name.clone(), spec)
        })
        .collect()
}

/// Each job's gang on the stack when its unit has more than one member: (the job whose
/// pod names the PodGroup, the unit's first, so that the gang sorts where the simulator
/// queues it; `minMember`). A unit's jobs made at one instant are one gang (a gang's
/// replacements, made together, are a new one).
fn gangs_of(jobs: &[Job]) -> Vec<Option<(usize, u32)>> {
    let mut units: std::collections::HashMap<(u32, u64), (usize, u32)> = Default::default();
    for (k, j) in jobs.iter().enumerate() {
        units.entry((j.unit, j.arrival.0)).or_insert((k, 0)).1 += 1;
    }
    jobs.iter()
        .map(|j| {
            let (first, size) = units[&(j.unit, j.arrival.0)];
            (size > 1).then_some((first, size))
        })
        .collect()
}

/// One replay on both sides: the simulator's jobs and what the stack gave each.
pub struct Both {
    pub jobs: Vec<Job>,
    pub stack: Vec<StackOutcome>,
    pub pods: Vec<gpuplace_sim::trace::TracePod>,
    pub nodes: Vec<gpuplace_model::NodeInventory>,
    /// The replay's end (what the simulator decided for later is past it on both sides).
    pub end_ms: u64,
    /// The simulator's report of the run.
    pub run: gpuplace_sim::timeline::TimelineRun,
}

/// The built-in mix for `s`: its sampled nodes, priorities and gangs.
fn workload(s: &Scenario) -> gpuplace_sim::Workload {
    let mut workload = gpuplace_sim::builtin_workload(64);
    workload.sample_nodes(s.nodes, s.seed).expect("sample");
    // In the order the API lists them (by name), which the scheduler sees: first-fit
    // takes the first in that order.
    workload.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    for (i, p) in workload.pods.iter_mut().enumerate() {
        p.priority = s.priorities.of(i);
    }
    if s.gangs {
        let whole: Vec<usize> = (0..workload.pods.len())
            .filter(|&i| workload.pods[i].request.gpu_milli == 1000)
            .collect();
        for (k, pair) in whole
            .chunks_exact(2)
            .enumerate()
            .filter(|(k, _)| k % 3 == 0)
        {
            for &i in pair {
                workload.pods[i].gang = Some(format!("g{k}"));
            }
        }
    }
    workload
}

/// `s` replayed by the simulator and through the stack.
pub async fn replay_both(s: &Scenario) -> Both {
    let defrag = s.defrag();
    let options = TimelineOptions {
        arrivals: s.arrivals,
        warmup: 0.0,
        durations: DurationModel {
            max_s: Some(7_200.0),
            ..DurationModel::default()
        },
        costs: s.sim_costs(),
        preempt: s.preempt,
        load: s.load,
        tenants: s.tenants_file(),
        queues_serve: !s.queues.is_empty(),
        defrag: DefragSim {
            settings: defrag.clone(),
            movable: s.movable,
        },
        ..TimelineOptions::default()
    };
    let timeline = Timeline::new(workload(s), options).expect("timeline");
    let (run, jobs) = timeline.run_with_jobs(s.policy, s.seed);
    let (pods, nodes) = (&timeline.workload().pods, &timeline.workload().nodes);
    let end_ms = (run.simulated_s * 1e3).round() as u64;
    let stack_side = s.stack_side();
    let queue_of = s.tenants(nodes, pods);
    let moving = s.make_room || s.rebalance;
    let stack_jobs: Vec<StackJob> = jobs
        .iter()
        .zip(gangs_of(&jobs))
        .map(|(j, gang)| StackJob {
            arrival_ms: j.arrival.0,
            request: pods[j.pod as usize].request.clone(),
            priority: pods[j.pod as usize].priority,
            run_ms: j.run_ms,
            replaces: j.replaces.map(|r| r as usize),
            queue: queue_of
                .as_ref()
                .map(|t| t.tree.name(t.queue_of[j.pod as usize]).to_string()),
            movable: moving && movable_pod(j.pod, s.movable),
            gang,
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let stack_options = TimelineStackOptions {
        policy: s.policy,
        placer_seed: Timeline::placer_seed(s.seed),
        workload: Some(Arc::new(TargetWorkload::from_requests(
            pods.iter().map(|p| &p.request),
            0.95,
        ))),
        end_ms,
        settle_timeout: Duration::from_secs(20),
        queues: (stack_side.tenants(nodes, pods).as_ref())
            .map(queue_objects)
            .unwrap_or_default(),
        defrag: stack_side.defrag(),
        nodes: s.stack_nodes,
        costs: s.costs,
    };
    let stack = replay_timeline(dir.path(), nodes, &stack_jobs, &stack_options)
        .await
        .expect("stack replay");
    Both {
        jobs,
        stack,
        pods: pods.clone(),
        nodes: nodes.clone(),
        end_ms,
        run,
    }
}

/// What one side says of a pod: when it started, where, on which devices; when it ended and
/// whether it was evicted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Said {
    pub start: Option<u64>,
    pub node: Option<String>,
    pub devices: Vec<String>,
    pub end: Option<u64>,
    pub evicted: bool,
}

impl Both {
    /// The simulator's pod `i`, within the replay's end.
    pub fn sim(&self, i: usize) -> Said {
        let (sim, end) = (&self.jobs[i], self.end_ms);
        let within = |t: Option<Ms>| t.map(|t| t.0).filter(|t| *t <= end);
        let start = within(sim.start);
        let node = &self.nodes[sim.node as usize];
        let mut devices: Vec<String> = match start {
            Some(_) => sim
                .gpus
                .iter()
                .map(|&(g, _)| node.gpus[g].id.clone())
                .collect(),
            None => Vec::new(),
        };
        devices.sort();
        let ended = within(sim.end);
        Said {
            start,
            node: start.map(|_| node.name.clone()),
            devices,
            end: ended,
            evicted: sim.evicted && ended.is_some(),
        }
    }

    /// The stack's pod `i`.
    pub fn stack(&self, i: usize) -> Said {
        let s = &self.stack[i];
        Said {
            start: s.start_ms,
            node: s.node.clone(),
            devices: s.devices.clone(),
            end: s.end_ms,
            evicted: s.evicted,
        }
    }

    /// The earliest difference (by the simulated time it shows), so a failure names its
    /// cause rather than its consequences.
    pub fn first_difference(&self) -> Option<(u64, String)> {
        let mut first: Option<(u64, String)> = None;
        for i in 0..self.jobs.len() {
            let (ours, theirs) = (self.sim(i), self.stack(i));
            let placed = |s: &Said| (s.start, s.node.clone(), s.devices.clone());
            let at = if placed(&ours) != placed(&theirs) {
                [ours.start, theirs.start].into_iter().flatten().min()
            } else if (ours.end, ours.evicted) != (theirs.end, theirs.evicted) {
                [ours.end, theirs.end].into_iter().flatten().min()
            } else {
                continue;
            };
            let at = at.unwrap_or(u64::MAX);
            if first.as_ref().is_none_or(|(t, _)| at < *t) {
                let what = format!(
                    "pod {i} (unit {}, arrived at {} ms, replaces {:?}): simulator {ours:?}, stack {theirs:?}",
                    self.jobs[i].unit, self.jobs[i].arrival.0, self.jobs[i].replaces
                );
                first = Some((at, what));
            }
        }
        first
    }

    /// Every pod either side ran on `node` from `from` ms on, by start (to see what held
    /// a device before a difference).
    pub fn on_node(&self, node: &str, from: u64) -> String {
        let mut lines: Vec<(u64, String)> = (0..self.jobs.len())
            .filter_map(|i| {
                let (ours, theirs) = (self.sim(i), self.stack(i));
                let here = |s: &Said| s.node.as_deref() == Some(node) && s.end.is_none_or(|e| e >= from);
                (here(&ours) || here(&theirs)).then(|| {
                    let start = ours.start.or(theirs.start).unwrap_or(0);
                    let p = &self.pods[self.jobs[i].pod as usize];
                    (start, format!(
                        "  pod {i} priority {} {}x{} milli, cpu {} memory {}, arrived {}: simulator {ours:?}, stack {theirs:?}",
                        p.priority, p.request.gpu_count, p.request.gpu_milli, p.request.cpu_milli,
                        p.request.memory_mib, self.jobs[i].arrival.0
                    ))
                })
            })
            .collect();
        lines.sort();
        lines
            .into_iter()
            .map(|l| l.1)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The pods that arrived, started or ended within 2 s of `at`, on both sides.
    pub fn around(&self, at: u64) -> String {
        let near = |t: Option<u64>| t.is_some_and(|t| t + 2_000 >= at && t <= at + 2_000);
        (0..self.jobs.len())
            .filter_map(|i| {
                let (ours, theirs) = (self.sim(i), self.stack(i));
                let arrived = self.jobs[i].arrival.0;
                let any = [ours.start, ours.end, theirs.start, theirs.end, Some(arrived)];
                let p = &self.pods[self.jobs[i].pod as usize];
                any.into_iter().any(near).then(|| {
                    format!(
                        "  pod {i} priority {} {}x{} milli, arrived {arrived}: simulator {ours:?}, stack {theirs:?}",
                        p.priority, p.request.gpu_count, p.request.gpu_milli
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
