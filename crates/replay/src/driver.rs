//! The replay's clock: pods created at their arrivals (simulated time over `speed`), each
//! deleted when its run ends (from the Binding the watch shows), and, as a controller
//! would, an evicted pod created again with its whole run ahead. On fake nodes the driver
//! also plays the kubelet: a pod someone deletes gracefully is gone at once (no container
//! holds it). Every object carries the run's label, so a clean-up
//! deletes exactly what the replay made, whatever stopped it.
//!
//! The warm start is the cluster as it stands at simulated time 0 (the simulator places it
//! in one round before the first arrival): the driver creates it with the clock stopped,
//! waits until the scheduler has bound it (or has bound none of it for [`WARM_QUIET`]),
//! and starts the clock then. Started earlier, the first arrivals would queue behind
//! thousands of warm-start creations and be made seconds (tens of simulated seconds) late.
//! The warm start is created one pod at a time, in the simulator's order: made 16 at a
//! time, creations complete in any order, a scheduler's round sees pods 0, 4 and 9 before
//! pod 1, and from the second pod on its places differ from the simulator's (found on the
//! real API server: 334 of 4,055 warm-start pods where the simulator put them).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use gpuplace_model::{Assignment, NodeInventory};
use gpuplace_sim::timeline::Ms;
use gpuplace_sim::timeline::observed::{Life, LiveCounts};
use gpuplace_sim::trace::TracePod;
use tokio::sync::watch;

use crate::api::{ApiError, Object, PodSeen, PodState, ReplayApi};
pub use crate::error::ReplayError;
use crate::flights::{create_flight, delete_flight, heartbeat_flight, settle};
use crate::objects::{self, ObjectError, PodTemplate};
use crate::plan::Plan;

/// The warm start is taken as placed once this long passes without a Binding of one of its
/// pods (the rest wait, as in the simulator, from time 0), by default
/// ([`DriverConfig::warm_quiet`]).
pub const WARM_QUIET: Duration = Duration::from_secs(2);

/// How a replay runs.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Simulated seconds per real second.
    pub speed: f64,
    /// The nodes are the replay's fakes: nobody else runs their pods' containers.
    pub fake_nodes: bool,
    pub template: PodTemplate,
    /// Creations and deletions in flight at once.
    pub in_flight: usize,
    /// How long the pod watch may fail without a break before the replay gives up.
    pub watch_patience: Duration,
    /// How often fake nodes' heartbeats are renewed (zero: never).
    pub heartbeat: Duration,
    /// How long without a Binding ends the warm start ([`WARM_QUIET`]; longer where a
    /// pod's first attempt waits for its claim to be made, as with DRA).
    pub warm_quiet: Duration,
}

/// Where a replay stands, for a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub simulated_ms: u64,
    pub end_ms: u64,
    pub created: usize,
    pub waiting: usize,
    pub bound: usize,
    pub finished: usize,
    pub evicted: usize,
}

/// What a replay saw.
#[derive(Clone, Debug, Default)]
pub struct ReplayOutcome {
    /// Every pod's life, in creation order.
    pub lives: Vec<Life>,
    pub counts: LiveCounts,
    /// Requests the driver made (creations, deletions, retries included).
    pub requests: u64,
    /// How far behind its arrival each unit after the warm start was created, real ms:
    /// p50, p99, most.
    pub creation_lag_ms: [f64; 3],
    /// How much longer than its run each pod that ran to its end held its node (the
    /// deletion's request and the watch that shows it gone), real ms: p50, p99, most.
    pub deletion_lag_ms: [f64; 3],
    /// How long the warm start took to create and place, with the clock stopped.
    pub warm_wall: Duration,
    /// Warm-start pods bound before the clock started, of how many.
    pub warm_bound: [usize; 2],
    pub wall: Duration,
}

pub use crate::prepare::prepare;

