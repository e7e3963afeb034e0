//! The timeline replay's event loop: arrivals, departures and the scheduler's queue in
//! simulated time, with core deciding every placement as in the scheduler.
//!
//! At each moment something happens (a pod leaves, a unit arrives, a backoff ends) the
//! departures are given back, the arrivals join the queue, and a round runs as the
//! scheduler's does: parked units wake when something left, units parked past the flush
//! interval wake, then every due unit is tried in queue order (priority, then arrival),
//! each placement taken before the next is tried, so a unit that does not fit is passed by
//! the ones behind it. A unit that fits nowhere backs off and is parked
//! ([`gpuplace_core::queue`], the scheduler's own queue). A gang is placed whole or not at
//! all. With preemption, a single pod that fits nowhere evicts lower-priority units chosen
//! by the scheduler's victim search; the victims go back to the queue (their controller
//! makes them again) and the work they had done is counted as lost.

mod arrive;
mod chain;
mod clock;
mod costs;
mod defrag;
mod defrag_state;
mod estimate;
mod estimating;
mod evictable;
mod fair;
mod fair_round;
mod freeing;
mod gpu_levels;
mod groups;
mod kept;
mod leaving;
mod members;
mod movable;
pub(crate) mod node_plans;
mod nominee;
mod once;
mod pace;
mod parked;
pub(crate) mod quiet;
mod quieting;
mod reclaim;
mod running;
mod soon;
mod steering;
mod units;
mod victims;
mod wakeups;
mod warm;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use gpuplace_core::cycle::{self, place::Trial};
use gpuplace_core::queue::store::ByIndex;
use gpuplace_core::queue::{Discipline, Entry, Queue};
use gpuplace_core::{ClusterState, Placer};

use super::arrivals::{Mix, Schedule};
use super::metrics::{Recorder, Values};
use super::options::{Costs, Ms, Patience, TimelineOptions, WarmAttempts};
use super::tenants::Tenants;
use crate::trace::TracePod;

pub use defrag_state::{DefragCounts, movable_pod};
pub(crate) use estimate::Errors as EstimateErrors;
pub use estimate::{EstimateRun, PartRun};
pub use fair::{QueueRun, TenantRun};
pub use units::Job;
use units::{Placed, Tried, Unit};

/// The workload a replay runs: the pod list, its mix of arrival units and run times, and
/// each pod's distinct request id (for the failure memo).
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub pods: &'a [TracePod],
    pub mix: &'a Mix,
    pub request_ids: &'a [u32],
}

/// What a replay leaves behind for the metrics.
pub struct Outcome {
    pub jobs: Vec<Job>,
    pub recorder: Recorder,
    pub preempted_pods: usize,
    pub preempted_milli: u64,
    /// Milli-GPU times milliseconds of work evicted before it finished.
    pub lost_milli_ms: u128,
    /// Units whose user deleted them while they waited.
    pub abandoned_units: usize,
    pub rounds: u64,
    pub attempts: u64,
    /// Attempts that left the unit waiting (`None` in a live report: the scheduler counts
    /// its own, kube-scheduler as `scheduler_schedule_attempts_total{result="unschedulable"}`).
    pub failed_attempts: Option<u64>,
    pub defrag: DefragCounts,
    pub tenants: Option<fair::TenantRun>,
    /// Per class, the expected starts' errors (with `--declared-share`).
    pub estimates: std::collections::BTreeMap<super::metrics::Class, estimate::EstimateRun>,
    /// How often the line was projected for them.
    pub projections: u64,
}

