//! The scheduler, staged as kube-scheduler's framework: a [`queue`] of pods (active,
//! backoff, parked until a cluster event), the filter stage ([`crate::framework`]), core's decision of the
//! node and exact GPUs, an [`assume`]d reservation made at once, the gang stage
//! ([`gang_permit`]), and the [`bind`] stage that writes off the decision path. The loop
//! that drives rounds on watch events and owns leadership is in [`run`].
//!
//! A round takes the cache's view only when something changed (a watch event, a write's
//! outcome, a backoff that ended); it decides pod after pod, each decision reserving its
//! GPUs in the state before the next one is made, and hands the Bindings to the bind stage.

mod carry;
mod chain;
pub mod defrag;
pub(crate) mod events;
pub use events::SAME_MEANING_FOR;
mod fair_round;
mod first_available;
mod gang_permit;
mod gang_status;
mod gangs;
mod left;
mod line;
mod make_room;
mod make_room_gang;
mod moves;
mod observe;
mod post_filter;
pub mod preempt;
mod queue_status;
mod rebalance;
mod reclaim;
mod room_shape;
mod round;
mod round_state;
pub mod run;
mod units;
mod usage;
mod usage_watch;
mod waiting;
mod wakes;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuplace_core::{Placer, Policy};

pub use crate::shared::assume::{Reservation, Reservations};
pub use crate::shared::bind::{WriteFailure, WriteOutcome};
pub use gpuplace_core::queue::QueueConfig;
pub use queue_status::QueueFigures;
pub(crate) use units::Unit;

/// The scheduling queue's attempt state, by pod UID (see [`gpuplace_core::queue`]).
pub type Queue = gpuplace_core::queue::Queue<String, Instant>;

use crate::api::ClusterApi;
use crate::k8s::leader::Gate;

/// What the scheduler is configured with.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub scheduler_name: String,
    pub policy: Policy,
    /// Score nodes by a weighted sum of these policies instead of `policy` alone (which
    /// still picks the GPU of a fractional request). Empty: `policy` alone.
    pub weights: Vec<(Policy, i64)>,
    pub gpu_resource: String,
    pub seed: u64,
    pub queue: QueueConfig,
    /// Bindings in flight at once.
    pub max_in_flight: usize,
    /// Decisions one round makes at most; the pods it does not reach go in the next round,
    /// which starts at once. A round holds what it decided (reservations, Bindings, the
    /// pods' versions it saw) until it ends: one round over 40,000 pending pods lasted
    /// most of a minute and held them all.
    pub max_round_decisions: usize,
    /// Attempts at a single pod's Binding before it goes back to the queue.
    pub bind_attempts: u32,
    /// Attempts at a gang member's Binding (its gang is reserved whole: keep trying).
    pub gang_bind_attempts: u32,
    /// FGD's target workload as the operator declares it (e.g. the shapes of a pod list of
    /// the cluster's history); `None`: the shapes of the pods the cluster runs and is asked
    /// to run, recomputed every round.
    pub workload: Option<std::sync::Arc<gpuplace_core::TargetWorkload>>,
    /// Moving pods that opted in (see [`defrag`]).
    pub defrag: defrag::DefragConfig,
    /// The half-life of the usage over time of queues whose tree sets none (ms; 0: fair
    /// order by the allocation now).
    pub usage_half_life_ms: u64,
    /// Which DRA claims are gpuplace's to allocate.
    pub dra: crate::k8s::dra::DraSettings,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: "gpuplace".into(),
            policy: Policy::DEFAULT,
            weights: Vec::new(),
            gpu_resource: gpuplace_model::keys::GPU_RESOURCE.into(),
            seed: 42,
            queue: QueueConfig::default(),
            max_in_flight: 16,
            max_round_decisions: 4096,
            bind_attempts: 3,
            gang_bind_attempts: 30,
            workload: None,
            defrag: defrag::DefragConfig::default(),
            usage_half_life_ms: 0,
            dra: Default::default(),
        }
    }
}

