//! Nodes grouped by identical state, so that one decision fits and scores each distinct
//! state once instead of every node.
//!
//! Two nodes of the same type (see [`ClusterState::node_type`]) with equal free CPU, memory
//! and GPU milli, equal usable capacity and equal pod classes fit and score every request
//! the same under every policy that does not look at the node itself. Within a class the
//! members are kept in the placer's seeded node order, so the first member that passes the
//! caller's mask is exactly the node a full scan would pick among them.
//!
//! The index follows the state through its change journal; handed another state value (or
//! a clone), it rebuilds itself.

use std::collections::{BTreeSet, HashMap};

use crate::state::ClusterState;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClassKey {
    node_type: u32,
    cpu_free: u64,
    memory_free: u64,
    /// (free, capacity) milli per GPU, in the canonical order of the node's symmetries.
    gpus: Vec<(u32, u32)>,
    /// Pod classes on the node, sorted (the state keeps them in arrival order).
    pod_classes: Vec<(u32, u32)>,
}

impl ClassKey {
    /// `with_pods`: whether the pods' GPU classes on the node are part of its state (only
    /// gpu-clustering scores them; for other policies they would only split classes).
    fn of(state: &ClusterState, n: usize, with_pods: bool) -> Self {
        let node = state.node(n);
        let mut pod_classes = if with_pods {
            node.classes.clone()
        } else {
            Vec::new()
        };
        pod_classes.sort_unstable();
        // Nodes whose states differ by a symmetry of their GPUs (see [`Symmetry`]) are in
        // one class: fits and scores are the same, and the GPUs are chosen on the member
        // itself.
        let mut gpus: Vec<(u32, u32)> = node
            .gpu_free
            .iter()
            .copied()
            .zip(node.gpu_capacity.iter().copied())
            .collect();
        state.symmetry(n).canonicalize(&mut gpus);
        ClassKey {
            node_type: state.node_type(n),
            cpu_free: node.cpu_free,
            memory_free: node.memory_free,
            gpus,
            pod_classes,
        }
    }
}

/// Enough of a class's state to reject most requests without touching the node: kept in
/// an array parallel to the live classes, so the decision loop reads memory in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FitSummary {
    cpu_free: u64,
    memory_free: u64,
    /// The largest free milli per GPU, descending (the first eight GPUs' worth).
    top: [u32; 8],
    gpus: usize,
    /// Time-slicing replicas of the class's nodes (a one-GPU pod takes one replica).
    replicas: u32,
}

impl FitSummary {
    fn of(key: &ClassKey, replicas: u32) -> Self {
        // The eight largest free milli, descending, without sorting every GPU.
        let mut top = [0u32; 8];
        for &(f, _) in &key.gpus {
            if f > top[7] {
                let at = top.partition_point(|&t| t >= f);
                top.copy_within(at..7, at + 1);
                top[at] = f;
            }
        }
        FitSummary {
            cpu_free: key.cpu_free,
            memory_free: key.memory_free,
            top,
            gpus: key.gpus.len(),
            replicas,
        }
    }

    /// False only when the request certainly does not fit (true means: check exactly).
    pub fn may_fit(&self, request: &gpuplace_model::Request) -> bool {
        if self.cpu_free < request.cpu_milli || self.memory_free < request.memory_mib {
            return false;
        }
        let count = request.gpu_count as usize;
        match count {
            0 => true,
            _ if count > self.gpus => false,
            _ if count > self.top.len() => true,
            1 if self.replicas > 1 && request.gpu_milli == gpuplace_model::MILLI_PER_GPU => {
                self.top[0] >= gpuplace_model::MILLI_PER_GPU / self.replicas
            }
            _ => self.top[count - 1] >= request.gpu_milli,
        }
    }
}

/// Nodes in one identical state.
pub(crate) struct Class {
    key: ClassKey,
    /// (seeded rank, node), first = the node a scan would prefer among equals.
    pub members: BTreeSet<(u64, u32)>,
    /// Position in [`NodeClasses::live`].
    live_at: usize,
    /// Cached scores by shape id: (score, GPU hint). The class's state never changes, so
    /// an entry stays right until the workload does.
    pub scores: Vec<Option<(i64, u32)>>,
}

/// The classes of one state value, kept in step with its journal.
#[derive(Default)]
pub(crate) struct NodeClasses {
    instance: u64,
    consumed: usize,
    workload_generation: u64,
    ids: HashMap<ClassKey, u32, foldhash::fast::RandomState>,
    of_node: Vec<u32>,
    classes: Vec<Class>,
    free: Vec<u32>,
    /// Classes with at least one member.
    live: Vec<u32>,
    /// `summaries[i]` describes class `live[i]`.
    summaries: Vec<FitSummary>,
    /// Whether the pods' GPU classes on a node are part of its key.
    with_pods: bool,
    /// Bumped whenever the index is rebuilt or the workload changes: positions in
    /// `touched` and rankings of older epochs mean nothing.
    epoch: u64,
    /// Classes that gained or lost a member, in order (a class id may repeat).
    touched: Vec<u32>,
}

/// Above this many entries the touched log is cleared and the epoch bumped.
const TOUCHED_LIMIT: usize = 1 << 20;

impl NodeClasses {
    /// Brings the index up to date with `state`; `rank` is the placer's seeded node order.
    /// Keys classes by the pods' GPU classes on each node too (for gpu-clustering).
    pub fn with_pod_classes(mut self, with: bool) -> Self {
        self.with_pods = with;
        self
    }