/// The replay of one (policy, seed).
pub struct Engine<'a> {
    pods: &'a [TracePod],
    mix: &'a Mix,
    /// Per pod, the id of its distinct request (for the failure memo).
    request_ids: &'a [u32],
    /// Per request id, a pod that asks it.
    shape_requests: Vec<u32>,
    preempt: bool,
    /// The warm start's waiting units failed before t=0 (their backoff over).
    warm_pending_due: bool,
    /// How many times they had been tried by then.
    warm_attempts: WarmAttempts,
    state: ClusterState,
    placer: Placer,
    queue: Queue<u32, Ms, ByIndex<Entry<Ms>>>,
    /// Under [`Discipline::KubeScheduler`]: its backoff queue's flush period (ms).
    queue_tick_ms: u64,
    jobs: Vec<Job>,
    units: Vec<Unit>,
    /// Units that joined the queue and were never tried.
    fresh: Vec<u32>,
    /// Due units a round had no time for (with an attempt cost): still in the active
    /// queue when the scheduler is next free.
    active: Vec<u32>,
    /// When the scheduler's attempt in flight ends (with an attempt cost; [`pace`]).
    busy_until: Ms,
    /// When units told when to look again (make-room's memo) are due, as (time, unit,
    /// failure count).
    wakes: BinaryHeap<Reverse<(Ms, u32, u32)>>,
    /// When failed units' parking ends: in time order.
    flushes: VecDeque<quiet::Flush>,
    /// Flushes known to fail, counted instead of made ([`quiet`]).
    quiet: quiet::Quiet,
    /// Wake-ups of units an event woke, due one initial backoff after their last attempt
    /// (bucketed by that time: a long backlog's trip through `wakes` was half a replay).
    soon: soon::Soon,
    /// Units whose backoff has ended but which were parked when last looked at: due once
    /// something wakes them. (An index over the queue so that a round looks at the units
    /// that can be due instead of every waiting one; which are due is still the queue's
    /// answer.)
    ready: Vec<u32>,
    /// Units that failed since they were last woken, by what could wake them: a wake-up
    /// makes them due sooner (the queue's initial backoff after their failure), which the
    /// wake-up entries must say.
    parked: parked::Parked,
    departures: BinaryHeap<Reverse<(Ms, u32)>>,
    running: running::Running,
    /// Running pods by priority, and their GPUs per node (no victim search where no
    /// eviction could make room).
    by_priority: evictable::ByPriority,
    /// What running pods hold per GPU, by node and priority (core's wake rule reads it).
    gpu_levels: gpu_levels::GpuLevels,
    /// Preemption's plans for pods alone, kept per node while the node is unchanged.
    node_plans: node_plans::NodePlans,
    /// Reclaim searches of pods alone that found nothing while nothing changed, the
    /// queues' holdings included.
    failed_reclaims: evictable::FailedSearches<Vec<gpuplace_core::fairshare::Res>>,
    /// Reclaim's candidates while nothing they read changed.
    reclaim_pool: Option<std::rc::Rc<groups::ReclaimPool>>,
    /// Make-room's movable units at a generation of the running pods and a time.
    movable_kept: std::cell::RefCell<Option<kept::MovableKept>>,
    /// Scratch for the victim search's grouping.
    unit_marks: std::cell::RefCell<kept::UnitMarks>,
    /// Per request id, the length of `released` when it last fitted nowhere (`u32::MAX`:
    /// never failed). Nodes nothing left since then only lost free resources, so the request
    /// fits somewhere only if it fits one of the nodes released since: those alone are
    /// checked. Exact: the same decisions as searching every node, without the search.
    failed_at: Vec<u32>,
    /// The node of every release (departure or eviction), in order.
    released: Vec<u32>,
    /// Whether [`Self::still_fails`] may answer (off only to check that it changes nothing).
    memo: bool,
    /// Scratch for [`Self::still_fails`]: each released node asked once (a set of the nodes
    /// seen was 6% of a gpuspec10 run at load 1.2).
    seen_nodes: once::OncePerPass,
    /// The nodes pods left since the last round (parked units they could help wake).
    left: Vec<u32>,
    sequence: u64,
    pending_milli: u64,
    waiting_pods: usize,
    measure_from: Ms,
    /// The last arrival: the replay's last round is at it.
    run_end: Ms,
    outcome_counts: Counts,
    defrag: defrag_state::DefragState,
    /// Tenants' queues (`--tenants`).
    tenants: Option<fair::FairState>,
    /// With tenants: the queues serve (else they only measure).
    queues_serve: bool,
    costs: Costs,
    checkpointed: bool,
    patience: Patience,
    /// The arrival seed (users' patience is drawn from it).
    seed: u64,
    /// Evicted pods' replacements, made by their controller later: (when, index into
    /// `recreations`).
    later: BinaryHeap<Reverse<(Ms, u32)>>,
    recreations: Vec<units::Recreation>,
    /// When waiting units' users give up: (when, unit).
    give_ups: BinaryHeap<Reverse<(Ms, u32)>>,
    /// Evicted pods, holding what their plan did not take of their place until they are
    /// gone (their grace period over): each then wakes the parked units, as the Pod's
    /// deletion does in the scheduler.
    leaving: leaving::Leaving,
    /// Expected starts told to waiting pods, and how good they were.
    estimates: estimate::Estimates,
}