/// What one round (or one settling of writes) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Bindings in flight, reservations held and Events dropped so far, when it ended.
    pub in_flight: usize,
    pub reservations: usize,
    pub events_dropped: u64,
    /// Events waiting to be sent when it ended.
    pub events_queued: usize,
    /// Nothing changed since the last round: no view was built.
    pub idle: bool,
    /// It stopped at `max_round_decisions`: the next round is due at once.
    pub more: bool,
    /// Decisions made (reservations taken, Bindings handed to the bind stage).
    pub assumed: usize,
    /// Bindings the server accepted.
    pub bound: usize,
    pub unschedulable: usize,
    /// Pods evicted by preemption.
    pub preempted: usize,
    /// Pods moved to make room for a pod or gang.
    pub made_room: usize,
    /// Pods moved by rebalancing.
    pub moved: usize,
    /// Preemptors waiting for their victims to go (nominations held).
    pub nominated: usize,
    /// Bindings refused or failed (their pods went back to the queue).
    pub conflicts: usize,
    pub waiting_gangs: usize,
    /// Pods of ours still waiting for a decision.
    pub pending: usize,
    /// GPU capacity and allocation (milli-GPU) and FGD fragmentation after the round.
    pub gpu_capacity_milli: u64,
    pub gpu_allocated_milli: u64,
    pub fragmentation_milli: u64,
    /// Where the round's time went.
    pub timings: RoundTimings,
    /// Pods reclaimed this round, by the queue they were taken from.
    pub reclaimed: std::collections::BTreeMap<String, usize>,
    /// Each queue's figures after the round (empty while queues are not in use).
    pub queues: Vec<queue_status::QueueFigures>,
    /// How long each of the round's preemption searches took (candidates, victim search
    /// and plan; not the evictions' writes).
    pub preemption_searches: Vec<Duration>,
}

impl RoundTimings {
    /// Adds `other`'s time, phase by phase (a run's rounds summed).
    pub fn add(&mut self, other: &RoundTimings) {
        self.view += other.view;
        self.snapshot += other.snapshot;
        self.filter += other.filter;
        self.core += other.core;
        self.api += other.api;
        self.gangs += other.gangs;
        self.queues += other.queues;
    }
}

impl RoundReport {
    /// Adds the outcome counts of `other` (writes settled after the round).
    pub fn add_outcomes(&mut self, other: &RoundReport) {
        self.bound += other.bound;
        self.conflicts += other.conflicts;
    }
}

/// Wall time of one round by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTimings {
    /// Reading the view from the caches.
    pub view: Duration,
    /// Building the cluster state from the view and ordering the queue.
    pub snapshot: Duration,
    /// Requests and the filters outside core (taints, selectors, affinity, extended).
    pub filter: Duration,
    /// The core's decisions (node and exact GPUs).
    pub core: Duration,
    /// Handing writes to the bind stage (waiting for a free slot) and settling them.
    pub api: Duration,
    /// Gang planning, all phases together.
    pub gangs: Duration,
    /// The queues' own work: their standing and fair order, their figures, and writing
    /// their statuses (zero without queues).
    pub queues: Duration,
}

/// What the last built view showed, to tell which changes could help parked pods.
#[derive(Debug, Default)]
struct Seen {
    generation: Option<u64>,
    /// The node list the cache handed out (compared by pointer first) and its nodes in
    /// name order.
    node_list: Option<crate::api::Listed<k8s_openapi::api::core::v1::Node>>,
    nodes: Vec<std::sync::Arc<k8s_openapi::api::core::v1::Node>>,
    /// UIDs of the pods bound and not finished, kept in step with the feed.
    active: HashSet<String>,
    group_list: Option<crate::api::Listed<crate::k8s::gang::PodGroup>>,
    /// `namespace/name` -> the group's spec as JSON.
    groups: HashMap<String, String>,
    /// [`crate::framework::volumes::digest`] of the claims and volumes.
    volumes: u64,
    /// Disruption budgets' resourceVersions (a budget that allows more may let a pod
    /// that waits for room make it by moving pods).
    budgets: Vec<String>,
    queue_list: Option<crate::api::Listed<crate::k8s::queue::Queue>>,
    namespace_list: Option<crate::api::Listed<k8s_openapi::api::core::v1::Namespace>>,
    /// Queues' specs and namespaces' default queues (a limit raised, a queue created).
    queues: Vec<String>,
    /// What left since parked pods were last woken ([`wakes`]).
    left: left::Left,
    /// The allocated claims no pod held (their devices free once deallocated).
    claim_holds: std::sync::Arc<[crate::k8s::dra::store::ClaimHold]>,
    /// The DeviceClass that served the GPU resource on DRA nodes (nodes open or close to
    /// such pods when it changes).
    gpu_class: Option<std::sync::Arc<crate::k8s::dra::extended::GpuClass>>,
    /// Views observed (the tests' builds check the feed against every pod on some).
    #[cfg(debug_assertions)]
    observed: u64,
}

