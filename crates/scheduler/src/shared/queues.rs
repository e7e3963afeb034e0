//! The queue stage (kube-scheduler's QueueSort, made fair): which queue each pod belongs
//! to, the tree of queues as the `Queue` objects define it, and per round the order units
//! are served in (core's [`Picker`]: below their guarantee first, then furthest below their
//! fair share, priority then arrival within a queue), each queue's limit, and what reclaim
//! may take ([`super::reclaim`]).
//!
//! While no `Queue` exists, no namespace names a default queue and no waiting pod names a
//! queue, the stage stands aside: units go in priority order as before, at no cost.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuplace_core::fairshare::{DIMS, Picker, QueueSpec, QueueTree, Res, fair_shares_of};
use k8s_openapi::api::core::v1::Namespace;

use crate::api::{ClusterView, Listed};
use crate::k8s::pod_info::PodInfo;
use crate::k8s::queue::{DEFAULT_QUEUE_ANNOTATION, Queue, core_spec, queue_name};
use crate::snapshot::Snapshot;

/// Why a pod has no queue to wait in.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NoQueue {
    #[error("queue {0} does not exist")]
    Missing(String),
    #[error("queue {0} cannot take pods: {1}")]
    Rejected(String, String),
    #[error("queue {0} has child queues; pods go to queues without children")]
    Inner(String),
}

/// The queues as the last view defined them.
pub struct Queues {
    tree: Arc<QueueTree>,
    /// The queue objects' names and specs the tree was built from (status writes change
    /// nothing here).
    built_from: Vec<(String, String)>,
    /// Queues whose spec could not be read, with why.
    spec_errors: BTreeMap<String, String>,
    /// Namespace -> its default queue.
    ns_defaults: HashMap<String, String>,
    ns_from: Vec<(String, String)>,
    gpu_resource: String,
    /// Per queue, the last half-life its spec set that could be used (kept while a later
    /// one cannot), and why the spec's present one was refused.
    last_half_life: HashMap<String, Option<u64>>,
    half_life_errors: BTreeMap<String, String>,
    /// The queue and namespace lists the last refresh read (the caches hand out the same
    /// list until that kind changes: then nothing is read again).
    read: Option<(Listed<Queue>, Listed<Namespace>)>,
    /// What each node's placed pods hold by queue, as last counted (see [`HeldMemo`]).
    held_memo: HeldMemo,
}

/// Per node, the placed pods last counted (compared by pointer) and what they held by
/// queue: a round recounts only the nodes whose pods changed, not every placed pod (at
/// 40,000 pods the walk, a queue lookup and a hash of the UID per pod, was four fifths of a
/// streamed run's CPU). Emptied whenever the queue specs or the namespaces' default queues
/// change (the queue a pod belongs to may have changed), not on a status alone.
#[derive(Default)]
struct HeldMemo {
    /// The state the counts were taken from (a state built anew may clamp what a pod holds
    /// differently: nothing is kept across one).
    built: usize,
    nodes: Vec<NodeHeld>,
    /// By queue index, the sum of every node's `held`.
    totals: Vec<Res>,
}

#[derive(Default)]
struct NodeHeld {
    node: Option<Arc<k8s_openapi::api::core::v1::Node>>,
    pods: Vec<Arc<PodInfo>>,
    held: Vec<(usize, Res)>,
}

