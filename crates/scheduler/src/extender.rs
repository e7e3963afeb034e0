//! gpuplace inside the stock kube-scheduler, as an HTTP extender: `filter`, `prioritize`
//! and `bind` decided on the same watch-fed state, filters, placement policy and
//! reservations as the standalone scheduler (the code is shared, not copied).
//!
//! - **filter** runs the scheduler's filters (node filters, extended resources, volumes,
//!   filters about other pods, then core's fit) on the candidate nodes and says why each
//!   other node fails, split by whether preemption could help. In [`FilterMode::Best`] only
//!   the node gpuplace would choose passes (kube-scheduler's own scores cannot undo the
//!   placement); in [`FilterMode::All`] every fitting node passes.
//! - **prioritize** ranks the candidates by preferences first, then the placement policy
//!   (as the scheduler chooses), spread over 0-10 so the best node gets 10.
//! - **bind** chooses the exact GPUs on the node kube-scheduler picked (which may differ
//!   from gpuplace's), reserves them at once, so the next pod's filter already sees them, and
//!   writes one Binding that carries the assignment annotation; a failed write gives the
//!   reservation back. The watch's confirmation replaces the reservation, as in the
//!   scheduler.
//!
//! Gangs are not held together here (kube-scheduler binds pod by pod): use the standalone
//! scheduler, or kube's coscheduling plugin, for all-or-nothing groups.

mod evaluate;
pub mod http;
mod last_judgement;
mod names;
mod queue_limits;
mod spread;
pub mod wire;

pub use spread::spread_scores;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpuplace_core::{Placer, Policy, TargetWorkload};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

use crate::api::{ApiError, ClusterApi, ClusterView, FedView, Listed, PodLookup};
use crate::framework::filter::VerdictCache;
use crate::framework::volumes::VolumeIndex;
use crate::k8s::leader::Gate;
use crate::k8s::pod_info::PodInfo;
use crate::shared::assume::reserve;
use crate::shared::cluster_cache::{Brought, ClusterCache};
use evaluate::{NameIndex, Need, Verdict, Verdicts};
use wire::{BindingArgs, ExtenderArgs, FilterResult, Names, Priorities};

/// Which nodes `filter` lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FilterMode {
    /// Every node where the pod fits; kube-scheduler's scores (with ours) choose.
    All,
    /// Only the node gpuplace would choose.
    #[default]
    Best,
}

impl std::str::FromStr for FilterMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(FilterMode::All),
            "best" => Ok(FilterMode::Best),
            other => Err(format!("filter mode {other:?}: expected all or best")),
        }
    }
}

/// What the extender is configured with.
#[derive(Clone, Debug)]
pub struct ExtenderConfig {
    pub policy: Policy,
    pub weights: Vec<(Policy, i64)>,
    pub seed: u64,
    pub gpu_resource: String,
    pub filter_mode: FilterMode,
    /// Attempts per Binding before the bind call fails.
    pub bind_attempts: u32,
    /// FGD's target workload as declared (see `SchedulerConfig::workload`); `None`: the
    /// pods' shapes, recomputed every 10 s.
    pub workload: Option<Arc<TargetWorkload>>,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        ExtenderConfig {
            policy: Policy::DEFAULT,
            weights: Vec::new(),
            seed: 42,
            gpu_resource: gpuplace_model::keys::GPU_RESOURCE.into(),
            filter_mode: FilterMode::Best,
            bind_attempts: 5,
            workload: None,
        }
    }
}

/// Pods seen in filter requests, for bind (which names the pod only): the newest
/// [`PODS_REMEMBERED`], by UID.
const PODS_REMEMBERED: usize = 16_384;

/// The FGD workload (the mix of pod shapes, which moves slowly) is recomputed from the
/// cluster's pods at most this often: each new one rescores every node.
const WORKLOAD_EVERY: Duration = Duration::from_secs(10);

struct Inner {
    placer: Placer,
    cache: ClusterCache,
    verdicts: VerdictCache,
    volumes: VolumeIndex,
    /// The filters and preferences, as configured.
    profile: crate::framework::Profile,
    /// The claims and volumes `volumes` was built from (unchanged lists: no rebuild).
    volume_lists: VolumeLists,
    names: NameIndex,
    /// The last judgement by node, for prioritize after filter of the same pod.
    last: last_judgement::LastJudgement,
    /// Changes to the kept state so far (views that moved it, reservations made and
    /// dropped).
    changes: u64,
    generation: Option<u64>,
    workload: Option<(Instant, Arc<TargetWorkload>)>,
    pods: HashMap<String, Arc<PodInfo>>,
    order: VecDeque<String>,
    /// Queues' limits (all extender mode can enforce of queues).
    queue_limits: queue_limits::QueueLimits,
}