#[derive(Default)]
struct Counts {
    preempted_pods: usize,
    preempted_milli: u64,
    lost_milli_ms: u128,
    abandoned_units: usize,
    rounds: u64,
    attempts: u64,
    failed_attempts: u64,
}

impl<'a> Engine<'a> {
    pub fn new(
        inputs: Inputs<'a>,
        state: ClusterState,
        placer: Placer,
        options: &TimelineOptions,
        tenants: Option<&Tenants>,
        seed: u64,
    ) -> Self {
        let nodes = state.len();
        let Inputs {
            pods,
            mix,
            request_ids,
        } = inputs;
        let distinct = request_ids.iter().max().map_or(0, |m| *m as usize + 1);
        let mut shape_requests = vec![0; distinct];
        for (pod, &rid) in request_ids.iter().enumerate().rev() {
            shape_requests[rid as usize] = pod as u32;
        }
        let capacity = [
            state.gpu_capacity_milli(),
            (0..state.len()).map(|n| state.inventory(n).cpu_milli).sum(),
            (0..state.len())
                .map(|n| state.inventory(n).memory_mib)
                .sum(),
        ];
        let tenants =
            tenants.map(|t| fair::FairState::new(t, capacity, options.usage_half_life_ms));
        let placer_seed = placer.seed();
        // kube-default and kube-dra model a stock cluster, whose queue is kube-scheduler's.
        let discipline = options
            .queue_model
            .unwrap_or(if placer.policy().is_kube_scheduler() {
                Discipline::KubeScheduler
            } else {
                Discipline::Gpuplace
            });
        Engine {
            pods,
            mix,
            request_ids,
            shape_requests,
            preempt: options.preempt,
            warm_pending_due: options.warm_pending_due,
            warm_attempts: options.warm_attempts.clone(),
            state,
            placer,
            queue: Queue::with_discipline(options.queue, discipline),
            queue_tick_ms: (options.kube_queue_tick.as_millis() as u64).max(1),
            jobs: Vec::new(),
            units: Vec::new(),
            fresh: Vec::new(),
            active: Vec::new(),
            busy_until: Ms(0),
            wakes: BinaryHeap::new(),
            flushes: VecDeque::new(),
            quiet: quiet::Quiet::for_run(discipline, options),
            soon: soon::Soon::default(),
            ready: Vec::new(),
            parked: parked::Parked::default(),
            departures: BinaryHeap::new(),
            running: Default::default(),
            by_priority: evictable::ByPriority::new(nodes),
            gpu_levels: gpu_levels::GpuLevels::new(nodes),
            unit_marks: Default::default(),
            movable_kept: Default::default(),
            node_plans: Default::default(),
            failed_reclaims: Default::default(),
            reclaim_pool: None,
            failed_at: vec![u32::MAX; distinct],
            released: Vec::new(),
            seen_nodes: Default::default(),
            memo: true,
            left: Vec::new(),
            sequence: 0,
            pending_milli: 0,
            waiting_pods: 0,
            measure_from: Ms(0),
            run_end: Ms(u64::MAX),
            outcome_counts: Counts::default(),
            defrag: defrag_state::DefragState::new(options.defrag.clone(), placer_seed),
            tenants,
            queues_serve: options.queues_serve,
            costs: options.costs,
            checkpointed: options.checkpointed,
            patience: options.patience,
            seed,
            later: BinaryHeap::new(),
            recreations: Vec::new(),
            give_ups: BinaryHeap::new(),
            leaving: leaving::Leaving::default(),
            estimates: estimate::Estimates::new(options.declared_share),
        }
    }

