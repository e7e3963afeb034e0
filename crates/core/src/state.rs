//! What is free on every node, updated one placement at a time.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gpuplace_model::{NodeInventory, Request};

use crate::fit::FitFailure;
use crate::frag::TargetWorkload;
use crate::gaps::GapCounts;
use crate::require::{self, PairRules};
use crate::reserve::ModelReserve;
use crate::symmetry::Symmetry;
use crate::topology::LinkMatrix;

pub use crate::node_state::NodeState;

/// Why a state change was refused (the state is left unchanged).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("node index {0} is out of range")]
    NodeOutOfRange(usize),
    #[error("node {node}: gpu position {gpu} is out of range")]
    GpuOutOfRange { node: String, gpu: usize },
    #[error("node {node}: gpu position {gpu} listed twice in one placement")]
    GpuRepeated { node: String, gpu: usize },
    #[error("node {node}: {what} would be over capacity")]
    OverCommit { node: String, what: String },
    #[error("node {node}: releasing more {what} than is allocated")]
    OverRelease { node: String, what: String },
    #[error("invalid inventory for node {node}: {source}")]
    Inventory {
        node: String,
        source: gpuplace_model::InventoryError,
    },
    #[error("node name {0:?} appears more than once")]
    DuplicateNode(String),
}

/// Identifies one state value; a clone gets a new one, so a placer that follows a state's
/// change journal notices when it is handed a different (or copied) state.
#[derive(Debug)]
struct InstanceId(u64);

impl InstanceId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        InstanceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Clone for InstanceId {
    fn clone(&self) -> Self {
        InstanceId::fresh()
    }
}

/// Nodes in the order their state changed, for an index that follows a state
/// ([`ClusterState::changes_since`]). A clone starts empty: it is another state (its
/// [`InstanceId`] is new), so an index rebuilds on it anyway, and copying the whole history
/// of a long-lived state into every copy cost more than the copy. Past [`JOURNAL_MAX`]
/// entries it starts again under a new id (indexes rebuild once) instead of growing
/// without end.
#[derive(Debug, Default)]
struct Journal(Vec<u32>);

/// Changes a journal holds at most.
const JOURNAL_MAX: usize = if cfg!(test) { 64 } else { 1 << 20 };

impl Clone for Journal {
    fn clone(&self) -> Self {
        Journal::default()
    }
}

/// What placement reads of a node's inventory, without names and IDs: nodes with equal
/// keys and equal [`NodeState`] fit and score every request the same.
#[derive(PartialEq, Eq, Hash)]
struct NodeTypeKey {
    cpu_milli: u64,
    memory_mib: u64,
    replicas: u32,
    gpus: Vec<(String, u64, u32)>,
    links: Vec<u32>,
    /// NUMA node per GPU (the `numa` topology requirement reads it).
    numa: Vec<Option<u32>>,
}