#[derive(Default)]
struct VolumeLists {
    claims: Listed<PersistentVolumeClaim>,
    volumes: Listed<PersistentVolume>,
}

impl VolumeLists {
    fn same(&self, view: &ClusterView) -> bool {
        fn same<T>(a: &Listed<T>, b: &Listed<T>) -> bool {
            Arc::ptr_eq(a, b)
                || (a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| Arc::ptr_eq(x, y)))
        }
        same(&self.claims, &view.claims) && same(&self.volumes, &view.volumes)
    }
}

/// The extender's decisions; cheap to share between HTTP handlers.
pub struct Extender<A: ClusterApi> {
    api: A,
    config: ExtenderConfig,
    gate: Gate,
    inner: Mutex<Inner>,
}

/// How the extender's kept state was brought up to date.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateUpdates {
    /// Built anew (the first call, a node changed).
    pub builds: usize,
    /// Updated from the pods' change feed.
    pub updates: usize,
    /// Updated by walking every pod (after a relist, or further behind than the feed).
    pub walks: usize,
}

/// Why a bind did not happen (sent back in `ExtenderBindingResult.Error`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindError {
    #[error("pod {0} is not known to gpuplace yet (no filter call, not in the watch cache)")]
    UnknownPod(String),
    #[error("node {0} is not in gpuplace's cache")]
    UnknownNode(String),
    #[error("pod {pod} no longer fits on node {node}: {why}")]
    NoLongerFits {
        pod: String,
        node: String,
        why: String,
    },
    #[error("pod {0}: {1}")]
    BadPod(String, String),
    #[error("pod {0}: {1}")]
    Queue(String, String),
    #[error("pod {0} is already bound, or being bound, to node {1}")]
    Elsewhere(String, String),
    #[error("binding pod {0}: {1}")]
    Write(String, String),
    #[error("api server: {0}")]
    Api(#[from] ApiError),
}

impl<A: ClusterApi> Extender<A> {
    pub fn new(api: A, config: ExtenderConfig) -> Self {
        let placer = crate::framework::placer(config.policy, &config.weights, config.seed);
        let queue_limits = queue_limits::QueueLimits::new(&config.gpu_resource);
        let profile = crate::framework::Profile::new(&config.gpu_resource);
        Extender {
            api,
            config,
            gate: Gate::always_open(),
            inner: Mutex::new(Inner {
                placer,
                cache: ClusterCache::default(),
                verdicts: VerdictCache::default(),
                volumes: VolumeIndex::default(),
                profile,
                volume_lists: VolumeLists::default(),
                names: NameIndex::default(),
                last: last_judgement::LastJudgement::default(),
                changes: 0,
                generation: None,
                workload: None,
                pods: HashMap::new(),
                order: VecDeque::new(),
                queue_limits,
            }),
        }
    }

    pub fn api(&self) -> &A {
        &self.api
    }

    /// Reservations whose Binding the watch has not confirmed yet.
    pub fn reservations(&self) -> usize {
        self.lock().cache.reserved_count()
    }

    /// Compares the state kept across calls with one built afresh from `view`, when the
    /// state reflects `view`'s generation (`Ok(false)` otherwise). For tests of the
    /// incremental cache (feature `bench-hooks`).
    #[cfg(feature = "bench-hooks")]
    pub fn verify_state(&self, view: &ClusterView) -> Result<bool, String> {
        let mut inner = self.lock();
        if inner.generation != Some(view.generation) {
            return Ok(false);
        }
        inner
            .cache
            .verify(view, &self.config.gpu_resource)
            .map(|()| true)
    }