/// A pod the driver made, by its Kubernetes name.
struct Made {
    /// Index into the plan's pods.
    planned: usize,
    /// Index into the lives.
    life: usize,
    /// The replay asked for its deletion (its run ended).
    deleting: bool,
    gone: bool,
    /// The watch has shown it: until then its creation may be in flight, and a relist that
    /// lacks it says nothing of it.
    seen: bool,
}

/// The replay's state while it runs.
struct Run<'a> {
    plan: &'a Plan,
    pods: &'a [TracePod],
    node_index: &'a HashMap<String, (usize, NodeInventory)>,
    config: &'a DriverConfig,
    /// When simulated time 0 was (none while the warm start is being placed).
    start: Option<Instant>,
    /// The warm start's pods, bound of them, and when the last one was bound or created.
    warm: WarmStart,
    made: HashMap<String, Made>,
    lives: Vec<Life>,
    /// Deletions due, (simulated ms, pod name).
    due: BinaryHeap<Reverse<(u64, String)>>,
    /// Controllers' new pods to make, (planned index, run ms).
    recreate: Vec<usize>,
    recreated: HashMap<usize, u32>,
    /// By planned index, the life of its pod last evicted (its controller's new pod
    /// replaces that one).
    evicted_life: HashMap<usize, u32>,
    counts: LiveCounts,
    lag_ms: Vec<f64>,
    progress: Progress,
}

/// The warm start while it is placed.
struct WarmStart {
    units: usize,
    pods: usize,
    bound: usize,
    began: Instant,
    last: Instant,
}

impl WarmStart {
    fn new(plan: &Plan, units: &[Vec<usize>]) -> Self {
        let now = Instant::now();
        WarmStart {
            units: units.iter().take_while(|u| plan.pods[u[0]].warm).count(),
            pods: plan.pods.iter().filter(|p| p.warm).count(),
            bound: 0,
            began: now,
            last: now,
        }
    }

    /// Every warm-start unit created (`next_unit` past them, no flight left) and either
    /// every pod bound or none bound for `quiet`.
    fn placed(&self, next_unit: usize, flights: usize, quiet: Duration) -> bool {
        next_unit >= self.units
            && flights == 0
            && (self.bound >= self.pods || self.last.elapsed() >= quiet)
    }
}

