//! The scheduling loop: one round takes a fresh view, orders the pending pods, and for each
//! one filters nodes, asks `core` for the node and exact GPUs, records the assignment on the
//! pod (guarded by its resourceVersion), binds, and explains failures in an Event.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use gpuplace_core::{Decision, Placer, Policy, Unschedulable};
use tracing::{debug, info, warn};

use crate::api::{ApiError, ClusterApi, EventRecord, PodKey};
use crate::demand::{Assignment, ContainerDemand, PodDemand, split_devices};
use crate::filters::{NodeRejection, check_node};
use crate::pod_info::PodInfo;
use crate::snapshot::{Held, Snapshot, build};

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
    /// First backoff after an unschedulable attempt (doubles up to `max_backoff`).
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: "gpuplace".into(),
            policy: Policy::Fgd,
            weights: Vec::new(),
            gpu_resource: "nvidia.com/gpu".into(),
            seed: 42,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    pub bound: usize,
    pub unschedulable: usize,
    pub conflicts: usize,
    pub waiting_gangs: usize,
    /// Pods of ours still pending after the round.
    pub pending: usize,
    /// GPU capacity and allocation (milli-GPU) and FGD fragmentation after the round.
    pub gpu_capacity_milli: u64,
    pub gpu_allocated_milli: u64,
    pub fragmentation_milli: u64,
    /// Where the round's time went.
    pub timings: RoundTimings,
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
    /// API writes: assignment patch, Binding, Events.
    pub api: Duration,
    /// Gang planning and commits, all phases together.
    pub gangs: Duration,
}

/// The scheduler over any [`ClusterApi`].
pub struct Scheduler<A> {
    api: A,
    config: SchedulerConfig,
    placer: Placer,
    /// Pod UID -> (retry not before, current backoff).
    backoff: HashMap<String, (Instant, Duration)>,
    /// Pod groups first seen waiting, for their timeout.
    gang_since: HashMap<String, Instant>,
    /// Object problems already logged: each is logged once while it lasts, not every round.
    warned: std::collections::HashSet<String>,
    /// Node and pod count of the last view, to retry backed-off pods when the cluster changes.
    last_shape: (usize, usize),
}

/// RFC 3339 UTC time of `t` (seconds precision).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Per-node verdicts of the filters outside core, and the mask core places within.
#[derive(Clone)]
struct Filtered {
    allowed: Vec<bool>,
    rejected: BTreeMap<String, usize>,
}

impl Filtered {
    /// The mask for core; none when every node is allowed.
    fn mask(&self) -> Option<&[bool]> {
        (!self.rejected.is_empty()).then_some(&self.allowed[..])
    }
}

/// The verdicts for one filter key (see [`crate::pod_info::SchedulingTerms::key`]) and the
/// mask they give a pod without extended resources.
struct NodeFilter {
    verdicts: Vec<Result<(), NodeRejection>>,
    plain: Filtered,
}

type Verdicts = std::rc::Rc<NodeFilter>;

fn mask_of<'a>(verdicts: impl Iterator<Item = Result<(), &'a NodeRejection>>) -> Filtered {
    let mut allowed = Vec::new();
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    for verdict in verdicts {
        match verdict {
            Ok(()) => allowed.push(true),
            Err(r) => {
                allowed.push(false);
                *rejected.entry(r.phrase()).or_default() += 1;
            }
        }
    }
    Filtered { allowed, rejected }
}

/// The mask for `demand`: the cached one, unless it asks for extended resources, whose
/// free amounts change as pods are placed.
fn filter_nodes<'a>(
    snapshot: &Snapshot,
    filter: &'a NodeFilter,
    demand: &PodDemand,
) -> std::borrow::Cow<'a, Filtered> {
    if demand.extended.is_empty() {
        return std::borrow::Cow::Borrowed(&filter.plain);
    }
    let shortfall = |n: usize| {
        demand
            .extended
            .iter()
            .find(|(resource, want)| {
                snapshot.extended_free[n]
                    .get(*resource)
                    .copied()
                    .unwrap_or(0)
                    < **want
            })
            .map(|(resource, _)| NodeRejection::Extended(resource.clone()))
    };
    let verdicts: Vec<Result<(), NodeRejection>> = filter
        .verdicts
        .iter()
        .enumerate()
        .map(|(n, verdict)| match verdict {
            Err(r) => Err(r.clone()),
            Ok(()) => shortfall(n).map_or(Ok(()), Err),
        })
        .collect();
    std::borrow::Cow::Owned(mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ()))))
}

/// Node verdicts per filter key, computed once per round.
#[derive(Default)]
struct VerdictCache {
    by_key: HashMap<String, Verdicts>,
}