    /// Searches every node on every attempt (the reference the failure memo is checked
    /// against).
    #[cfg(test)]
    pub fn without_memo(mut self) -> Self {
        self.memo = false;
        self
    }

    /// Runs `schedule`, measuring from the arrival at index `warmup` to the last one.
    pub fn run(mut self, schedule: &Schedule, warmup: usize, points: usize) -> Outcome {
        let arrivals = &schedule.arrivals;
        let end = arrivals.last().map_or(Ms(0), |a| a.at);
        self.run_end = end;
        self.measure_from = arrivals
            .get(warmup.min(arrivals.len().saturating_sub(1)))
            .map_or(Ms(0), |a| a.at);
        let mut recorder = Recorder::new(
            self.measure_from,
            end,
            self.state.gpu_capacity_milli(),
            points,
        );
        for warm in &schedule.warm {
            self.admit(warm.template, Ms(0), Some(warm.left), None);
        }
        let mut now = Ms(0);
        let mut next = 0;
        if !schedule.warm.is_empty() {
            // The warm start is the cluster before the clock starts: its round takes no
            // time, as a live replay places it with the clock stopped.
            self.round(now, None, clock::AttemptCosts::default());
            self.warm_leftovers(now);
        }
        loop {
            // A busy scheduler takes up what became due once its attempt in flight ends.
            let busy = self.busy_until;
            let other = [
                arrivals.get(next).map(|a| a.at),
                self.departures.peek().map(|d| d.0.0),
                self.next_wake_but_flushes().map(|w| w.max(busy)),
                self.resume_at().map(|r| r.max(now)),
                self.later.peek().map(|r| r.0.0),
                self.give_ups.peek().map(|g| g.0.0),
                self.leaving.next(),
                self.next_steer_check(),
            ]
            .into_iter()
            .flatten()
            .min();
            // Instants where only quiet turns are due, and all are quiet, pass here.
            self.quiet_instants_before(other, end, &mut recorder);
            let flush = self.next_flush().map(|w| w.max(busy));
            let at = other.into_iter().chain(flush).min();
            let Some(at) = at.filter(|t| *t <= end) else {
                break;
            };
            recorder.advance(at, self.values());
            if let Some(t) = &mut self.tenants {
                t.advance(at, self.measure_from);
            }
            now = at;
            while let Some(&Reverse((t, job))) = self.departures.peek()
                && t <= now
            {
                self.departures.pop();
                self.depart(job, now, false);
            }
            self.gone_due(now);
            self.recreate_due(now);
            while let Some(a) = arrivals.get(next)
                && a.at <= now
            {
                self.admit(a.template, now, None, Some(next as u64));
                next += 1;
            }
            self.give_up_due(now);
            self.bind_freed_replacements(now);
            let costs = clock::AttemptCosts {
                failed: self.costs.attempt,
                placed: self.costs.placed_attempt,
            };
            self.round(now, arrivals.get(next).map(|a| a.at), costs);
            if next == arrivals.len() && now >= end {
                break;
            }
        }
        recorder.advance(end, self.values());
        #[cfg(debug_assertions)]
        self.check_queue_demand();
        if let Some(t) = &mut self.tenants {
            t.advance(end, self.measure_from);
        }
        let tenants = self
            .tenants
            .as_ref()
            .map(|t| t.report(&self.queue_waits(end)));
        self.count_pods_attempts();
        let counts = self.outcome_counts;
        Outcome {
            jobs: self.jobs,
            recorder,
            preempted_pods: counts.preempted_pods,
            preempted_milli: counts.preempted_milli,
            lost_milli_ms: counts.lost_milli_ms,
            abandoned_units: counts.abandoned_units,
            rounds: counts.rounds,
            attempts: counts.attempts,
            failed_attempts: Some(counts.failed_attempts),
            defrag: self.defrag.counts,
            tenants,
            estimates: self.estimates.report(),
            projections: self.estimates.projections,
        }
    }