/// Every node's inventory and what is free on it.
#[derive(Clone, Debug)]
pub struct ClusterState {
    id: InstanceId,
    /// What never changes after [`ClusterState::new`] is shared by copies (a projection
    /// copies the state several times a period).
    nodes: Arc<Vec<NodeInventory>>,
    state: Vec<NodeState>,
    links: Arc<Vec<LinkMatrix>>,
    rules: Arc<Vec<PairRules>>,
    /// FNV-1a of each node name, the stable key of seeded node orders.
    name_hash: Vec<u64>,
    /// Node index by name.
    by_name: Arc<HashMap<String, usize>>,
    /// Interned [`NodeTypeKey`] of each node.
    node_type: Vec<u32>,
    /// The symmetries of each node type's GPUs (see [`Symmetry`]), by type.
    symmetry: Arc<Vec<Symmetry>>,
    /// Whether all of a node's GPUs are of one model.
    one_model: Vec<bool>,
    /// Per node: its GPUs are time-sliced (replicas above 1), read on every decision.
    time_sliced: Vec<bool>,
    /// Whether any node's GPUs are time-sliced.
    any_time_sliced: bool,
    /// Nodes in the order their state changed (one entry per apply or release).
    journal: Journal,
    /// Bumped whenever a new workload is bound (scores against the old one are stale).
    workload_generation: u64,
    workload: Option<Arc<TargetWorkload>>,
    total_frag: f64,
    /// Partly used GPUs per free milli (see [`GapCounts`]).
    gaps: GapCounts,
    /// Free GPU milli per model and what restricted pods will need of it (see
    /// [`ModelReserve`]).
    reserve: ModelReserve,
    gpu_capacity_milli: u64,
    gpu_free_milli: u64,
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn class_of(request: &Request) -> Option<u32> {
    match request.gpu_count {
        0 => None,
        _ if request.is_fractional() => Some(0),
        n => Some(n),
    }
}

impl ClusterState {
    /// Builds the state of empty nodes; inventories are validated.
    pub fn new(nodes: Vec<NodeInventory>) -> Result<Self, StateError> {
        let mut by_name = HashMap::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            node.validate().map_err(|source| StateError::Inventory {
                node: node.name.clone(),
                source,
            })?;
            if by_name.insert(node.name.clone(), i).is_some() {
                return Err(StateError::DuplicateNode(node.name.clone()));
            }
        }
        let state: Vec<NodeState> = nodes
            .iter()
            .map(|node| {
                let capacity: Vec<u32> = node
                    .gpus
                    .iter()
                    .map(|g| if g.healthy { g.milli_capacity } else { 0 })
                    .collect();
                NodeState {
                    cpu_free: node.cpu_milli,
                    memory_free: node.memory_mib,
                    gpu_free: capacity.clone(),
                    gpu_capacity: capacity,
                    version: 0,
                    classes: Vec::new(),
                    frag: 0.0,
                }
            })
            .collect();
        let links: Vec<LinkMatrix> = nodes.iter().map(LinkMatrix::from_inventory).collect();
        let rules: Vec<PairRules> = nodes.iter().map(PairRules::from_inventory).collect();
        let name_hash = nodes.iter().map(|n| fnv1a(&n.name)).collect();
        let mut types: HashMap<NodeTypeKey, u32> = HashMap::new();
        let node_type: Vec<u32> = nodes
            .iter()
            .zip(&links)
            .map(|(node, links)| {
                let key = NodeTypeKey {
                    cpu_milli: node.cpu_milli,
                    memory_mib: node.memory_mib,
                    replicas: node.replicas,
                    gpus: node
                        .gpus
                        .iter()
                        .map(|g| (g.model.clone(), g.memory_mib, g.milli_capacity))
                        .collect(),
                    links: links.scores().to_vec(),
                    numa: node.gpus.iter().map(|g| g.numa_node).collect(),
                };
                let next = types.len() as u32;
                *types.entry(key).or_insert(next)
            })
            .collect();
        // One node of each type stands for it (a type's inventories differ only in names).
        let mut symmetry = vec![None; types.len()];
        for (n, &t) in node_type.iter().enumerate() {
            if symmetry[t as usize].is_none() {
                symmetry[t as usize] = Some(Symmetry::of(&nodes[n], &links[n], &rules[n]));
            }
        }
        let symmetry = Arc::new(symmetry.into_iter().flatten().collect());
        let one_model = nodes
            .iter()
            .map(|node| node.gpus.windows(2).all(|w| w[0].model == w[1].model))
            .collect();
        let time_sliced: Vec<bool> = nodes.iter().map(|n| n.replicas > 1).collect();
        let gpu_capacity_milli = state.iter().map(NodeState::gpu_idle).sum();
        let reserve = ModelReserve::new(&nodes, state.iter().map(NodeState::gpu_idle));
        Ok(ClusterState {
            id: InstanceId::fresh(),
            nodes: Arc::new(nodes),
            state,
            links: Arc::new(links),
            rules: Arc::new(rules),
            name_hash,
            by_name: Arc::new(by_name),
            node_type,
            symmetry,
            one_model,
            any_time_sliced: time_sliced.iter().any(|&t| t),
            time_sliced,
            journal: Journal::default(),
            workload_generation: 0,
            workload: None,
            total_frag: 0.0,
            gaps: GapCounts::default(),
            reserve,
            gpu_capacity_milli,
            gpu_free_milli: gpu_capacity_milli,
        })
    }