    /// How the kept state was brought up to date so far.
    pub fn state_updates(&self) -> StateUpdates {
        let inner = self.lock();
        StateUpdates {
            builds: inner.cache.builds,
            updates: inner.cache.updates,
            walks: inner.cache.walks,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state brought up to the cache's latest view (taken only when it changed): the
    /// pods changed since the state's moment, from the pod store's feed.
    async fn fresh(&self) -> Result<MutexGuard<'_, Inner>, ApiError> {
        loop {
            let generation = self.api.generation();
            let since = {
                let mut inner = self.lock();
                if inner.generation == Some(generation) && inner.cache_ready() {
                    return Ok(inner);
                }
                inner.cache.cursor()
            };
            let fed = self.api.view_since(since, false).await?;
            let mut inner = self.lock();
            // Another call may have taken changes meanwhile: these follow only from `since`.
            if inner.cache.cursor() == since {
                inner.take(
                    fed,
                    &self.config.gpu_resource,
                    self.config.workload.as_ref(),
                );
                return Ok(inner);
            }
        }
    }

    /// `filter`: the candidates where the pod fits (all, or gpuplace's choice), and why
    /// the others fail.
    pub async fn filter(&self, mut args: ExtenderArgs) -> Result<FilterResult, ApiError> {
        let as_objects = args.nodes.is_some() && args.node_names.is_none();
        let names = args.take_names();
        let mut guard = self.fresh().await?;
        let inner = &mut *guard;
        let pod = inner.pod_info(&args.pod, &self.config.gpu_resource);
        inner.remember(&pod);
        if let Some(why) = inner.queue_refused(&pod) {
            drop(guard);
            let count = names.len();
            let mut result = FilterResult::about(names);
            let why: Arc<str> = Arc::from(format!("{why}."));
            for i in 0..count {
                result.fail_unresolvable(i, Arc::clone(&why));
            }
            answer_passing(&mut result, args.nodes.take(), as_objects, &[]);
            return Ok(result);
        }
        // In mode all the scores are worked out too (once per class of identical nodes):
        // prioritize of this pod then answers from this judgement.
        let need = Need {
            scores: self.config.filter_mode == FilterMode::All,
            best: self.config.filter_mode == FilterMode::Best,
        };
        let verdicts = inner.evaluate(&pod, &names, &self.config.gpu_resource, need);
        drop(guard);
        let mut result = FilterResult::about(names);
        let mut passing: Vec<usize> = Vec::new();
        for (i, verdict) in verdicts.nodes.into_iter().enumerate() {
            match verdict {
                Verdict::Fits(_) => passing.push(i),
                Verdict::Fails(why) => result.fail(i, why),
                Verdict::Unresolvable(why) => result.fail_unresolvable(i, why),
            }
        }
        if self.config.filter_mode == FilterMode::Best
            && let Some(best) = verdicts.best
        {
            // The other fitting nodes are left out, not failed: they fit, and kube-scheduler
            // keeps no status for nodes an extender drops.
            passing = vec![best];
        }
        answer_passing(&mut result, args.nodes.take(), as_objects, &passing);
        Ok(result)
    }

    /// `prioritize`: every candidate scored 0-10, preferences first, then the policy; the
    /// best node gets 10, nodes where the pod does not fit 0.
    pub async fn prioritize(&self, mut args: ExtenderArgs) -> Result<Priorities, ApiError> {
        let names = args.take_names();
        let mut guard = self.fresh().await?;
        let inner = &mut *guard;
        let pod = inner.pod_info(&args.pod, &self.config.gpu_resource);
        inner.remember(&pod);
        let keys = inner.parts().keys(
            &pod,
            &names,
            args.picked.as_ref(),
            &self.config.gpu_resource,
        );
        drop(guard);
        Ok(Priorities {
            names,
            scores: spread_scores(&keys),
        })
    }

    /// `bind`: the exact GPUs on the node kube-scheduler chose, reserved, then one Binding
    /// with the assignment annotation.
    pub async fn bind(&self, args: BindingArgs) -> Result<(), BindError> {
        let id = format!("{}/{}", args.pod_namespace, args.pod_name);
        let known = self.lock().pods.get(&args.pod_uid).cloned();
        let pod = match known {
            Some(pod) => pod,
            None => self
                .fresh()
                .await?
                .cache
                .pods()
                .pod(&args.pod_namespace, &args.pod_name)
                .filter(|p| p.key.uid == args.pod_uid)
                .cloned()
                .ok_or_else(|| BindError::UnknownPod(id.clone()))?,
        };
        let request = {
            let mut guard = self.fresh().await?;
            let inner = &mut *guard;
            if let Some(r) = inner.cache.reservation(&args.pod_uid) {
                if r.node == args.node && r.written {
                    // kube-scheduler retried a bind that already landed.
                    return Ok(());
                }
                return Err(BindError::Elsewhere(id.clone(), r.node.clone()));
            }
            // A pod whose claim asks all of a node's GPUs has no demand until sized.
            let bad = |e: String| BindError::BadPod(id.clone(), e);
            let demand = match pod.demand.clone() {
                Err(e) if !crate::k8s::dra::store::has_ways(&pod) => return Err(bad(e)),
                demand => demand.ok(),
            };
            if let Some(why) = inner.queue_refused(&pod) {
                return Err(BindError::Queue(id.clone(), why));
            }
            let Some(snapshot) = inner.cache.snapshot_mut() else {
                return Err(BindError::UnknownNode(args.node.clone()));
            };
            if let Some(held) = snapshot.held.get(&args.pod_uid) {
                let on = snapshot.state.inventory(held.node).name.clone();
                // Bound already (the watch has shown it): the same node is a retry.
                return if on == args.node {
                    Ok(())
                } else {
                    Err(BindError::Elsewhere(id.clone(), on))
                };
            }
            let n = snapshot
                .node_index(&args.node)
                .ok_or_else(|| BindError::UnknownNode(args.node.clone()))?;
            let mut only = vec![false; snapshot.nodes.len()];
            only[n] = true;
            let (demand, decision) =
                evaluate::choose_way(&mut inner.placer, &snapshot.state, &pod, demand, &only)
                    .map_err(|why| match why {
                        Some(mut why) => {
                            why.nodes = 1;
                            BindError::NoLongerFits {
                                pod: id.clone(),
                                node: args.node.clone(),
                                why: why.message(&self.config.gpu_resource),
                            }
                        }
                        None => bad(pod.demand.clone().err().unwrap_or_default()),
                    })?;
            let policy = self.config.policy.to_string();
            let (mut reservation, mut request) =
                reserve(snapshot, &pod, &demand, &decision, &policy, None);
            // Behind kube-scheduler, its DynamicResources plugin allocates a pod's claims
            // (in PreBind, before this bind), the claim of a pod asking the GPU resource on
            // a DRA node too: the extender writes none.
            request.claims.clear();
            request.extended = None;
            // kube-scheduler sent the pod: the lagging watch may not have shown it yet.
            reservation.seen = false;
            inner.cache.assume(reservation);
            inner.changes += 1;
            request
        };
        let written = crate::shared::bind::write(
            &self.api,
            &self.gate,
            request,
            self.config.bind_attempts,
            true,
        )
        .await;
        let mut inner = self.lock();
        match written {
            Ok(()) => {
                inner.cache.written(&args.pod_uid);
                Ok(())
            }
            Err(e) => {
                inner.cache.forget(&args.pod_uid);
                inner.changes += 1;
                Err(BindError::Write(id, e.to_string()))
            }
        }
    }
}

impl Inner {
    fn cache_ready(&mut self) -> bool {
        self.cache.snapshot_mut().is_some()
    }

