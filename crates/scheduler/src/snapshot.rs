//! From Kubernetes objects to a [`ClusterState`]: node inventories (the device plugin's
//! annotation, or capacity and GFD labels), and what bound pods already hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuplace_core::ClusterState;
use gpuplace_model::{INVENTORY_ANNOTATION, NodeInventory, Request};
use k8s_openapi::api::core::v1::Node;
use tracing::warn;

use crate::k8s::demand::{Allocated, Assignment, milli_value};
use crate::k8s::pod_info::PodInfo;

mod holds;

/// What a bound pod holds on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub node: usize,
    pub request: Request,
    pub gpus: Vec<(usize, u32)>,
    pub extended: BTreeMap<String, i64>,
}

/// Scalar resources still free per node besides CPU, memory and GPUs (extended resources,
/// the pod count, ephemeral storage, hugepages), in the units of [`PodDemand::extended`].
///
/// [`PodDemand::extended`]: crate::k8s::demand::PodDemand
#[derive(Clone, Debug, Default)]
pub struct Scalars {
    pub free: Vec<BTreeMap<String, i64>>,
    /// Nodes with no pod slot left: while none is full, a pod asking only for its slot
    /// needs no per-node check.
    pods_full: usize,
    /// gpuplace's DeviceClass that serves the device plugin's GPU resource on nodes
    /// served through DRA (the view's), if one: pods asking that resource may go there.
    pub gpu_class: Option<std::sync::Arc<crate::k8s::dra::extended::GpuClass>>,
}

impl Scalars {
    fn new(free: Vec<BTreeMap<String, i64>>) -> Scalars {
        let pods_full = free
            .iter()
            .filter(|m| m.get("pods").is_some_and(|f| *f < 1))
            .count();
        Scalars {
            free,
            pods_full,
            gpu_class: None,
        }
    }

    /// Whether node `n` serves its GPUs through gpuplace's DRA driver.
    pub fn serves_claims(&self, n: usize) -> bool {
        self.free
            .get(n)
            .is_some_and(|f| f.contains_key(crate::k8s::dra::DRA_GPUS))
    }

    /// Takes one pod's `amounts` (and its pod slot) on node `n`.
    pub fn take(&mut self, n: usize, amounts: &BTreeMap<String, i64>) {
        let Some(free) = self.free.get_mut(n) else {
            return;
        };
        for (k, v) in amounts {
            *free.entry(k.clone()).or_default() -= v;
        }
        if let Some(slots) = free.get_mut("pods") {
            *slots -= 1;
            if *slots == 0 {
                self.pods_full += 1;
            }
        }
    }

    /// Gives back what [`take`](Self::take) took.
    pub fn give(&mut self, n: usize, amounts: &BTreeMap<String, i64>) {
        let Some(free) = self.free.get_mut(n) else {
            return;
        };
        for (k, v) in amounts {
            *free.entry(k.clone()).or_default() += v;
        }
        if let Some(slots) = free.get_mut("pods") {
            *slots += 1;
            if *slots == 1 {
                self.pods_full = self.pods_full.saturating_sub(1);
            }
        }
    }

    /// Whether `amounts` (and a pod slot) must be checked node by node.
    pub fn must_check(&self, amounts: &BTreeMap<String, i64>) -> bool {
        !amounts.is_empty() || self.pods_full > 0
    }
}

/// The cluster as the scheduler sees it at the start of a round.
pub struct Snapshot {
    pub state: ClusterState,
    pub nodes: Vec<Arc<Node>>,
    /// Scalar resources still free per node.
    pub scalars: Scalars,
    /// Pod UID -> what it holds.
    pub held: HashMap<String, Held>,
    /// The pods on each node (bound, or reserved), for filters about other pods.
    pub placed: Vec<Vec<Arc<PodInfo>>>,
    /// Placed pods with anti-affinity terms: while there are none, pods without terms of
    /// their own skip the inter-pod filters.
    pub anti_affinity_pods: usize,
    /// Placed pods with preferred pod (anti-)affinity terms, which score other pods' nodes.
    pub preferring_pods: usize,
    /// Nodes with a `PreferNoSchedule` taint (while there are some, every pod is scored).
    pub soft_taint_nodes: usize,
    /// Placed pods per priority: a preemptor with nothing below it needs no search.
    pub priorities: BTreeMap<i32, usize>,
    /// Problems found in objects (malformed annotations); nothing was lost because of them.
    pub warnings: Vec<Warning>,
    /// Per set of DRA claim selectors, each node's verdict (see
    /// [`crate::framework::claim_selectors`]), made once per node set.
    pub selector_verdicts: std::sync::Mutex<HashMap<String, Arc<Vec<Option<String>>>>>,
}