    pub fn sync(&mut self, state: &ClusterState, rank: impl Fn(usize) -> u64) {
        if self.instance != state.instance() || self.of_node.len() != state.len() {
            self.rebuild(state, &rank);
        } else {
            for &n in state.changes_since(self.consumed) {
                self.moved(state, n as usize, &rank);
            }
        }
        self.consumed = state.journal_len();
        if self.workload_generation != state.workload_generation() {
            self.workload_generation = state.workload_generation();
            for class in &mut self.classes {
                class.scores.clear();
            }
            self.epoch += 1;
        }
        if self.touched.len() > TOUCHED_LIMIT {
            self.touched.clear();
            self.epoch += 1;
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Classes touched since position `pos` of the log, and the log's end.
    pub fn touched_since(&self, pos: usize) -> (&[u32], usize) {
        (self.touched.get(pos..).unwrap_or(&[]), self.touched.len())
    }

    /// Whether class `id` has members.
    pub fn is_live(&self, id: u32) -> bool {
        self.classes
            .get(id as usize)
            .is_some_and(|c| !c.members.is_empty())
    }

    fn rebuild(&mut self, state: &ClusterState, rank: &impl Fn(usize) -> u64) {
        *self = NodeClasses {
            instance: state.instance(),
            workload_generation: state.workload_generation(),
            of_node: Vec::with_capacity(state.len()),
            with_pods: self.with_pods,
            epoch: self.epoch + 1,
            ..NodeClasses::default()
        };
        for n in 0..state.len() {
            let replicas = state.inventory(n).replicas;
            let class = self.join(ClassKey::of(state, n, self.with_pods), n, rank(n), replicas);
            self.of_node.push(class);
        }
    }

    /// Moves node `n` to the class of its current state.
    fn moved(&mut self, state: &ClusterState, n: usize, rank: &impl Fn(usize) -> u64) {
        let key = ClassKey::of(state, n, self.with_pods);
        let old = self.of_node[n];
        if self.classes[old as usize].key == key {
            return;
        }
        let r = rank(n);
        self.touched.push(old);
        let emptied = {
            let class = &mut self.classes[old as usize];
            class.members.remove(&(r, n as u32));
            class.members.is_empty()
        };
        if emptied {
            self.retire(old);
        }
        self.of_node[n] = self.join(key, n, r, state.inventory(n).replicas);
        self.touched.push(self.of_node[n]);
    }

    fn join(&mut self, key: ClassKey, n: usize, rank: u64, replicas: u32) -> u32 {
        let id = match self.ids.get(&key) {
            Some(&id) => id,
            None => {
                let class = Class {
                    key: key.clone(),
                    members: BTreeSet::new(),
                    live_at: self.live.len(),
                    scores: Vec::new(),
                };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.classes[id as usize] = class;
                        id
                    }
                    None => {
                        self.classes.push(class);
                        (self.classes.len() - 1) as u32
                    }
                };
                self.live.push(id);
                self.summaries.push(FitSummary::of(&key, replicas));
                self.ids.insert(key, id);
                id
            }
        };
        self.classes[id as usize].members.insert((rank, n as u32));
        id
    }

    fn retire(&mut self, id: u32) {
        let at = self.classes[id as usize].live_at;
        self.live.swap_remove(at);
        self.summaries.swap_remove(at);
        if let Some(&moved) = self.live.get(at) {
            self.classes[moved as usize].live_at = at;
        }
        self.ids.remove(&self.classes[id as usize].key);
        let class = &mut self.classes[id as usize];
        class.scores = Vec::new();
        self.free.push(id);
    }

    /// The class of every node, by node index (as of the last [`sync`](Self::sync)).
    pub fn of_nodes(&self) -> &[u32] {
        &self.of_node
    }

    /// Classes with members, in no particular order.
    pub fn live(&self) -> &[u32] {
        &self.live
    }

    /// Fit summaries, parallel to [`Self::live`].
    pub fn summaries(&self) -> &[FitSummary] {
        &self.summaries
    }

    pub fn class(&self, id: u32) -> &Class {
        &self.classes[id as usize]
    }

    pub fn class_mut(&mut self, id: u32) -> &mut Class {
        &mut self.classes[id as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::{NodeInventory, Request};

    fn req(count: u32, milli: u32) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    #[test]
    fn identical_nodes_share_a_class_until_one_changes() {
        let mut nodes: Vec<NodeInventory> = (0..4)
            .map(|i| NodeInventory::uniform(&format!("n{i}"), 8000, 1024, 2, "T4"))
            .collect();
        nodes.push(NodeInventory::uniform("big", 16_000, 1024, 2, "T4"));
        let mut state = ClusterState::new(nodes).unwrap();
        let mut index = NodeClasses::default();
        index.sync(&state, |n| n as u64);
        assert_eq!(index.live().len(), 2);
        state.apply(1, &req(1, 500), &[(0, 500)]).unwrap();
        index.sync(&state, |n| n as u64);
        assert_eq!(index.live().len(), 3);
        // Node 2 reaches the same state as node 1: they share a class again.
        state.apply(2, &req(1, 500), &[(0, 500)]).unwrap();
        index.sync(&state, |n| n as u64);
        assert_eq!(index.live().len(), 3);
        state.release(1, &req(1, 500), &[(0, 500)]).unwrap();
        state.release(2, &req(1, 500), &[(0, 500)]).unwrap();
        index.sync(&state, |n| n as u64);
        assert_eq!(index.live().len(), 2);
        let sizes: Vec<usize> = index
            .live()
            .iter()
            .map(|&c| index.class(c).members.len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 5);
        // A clone is another state: the index rebuilds rather than trusting the journal.
        let copy = state.clone();
        assert_ne!(copy.instance(), state.instance());
        index.sync(&copy, |n| n as u64);
        assert_eq!(index.live().len(), 2);
    }
}