    fn values(&self) -> Values {
        Values {
            allocated_milli: self.state.gpu_allocated_milli(),
            frag_milli: self.state.total_frag(),
            pending_milli: self.pending_milli,
            waiting: self.waiting_pods,
        }
    }

    /// One scheduling round at `now` (see the module's text), its attempts taking their
    /// `costs` one after another until the next event ([`pace`]; `next_arrival`: the next
    /// unit to arrive).
    fn round(&mut self, now: Ms, next_arrival: Option<Ms>, costs: clock::AttemptCosts) {
        if !self.left.is_empty() {
            self.wake_parked(now);
        }
        if now < self.busy_until {
            // An attempt is in flight: what is due waits for it in the active queue.
            return;
        }
        self.outcome_counts.rounds += 1;
        let due = self.due(now);
        let horizon = if costs.is_free() {
            None
        } else {
            self.horizon(now, next_arrival)
        };
        let mut timer = clock::AttemptClock::new(now, horizon, costs);
        let attempts = self.fair_round(due, &mut timer);
        self.busy_until = timer.free_at();
        self.active = attempts.left;
        for attempt in attempts.done {
            self.attempted(attempt);
        }
        // After the round's decisions, as the scheduler rebalances.
        self.maybe_rebalance(now);
    }

    /// The queue's bookkeeping after one attempt.
    fn attempted(&mut self, attempt: clock::Attempt) {
        let clock::Attempt {
            unit,
            tried,
            at: now,
        } = attempt;
        if let Tried::Quiet(fails, turn) = tried {
            self.quiet_attempted(unit, fails, turn, now);
            return;
        }
        if tried == Tried::Started {
            self.quiet_ends(unit);
            self.units[unit as usize].waiting = false;
            self.estimate_left_line(unit);
            self.queue.forget(&unit);
            return;
        }
        // A parked unit is due only once an event wakes it (then `backing_off` queues its
        // wake-up) or its parking is flushed (the flush entry): a wake-up at its backoff's
        // end would find it still parked. Only a unit told when to look again needs one.
        let due = match tried {
            Tried::Later(at) => {
                self.queue.retry_at(&unit, now, at);
                self.queue.due_at(&unit)
            }
            _ => {
                self.queue.unschedulable(&unit, now);
                None
            }
        };
        let flush = self.queue.config().unschedulable_flush;
        let first = self.units[unit as usize].fails == 0;
        self.estimate_failed(unit, now, first);
        self.tally_failure(unit);
        let kube = self.queue.discipline() == Discipline::KubeScheduler;
        let tick = self.queue_tick_ms;
        let slot = self.park_slot(unit, tried);
        let fails = self.units[unit as usize].fails;
        let quiet = self.quiet_after_failure(unit, fails, slot);
        let u = &mut self.units[unit as usize];
        u.failed_at = now;
        if u.parked != Some(slot) {
            u.parked = Some(slot);
            self.parked.push(unit, u.key, slot);
        }
        if let Some(due) = due {
            let due = if kube {
                soon::next_tick(due, tick)
            } else {
                due
            };
            self.wakes.push(Reverse((due, unit, u.fails)));
        }
        // kube-scheduler looks for pods parked too long every 30 ticks, and only moves
        // those parked longer than the interval.
        let flush_at = if kube {
            soon::next_tick(now + flush + Duration::from_millis(1), 30 * tick)
        } else {
            now + flush
        };
        self.flushes.push_back(quiet::Flush {
            at: flush_at,
            unit,
            fails,
            quiet,
        });
    }