    /// Binds the workload that fragmentation is measured against (FGD's M).
    pub fn set_workload(&mut self, workload: Arc<TargetWorkload>) {
        self.gaps = GapCounts::new(workload.share_floor());
        let capacity = self
            .state
            .iter()
            .map(|s| s.gpu_capacity.iter().map(|&c| u64::from(c)).sum());
        self.reserve.bind(&workload, capacity);
        self.workload = Some(workload);
        self.workload_generation += 1;
        // Every node measured afresh (a node's old figure is not subtracted from the new
        // total: binding the same workload again must not zero the total).
        self.total_frag = 0.0;
        for n in 0..self.state.len() {
            self.state[n].frag = 0.0;
            self.refresh_frag(n);
            let s = &self.state[n];
            for (&free, &capacity) in s.gpu_free.iter().zip(&s.gpu_capacity) {
                self.gaps.update(capacity, capacity, free);
            }
        }
    }

    /// Partly used GPUs per free milli, counting gaps a share of the bound workload can
    /// still fill (none without a workload).
    pub fn gaps(&self) -> &GapCounts {
        &self.gaps
    }

    /// Free GPU milli per model and the part of it pods restricted to models will need.
    pub fn reserve(&self) -> &ModelReserve {
        &self.reserve
    }

    /// The bound target workload, if any.
    pub fn workload(&self) -> Option<&TargetWorkload> {
        self.workload.as_deref()
    }

    /// Node `n`'s state changed: the journal notes it (see [`Journal`]).
    fn note_change(&mut self, n: usize) {
        if self.journal.0.len() >= JOURNAL_MAX {
            self.journal.0.clear();
            self.id = InstanceId::fresh();
        }
        self.journal.0.push(n as u32);
    }

    /// A copy that does not measure fragmentation as it changes, for a projection that
    /// asks only where room goes (fits and places as this state does; its fragmentation
    /// figures are not kept: measuring a node against the workload on every change was
    /// the most of a projection's time).
    pub fn unmeasured_copy(&self) -> ClusterState {
        let mut copy = self.clone();
        copy.workload = None;
        copy
    }