/// The scheduler over any [`ClusterApi`].
pub struct Scheduler<A: ClusterApi> {
    api: A,
    config: SchedulerConfig,
    /// The filters and preferences, as configured.
    profile: crate::framework::Profile,
    placer: Placer,
    queue: Queue,
    /// The cluster state across rounds, with reservations and nominations on it.
    cluster: crate::shared::cluster_cache::ClusterCache,
    binder: crate::shared::bind::Binder<A>,
    events: events::EventSink<A>,
    gate: Gate,
    seen: Seen,
    /// A write's outcome or an unfinished round: the next round must look again.
    dirty: bool,
    last_round: Option<Instant>,
    /// Gangs between rounds: waiting since, Bindings in flight, statuses written.
    gangs: gangs::Gangs,
    /// Object problems already logged: each is logged once while it lasts.
    warned: HashSet<crate::snapshot::Warning>,
    /// Places planned for moved pods' replacements.
    steers: defrag::Steers,
    /// Preemptors (by UID) some of whose evictions or moves the server refused this
    /// round: they back off and try again rather than wait for a cluster event, as the
    /// victims that stayed will not make one.
    unfinished: HashSet<String>,
    /// Pods (by UID) whose move the server refused, and when: left out of make-room
    /// plans for a while, so that the next plan goes around them.
    refused_moves: HashMap<String, std::time::Instant>,
    /// Make-room searches for a pod's shape that found nothing, and until when they are
    /// not made again (core's rule, as the timeline's).
    room_memo: gpuplace_core::defrag::RoomMemo<room_shape::RoomShape, Instant>,
    /// Rebalancing's memory between rounds (core's, keyed by controller UID).
    rebalancing: gpuplace_core::defrag::RebalancePace<String, Instant>,
    /// The queues as the view defines them.
    queues: crate::shared::queues::Queues,
    /// Queues' statuses as written and wanted.
    queue_status: queue_status::StatusWriter,
    /// The queues' usage over time.
    usage: usage::UsageBook,
    /// Wall time on the rounds' clock (pod ages, expected starts, stamps written).
    wall: crate::clock::WallClock,
    /// How long pods ran, by queue and shape (expected starts read it).
    runs: gpuplace_core::waiting::history::RunHistory,
    /// The Jobs the last view could look up (their deadlines bound their pods' runs).
    jobs: crate::k8s::job::Jobs,
    /// The starts projected lately.
    starts: line::Starts,
}

pub use crate::clock::rfc3339;

impl<A: ClusterApi> Scheduler<A> {
    /// A scheduler that always decides (no leader election).
    pub fn new(api: A, config: SchedulerConfig) -> Self {
        Self::with_gate(api, config, Gate::always_open())
    }

    /// A scheduler that decides and writes only while `gate` is open.
    pub fn with_gate(api: A, config: SchedulerConfig, gate: Gate) -> Self {
        let gpu_resource = config.gpu_resource.clone();
        let config_usage = config.usage_half_life_ms;
        let wall = crate::clock::WallClock::default();
        let placer = crate::framework::placer(config.policy, &config.weights, config.seed);
        let binder =
            crate::shared::bind::Binder::new(api.clone(), gate.clone(), config.max_in_flight);
        let events = events::EventSink::new(
            api.clone(),
            config.max_in_flight.min(16),
            binder.load(),
            wall,
        );
        Scheduler {
            binder,
            events,
            queue: Queue::new(config.queue),
            api,
            config,
            profile: crate::framework::Profile::new(&gpu_resource),
            placer,
            cluster: crate::shared::cluster_cache::ClusterCache::default(),
            gate,
            seen: Seen::default(),
            dirty: true,
            last_round: None,
            gangs: gangs::Gangs::default(),
            warned: HashSet::new(),
            steers: defrag::Steers::default(),
            unfinished: HashSet::new(),
            refused_moves: HashMap::new(),
            room_memo: Default::default(),
            rebalancing: Default::default(),
            queues: crate::shared::queues::Queues::new(&gpu_resource),
            queue_status: Default::default(),
            usage: usage::UsageBook::new(config_usage, wall),
            wall,
            runs: Default::default(),
            jobs: Default::default(),
            starts: Default::default(),
        }
    }