/// A problem found in an object. `namespace` is whose object it is (a pod's namespace;
/// none for a node): the map shows it only to who may see that namespace's pods, by this
/// field, never by reading the text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Warning {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub message: String,
}

impl Warning {
    /// A warning about node `name`'s object.
    pub fn node(message: String) -> Warning {
        Warning {
            namespace: None,
            message,
        }
    }

    /// A warning about `pod`: `pod NAMESPACE/NAME: what`.
    pub fn pod(pod: &crate::api::PodKey, what: impl std::fmt::Display) -> Warning {
        Warning {
            namespace: Some(pod.namespace.clone()),
            message: format!("pod {pod}: {what}"),
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn allocatable(node: &Node, name: &str) -> i128 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(name))
        .and_then(|q| milli_value(q).ok())
        .unwrap_or(0)
}

/// Time-slicing replicas per GPU the node's device plugin advertises (`nvidia.com/gpu.replicas`,
/// set by gpuplace's plugin and by GFD); 1 without.
pub fn replicas_of(node: &Node) -> u32 {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(gpuplace_model::keys::GPU_REPLICAS_LABEL))
        .and_then(|r| r.trim().parse::<u32>().ok())
        .filter(|r| (1..=64).contains(r))
        .unwrap_or(1)
}

/// The node's inventory: CPU and memory from allocatable; GPUs, links and health from the
/// device plugin's annotation whenever it is valid, so one unhealthy GPU never costs the
/// node its topology. The kubelet's allocatable count (healthy devices, divided by the
/// time-slicing replicas) says how many GPUs it will admit pods to: while it is lower than
/// the annotation's healthy GPUs (a GPU back to health that the kubelet's node status, sent
/// every 10 s, does not show yet; 0 before the plugin registered), the last healthy GPUs
/// beyond it get no capacity. Without a valid annotation: `count` plain GPUs named
/// `<node>-gpu<i>` with the GFD product label as model.
pub fn inventory_of(node: &Node, gpu_resource: &str) -> (NodeInventory, Option<Warning>) {
    let (mut inv, warning) = counted_inventory(node, gpu_resource);
    if is_dra_node(node) {
        // The kubelet counts no device plugin GPUs here: its GPUs are the inventory's.
        if let Some(published) = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INVENTORY_ANNOTATION))
            .and_then(|t| NodeInventory::from_json(t).ok())
        {
            for (gpu, was) in inv.gpus.iter_mut().zip(&published.gpus) {
                gpu.healthy = was.healthy;
            }
            return (inv, None);
        }
    }
    (inv, warning)
}

/// Whether gpuplace's DRA driver serves `node`'s GPUs (claim pods go there).
pub fn is_dra_node(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(gpuplace_model::keys::DRA_DRIVER_LABEL))
}

fn counted_inventory(node: &Node, gpu_resource: &str) -> (NodeInventory, Option<Warning>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let cpu_milli = u64::try_from(allocatable(node, "cpu")).unwrap_or(0);
    let memory_mib = (u64::try_from(allocatable(node, "memory")).unwrap_or(0) / 1000) >> 20;
    let replicas = replicas_of(node);
    let count = u32::try_from(allocatable(node, gpu_resource) / 1000).unwrap_or(0) / replicas;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let mut warning = None;
    if let Some(text) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INVENTORY_ANNOTATION))
    {
        match NodeInventory::from_json(text) {
            Ok(mut inv) => {
                let healthy = inv.gpus.iter().filter(|g| g.healthy).count() as u32;
                if count < healthy {
                    if count > 0 {
                        warning = Some(Warning::node(format!(
                            "node {name}: {INVENTORY_ANNOTATION} lists {healthy} healthy GPUs but {gpu_resource} allocatable is {count}; the last {} are not used until the kubelet counts them",
                            healthy - count
                        )));
                    }
                    let mut keep = count;
                    for gpu in inv.gpus.iter_mut().filter(|g| g.healthy) {
                        if keep == 0 {
                            gpu.healthy = false;
                        } else {
                            keep -= 1;
                        }
                    }
                }
                inv.name = name;
                inv.cpu_milli = cpu_milli;
                inv.memory_mib = memory_mib;
                inv.replicas = replicas;
                return (inv, warning);
            }
            Err(e) => {
                warning = Some(Warning::node(format!(
                    "node {name}: {INVENTORY_ANNOTATION}: {e}; using the count"
                )))
            }
        }
    }
    let model = labels
        .get(gpuplace_model::keys::GPU_PRODUCT_LABEL)
        .cloned()
        .unwrap_or_default();
    let mut inv = NodeInventory::uniform(&name, cpu_milli, memory_mib, count, &model);
    let gpu_memory = labels
        .get(gpuplace_model::keys::GPU_MEMORY_LABEL)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    for gpu in &mut inv.gpus {
        gpu.memory_mib = gpu_memory;
    }
    inv.labels = labels;
    inv.replicas = replicas;
    (inv, warning)
}