    /// Filter, Score and Reserve for `unit`'s members on the live state (core's
    /// [`cycle::place::trial`]; a nominee's hold lifted by its cycle); nothing when a
    /// single pod's request is known to fit nowhere still.
    fn trial(
        &mut self,
        unit: u32,
        narrow: Option<&[bool]>,
        nominated: &[(u32, usize)],
    ) -> Trial<Placed, ()> {
        self.outcome_counts.attempts += 1;
        let single = match self.units[unit as usize].single {
            Some(one) => {
                let rid = one.rid as usize;
                if self.still_fails(rid) {
                    return Trial::failed(None);
                }
                Some(rid)
            }
            None => None,
        };
        let trial = {
            let mut members = members::Members {
                state: &mut self.state,
                pods: self.pods,
                jobs: &self.jobs,
                members: &self.units[unit as usize].jobs,
                nominated,
            };
            cycle::place::trial(&mut members, &mut self.placer, narrow)
        };
        // A failure within a queue's model limits says nothing of the request elsewhere.
        if let Some(rid) = single
            && trial.placed.is_empty()
            && narrow.is_none()
        {
            self.failed_at[rid] = self.released.len() as u32;
        }
        trial
    }

    /// `job` was decided at `now` where it was placed (its GPUs already taken in the state):
    /// its Binding is written once `room_in` has passed (victims leaving) and the bind
    /// latency, its container runs after the start cost, and it leaves when its run ends.
    fn start(&mut self, job: u32, placed: Placed, now: Ms, room_in: std::time::Duration) {
        let bound = now + room_in + self.costs.bind_latency;
        let work_from = bound + self.costs.start;
        let j = &mut self.jobs[job as usize];
        j.placed_at = Some(now);
        j.placed_round = self.outcome_counts.rounds;
        j.start = Some(bound);
        self.estimate_started(job, bound);
        let j = &mut self.jobs[job as usize];
        j.work_from = Some(work_from);
        j.node = placed.node as u32;
        j.gpus = placed.gpus;
        let request = &self.pods[j.pod as usize];
        self.pending_milli -= request.request.total_gpu_milli();
        self.waiting_pods -= 1;
        self.by_priority
            .started(placed.node, request.priority, &request.request);
        self.gpu_levels
            .started(placed.node, request.priority, &j.gpus);
        self.departures
            .push(Reverse((Ms(work_from.0 + j.run_ms), job)));
        let made = self.made(job);
        let j = &self.jobs[job as usize];
        let started = running::Started {
            unit: j.unit,
            alone: self.units[j.unit as usize].jobs.len() == 1,
            pod: j.pod,
            decided: now,
            work_from,
        };
        self.running.start(made, placed.node, started);
        self.fair_started(job, placed.node);
    }

    /// `job` leaves at `now` (finished, or evicted); a stale departure of a job evicted
    /// earlier is ignored.
    fn depart(&mut self, job: u32, now: Ms, evicted: bool) {
        let (node, unit) = (self.jobs[job as usize].node, self.jobs[job as usize].unit);
        if !self.running.end(self.made(job), node as usize, unit) {
            return;
        }
        let j = &mut self.jobs[job as usize];
        let pod = &self.pods[j.pod as usize];
        let given = self.state.release(j.node as usize, &pod.request, &j.gpus);
        // Each job gives back exactly what it took.
        debug_assert!(given.is_ok(), "timeline replay: {given:?}");
        j.end = Some(now);
        j.evicted = evicted;
        self.by_priority
            .left(j.node as usize, pod.priority, &pod.request);
        self.gpu_levels.left(j.node as usize, pod.priority, &j.gpus);
        let node = j.node as usize;
        self.released.push(j.node);
        if !evicted {
            self.estimate_ended(job);
        }
        if evicted {
            // Terminating until its grace period ends: what its plan does not take of its
            // place is still its until then ([`Self::hold_remains`]).
            self.leaving.evicted(job);
        } else {
            self.left.push(node as u32);
        }
        self.fair_departed(job, node);
    }
}