    /// Takes a view and the pods changed since the state's moment. `declared`: FGD's
    /// target workload as configured, else the pods' shapes.
    fn take(&mut self, fed: FedView, gpu_resource: &str, declared: Option<&Arc<TargetWorkload>>) {
        let FedView { view, feed } = fed;
        let quiet = last_judgement::moves_nothing(
            self.cache.snapshot(),
            self.cache.reservations(),
            feed.changes.as_deref(),
        ) && self.volume_lists.same(&view);
        let reserved = self.cache.reserved_count();
        if !self.volume_lists.same(&view) {
            self.volumes = VolumeIndex::new(&view.claims, &view.volumes);
            self.volume_lists = VolumeLists {
                claims: view.claims.clone(),
                volumes: view.volumes.clone(),
            };
        }
        self.generation = Some(view.generation);
        self.queue_limits.refresh(&view);
        let Brought {
            mut snapshot,
            rebuilt,
            ..
        } = self.cache.update(&view, feed, gpu_resource);
        let stale = self
            .workload
            .as_ref()
            .is_none_or(|(at, _)| declared.is_none() && at.elapsed() >= WORKLOAD_EVERY);
        if stale {
            self.workload = Some((Instant::now(), self.cache.workload(declared)));
        }
        // Setting the workload scores every node's fragmentation again: only when it or
        // the state is new.
        if (stale || rebuilt)
            && let Some((_, workload)) = &self.workload
        {
            snapshot.state.set_workload(Arc::clone(workload));
        }
        self.cache.keep(snapshot);
        // The last judgement stays valid while nothing it reads moved.
        if !quiet || stale || rebuilt || self.cache.reserved_count() != reserved {
            self.changes += 1;
        }
        if rebuilt {
            // Node verdicts and node indices depend on the nodes only.
            self.verdicts = VerdictCache::default();
            self.names = NameIndex::default();
        }
    }