/// Builds the state from every node and every pod (bound pods' holdings applied).
pub fn build(nodes: &[Arc<Node>], pods: &[Arc<PodInfo>], gpu_resource: &str) -> Snapshot {
    let mut warnings = Vec::new();
    let mut inventories = Vec::with_capacity(nodes.len());
    let mut names = std::collections::HashSet::new();
    let mut kept = Vec::with_capacity(nodes.len());
    for node in nodes {
        let (inv, warning) = inventory_of(node, gpu_resource);
        warnings.extend(warning);
        if inv.name.is_empty() || !names.insert(inv.name.clone()) || inv.validate().is_err() {
            warnings.push(Warning::node(format!(
                "node {:?} skipped: no name, a duplicate, or an invalid inventory",
                inv.name
            )));
            continue;
        }
        inventories.push(inv);
        kept.push(Arc::clone(node));
    }
    let extended_free: Vec<BTreeMap<String, i64>> = kept
        .iter()
        .map(|node| {
            node.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| {
                    a.iter()
                        .filter(|(k, _)| {
                            !matches!(k.as_str(), "cpu" | "memory") && k.as_str() != gpu_resource
                        })
                        .map(|(k, q)| (k.clone(), (milli_value(q).unwrap_or(0) / 1000) as i64))
                        .collect()
                })
                .map(|mut free: BTreeMap<String, i64>| {
                    if is_dra_node(node) {
                        free.insert(crate::k8s::dra::DRA_GPUS.to_string(), i64::MAX / 2);
                    }
                    free
                })
                .unwrap_or_default()
        })
        .collect();
    // Inventories were validated above, so this cannot fail.
    let state = ClusterState::new(inventories).unwrap_or_else(|_| {
        ClusterState::new(Vec::new()).unwrap_or_else(|_| unreachable!("empty state is valid"))
    });
    let node_count = kept.len();
    let mut snapshot = Snapshot {
        state,
        nodes: kept,
        scalars: Scalars::new(extended_free),
        held: HashMap::new(),
        placed: vec![Vec::new(); node_count],
        anti_affinity_pods: 0,
        preferring_pods: 0,
        soft_taint_nodes: 0,
        priorities: BTreeMap::new(),
        warnings,
        selector_verdicts: Default::default(),
    };
    snapshot.soft_taint_nodes = snapshot
        .nodes
        .iter()
        .filter(|n| crate::framework::preference::has_soft_taint(n))
        .count();
    for pod in pods.iter().filter(|p| p.is_active_bound()) {
        snapshot.account(pod);
        if let Some(n) = pod
            .node_name
            .as_deref()
            .and_then(|n| snapshot.node_index(n))
        {
            snapshot.place(n, pod);
        }
    }
    snapshot
}

impl Snapshot {
    /// Records `pod` as placed on node `n` for the inter-pod filters.
    pub fn place(&mut self, n: usize, pod: &Arc<PodInfo>) {
        if pod
            .placement
            .as_ref()
            .is_some_and(|t| !t.anti_affinity.is_empty())
        {
            self.anti_affinity_pods += 1;
        }
        if pod.placement.as_ref().is_some_and(|t| t.scores_others()) {
            self.preferring_pods += 1;
        }
        *self.priorities.entry(pod.priority).or_default() += 1;
        if let Some(list) = self.placed.get_mut(n) {
            list.push(Arc::clone(pod));
        }
    }

    /// Gives back everything pod `uid` holds (bound or reserved); false when it holds
    /// nothing.
    pub fn release(&mut self, uid: &str) -> bool {
        let Some(held) = self.held.remove(uid) else {
            return false;
        };
        if let Err(e) = self.state.release(held.node, &held.request, &held.gpus) {
            warn!(pod = %uid, error = %e, "cannot give back what a pod held");
        }
        self.scalars.give(held.node, &held.extended);
        if let Some(list) = self.placed.get_mut(held.node)
            && let Some(i) = list.iter().position(|p| p.key.uid == uid)
        {
            let pod = list.swap_remove(i);
            if pod
                .placement
                .as_ref()
                .is_some_and(|t| !t.anti_affinity.is_empty())
            {
                self.anti_affinity_pods = self.anti_affinity_pods.saturating_sub(1);
            }
            if pod.placement.as_ref().is_some_and(|t| t.scores_others()) {
                self.preferring_pods = self.preferring_pods.saturating_sub(1);
            }
            if let Some(count) = self.priorities.get_mut(&pod.priority) {
                *count = count.saturating_sub(1);
            }
        }
        true
    }