impl Run<'_> {
    /// Simulated ms since time 0 (0 until the clock starts).
    fn now_ms(&self) -> u64 {
        self.start.map_or(0, |start| {
            (start.elapsed().as_secs_f64() * self.config.speed * 1000.0) as u64
        })
    }

    /// When simulated `ms` is in real time (soon, while the clock is stopped).
    fn real_at(&self, ms: u64) -> Instant {
        match self.start {
            Some(start) => start + Duration::from_secs_f64(ms as f64 / 1000.0 / self.config.speed),
            None => Instant::now() + Duration::from_millis(50),
        }
    }

    /// The objects of planned pods `range` (one unit), recorded as made.
    fn unit_objects(
        &mut self,
        planned: &[usize],
        by_controller: bool,
    ) -> Result<Vec<Object>, ObjectError> {
        let mut out = Vec::new();
        let now = self.now_ms();
        for &i in planned {
            let p = &self.plan.pods[i];
            if !by_controller && let Some(g) = p.gang.as_ref().filter(|_| i == planned[0]) {
                let t = &self.config.template;
                let group = objects::pod_group(&t.run, &t.namespace, &g.name, g.members);
                out.push(Object::PodGroup(Box::new(group)));
            }
            let name = if by_controller {
                let n = self.recreated.entry(i).or_insert(0);
                *n += 1;
                format!("{}-r{n}", p.name)
            } else {
                p.name.clone()
            };
            let request = &self.pods[p.pod as usize].request;
            let pod = objects::pod(&self.config.template, p, &name, request)?;
            out.push(Object::Pod(Box::new(pod)));
            self.made.insert(
                name,
                Made {
                    planned: i,
                    life: self.lives.len(),
                    deleting: false,
                    gone: false,
                    seen: false,
                },
            );
            self.lives.push(Life {
                pod: p.pod,
                unit: p.unit,
                arrival: Ms(now),
                run_ms: if by_controller { p.full_ms } else { p.run_ms },
                full_ms: p.full_ms,
                measured: p.measured && !by_controller,
                bound: None,
                end: None,
                evicted: false,
                by_controller,
                node: None,
                gpus: None,
                replaces: if by_controller {
                    self.evicted_life.get(&i).copied()
                } else {
                    None
                },
            });
            self.progress.created += 1;
            self.progress.waiting += 1;
        }
        Ok(out)
    }

    /// A pod's Binding (or its deletion) as the watch shows it.
    fn seen(&mut self, state: PodState) -> Option<String> {
        let now = self.now_ms();
        let made = self.made.get_mut(&state.name)?;
        made.seen = true;
        let life = &mut self.lives[made.life];
        if let (Some(node), None) = (&state.node, life.bound) {
            life.bound = Some(Ms(now.max(life.arrival.0)));
            if self.start.is_none() && self.plan.pods[made.planned].warm {
                self.warm.bound += 1;
                self.warm.last = Instant::now();
            }
            self.progress.waiting = self.progress.waiting.saturating_sub(1);
            self.progress.bound += 1;
            if let Some((n, inv)) = self.node_index.get(node) {
                life.node = Some(*n);
                life.gpus = state
                    .assignment
                    .as_deref()
                    .and_then(|a| gpus_of(a, inv, &self.pods[life.pod as usize].request));
            }
            self.due
                .push(Reverse((now + life.run_ms, state.name.clone())));
        }
        // Someone else is deleting it gracefully; on a fake node nothing holds it.
        (state.terminating && !made.deleting && self.config.fake_nodes).then_some(state.name)
    }

    /// A pod gone: its run's end, or an eviction (then its controller makes another).
    fn gone(&mut self, name: &str) {
        let now = self.now_ms();
        let Some(made) = self.made.get_mut(name) else {
            return;
        };
        if made.gone {
            return;
        }
        made.gone = true;
        let life = &mut self.lives[made.life];
        life.end = Some(Ms(now.max(life.arrival.0)));
        if life.bound.is_none() {
            self.progress.waiting = self.progress.waiting.saturating_sub(1);
        } else {
            self.progress.bound = self.progress.bound.saturating_sub(1);
        }
        if made.deleting {
            self.progress.finished += 1;
        } else {
            life.evicted = true;
            self.progress.evicted += 1;
            if life.bound.is_some() {
                self.counts.preempted_pods += 1;
                self.counts.preempted_milli +=
                    self.pods[life.pod as usize].request.total_gpu_milli();
            }
            self.evicted_life.insert(made.planned, made.life as u32);
            self.recreate.push(made.planned);
        }
    }
}