    /// What judging the candidates reads and keeps (see [`evaluate`]).
    fn parts(&mut self) -> evaluate::Parts<'_> {
        evaluate::Parts {
            snapshot: self.cache.snapshot_mut().map(|s| &*s),
            placer: &mut self.placer,
            verdicts: &mut self.verdicts,
            volumes: &self.volumes,
            profile: &self.profile,
            names: &mut self.names,
            last: &mut self.last,
            state: self.changes,
        }
    }

    /// Judges the candidates (see [`evaluate`]) for the first of the pod's ways to meet
    /// its claims (`firstAvailable`) that fits one of them, as the scheduler decides.
    fn evaluate(&mut self, pod: &Arc<PodInfo>, names: &Names, res: &str, need: Need) -> Verdicts {
        use crate::k8s::dra::store::{alternatives, node_sizes};
        let verdicts = self.parts().evaluate(pod, names, res, need);
        let sizes = |s: Option<&crate::snapshot::Snapshot>| s.map(|s| node_sizes(&s.state));
        (!verdicts.any_fits())
            .then(|| alternatives(pod, &sizes(self.cache.snapshot()).unwrap_or_default()))
            .into_iter()
            .flatten()
            .map(|way| self.parts().evaluate(&way, names, res, need))
            .find(Verdicts::any_fits)
            .unwrap_or(verdicts)
    }

    /// Why `pod`'s queue lets it take nothing now, if so.
    fn queue_refused(&self, pod: &PodInfo) -> Option<String> {
        self.queue_limits.refused(
            pod,
            self.cache.pods(),
            self.cache.reservations(),
            &self.pods,
        )
    }

    /// The pod as gpuplace reads it: one already converted when the UID and
    /// resourceVersion match (the API server never gives two versions of an object the same
    /// resourceVersion): for an earlier call, or by the pod store from the watch (which
    /// usually shows a pending pod before kube-scheduler sends it); else converted now.
    fn pod_info(&self, pod: &Pod, gpu_resource: &str) -> Arc<PodInfo> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let version = pod.metadata.resource_version.as_deref().unwrap_or_default();
        if !uid.is_empty() && !version.is_empty() {
            let same =
                |known: &&Arc<PodInfo>| known.key.uid == uid && known.resource_version == version;
            if let Some(known) = self.pods.get(uid).filter(same) {
                return Arc::clone(known);
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if let Some(known) = self.cache.pods().pod(namespace, name).filter(same) {
                return Arc::clone(known);
            }
        }
        Arc::new(PodInfo::from_pod(pod, gpu_resource))
    }

    fn remember(&mut self, pod: &Arc<PodInfo>) {
        let uid = pod.key.uid.clone();
        if self.pods.insert(uid.clone(), Arc::clone(pod)).is_none() {
            self.order.push_back(uid);
            while self.order.len() > PODS_REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.pods.remove(&old);
                }
            }
        }
    }
}

/// Sets the passing candidates (positions in the request's list) on `result`: as Node
/// objects when the request sent objects (`nodes`, in the order given), else as names.
fn answer_passing(
    result: &mut FilterResult,
    nodes: Option<Vec<k8s_openapi::api::core::v1::Node>>,
    as_objects: bool,
    passing: &[usize],
) {
    match nodes {
        Some(mut nodes) if as_objects => {
            let mut keep = vec![false; nodes.len()];
            for &i in passing {
                if let Some(k) = keep.get_mut(i) {
                    *k = true;
                }
            }
            let mut flags = keep.into_iter();
            nodes.retain(|_| flags.next().unwrap_or(false));
            result.nodes = Some(wire::node_list(nodes));
        }
        _ => result.pass(passing.iter().copied()),
    }
}

#[cfg(test)]
#[path = "extender/tests.rs"]
mod tests;