    /// What the state holds per node (free CPU, memory, milli-GPU per GPU), to compare two
    /// states built different ways.
    pub fn free_by_node(&self) -> Vec<(String, u64, u64, Vec<u32>)> {
        (0..self.state.len())
            .map(|n| {
                let s = self.state.node(n);
                (
                    self.state.inventory(n).name.clone(),
                    s.cpu_free,
                    s.memory_free,
                    s.gpu_free.clone(),
                )
            })
            .collect()
    }

    /// Whether some placed pod has a priority below `priority`.
    pub fn has_priority_below(&self, priority: i32) -> bool {
        self.priorities.range(..priority).any(|(_, n)| *n > 0)
    }

    /// Node index by name.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.state.find(name)
    }

    /// The position of GPU `id` among node `n`'s devices.
    pub fn gpu_position(&self, n: usize, id: &str) -> Option<usize> {
        gpu_position(self.state.inventory(n), id)
    }

    /// Applies what a bound pod holds. Its devices come from the node's record of what the
    /// kubelet gave it (`gpuplace.io/allocated`), else from its assignment; a pod with
    /// neither (bound by another scheduler, before its node reported) or with malformed ones
    /// takes the first fitting GPUs, so nothing is ever handed out twice.
    pub fn account(&mut self, pod: &PodInfo) {
        let uid = pod.key.uid.clone();
        if uid.is_empty() || self.held.contains_key(&uid) {
            return;
        }
        let node_name = pod.node_name.clone().unwrap_or_default();
        let Some(n) = self.node_index(&node_name) else {
            return;
        };
        let pod_name = pod.key.name.clone();
        let demand = match &pod.demand {
            Ok(d) => d.clone(),
            Err(e) => {
                self.warnings
                    .push(Warning::pod(&pod.key, format_args!("{e}; not counted")));
                return;
            }
        };
        // What the pod holds of each of its GPUs (a replica on a time-sliced node).
        let milli = self.state.effective(n, &demand.request).gpu_milli.max(1);
        let mut gpus = self.recorded_gpus(pod, n, milli);
        if gpus.len() != demand.request.gpu_count as usize {
            // Unknown devices: hold the first GPUs that fit.
            gpus.clear();
            let state = self.state.node(n);
            for (pos, &free) in state.gpu_free.iter().enumerate() {
                if gpus.len() == demand.request.gpu_count as usize {
                    break;
                }
                if free >= milli {
                    gpus.push((pos, milli));
                }
            }
        }
        // A node already over-committed (pods bound elsewhere) still gets the pod counted:
        // clamp to what is there rather than lose the pod.
        let mut request = demand.request.clone();
        let free = self.state.node(n);
        request.cpu_milli = request.cpu_milli.min(free.cpu_free);
        request.memory_mib = request.memory_mib.min(free.memory_free);
        gpus.retain(|&(g, m)| free.gpu_free[g] >= m);
        if let Err(e) = self.state.apply(n, &request, &gpus) {
            warn!(pod = %pod_name, error = %e, "cannot account a bound pod");
            return;
        }
        self.scalars.take(n, &demand.extended);
        if let Err(e) = &pod.declared_ms {
            self.warnings.push(Warning::pod(&pod.key, e));
        }
        self.held.insert(
            uid,
            Held {
                node: n,
                request,
                gpus,
                extended: demand.extended,
            },
        );
    }

    /// The GPUs of node `n` a bound pod holds (position, `milli` each), as recorded: the
    /// node's record of what the kubelet gave the pod wins over the scheduler's plan. A
    /// record naming another node, or unreadable, is warned about and not used.
    fn recorded_gpus(&mut self, pod: &PodInfo, n: usize, milli: u32) -> Vec<(usize, u32)> {
        let node_name = pod.node_name.as_deref().unwrap_or_default();
        let inventory = self.state.inventory(n);
        let mut gpus: Vec<(usize, u32)> = Vec::new();
        // The pod's share of each GPU, not one container's part of it.
        let hold = |gpus: &mut Vec<(usize, u32)>, ids: Vec<&str>| {
            for id in ids {
                if let Some(pos) = gpu_position(inventory, id)
                    && !gpus.iter().any(|(p, _)| *p == pos)
                {
                    gpus.push((pos, milli));
                }
            }
        };
        match pod.allocated.as_deref().map(Allocated::from_json) {
            Some(Ok(a)) if a.node == node_name => hold(
                &mut gpus,
                a.devices().iter().map(|d| d.id.as_str()).collect(),
            ),
            Some(Ok(a)) => self.warnings.push(Warning::pod(
                &pod.key,
                format_args!(
                    "allocation names node {} but the pod is bound to {node_name}",
                    a.node
                ),
            )),
            Some(Err(e)) => self.warnings.push(Warning::pod(&pod.key, e)),
            None => {}
        }
        if !gpus.is_empty() {
            return gpus;
        }
        // A claim pod's GPUs: its claims' allocation, the record (its own part of each).
        if let Some(held) = pod.claim_gpus.as_deref().filter(|h| !h.is_empty()) {
            for &(index, part) in held {
                if let Some(pos) = inventory.gpus.iter().position(|g| g.index == index)
                    && !gpus.iter().any(|(p, _)| *p == pos)
                {
                    gpus.push((pos, part.min(milli).max(1)));
                }
            }
            return gpus;
        }
        match pod.assignment.as_deref().map(Assignment::from_json) {
            Some(Ok(a)) if a.node == node_name => {
                hold(&mut gpus, a.devices().map(|d| d.id.as_str()).collect())
            }
            Some(Ok(a)) => self.warnings.push(Warning::pod(
                &pod.key,
                format_args!(
                    "assignment names node {} but the pod is bound to {node_name}",
                    a.node
                ),
            )),
            Some(Err(e)) => self.warnings.push(Warning::pod(&pod.key, e)),
            None => {}
        }
        gpus
    }
}

