//! The handshake at run time: GetPreferredAllocation answers the scheduler's plan for the
//! container being admitted, Allocate checks what the kubelet really chose and records it,
//! and the reconciler writes the node's truth back on the pod.
//!
//! Identification is [`crate::plan::identify::identify`]; the kubelet's `List` is read fresh for
//! every admission step while the rate limit allows, and otherwise reused within the same
//! pod's admission (the one case where a cached view is exact: the plugin itself recorded
//! every change since). Differences are served, never refused: the pod runs, and the
//! difference is counted, logged, recorded on the pod and reported with a Warning Event.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuplace_model::{ContainerKind, ContainerNeed};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::devices::{DeviceTable, PreferenceError};
use crate::kubelet::podresources::{PodResources, Priority};
use crate::metrics::Metrics;
use crate::plan::attribute::Unattributed;
use crate::plan::identify::{
    Admitting, Ask, Candidate, Identified, ListedPod, Served, identify, next_container,
};
use crate::plan::store::{NodePod, NodePods};

mod reconcile;

/// A failed write to the API server (retried on the next pass).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NodeApiError(pub String);

/// The writes the node agent makes on pods.
pub trait NodeApi: Send + Sync + 'static {
    /// Sets the pod's `gpuplace.io/allocated` annotation (only if the UID still matches).
    fn set_allocated(
        &self,
        pod: &NodePod,
        allocated: &str,
    ) -> impl Future<Output = Result<(), NodeApiError>> + Send;

    /// A Warning Event on the pod.
    fn warn(
        &self,
        pod: &NodePod,
        reason: &str,
        note: String,
    ) -> impl Future<Output = Result<(), NodeApiError>> + Send;
}

/// The answer given to the last GetPreferredAllocation, waiting for its Allocate; `pod` is
/// `None` when no container was found (the Allocate then needs no second look), and
/// `candidates` the containers it could have been.
#[derive(Clone, Debug)]
struct Pending {
    pod: Option<(Arc<NodePod>, String)>,
    answer: Vec<String>,
    candidates: Vec<Candidate>,
}

/// Whose container an identification found: the one, or the candidates.
fn owner(found: Identified) -> (Option<(Arc<NodePod>, String)>, Vec<Candidate>) {
    match found {
        Identified::Planned(a) => (Some((a.pod, a.container)), Vec::new()),
        // One pod placed without a plan: its devices are still recorded as its.
        Identified::Unplanned(mut c) if c.len() == 1 => {
            let one = c.remove(0);
            (Some((one.pod, one.container)), Vec::new())
        }
        Identified::Unplanned(c) | Identified::Ambiguous(c) => (None, c),
        Identified::NotYetKnown(_) => (None, Vec::new()),
    }
}

/// A `List` kept for the rest of one pod's admission, updated with what the plugin served.
#[derive(Clone, Debug)]
struct Cached {
    list: Vec<ListedPod>,
    uid: String,
    at: Instant,
}

#[derive(Default)]
struct State {
    served: Served,
    /// Allocates not yet known to be whose (attributed by the reconciler).
    unattributed: Unattributed,
    pending: Option<Pending>,
    cache: Option<Cached>,
    /// Containers already reported as different (one Event each).
    reported: HashSet<(String, String)>,
    /// The annotation last written per pod UID (the watch may not show it yet).
    written: HashMap<String, String>,
    /// The last `List` read during an admission, and when.
    fresh: Option<(Instant, Vec<ListedPod>)>,
}

/// A container whose devices differ from the plan: name, planned and real GPU IDs.
type Difference = (String, Vec<String>, Vec<String>);

/// Settings of the handshake.
#[derive(Clone, Debug)]
pub struct HandshakeConfig {
    pub node: String,
    /// How long an admission waits for the pod watch to deliver a pod the kubelet lists.
    pub wait_for_watch: Duration,
    /// Reconcile at least this often.
    pub resync: Duration,
}