/// The GPU positions of gpuplace's recorded assignment on `inventory`.
fn gpus_of(
    assignment: &str,
    inventory: &NodeInventory,
    request: &gpuplace_model::Request,
) -> Option<Vec<(usize, u32)>> {
    let a = Assignment::from_json(assignment).ok()?;
    let mut out = Vec::new();
    for c in &a.containers {
        for d in &c.devices {
            let g = inventory.gpus.iter().position(|g| g.id == d.id)?;
            out.push((g, request.gpu_milli));
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Replays `plan` (pods asking `pods`' requests) until its last arrival; `node_index` maps
/// node names to the workload's node index and inventory (as the replay named them).
#[allow(clippy::too_many_arguments)]
pub async fn run<A: ReplayApi>(
    api: &A,
    plan: &Plan,
    pods: &[TracePod],
    node_index: &HashMap<String, (usize, NodeInventory)>,
    config: &DriverConfig,
    mut cancel: watch::Receiver<bool>,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<ReplayOutcome, ReplayError> {
    if !(config.speed.is_finite() && config.speed > 0.0 && config.speed <= 100_000.0) {
        return Err(ReplayError::Speed(config.speed));
    }
    let mut watch = api.watch_pods();
    // The warm start begins once the watch is live (its first listing is in); the clock
    // starts once the warm start is placed.
    await_listing(&mut watch, &mut cancel, config.watch_patience).await?;
    let units = units_of(plan);
    let mut run = Run {
        plan,
        pods,
        node_index,
        config,
        start: None,
        warm: WarmStart::new(plan, &units),
        made: HashMap::new(),
        lives: Vec::new(),
        due: BinaryHeap::new(),
        recreate: Vec::new(),
        recreated: HashMap::new(),
        evicted_life: HashMap::new(),
        counts: LiveCounts::default(),
        lag_ms: Vec::new(),
        progress: Progress {
            end_ms: plan.end_ms,
            ..Progress::default()
        },
    };
    let mut next_unit = 0;
    let mut requests = 0u64;
    // Declared before the flights that borrow it.
    let beating: Vec<String> = if config.fake_nodes && !config.heartbeat.is_zero() {
        node_index.keys().cloned().collect()
    } else {
        Vec::new()
    };
    let mut flights = FuturesUnordered::new();
    let mut last_progress = Instant::now();
    let mut failing_since: Option<Instant> = None;
    let tick = Duration::from_millis(20);
    let mut last_beat = Instant::now();
    loop {
        if !beating.is_empty() && last_beat.elapsed() >= config.heartbeat {
            last_beat = Instant::now();
            flights.push(heartbeat_flight(api, &config.template.run, &beating));
        }
        if run.start.is_none() && run.warm.placed(next_unit, flights.len(), config.warm_quiet) {
            run.start = Some(Instant::now());
        }
        let now = run.now_ms().min(plan.end_ms);
        // Creations and deletions due, within the flights allowed (while the clock is
        // stopped, the warm start alone).
        let in_flight = if run.start.is_none() {
            1
        } else {
            config.in_flight
        };
        while flights.len() < in_flight {
            let unit = units.get(next_unit).filter(|u| {
                plan.pods[u[0]].arrival_ms <= now
                    && (run.start.is_some() || next_unit < run.warm.units)
            });
            let objects = if let Some(i) = run.recreate.pop() {
                run.unit_objects(&[i], true)?
            } else if let Some(unit) = unit {
                next_unit += 1;
                // The warm start is made at once; its lag says nothing of the pace.
                let first = &plan.pods[unit[0]];
                if !first.warm {
                    let lag = now.saturating_sub(first.arrival_ms) as f64 / config.speed;
                    run.lag_ms.push(lag);
                }
                if run.start.is_none() {
                    run.warm.last = Instant::now();
                }
                run.unit_objects(unit, false)?
            } else {
                break;
            };
            flights.push(create_flight(api, objects));
        }
        while flights.len() < config.in_flight
            && let Some(Reverse((at, _))) = run.due.peek()
            && *at <= now
        {
            let Some(Reverse((_, name))) = run.due.pop() else {
                break;
            };
            if let Some(m) = run.made.get_mut(&name).filter(|m| !m.gone) {
                m.deleting = true;
                flights.push(delete_flight(api, name));
            }
        }
        if run.start.is_some() && now >= plan.end_ms && next_unit == units.len() {
            break;
        }
        let wake = [
            units.get(next_unit).map(|u| plan.pods[u[0]].arrival_ms),
            run.due.peek().map(|Reverse((at, _))| *at),
            Some(plan.end_ms),
        ]
        .into_iter()
        .flatten()
        .min()
        .map_or(Instant::now() + tick, |ms| run.real_at(ms))
        .max(Instant::now() + Duration::from_millis(1))
        .min(Instant::now() + Duration::from_millis(500));
        tokio::select! {
            changed = cancel.changed() => {
                if changed.is_err() || *cancel.borrow() {
                    return Err(ReplayError::Interrupted);
                }
            }
            seen = watch.next() => match seen {
                Some(Ok(seen)) => {
                    failing_since = None;
                    // Played kubelet: the evicted pod's container is gone at once.
                    for name in handle_seen(&mut run, seen) {
                        flights.push(delete_flight(api, name));
                    }
                }
                Some(Err(e)) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > config.watch_patience {
                        return Err(ReplayError::Watch(config.watch_patience, e));
                    }
                }
                None => return Err(ReplayError::Watch(Duration::ZERO,
                    ApiError::Unavailable("the pod watch ended".into()))),
            },
            Some(flight) = flights.next(), if !flights.is_empty() => {
                requests += settle(flight)?;
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        if last_progress.elapsed() >= Duration::from_millis(250) {
            run.progress.simulated_ms = run.now_ms().min(plan.end_ms);
            progress(&run.progress);
            last_progress = Instant::now();
        }
    }
    run.progress.simulated_ms = plan.end_ms;
    progress(&run.progress);
    // Pods that ran to their end: how much longer than their run they held their node.
    let held: Vec<f64> = run
        .lives
        .iter()
        .filter(|l| !l.evicted)
        .filter_map(|l| Some(l.end?.0.saturating_sub(l.bound?.0 + l.run_ms)))
        .map(|ms| ms as f64 / config.speed)
        .collect();
    let start = run.start.unwrap_or(run.warm.began);
    Ok(ReplayOutcome {
        creation_lag_ms: spread(run.lag_ms.clone()),
        deletion_lag_ms: spread(held),
        warm_wall: start.duration_since(run.warm.began),
        warm_bound: [run.warm.bound, run.warm.pods],
        lives: run.lives,
        counts: run.counts,
        requests,
        wall: run.warm.began.elapsed(),
    })
}

/// p50, p99 and the most of `values`.
fn spread(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        values
            .get(((values.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    [at(0.5), at(0.99), values.last().copied().unwrap_or(0.0)]
}

/// Waits for the watch's first listing; an interrupt or a watch failing for `patience`
/// ends the wait with its error.
async fn await_listing(
    watch: &mut futures::stream::BoxStream<'static, Result<PodSeen, ApiError>>,
    cancel: &mut watch::Receiver<bool>,
    patience: Duration,
) -> Result<(), ReplayError> {
    let mut failing_since: Option<Instant> = None;
    loop {
        let seen = tokio::select! {
            changed = cancel.changed() => {
                if changed.is_err() || *cancel.borrow() {
                    return Err(ReplayError::Interrupted);
                }
                continue;
            }
            seen = watch.next() => seen,
        };
        match seen {
            Some(Ok(PodSeen::Listed(_))) => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > patience {
                    return Err(ReplayError::Watch(patience, e));
                }
                // A watch that fails at once must not spin.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None => {
                return Err(ReplayError::Watch(
                    Duration::ZERO,
                    ApiError::Unavailable("the pod watch ended".into()),
                ));
            }
        }
    }
}

/// What the watch said, applied; returns pods to delete now (played kubelet).
fn handle_seen(run: &mut Run<'_>, seen: PodSeen) -> Vec<String> {
    match seen {
        PodSeen::Changed(state) => run.seen(state).into_iter().collect(),
        PodSeen::Gone(name) => {
            run.gone(&name);
            Vec::new()
        }
        PodSeen::Listed(names) => {
            let listed: std::collections::HashSet<String> = names.into_iter().collect();
            // Only pods the watch showed before: one whose creation is in flight (or
            // answered after the list was taken) is not in the list and not gone; taking it
            // for evicted would make its controller's pod while it comes.
            let missing: Vec<String> = run
                .made
                .iter()
                .filter(|(n, m)| m.seen && !m.gone && !listed.contains(*n))
                .map(|(n, _)| n.clone())
                .collect();
            for name in missing {
                run.gone(&name);
            }
            Vec::new()
        }
    }
}

/// The plan's pods grouped by unit, in order.
fn units_of(plan: &Plan) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, p) in plan.pods.iter().enumerate() {
        match out.last_mut() {
            Some(last) if plan.pods[last[0]].unit == p.unit => last.push(i),
            _ => out.push(vec![i]),
        }
    }
    out
}