/// The position of GPU `id` among `inventory`'s devices.
fn gpu_position(inventory: &gpuplace_model::NodeInventory, id: &str) -> Option<usize> {
    inventory.gpus.iter().position(|g| g.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(allocatable: &str, healthy: &[bool]) -> Node {
        let gpus: Vec<_> = healthy
            .iter()
            .enumerate()
            .map(|(i, h)| json!({"id": format!("GPU-{i}"), "index": i, "model": "A100", "healthy": h}))
            .collect();
        let inventory = json!({"name": "n1", "cpu_milli": 1000, "memory_mib": 1024, "gpus": gpus});
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "annotations": {INVENTORY_ANNOTATION: inventory.to_string()}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": allocatable}}
        }))
        .expect("node")
    }

    #[test]
    fn an_unhealthy_gpu_keeps_the_others_real_ids() {
        let healthy =
            |inv: &NodeInventory| -> Vec<bool> { inv.gpus.iter().map(|g| g.healthy).collect() };
        // The kubelet counts 3 of 4 GPUs (one unhealthy): the inventory applies.
        let (inv, warning) = inventory_of(&node("3", &[true, false, true, true]), "nvidia.com/gpu");
        assert_eq!(warning, None);
        assert_eq!(inv.gpus.len(), 4);
        assert_eq!(inv.gpus[2].id, "GPU-2");
        assert_eq!(healthy(&inv), vec![true, false, true, true]);
        // The kubelet's status still counts a GPU the plugin found unhealthy: the topology
        // and the health stay the plugin's.
        let (inv, warning) = inventory_of(&node("4", &[true, false, true, true]), "nvidia.com/gpu");
        assert_eq!(warning, None);
        assert_eq!(healthy(&inv), vec![true, false, true, true]);
        // The kubelet counts fewer than the plugin: the last GPUs wait, the topology stays.
        let (inv, warning) = inventory_of(&node("2", &[true, true, true, true]), "nvidia.com/gpu");
        assert!(warning.is_some_and(|w| w.message.contains("the last 2")));
        assert_eq!(inv.gpus[3].id, "GPU-3");
        assert_eq!(healthy(&inv), vec![true, true, false, false]);
        // No plugin registered yet: the GPUs are known, none takes a pod.
        let (inv, warning) = inventory_of(&node("0", &[true, true]), "nvidia.com/gpu");
        assert_eq!(warning, None);
        assert_eq!(healthy(&inv), vec![false, false]);
        // Time-slicing replicas: 4 GPUs advertised 4 times each are 4 GPUs.
        let mut replicated = node("16", &[true, true, true, true]);
        replicated.metadata.labels =
            Some([("nvidia.com/gpu.replicas".to_string(), "4".to_string())].into());
        let (inv, warning) = inventory_of(&replicated, "nvidia.com/gpu");
        assert_eq!(warning, None);
        assert_eq!((inv.gpus.len(), replicas_of(&replicated)), (4, 4));
        assert!(inv.gpus.iter().all(|g| g.healthy));
    }
}