/// The node side of the handshake.
pub struct Handshake {
    config: HandshakeConfig,
    pods: NodePods,
    podres: PodResources,
    tables: watch::Receiver<Arc<DeviceTable>>,
    metrics: Metrics,
    state: Mutex<State>,
    dirty: Notify,
}

/// The physical GPU IDs behind advertised device IDs (unknown IDs are skipped).
fn physical_ids(table: &DeviceTable, ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for id in ids {
        if let Ok(d) = table.resolve(std::slice::from_ref(id), false) {
            let gpu = &table.gpu(d[0].gpu).id;
            if !out.contains(gpu) {
                out.push(gpu.clone());
            }
        }
    }
    out
}

/// Whether every device planned for the container `need` of `pod` is offered.
fn offered(pod: &NodePod, need: &ContainerNeed, ask: &Ask<'_>) -> bool {
    let planned = pod.planned(&need.name);
    planned.len() == need.count as usize
        && planned
            .iter()
            .all(|id| ask.must_include.contains(id) || ask.available.contains(id))
}

/// Whether `ids` are slices of the share resource.
fn is_share(table: &DeviceTable, ids: &[String]) -> bool {
    ids.first()
        .and_then(|id| table.resolve(std::slice::from_ref(id), false).ok())
        .is_some_and(|d| d[0].slice)
}