impl VerdictCache {
    fn get(&mut self, snapshot: &Snapshot, pod: &PodInfo) -> Verdicts {
        if let Some(hit) = self.by_key.get(&pod.filter_key) {
            return hit.clone();
        }
        let terms = pod.terms.as_deref();
        let verdicts: Vec<_> = snapshot
            .nodes
            .iter()
            .map(|n| check_node(n, terms))
            .collect();
        let plain = mask_of(verdicts.iter().map(|v| v.as_ref().map(|_| ())));
        let filter = std::rc::Rc::new(NodeFilter { verdicts, plain });
        self.by_key.insert(pod.filter_key.clone(), filter.clone());
        filter
    }
}

fn explain(
    mut why: Unschedulable,
    rejected: &BTreeMap<String, usize>,
    nodes: usize,
    resource: &str,
) -> String {
    why.nodes = nodes;
    why.other = rejected.iter().map(|(p, n)| (p.clone(), *n)).collect();
    why.message(resource)
}

impl<A: ClusterApi> Scheduler<A> {
    pub fn new(api: A, config: SchedulerConfig) -> Self {
        let placer = Placer::new(config.policy, config.seed)
            .with_weights(&config.weights)
            .unwrap_or_else(|e| {
                warn!(error = %e, policy = %config.policy, "weights refused; scoring with the policy alone");
                Placer::new(config.policy, config.seed)
            });
        Scheduler {
            api,
            config,
            placer,
            backoff: HashMap::new(),
            gang_since: HashMap::new(),
            warned: std::collections::HashSet::new(),
            last_shape: (0, 0),
        }
    }

    pub fn api(&self) -> &A {
        &self.api
    }

    fn is_ours_pending(&self, pod: &PodInfo) -> bool {
        pod.is_pending_for(&self.config.scheduler_name)
    }

    fn back_off(&mut self, uid: &str, now: Instant) {
        let next = match self.backoff.get(uid) {
            Some((_, d)) => (*d * 2).min(self.config.max_backoff),
            None => self.config.initial_backoff,
        };
        self.backoff.insert(uid.to_string(), (now + next, next));
    }

    async fn emit(&self, pod: &PodKey, kind: &str, reason: &str, message: String) {
        let event = EventRecord {
            pod: pod.clone(),
            kind: kind.to_string(),
            reason: reason.to_string(),
            message,
        };
        if let Err(e) = self.api.event(event).await {
            warn!(pod = %pod, error = %e, "cannot record event");
        }
    }