impl NodeHeld {
    fn is_for(&self, node: &Arc<k8s_openapi::api::core::v1::Node>, pods: &[Arc<PodInfo>]) -> bool {
        self.node.as_ref().is_some_and(|n| Arc::ptr_eq(n, node))
            && self.pods.len() == pods.len()
            && self.pods.iter().zip(pods).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Queues {
    pub fn new(gpu_resource: &str) -> Queues {
        Queues {
            tree: Arc::new(QueueTree::build(Vec::new())),
            built_from: Vec::new(),
            spec_errors: BTreeMap::new(),
            ns_defaults: HashMap::new(),
            ns_from: Vec::new(),
            gpu_resource: gpu_resource.to_string(),
            last_half_life: HashMap::new(),
            half_life_errors: BTreeMap::new(),
            read: None,
            held_memo: HeldMemo::default(),
        }
    }

    /// Rebuilds the tree when the queue objects changed, and the namespaces' defaults.
    pub fn refresh(&mut self, view: &ClusterView) {
        if let Some((queues, namespaces)) = &self.read
            && Arc::ptr_eq(queues, &view.queues)
            && Arc::ptr_eq(namespaces, &view.namespaces)
        {
            return;
        }
        self.read = Some((Arc::clone(&view.queues), Arc::clone(&view.namespaces)));
        let from: Vec<(String, String)> = view
            .queues
            .iter()
            .map(|q| {
                (
                    q.metadata.name.clone().unwrap_or_default(),
                    serde_json::to_string(&q.spec).unwrap_or_default(),
                )
            })
            .collect();
        if from != self.built_from {
            let mut specs = Vec::new();
            self.spec_errors.clear();
            self.half_life_errors.clear();
            for q in view.queues.iter() {
                let name = q.metadata.name.clone().unwrap_or_default();
                match core_spec(&name, &q.spec, &self.gpu_resource) {
                    Ok(mut spec) => {
                        spec.usage_half_life_ms = self.half_life_of(&name, q);
                        specs.push(spec)
                    }
                    Err(e) => {
                        // Kept in the tree (children still find it) but serving nothing.
                        self.spec_errors.insert(name.clone(), e.to_string());
                        let mut spec = QueueSpec::open(&name);
                        spec.parent = q.spec.parent.clone();
                        spec.weight = f64::NAN;
                        specs.push(spec);
                    }
                }
            }
            self.tree = Arc::new(QueueTree::build(specs));
            self.built_from = from;
            // The queue a pod belongs to may have changed; a status written (this
            // scheduler's own, 100 queues every few seconds) changes nothing counted.
            self.held_memo = HeldMemo::default();
        }
        let ns_from: Vec<(String, String)> = view
            .namespaces
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    n.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        if ns_from != self.ns_from {
            self.ns_defaults = view
                .namespaces
                .iter()
                .filter_map(|n| {
                    let q = n
                        .metadata
                        .annotations
                        .as_ref()?
                        .get(DEFAULT_QUEUE_ANNOTATION)?;
                    Some((n.metadata.name.clone()?, q.clone()))
                })
                .collect();
            self.ns_from = ns_from;
            self.held_memo = HeldMemo::default();
        }
    }

    /// The half-life queue `name`'s spec sets; a refused one is recorded and the last valid
    /// one kept (after a restart: the one its status says its usage decays with).
    fn half_life_of(&mut self, name: &str, q: &crate::k8s::queue::Queue) -> Option<u64> {
        match crate::k8s::queue::half_life(&q.spec) {
            Ok(h) => {
                self.half_life_errors.remove(name);
                self.last_half_life.insert(name.to_string(), h);
                h
            }
            Err(e) => {
                let kept = self
                    .last_half_life
                    .get(name)
                    .copied()
                    .flatten()
                    .or_else(|| {
                        let shown = &q.status.as_ref()?.usage.as_ref()?.half_life;
                        gpuplace_core::fairshare::parse_half_life(shown).ok()
                    });
                let keeping = kept.map_or_else(
                    || "none set before".to_string(),
                    |ms| format!("keeping {}", gpuplace_core::fairshare::show_half_life(ms)),
                );
                self.half_life_errors
                    .insert(name.to_string(), format!("usageHalfLife: {e}; {keeping}"));
                kept
            }
        }
    }

    /// Why each queue's half-life was refused.
    pub fn half_life_problems(&self) -> &BTreeMap<String, String> {
        &self.half_life_errors
    }

    /// Whether queues matter this round: some queue exists, some namespace names one, or
    /// some waiting pod does.
    pub fn in_use(&self, view: &ClusterView, waiting: &[&Arc<PodInfo>]) -> bool {
        self.defined(view)
            || waiting
                .iter()
                .any(|p| p.labels.contains_key(crate::k8s::queue::QUEUE_LABEL))
    }

    pub fn tree(&self) -> Arc<QueueTree> {
        Arc::clone(&self.tree)
    }

    /// The queue `pod` belongs to.
    pub fn of(&self, pod: &PodInfo) -> Result<usize, NoQueue> {
        let name = queue_name(
            &pod.labels,
            self.ns_defaults.get(&pod.key.namespace).map(String::as_str),
        );
        self.named(name)
    }

    /// The queue of pods of `namespace` whose label names `label`.
    pub fn of_key(&self, namespace: &str, label: Option<&str>) -> Result<usize, NoQueue> {
        let name = label
            .filter(|l| !l.is_empty())
            .or(self.ns_defaults.get(namespace).map(String::as_str))
            .filter(|l| !l.is_empty())
            .unwrap_or(gpuplace_core::fairshare::DEFAULT_QUEUE);
        self.named(name)
    }

    /// Whether queues may matter for pods at all (some queue exists or is named by a
    /// namespace).
    pub fn defined(&self, view: &ClusterView) -> bool {
        !view.queues.is_empty() || !self.ns_defaults.is_empty()
    }

    fn named(&self, name: &str) -> Result<usize, NoQueue> {
        let q = self
            .tree
            .index(name)
            .ok_or_else(|| NoQueue::Missing(name.to_string()))?;
        if let Some(e) = self.spec_errors.get(name) {
            return Err(NoQueue::Rejected(name.to_string(), e.clone()));
        }
        if let Some(p) = &self.tree.nodes[q].problem {
            return Err(NoQueue::Rejected(name.to_string(), p.to_string()));
        }
        if !self.tree.is_leaf(q) {
            return Err(NoQueue::Inner(name.to_string()));
        }
        Ok(q)
    }

    /// What `pods` (one node's placed pods) hold, by queue: those not terminating, with
    /// what the snapshot holds for them (GPUs counted by the node's model).
    fn held_on(&self, snapshot: &Snapshot, pods: &[Arc<PodInfo>]) -> Vec<(usize, Res)> {
        pods.iter()
            .filter(|p| !p.deleting)
            .filter_map(|pod| {
                let (Ok(q), Some(h)) = (self.of(pod), snapshot.held.get(&pod.key.uid)) else {
                    return None;
                };
                let model = snapshot.state.inventory(h.node).gpu_model();
                Some((q, Res::of(&h.request, Some(model))))
            })
            .collect()
    }

    /// Why each queue that serves no pod does not (spec errors and tree problems).
    pub fn problems(&self) -> BTreeMap<String, String> {
        let mut out = self.spec_errors.clone();
        for n in self.tree.nodes.iter().skip(1) {
            if let Some(p) = &n.problem
                && !out.contains_key(&n.spec.name)
            {
                out.insert(n.spec.name.clone(), p.to_string());
            }
        }
        out
    }
}

/// What each queue holds and waits for at the start of a round.
pub struct Standing {
    /// By queue index: what its pods hold (bound or reserved, not terminating, plus
    /// preemptors' nominated requests).
    pub held: Vec<Res>,
    /// What its waiting pods ask for (nominees counted in `held` instead).
    pub pending: Vec<Res>,
    pub pending_pods: Vec<u32>,
    pub capacity: [u64; DIMS],
}

impl Standing {
    /// Counts the snapshot's placed pods and the waiting ones by queue.
    /// `built` counts the states built anew so far (the memo of what nodes hold is
    /// dropped when it moves).
    pub fn measure(
        queues: &mut Queues,
        snapshot: &Snapshot,
        built: usize,
        waiting: &[&Arc<PodInfo>],
        nominated: &dyn Fn(&str) -> bool,
    ) -> Standing {
        let tree = Arc::clone(&queues.tree);
        let mut held = vec![Res::default(); tree.len()];
        let mut pending = vec![Res::default(); tree.len()];
        let mut pending_pods = vec![0u32; tree.len()];
        let mut memo = std::mem::take(&mut queues.held_memo);
        if memo.built != built
            || memo.nodes.len() != snapshot.placed.len()
            || memo.totals.len() != tree.len()
        {
            memo = HeldMemo {
                built,
                nodes: std::iter::repeat_with(NodeHeld::default)
                    .take(snapshot.placed.len())
                    .collect(),
                totals: vec![Res::default(); tree.len()],
            };
        }
        for ((list, node), kept) in snapshot
            .placed
            .iter()
            .zip(&snapshot.nodes)
            .zip(&mut memo.nodes)
        {
            if kept.is_for(node, list) {
                continue;
            }
            for (q, res) in &kept.held {
                memo.totals[*q].sub(res);
                // As a fresh count: only the models that have some.
                memo.totals[*q].models.retain(|(_, amount)| *amount > 0);
            }
            *kept = NodeHeld {
                node: Some(Arc::clone(node)),
                pods: list.clone(),
                held: queues.held_on(snapshot, list),
            };
            for (q, res) in &kept.held {
                memo.totals[*q].add(res);
            }
        }
        held.clone_from(&memo.totals);
        queues.held_memo = memo;
        // The tests' builds (every stress, every round) hold the memo to a fresh count.
        #[cfg(debug_assertions)]
        {
            let mut fresh = vec![Res::default(); tree.len()];
            for list in &snapshot.placed {
                for (q, res) in queues.held_on(snapshot, list) {
                    fresh[q].add(&res);
                }
            }
            assert_eq!(
                held, fresh,
                "the queues' held GPUs, kept by node, differ from a fresh count"
            );
        }
        for pod in waiting {
            let (Ok(q), Ok(demand)) = (queues.of(pod), pod.demand.as_ref()) else {
                continue;
            };
            let res = Res::of(&demand.request, None);
            // A nominee's GPUs are held for it: counted there, once, and not as demand
            // again (the timeline counts it so from nomination to its next decision).
            if nominated(&pod.key.uid) {
                held[q].add(&res);
            } else {
                pending[q].add(&res);
            }
            pending_pods[q] += 1;
        }
        let capacity = [
            snapshot.state.gpu_capacity_milli(),
            (0..snapshot.state.len())
                .map(|n| snapshot.state.inventory(n).cpu_milli)
                .sum(),
            (0..snapshot.state.len())
                .map(|n| snapshot.state.inventory(n).memory_mib)
                .sum(),
        ];
        Standing {
            held,
            pending,
            pending_pods,
            capacity,
        }
    }

    /// Each queue's fair share, and the picker that serves units by it.
    pub fn picker<'t, U>(&self, tree: &'t QueueTree) -> (Vec<[u64; DIMS]>, Picker<'t, U>) {
        let fair = fair_shares_of(tree, &self.capacity, &self.held, &self.pending);
        let picker = Picker::new(tree, &self.held, fair.clone());
        (fair, picker)
    }
}

/// What `pods` ask for together.
pub fn asked(pods: &[&Arc<PodInfo>]) -> Res {
    let mut res = Res::default();
    for p in pods {
        if let Ok(d) = &p.demand {
            res.add(&Res::of(&d.request, None));
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::{Value, json};

    fn node() -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "n1"},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"}}
            }))
            .expect("node"),
        )
    }

    fn pod(name: &str, queue: &str) -> Arc<PodInfo> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "labels": {"gpuplace.io/queue": queue}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .expect("pod");
        Arc::new(PodInfo::from_pod(&pod, "nvidia.com/gpu"))
    }

    fn waiting(name: &str, queue: &str) -> Arc<PodInfo> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
                "labels": {"gpuplace.io/queue": queue}},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .expect("pod");
        Arc::new(PodInfo::from_pod(&pod, "nvidia.com/gpu"))
    }

    fn queue(name: &str, guaranteed: &str, status: Value) -> Arc<Queue> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "gpuplace.io/v1alpha1", "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"guaranteed": {"nvidia.com/gpu": guaranteed}},
                "status": status
            }))
            .expect("queue"),
        )
    }

    fn view(queues: Vec<Arc<Queue>>) -> ClusterView {
        ClusterView {
            queues: Arc::new(queues),
            ..ClusterView::default()
        }
    }

    /// The memo of what nodes hold by queue survives the statuses this scheduler writes
    /// (100 queues' every few seconds, each a new queue list), and goes when a spec changes
    /// (a pod's queue index may have moved).
    #[test]
    fn a_status_written_keeps_the_counts_a_spec_changed_drops_them() {
        let pods = vec![pod("a1", "a"), pod("a2", "a"), pod("b1", "b")];
        let snapshot = crate::snapshot::build(&[node()], &pods, "nvidia.com/gpu");
        let mut queues = Queues::new("nvidia.com/gpu");
        let held = |queues: &mut Queues| -> Vec<u64> {
            let standing = Standing::measure(queues, &snapshot, 1, &[], &|_| false);
            standing.held.iter().map(|r| r.dims[0]).collect()
        };
        let counted = |queues: &Queues| queues.held_memo.nodes.iter().any(|n| n.node.is_some());

        queues.refresh(&view(vec![
            queue("a", "2", json!({})),
            queue("b", "1", json!({})),
        ]));
        let first = held(&mut queues);
        let (a, b) = (
            queues.of(&pods[0]).expect("a"),
            queues.of(&pods[2]).expect("b"),
        );
        assert_eq!((first[a], first[b]), (2000, 1000));
        assert!(counted(&queues));

        let written = json!({"allocatedGPUs": "2", "pendingPods": 0});
        queues.refresh(&view(vec![
            queue("a", "2", written.clone()),
            queue("b", "1", written),
        ]));
        assert!(counted(&queues), "a status alone dropped the counts");
        assert_eq!(held(&mut queues), first);

        // A queue added (and the list in another order): the tree is built again and the
        // pods' queue indexes may move.
        queues.refresh(&view(vec![
            queue("b", "1", json!({})),
            queue("c", "3", json!({})),
            queue("a", "2", json!({})),
        ]));
        assert!(!counted(&queues), "a changed spec kept the counts");
        let after = held(&mut queues);
        let a = queues.of(&pods[0]).expect("a");
        assert_eq!(after[a], 2000);
        assert_eq!(after.iter().sum::<u64>(), 3000);
    }

    /// A nominee's GPUs are held for it: its queue counts them once, as held and not as
    /// demand too (the timeline counts it so; its fair share and reclaim see it once).
    #[test]
    fn a_nominee_counts_once_as_held() {
        let placed = vec![pod("a1", "a")];
        let snapshot = crate::snapshot::build(&[node()], &placed, "nvidia.com/gpu");
        let mut queues = Queues::new("nvidia.com/gpu");
        queues.refresh(&view(vec![queue("a", "2", json!({}))]));
        let (nominee, other) = (waiting("a2", "a"), waiting("a3", "a"));
        let standing = Standing::measure(&mut queues, &snapshot, 1, &[&nominee, &other], &|uid| {
            uid == "u-a2"
        });
        let a = queues.of(&placed[0]).expect("a");
        assert_eq!(standing.held[a].dims[0], 2000);
        assert_eq!(standing.pending[a].dims[0], 1000);
        assert_eq!(standing.pending_pods[a], 2);
    }
}