    fn refresh_frag(&mut self, n: usize) {
        let frag = match &self.workload {
            Some(w) => w.node_fragmentation(&self.nodes[n], &self.state[n]),
            None => 0.0,
        };
        self.total_frag += frag - self.state[n].frag;
        self.state[n].frag = frag;
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn inventory(&self, n: usize) -> &NodeInventory {
        &self.nodes[n]
    }

    pub fn node(&self, n: usize) -> &NodeState {
        &self.state[n]
    }

    pub fn links(&self, n: usize) -> &LinkMatrix {
        &self.links[n]
    }

    /// What decides whether two GPUs of node `n` meet a topology requirement together.
    pub fn pair_rules(&self, n: usize) -> &PairRules {
        &self.rules[n]
    }

    /// What `request` takes on node `n`: itself, except on a node whose GPUs are
    /// time-sliced into replicas, where one whole GPU is one replica, a share of
    /// ⌊1000 / replicas⌋ milli of one GPU (NVIDIA's time-slicing, with gpuplace packing the
    /// replicas). Every per-node decision (fit, scores, the GPUs chosen) goes through it.
    pub fn effective<'r>(&self, n: usize, request: &'r Request) -> Cow<'r, Request> {
        if self.time_sliced[n] {
            crate::replicas::effective_on(&self.nodes[n], request)
        } else {
            Cow::Borrowed(request)
        }
    }

    /// Positions of node `n`'s GPUs that `request` may use right now: enough free milli,
    /// and the model and memory its requirements allow.
    pub fn usable_gpus(&self, n: usize, request: &Request) -> Vec<usize> {
        self.usable_gpus_on(n, &self.state[n], request)
    }

    /// [`usable_gpus`](Self::usable_gpus) of node `n` were it in state `s` (a state being
    /// considered, e.g. with preemption victims gone).
    pub fn usable_gpus_on(&self, n: usize, s: &NodeState, request: &Request) -> Vec<usize> {
        let request = &*self.effective(n, request);
        let gpus = &self.nodes[n].gpus;
        let need = &request.need;
        // A node of one model: its name is matched once, not once per GPU.
        let one_model = self.one_model[n];
        let model_ok = one_model && gpus.first().is_none_or(|g| need.allows_model(&g.model));
        (0..s.gpu_free.len())
            .filter(|&g| {
                s.gpu_free[g] >= request.gpu_milli
                    && need.allows_memory(gpus[g].memory_mib)
                    && if one_model {
                        model_ok
                    } else {
                        need.allows_model(&gpus[g].model)
                    }
            })
            .collect()
    }

    /// A stable hash of node `n`'s name.
    pub fn name_hash(&self, n: usize) -> u64 {
        self.name_hash[n]
    }

    /// Nodes with the same type and equal [`NodeState`] (less version and fragmentation,
    /// which follows from the rest) are interchangeable for fit and scoring.
    pub fn node_type(&self, n: usize) -> u32 {
        self.node_type[n]
    }

    /// Whether some node's GPUs are time-sliced.
    pub fn any_time_sliced(&self) -> bool {
        self.any_time_sliced
    }

    /// The symmetries of node `n`'s GPUs.
    pub(crate) fn symmetry(&self, n: usize) -> &Symmetry {
        &self.symmetry[self.node_type[n] as usize]
    }

    /// This state value's identity; clones get their own.
    pub fn instance(&self) -> u64 {
        self.id.0
    }

    /// Nodes changed since the journal had `mark` entries, in order (see [`Self::journal_len`]).
    pub fn changes_since(&self, mark: usize) -> &[u32] {
        self.journal.0.get(mark..).unwrap_or(&[])
    }

    /// How many changes the journal holds.
    pub fn journal_len(&self) -> usize {
        self.journal.0.len()
    }

    /// Generation of the bound workload; scores computed under another are stale.
    pub fn workload_generation(&self) -> u64 {
        self.workload_generation
    }

    /// Index of the node called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Healthy GPU capacity of the cluster in milli-GPU.
    pub fn gpu_capacity_milli(&self) -> u64 {
        self.gpu_capacity_milli
    }

    /// Allocated milli-GPU in the cluster.
    pub fn gpu_allocated_milli(&self) -> u64 {
        self.gpu_capacity_milli - self.gpu_free_milli
    }

    /// Idle milli-GPU in the cluster.
    pub fn gpu_idle_milli(&self) -> u64 {
        self.gpu_free_milli
    }

    /// Cluster fragmentation (sum over nodes) in milli-GPU; 0 without a workload.
    pub fn total_frag(&self) -> f64 {
        self.total_frag.max(0.0)
    }

    /// The running total behind [`Self::total_frag`], to be put back with
    /// [`Self::undone_to`] once a trial's changes are undone exactly (its sum of changes
    /// rounds; a copy would not have been touched).
    pub fn frag_sum(&self) -> f64 {
        self.total_frag
    }

    /// Every change since [`Self::frag_sum`] gave `sum` was undone: the total is that again.
    pub fn undone_to(&mut self, sum: f64) {
        self.total_frag = sum;
    }

    /// Whether `request` fits node `n` right now; the first failing check otherwise.
    pub fn fit(&self, n: usize, request: &Request) -> Result<(), FitFailure> {
        self.fit_on(n, &self.state[n], request)
    }

    /// [`fit`](Self::fit) on node `n` were it in state `s`.
    pub fn fit_on(&self, n: usize, s: &NodeState, request: &Request) -> Result<(), FitFailure> {
        self.fit_given(n, s, request, || self.need_static(n, request))
    }

    /// [`fit`](Self::fit) on node `n` now, with the verdict of
    /// [`fit_static`](Self::fit_static) given (e.g. remembered per node type): the same
    /// answer and the same reason as `fit`.
    pub fn fit_with_static(
        &self,
        n: usize,
        request: &Request,
        static_verdict: Result<(), FitFailure>,
    ) -> Result<(), FitFailure> {
        self.fit_given(n, &self.state[n], request, || static_verdict)
    }

    fn fit_given(
        &self,
        n: usize,
        s: &NodeState,
        request: &Request,
        static_verdict: impl FnOnce() -> Result<(), FitFailure>,
    ) -> Result<(), FitFailure> {
        let request = &*self.effective(n, request);
        if s.cpu_free < request.cpu_milli {
            return Err(FitFailure::InsufficientCpu);
        }
        if s.memory_free < request.memory_mib {
            return Err(FitFailure::InsufficientMemory);
        }
        if request.gpu_count == 0 {
            return Ok(());
        }
        // One pass over the free list; the capacity list is read only when nothing fits.
        let fitting = s
            .gpu_free
            .iter()
            .filter(|&&free| free >= request.gpu_milli)
            .count();
        if fitting == 0 && s.gpu_capacity.iter().all(|&c| c == 0) {
            return Err(FitFailure::NoGpus);
        }
        if !request.allowed_models.is_empty() && !request.allows_model(self.nodes[n].gpu_model()) {
            return Err(FitFailure::ModelNotAllowed);
        }
        if request.need.is_empty() {
            return if fitting >= request.gpu_count as usize {
                Ok(())
            } else if request.is_fractional() {
                Err(FitFailure::NoGpuWithShare)
            } else {
                Err(FitFailure::InsufficientGpus)
            };
        }
        static_verdict()?;
        self.need_dynamic(n, s, request)
    }

    /// The part of a request's requirements that depends on the node's hardware alone (its
    /// GPU models and memory): the same for every node of one [`node_type`](Self::node_type)
    /// whatever is free, so callers may remember it per type.
    pub fn fit_static(&self, n: usize, request: &Request) -> Result<(), FitFailure> {
        if request.need.is_empty() || request.gpu_count == 0 {
            return Ok(());
        }
        self.need_static(n, request)
    }

    fn need_static(&self, n: usize, request: &Request) -> Result<(), FitFailure> {
        let gpus = &self.nodes[n].gpus;
        let need = &request.need;
        // Most nodes hold one model: its name is matched once, not once per GPU.
        if self.one_model[n] {
            return match gpus.first() {
                Some(g) if !need.allows_model(&g.model) => Err(FitFailure::ModelNotAllowed),
                _ if !gpus.iter().any(|g| need.allows_memory(g.memory_mib)) => {
                    Err(FitFailure::GpuMemoryTooSmall)
                }
                _ => Ok(()),
            };
        }
        if !gpus.iter().any(|g| need.allows_model(&g.model)) {
            return Err(FitFailure::ModelNotAllowed);
        }
        if !gpus
            .iter()
            .any(|g| need.allows_model(&g.model) && need.allows_memory(g.memory_mib))
        {
            return Err(FitFailure::GpuMemoryTooSmall);
        }
        Ok(())
    }

    /// Enough usable GPUs (free, allowed, large enough), and a set meeting the topology.
    fn need_dynamic(&self, n: usize, s: &NodeState, request: &Request) -> Result<(), FitFailure> {
        let gpus = &self.nodes[n].gpus;
        let need = &request.need;
        // On a one-model node the model passed the static check.
        let one_model = self.one_model[n];
        let count = request.gpu_count as usize;
        let usable = (0..s.gpu_free.len())
            .filter(|&g| {
                s.gpu_free[g] >= request.gpu_milli
                    && need.allows_memory(gpus[g].memory_mib)
                    && (one_model || need.allows_model(&gpus[g].model))
            })
            .count();
        if usable < count {
            return Err(if request.is_fractional() {
                FitFailure::NoGpuWithShare
            } else {
                FitFailure::InsufficientGpus
            });
        }
        if need.topology != gpuplace_model::GpuTopology::Any && count > 1 {
            let usable = self.usable_gpus_on(n, s, request);
            if !require::exists(
                &self.links[n],
                &self.rules[n],
                need.topology,
                &usable,
                count,
            ) {
                return Err(FitFailure::TopologyUnavailable);
            }
        }
        Ok(())
    }

    fn check_gpus(&self, n: usize, gpus: &[(usize, u32)]) -> Result<(), StateError> {
        let node = &self.nodes[n].name;
        for (i, &(g, _)) in gpus.iter().enumerate() {
            if g >= self.state[n].gpu_free.len() {
                return Err(StateError::GpuOutOfRange {
                    node: node.clone(),
                    gpu: g,
                });
            }
            if gpus[..i].iter().any(|&(h, _)| h == g) {
                return Err(StateError::GpuRepeated {
                    node: node.clone(),
                    gpu: g,
                });
            }
        }
        Ok(())
    }
}

mod changes;

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