    /// One round over every pending pod. `now` drives backoff and gang timeouts.
    pub async fn round(&mut self, now: Instant) -> Result<RoundReport, ApiError> {
        let mut report = RoundReport::default();
        let started = Instant::now();
        let view = self.api.view().await?;
        report.timings.view = started.elapsed();
        let started = Instant::now();
        let shape = (view.nodes.len(), view.pods.len());
        if shape.0 > self.last_shape.0 || shape.1 < self.last_shape.1 {
            // A node was added or a pod left: everything backed off may fit now.
            self.backoff.clear();
        }
        self.last_shape = shape;
        let mut snapshot = build(&view.nodes, &view.pods, &self.config.gpu_resource);
        for w in &snapshot.warnings {
            if !self.warned.contains(w) {
                warn!("{w}");
            }
        }
        self.warned = snapshot.warnings.iter().cloned().collect();
        // FGD measures fragmentation against the shapes of the pods the cluster runs and
        // is asked to run.
        let shapes: Vec<gpuplace_model::Request> = view
            .pods
            .iter()
            .filter_map(|p| p.demand.as_ref().ok())
            .map(|d| d.request.clone())
            .collect();
        snapshot.state.set_workload(std::sync::Arc::new(
            gpuplace_core::TargetWorkload::from_requests(&shapes, 0.95),
        ));
        let mut verdicts = VerdictCache::default();
        let mut pending: Vec<&PodInfo> = view
            .pods
            .iter()
            .map(|p| &**p)
            .filter(|p| self.is_ours_pending(p))
            .filter(|p| {
                self.backoff
                    .get(&p.key.uid)
                    .is_none_or(|(until, _)| *until <= now)
            })
            .collect();
        pending.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.created.cmp(&b.created))
                .then_with(|| a.key.name.cmp(&b.key.name))
        });
        report.timings.snapshot = started.elapsed();
        let mut gangs: BTreeMap<(String, String), Vec<&PodInfo>> = BTreeMap::new();
        for pod in pending {
            match &pod.group {
                Some(g) => gangs
                    .entry((pod.key.namespace.clone(), g.clone()))
                    .or_default()
                    .push(pod),
                None => {
                    let started = Instant::now();
                    let v = verdicts.get(&snapshot, pod);
                    report.timings.filter += started.elapsed();
                    self.schedule_one(&mut snapshot, &v, pod, now, &mut report)
                        .await
                }
            }
        }
        let started = Instant::now();
        for ((namespace, group), members) in gangs {
            let members: Vec<(&PodInfo, Verdicts)> = members
                .into_iter()
                .map(|p| (p, verdicts.get(&snapshot, p)))
                .collect();
            self.schedule_gang(
                &mut snapshot,
                (&view.pods, &view.groups),
                (&namespace, &group),
                members,
                now,
                &mut report,
            )
            .await;
        }
        report.timings.gangs = started.elapsed();
        let waiting = view.pods.iter().filter(|p| self.is_ours_pending(p)).count();
        report.pending = waiting.saturating_sub(report.bound);
        report.gpu_capacity_milli = snapshot.state.gpu_capacity_milli();
        report.gpu_allocated_milli = snapshot.state.gpu_allocated_milli();
        report.fragmentation_milli = snapshot.state.total_frag() as u64;
        Ok(report)
    }

    /// Filters and places one pod on `snapshot` without committing.
    fn decide(
        &mut self,
        snapshot: &Snapshot,
        verdicts: &Verdicts,
        pod: &PodInfo,
        timings: &mut RoundTimings,
    ) -> Result<(PodDemand, Decision), String> {
        let started = Instant::now();
        let demand = pod.demand.clone()?;
        let filtered = filter_nodes(snapshot, verdicts, &demand);
        let decided = Instant::now();
        timings.filter += decided - started;
        let choice = self
            .placer
            .choose(&snapshot.state, &demand.request, filtered.mask());
        timings.core += decided.elapsed();
        choice.map(|d| (demand, d)).map_err(|why| {
            explain(
                why,
                &filtered.rejected,
                snapshot.nodes.len(),
                &self.config.gpu_resource,
            )
        })
    }

    async fn schedule_one(
        &mut self,
        snapshot: &mut Snapshot,
        verdicts: &Verdicts,
        pod: &PodInfo,
        now: Instant,
        report: &mut RoundReport,
    ) {
        let key = pod.key.clone();
        let decision = self.decide(snapshot, verdicts, pod, &mut report.timings);
        let started = Instant::now();
        match decision {
            Ok((demand, decision)) => {
                if self.commit(snapshot, pod, &demand, &decision).await {
                    report.bound += 1;
                } else {
                    report.conflicts += 1;
                }
            }
            Err(message) => {
                report.unschedulable += 1;
                self.back_off(&key.uid, now);
                debug!(pod = %key, %message, "unschedulable");
                self.emit(&key, "Warning", "FailedScheduling", message)
                    .await;
            }
        }
        report.timings.api += started.elapsed();
    }

    /// Records the assignment, binds, and applies it to the snapshot. On any failure the
    /// snapshot is unchanged and the annotation is removed, so nothing stays reserved.
    async fn commit(
        &mut self,
        snapshot: &mut Snapshot,
        pod: &PodInfo,
        demand: &PodDemand,
        decision: &Decision,
    ) -> bool {
        let key = pod.key.clone();
        let placement = decision.to_placement(&snapshot.state);
        let containers: &[ContainerDemand] = &demand.containers;
        let assignment = Assignment {
            node: placement.node.clone(),
            containers: split_devices(containers, &placement.devices),
            policy: self.config.policy.to_string(),
            time: rfc3339(SystemTime::now()),
        };
        let rv = pod.resource_version.clone();
        if let Err(e) = self
            .api
            .patch_assignment(&key, &rv, Some(&assignment.to_json()))
            .await
        {
            info!(pod = %key, error = %e, "assignment not recorded; retrying next round");
            return false;
        }
        if let Err(e) = self.api.bind(&key, &placement.node).await {
            warn!(pod = %key, node = %placement.node, error = %e, "binding failed; releasing the assignment");
            // The patch bumped the resourceVersion; remove the annotation unconditionally.
            let _ = self.api.patch_assignment(&key, "", None).await;
            return false;
        }
        if let Err(e) = snapshot
            .state
            .apply(decision.node, &demand.request, &decision.gpus)
        {
            warn!(pod = %key, error = %e, "bound pod could not be accounted");
        }
        for (k, v) in &demand.extended {
            *snapshot.extended_free[decision.node]
                .entry(k.clone())
                .or_default() -= v;
        }
        snapshot.held.insert(
            key.uid.clone(),
            Held {
                node: decision.node,
                request: demand.request.clone(),
                gpus: decision.gpus.clone(),
                extended: demand.extended.clone(),
            },
        );
        self.backoff.remove(&key.uid);
        let devices: Vec<&str> = assignment.devices().map(|d| d.id.as_str()).collect();
        self.emit(
            &key,
            "Normal",
            "Scheduled",
            format!(
                "Successfully assigned {key} to {} (GPUs: {})",
                placement.node,
                if devices.is_empty() {
                    "none".to_string()
                } else {
                    devices.join(",")
                }
            ),
        )
        .await;
        true
    }
}

mod gang_permit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
    }
}