fn same_set(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

/// The pending GetPreferredAllocation answer if the Allocate of `ids` is the call it
/// answered: the kubelet took exactly those devices. A pending answer of another size or
/// other devices is not this Allocate's: it is left from an admission that failed between
/// the two calls (its pod's devices busy), and taking it would give these devices to that
/// pod and lose them for this one (an init container missing from its pod's record).
fn answered(pending: Option<Pending>, ids: &[String]) -> Option<Pending> {
    pending.filter(|p| same_set(&p.answer, ids))
}

impl Handshake {
    pub fn new(
        config: HandshakeConfig,
        pods: NodePods,
        podres: PodResources,
        tables: watch::Receiver<Arc<DeviceTable>>,
        metrics: Metrics,
    ) -> Arc<Handshake> {
        Arc::new(Handshake {
            config,
            pods,
            podres,
            tables,
            metrics,
            state: Mutex::default(),
            dirty: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kubelet's active pods: from the cache when the rate limit has no token free
    /// and the pod whose admission the cache follows still has a container of this size
    /// to go (the kubelet is still admitting it), else fresh.
    async fn listed(&self, ask: &Ask<'_>) -> Result<Vec<ListedPod>, String> {
        if !self.podres.token_free() {
            let state = self.state();
            if let Some(c) = state.cache.as_ref()
                && c.at.elapsed() < Duration::from_secs(1)
                && let Some((l, pod)) = c.list.iter().find_map(|l| {
                    self.pods
                        .get(&l.namespace, &l.name)
                        .filter(|p| p.uid == c.uid)
                        .map(|p| (l, p))
                })
                && next_container(&pod, l, &state.served).is_some_and(|n| ask.matches(n))
            {
                self.metrics.handshake("list_cached");
                return Ok(c.list.clone());
            }
        }
        self.metrics.handshake("list");
        match self.podres.list(Priority::Admission).await {
            Ok(Some(list)) => {
                self.state().fresh = Some((Instant::now(), list.clone()));
                Ok(list)
            }
            Ok(None) => Err("no PodResources token".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Identifies the container being admitted, waiting a bounded time for the pod watch
    /// when the kubelet lists a pod it has not delivered yet.
    async fn identify(
        &self,
        table: &DeviceTable,
        available: &[String],
        must: &[String],
        size: usize,
        share: bool,
        waited: &mut bool,
    ) -> Identified {
        let available: HashSet<String> = physical_ids(table, available).into_iter().collect();
        let must: HashSet<String> = physical_ids(table, must).into_iter().collect();
        let ask = Ask {
            available: &available,
            must_include: &must,
            size,
            share,
        };
        let deadline = Instant::now() + self.config.wait_for_watch;
        if let Some(found) = self.confirm_by_get(&ask, deadline, waited).await {
            return found;
        }
        let list = match self.listed(&ask).await {
            Ok(list) => list,
            Err(e) => {
                warn!(error = %e, "cannot read the kubelet's pod resources: answering without the plan");
                self.metrics.handshake("list_error");
                return Identified::Unplanned(Vec::new());
            }
        };
        let mut changes = self.pods.subscribe();
        loop {
            let found = identify(&self.pods, &list, &self.state().served, &ask);
            match found {
                Identified::NotYetKnown(pods) => {
                    *waited = true;
                    self.metrics.handshake("waited_for_watch");
                    let woke = tokio::time::timeout_at(deadline, changes.changed()).await;
                    if !matches!(woke, Ok(Ok(()))) {
                        warn!(
                            ?pods,
                            "the kubelet admits pods the pod watch has not delivered; answering without them"
                        );
                        self.metrics.handshake("watch_late");
                        let known: Vec<ListedPod> = list
                            .iter()
                            .filter(|l| self.pods.get_or_deleted(&l.namespace, &l.name).is_some())
                            .cloned()
                            .collect();
                        let again = identify(&self.pods, &known, &self.state().served, &ask);
                        self.remember(list, &again);
                        return again;
                    }
                }
                found => {
                    self.remember(list, &found);
                    return found;
                }
            }
        }
    }

    /// The fast path on kubelets that serve PodResources `Get` (1.34+): the store's pods
    /// with a plan whose next container (by the plugin's own record) asks for this size
    /// with every planned device on offer, each confirmed with `Get`. The kubelet adds a pod
    /// to its active pods just before admitting it, one pod at a time, so an active candidate
    /// without devices for that container is the one being admitted. Exactly one confirmed:
    /// the answer, without listing every pod on the node; anything else (several, a pod
    /// without a plan that could be the one, `Get` not served): `None`, and `List` decides.
    ///
    /// When the store holds no pod at all that could be admitted, the pod watch is behind
    /// the kubelet's: wait for it (until `deadline`) rather than list every pod on the node.
    async fn confirm_by_get(
        &self,
        ask: &Ask<'_>,
        deadline: Instant,
        waited: &mut bool,
    ) -> Option<Identified> {
        if !self.podres.get_served() {
            return None;
        }
        let mut changes = self.pods.subscribe();
        let candidates = loop {
            let (candidates, others) = self.get_candidates(ask);
            if !candidates.is_empty() || others {
                break candidates;
            }
            *waited = true;
            self.metrics.handshake("waited_for_watch");
            let woke = tokio::time::timeout_at(deadline, changes.changed()).await;
            if !matches!(woke, Ok(Ok(()))) {
                return None;
            }
        };
        if candidates.is_empty() || candidates.len() > 3 {
            return None;
        }
        let mut confirmed = Vec::new();
        for pod in candidates {
            self.metrics.handshake("get");
            match self.podres.get(&pod.namespace, &pod.name).await {
                Ok(Some(listed)) => {
                    let next = {
                        let state = self.state();
                        next_container(&pod, &listed, &state.served)
                            .filter(|n| ask.matches(n) && offered(&pod, n, ask))
                            .map(|n| n.name.clone())
                    };
                    if let Some(container) = next {
                        confirmed.push((pod, container));
                    }
                }
                Ok(None) => {}
                Err(_) => return None,
            }
        }
        if confirmed.len() != 1 {
            return None;
        }
        let (pod, container) = confirmed.remove(0);
        Some(Identified::Planned(Admitting {
            planned: pod.planned(&container),
            pod,
            container,
            offered: true,
        }))
    }

    /// The store's pods with a plan that `Get` may confirm as the one being admitted, and
    /// whether another pod (no plan, or planned devices not on offer) could be it.
    fn get_candidates(&self, ask: &Ask<'_>) -> (Vec<Arc<NodePod>>, bool) {
        let nobody = ListedPod::default();
        let state = self.state();
        let others = std::cell::Cell::new(false);
        let candidates = self.pods.matching(|p| {
            if p.finished {
                return false;
            }
            let Some(next) = next_container(p, &nobody, &state.served).filter(|n| ask.matches(n))
            else {
                return false;
            };
            let planned = p.assignment().is_some() && offered(p, next, ask);
            others.set(others.get() || !planned);
            planned
        });
        (candidates, others.get())
    }

    fn remember(&self, list: Vec<ListedPod>, found: &Identified) {
        if let Identified::Planned(a) = found {
            let mut state = self.state();
            let fresh = state.cache.as_ref().is_none_or(|c| c.uid != a.pod.uid);
            if fresh {
                state.cache = Some(Cached {
                    list,
                    uid: a.pod.uid.clone(),
                    at: Instant::now(),
                });
            }
        }
    }

    /// GetPreferredAllocation for one container: the plan of the container being admitted
    /// when it can be found, else the topology-aware choice. Its time is observed, apart
    /// for the calls that had to wait for the pod watch.
    pub async fn preferred(
        &self,
        table: &DeviceTable,
        share: bool,
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<Vec<String>, PreferenceError> {
        let started = Instant::now();
        let mut waited = false;
        let answer = self
            .preferred_answer(table, share, available, must_include, size, &mut waited)
            .await;
        self.metrics
            .preferred_seconds(waited, started.elapsed().as_secs_f64());
        answer
    }

    async fn preferred_answer(
        &self,
        table: &DeviceTable,
        share: bool,
        available: &[String],
        must_include: &[String],
        size: i64,
        waited: &mut bool,
    ) -> Result<Vec<String>, PreferenceError> {
        let fallback = |result: &str, found: Identified| {
            self.metrics.handshake(result);
            let usage = self.usage(table);
            let answer = if share {
                let (ids, fits) = table.slices_for(available, must_include, size, &usage, None)?;
                if !fits {
                    self.metrics.handshake("share_without_room");
                }
                ids
            } else {
                table
                    .preferred_avoiding(available, must_include, size, &usage)
                    .map(|(ids, _)| ids)?
            };
            let (pod, candidates) = owner(found);
            self.state().pending = Some(Pending {
                pod,
                answer: answer.clone(),
                candidates,
            });
            Ok(answer)
        };
        if size < 1 {
            return fallback("no_plan", Identified::Unplanned(Vec::new()));
        }
        match self
            .identify(table, available, must_include, size as usize, share, waited)
            .await
        {
            Identified::Planned(a) => {
                let usage = self.usage(table);
                let answer = if share {
                    let (ids, fits) = table.slices_for(
                        available,
                        must_include,
                        size,
                        &usage,
                        a.planned.first().map(String::as_str),
                    )?;
                    if !fits {
                        self.metrics.handshake("share_without_room");
                        warn!(pod = %a.pod.name, container = %a.container, "no GPU has room for the planned share");
                    }
                    ids
                } else {
                    table.ids_for_plan(&a.planned, available, must_include, size, &usage)?
                };
                debug!(pod = %a.pod.name, container = %a.container, ?answer, "answering the plan");
                self.metrics
                    .handshake(if a.offered { "planned" } else { "planned_busy" });
                self.state().pending = Some(Pending {
                    pod: Some((a.pod, a.container)),
                    answer: answer.clone(),
                    candidates: Vec::new(),
                });
                Ok(answer)
            }
            Identified::Ambiguous(candidates) => {
                let names: Vec<String> = candidates.iter().map(ToString::to_string).collect();
                warn!(
                    candidates = ?names,
                    "several pods could be the one admitted: topology-aware answer instead of a plan"
                );
                fallback("ambiguous", Identified::Ambiguous(candidates))
            }
            found @ (Identified::Unplanned(_) | Identified::NotYetKnown(_)) => {
                fallback("no_plan", found)
            }
        }
    }

    /// Allocate for one container: attributes the devices to a (pod, container), records
    /// them, and counts a difference from the plan. Never fails the container.
    pub async fn allocated(&self, table: &DeviceTable, ids: &[String]) {
        let pending = self.state().pending.take();
        let (target, candidates) = match answered(pending, ids) {
            Some(p) => (p.pod, p.candidates),
            // No GetPreferredAllocation before (devices reused from init containers, or
            // an exactly aligned NUMA set), or a stale one: find the container by state.
            None => owner(
                self.identify(table, ids, &[], ids.len(), is_share(table, ids), &mut false)
                    .await,
            ),
        };
        let Some((pod, container)) = target else {
            // Kept until the kubelet's next containers tell whose it was.
            self.metrics.handshake("allocate_unattributed");
            self.state().unattributed.push(ids.to_vec(), candidates);
            self.dirty.notify_one();
            return;
        };
        let got = physical_ids(table, ids);
        let planned = pod.planned(&container);
        if !planned.is_empty() && !same_set(&got, &planned) {
            self.metrics.handshake("allocate_differs");
            warn!(pod = %format!("{}/{}", pod.namespace, pod.name), %container, ?planned, ?got, "the kubelet chose other devices than the plan");
        }
        let kind = pod
            .containers
            .iter()
            .find(|c| c.name == container)
            .map(|c| c.kind)
            .unwrap_or_default();
        let mut state = self.state();
        state.served.record(&pod.uid, &container, ids.to_vec());
        if let Some(cache) = state.cache.as_mut()
            && cache.uid == pod.uid
            && kind != ContainerKind::Init
            && let Some(l) = cache
                .list
                .iter_mut()
                .find(|l| l.namespace == pod.namespace && l.name == pod.name)
        {
            match l.containers.iter_mut().find(|(n, _)| *n == container) {
                Some((_, d)) => *d = ids.to_vec(),
                None => l.containers.push((container.clone(), ids.to_vec())),
            }
        }
        drop(state);
        self.dirty.notify_one();
    }

    /// Milli-GPU in use per GPU, by the devices of the node's live pods: what the plugin
    /// served (pods still in the store and not finished) and, when one was read in the
    /// last second, the kubelet's `List` (its record, for pods served before a restart).
    /// A GPU with shares is never handed out whole, and a wholly used GPU gives no shares.
    fn usage(&self, table: &DeviceTable) -> Vec<u32> {
        let pods = self.pods.snapshot();
        let live: HashSet<&str> = pods
            .values()
            .filter(|p| !p.finished)
            .map(|p| p.uid.as_str())
            .collect();
        let state = self.state();
        let mut ids: Vec<&str> = Vec::new();
        for (uid, containers) in state.served.pods() {
            if live.contains(uid.as_str()) {
                ids.extend(containers.values().flatten().map(String::as_str));
            }
        }
        if let Some((at, list)) = state.fresh.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            for l in list {
                if pods
                    .get(&(l.namespace.clone(), l.name.clone()))
                    .is_some_and(|p| !p.finished)
                {
                    ids.extend(
                        l.containers
                            .iter()
                            .flat_map(|(_, d)| d.iter().map(String::as_str)),
                    );
                }
            }
        }
        table.usage(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::{Pending, answered};

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_allocate_takes_the_pending_answer_only_for_exactly_its_devices() {
        let pending = || {
            Some(Pending {
                pod: None,
                answer: ids(&["GPU-0", "GPU-1"]),
                candidates: Vec::new(),
            })
        };
        // The call it answered, in any order.
        assert!(answered(pending(), &ids(&["GPU-1", "GPU-0"])).is_some());
        // Left from an admission that failed between the two calls: the same size on
        // other devices (the stale answer the handshake stress found), another size.
        assert!(answered(pending(), &ids(&["GPU-0", "GPU-2"])).is_none());
        assert!(answered(pending(), &ids(&["GPU-0"])).is_none());
        assert!(answered(pending(), &ids(&["GPU-0", "GPU-1", "GPU-2"])).is_none());
        assert!(answered(None, &ids(&["GPU-0"])).is_none());
    }
}