    /// Preemptors waiting for their victims.
    pub fn nominations(&self) -> &crate::shared::nominations::Nominations {
        self.cluster.nominations()
    }

    pub fn api(&self) -> &A {
        &self.api
    }

    /// The latest scheduling failure of each waiting pod (shared: the live map reads it).
    pub fn reasons(&self) -> crate::status::PendingReasons {
        self.events.reasons()
    }

    /// Pods assumed and not yet seen bound by the watch.
    pub fn reservations(&self) -> &Reservations {
        self.cluster.reservations()
    }

    /// The generation of the view the last round saw.
    pub fn seen_generation(&self) -> Option<u64> {
        self.seen.generation
    }

    /// Full builds of the cluster state and in-place updates so far.
    pub fn state_builds(&self) -> (usize, usize) {
        (self.cluster.builds, self.cluster.updates)
    }

    /// Compares the state kept across rounds with one built afresh from `view` (with the
    /// same reservations): `Err` names the first node whose free resources differ. For
    /// tests of the incremental cache (feature `bench-hooks`).
    #[cfg(feature = "bench-hooks")]
    pub fn verify_state(&mut self, view: &crate::api::ClusterView) -> Result<(), String> {
        self.cluster.verify(view, &self.config.gpu_resource)
    }

    /// Bindings in flight.
    pub fn in_flight(&self) -> usize {
        self.binder.in_flight()
    }

    /// Events dropped because too many were queued.
    pub fn dropped_events(&self) -> u64 {
        self.events.dropped()
    }

    /// Events queued and not yet sent.
    pub fn queued_events(&self) -> usize {
        self.events.queued()
    }

    /// One round whose writes are then waited for: decisions, Bindings, their outcomes
    /// and Events, all done when it returns (tests and benchmarks; the production loop
    /// overlaps rounds and writes, see [`run`]; feature `bench-hooks`).
    #[cfg(feature = "bench-hooks")]
    pub async fn round(&mut self, now: Instant) -> Result<RoundReport, crate::api::ApiError> {
        let mut report = self.schedule(now).await?;
        let started = Instant::now();
        let settled = self.drain_writes(now).await;
        report.add_outcomes(&settled);
        report.timings.api += started.elapsed();
        Ok(report)
    }

    /// Waits for every write in flight (Bindings, queue statuses) and every queued Event,
    /// and takes their outcomes.
    pub async fn drain_writes(&mut self, now: Instant) -> RoundReport {
        let mut report = RoundReport::default();
        while let Some(outcome) = self.binder.next().await {
            self.take_write_outcome(outcome, now, &mut report).await;
        }
        self.events.flush().await;
        // The Bindings are done: the statuses they changed go out now, however recent the
        // last write (a burst sends none while it lasts), then the batch is awaited.
        self.queue_status.finish().await;
        self.flush_queue_statuses_now(now).await;
        self.queue_status.finish().await;
        report
    }

    /// Takes the outcomes of writes that have finished, without waiting.
    pub async fn take_finished_writes(&mut self, now: Instant) -> RoundReport {
        let mut report = RoundReport::default();
        for outcome in self.binder.finished() {
            self.take_write_outcome(outcome, now, &mut report).await;
        }
        report
    }

    /// When the next pod comes out of backoff or parking (for the loop to wake then).
    pub fn next_due(&self, after: Instant) -> Option<Instant> {
        self.queue.next_due(after)
    }

    /// The pairing of round-clock instants with wall time that this scheduler stamps and
    /// measures ages by (a driver on a simulated clock stamps start times with it).
    pub fn wall_clock(&self) -> crate::clock::WallClock {
        self.wall
    }
}
