//! The queue tree: queues by name under an implicit root, each with a guarantee, a limit,
//! a weight and whether what it holds above its guarantee may be reclaimed. A queue whose
//! definition cannot hold (a parent that does not exist, a cycle, guarantees past its
//! parent's or its own limit) is kept in the tree with its problem, so that it can be
//! reported, but serves no pod; nor do the queues under it.

use std::collections::HashMap;

use super::{DIM_NAMES, DIMS, Res, show_amount};

/// The implicit root's index.
pub const ROOT: usize = 0;

/// Amounts a queue is guaranteed or limited to: per resource (`None`: not set), and
/// milli-GPU per GPU model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    pub dims: [Option<u64>; DIMS],
    /// Sorted by model.
    pub models: Vec<(String, u64)>,
}

impl Bounds {
    /// The amount set for `dim`, 0 when not set (a guarantee).
    pub fn floor(&self, dim: usize) -> u64 {
        self.dims[dim].unwrap_or(0)
    }

    /// The amount set for `model`.
    pub fn model(&self, model: &str) -> Option<u64> {
        self.models
            .binary_search_by(|(m, _)| m.as_str().cmp(model))
            .ok()
            .map(|i| self.models[i].1)
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.dims.iter().all(Option::is_none) && self.models.is_empty()
    }

    /// As an amount (unset as 0).
    pub fn as_res(&self) -> Res {
        Res {
            dims: std::array::from_fn(|d| self.floor(d)),
            models: self.models.clone(),
        }
    }
}

/// One queue as written (a `Queue` object, or a line of the simulator's tenants file).
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    pub name: String,
    /// `None`: under the root.
    pub parent: Option<String>,
    pub guaranteed: Bounds,
    pub limit: Bounds,
    /// Its part of what nobody is guaranteed, against its siblings' (positive).
    pub weight: f64,
    /// Whether its pods above its guarantee may be preempted for other queues.
    pub reclaimable: bool,
    /// How fast its usage over time fades (milliseconds; `None`: its parent's, else the
    /// scheduler's default; 0: no usage kept). See [`super::usage`].
    pub usage_half_life_ms: Option<u64>,
}

impl QueueSpec {
    /// A queue with no guarantee, no limit, weight 1, reclaimable.
    pub fn open(name: &str) -> QueueSpec {
        QueueSpec {
            name: name.to_string(),
            parent: None,
            guaranteed: Bounds::default(),
            limit: Bounds::default(),
            weight: 1.0,
            reclaimable: true,
            usage_half_life_ms: None,
        }
    }
}

/// Why a queue serves no pod.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum QueueProblem {
    #[error("its parent queue {0} does not exist")]
    UnknownParent(String),
    #[error("its parents form a cycle")]
    Cycle,
    #[error("its parent queue {0} cannot serve pods")]
    ParentRejected(String),
    #[error(
        "the guarantees of the children of {parent} add up to {sum} {resource}, more than its own guarantee of {own}"
    )]
    OverParent {
        parent: String,
        resource: String,
        sum: String,
        own: String,
    },
    #[error("its guarantee of {guaranteed} {resource} is above its limit of {limit}")]
    OverLimit {
        resource: String,
        guaranteed: String,
        limit: String,
    },
    #[error("weight {0} is not a positive number")]
    BadWeight(f64),
    #[error("the name is used twice")]
    Duplicate,
}

/// A queue in the tree.
#[derive(Clone, Debug)]
pub struct QueueNode {
    pub spec: QueueSpec,
    /// The root's parent is the root.
    pub parent: usize,
    /// Sorted by name.
    pub children: Vec<usize>,
    pub problem: Option<QueueProblem>,
}

/// Every queue, the root first (index [`ROOT`], named ""), then by name.
#[derive(Clone, Debug)]
pub struct QueueTree {
    pub nodes: Vec<QueueNode>,
    by_name: HashMap<String, usize>,
}

/// The queue pods go to when neither they nor their namespace name one.
pub const DEFAULT_QUEUE: &str = "default";

impl QueueTree {
    /// The tree of `specs`, with the queue `default` added (open, under the root) when
    /// none is named so. Problems are recorded on the queues they concern.
    pub fn build(mut specs: Vec<QueueSpec>) -> QueueTree {
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        if !specs.iter().any(|s| s.name == DEFAULT_QUEUE) {
            let at = specs.partition_point(|s| s.name.as_str() < DEFAULT_QUEUE);
            specs.insert(at, QueueSpec::open(DEFAULT_QUEUE));
        }
        let mut tree = QueueTree {
            nodes: vec![QueueNode {
                spec: QueueSpec::open(""),
                parent: ROOT,
                children: Vec::new(),
                problem: None,
            }],
            by_name: HashMap::new(),
        };
        for spec in specs {
            let problem = if tree.by_name.contains_key(&spec.name) {
                Some(QueueProblem::Duplicate)
            } else {
                own_problem(&spec)
            };
            let i = tree.nodes.len();
            if problem != Some(QueueProblem::Duplicate) {
                tree.by_name.insert(spec.name.clone(), i);
            }
            tree.nodes.push(QueueNode {
                spec,
                parent: ROOT,
                children: Vec::new(),
                problem,
            });
        }
        tree.link();
        tree.check_guarantees();
        tree.inherit_problems();
        tree
    }

    /// Parents found (unknown ones and cycles recorded; such queues hang from the root).
    fn link(&mut self) {
        for i in 1..self.nodes.len() {
            let Some(parent) = self.nodes[i].spec.parent.clone().filter(|p| !p.is_empty()) else {
                continue;
            };
            match self.by_name.get(&parent) {
                Some(&p) => self.nodes[i].parent = p,
                None => {
                    self.nodes[i]
                        .problem
                        .get_or_insert(QueueProblem::UnknownParent(parent));
                }
            }
        }
        for i in 1..self.nodes.len() {
            let mut at = self.nodes[i].parent;
            let mut steps = 0;
            while at != ROOT && at != i && steps <= self.nodes.len() {
                at = self.nodes[at].parent;
                steps += 1;
            }
            if at != ROOT {
                self.nodes[i].problem = Some(QueueProblem::Cycle);
            }
        }
        for i in 1..self.nodes.len() {
            if matches!(self.nodes[i].problem, Some(QueueProblem::Cycle)) {
                self.nodes[i].parent = ROOT;
            }
            let p = self.nodes[i].parent;
            self.nodes[p].children.push(i);
        }
    }

    /// Children whose guarantees, added in name order, go past their parent's are rejected.
    fn check_guarantees(&mut self) {
        for p in 1..self.nodes.len() {
            let children = self.nodes[p].children.clone();
            let own = self.nodes[p].spec.guaranteed.clone();
            let mut sums = [0u64; DIMS];
            let mut models: HashMap<String, u64> = HashMap::new();
            for c in children {
                if self.nodes[c].problem.is_some() {
                    continue;
                }
                let g = &self.nodes[c].spec.guaranteed;
                let mut over = None;
                for d in 0..DIMS {
                    let sum = sums[d] + g.floor(d);
                    if g.floor(d) > 0 && sum > own.floor(d) {
                        over = Some((DIM_NAMES[d].to_string(), d, sum, own.floor(d)));
                        break;
                    }
                }
                for (model, amount) in &g.models {
                    let sum = models.get(model).copied().unwrap_or(0) + amount;
                    let parent = own.model(model).unwrap_or_else(|| own.floor(0));
                    if over.is_none() && *amount > 0 && sum > parent {
                        over = Some((format!("nvidia.com/gpu.{model}"), 0, sum, parent));
                    }
                }
                if let Some((resource, d, sum, own_amount)) = over {
                    self.nodes[c].problem = Some(QueueProblem::OverParent {
                        parent: self.nodes[p].spec.name.clone(),
                        resource,
                        sum: show_amount(d, sum),
                        own: show_amount(d, own_amount),
                    });
                    continue;
                }
                for (d, sum) in sums.iter_mut().enumerate() {
                    *sum += g.floor(d);
                }
                for (model, amount) in &g.models {
                    *models.entry(model.clone()).or_insert(0) += amount;
                }
            }
        }
    }

    /// A queue under one that serves no pod serves none either.
    fn inherit_problems(&mut self) {
        for i in 1..self.nodes.len() {
            if self.nodes[i].problem.is_some() {
                continue;
            }
            let mut at = self.nodes[i].parent;
            while at != ROOT {
                if self.nodes[at].problem.is_some() {
                    let name = self.nodes[at].spec.name.clone();
                    self.nodes[i].problem = Some(QueueProblem::ParentRejected(name));
                    break;
                }
                at = self.nodes[at].parent;
            }
        }
    }

    /// The queue named `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    pub fn name(&self, q: usize) -> &str {
        &self.nodes[q].spec.name
    }

    /// `q` and its ancestors up to, not including, the root.
    pub fn path(&self, q: usize) -> impl Iterator<Item = usize> + '_ {
        let mut at = q;
        std::iter::from_fn(move || {
            if at == ROOT {
                return None;
            }
            let here = at;
            at = self.nodes[at].parent;
            Some(here)
        })
    }

    /// Whether `q` has no child queues (pods are served from leaves and inner queues alike).
    /// What each queue and everything under it holds, given what each queue's own pods
    /// hold (`own`, by queue index; the root's total is left empty).
    pub fn subtree_totals(&self, own: &[super::Res]) -> Vec<super::Res> {
        let mut alloc = vec![super::Res::default(); self.len()];
        for (q, held) in own
            .iter()
            .enumerate()
            .skip(1)
            .take(self.len().saturating_sub(1))
        {
            for a in self.path(q) {
                alloc[a].add(held);
            }
        }
        alloc
    }

    /// The half-life `q`'s usage decays with: its own, else the nearest ancestor's (`None`:
    /// no queue on its path sets one).
    pub fn half_life_ms(&self, q: usize) -> Option<u64> {
        if q == ROOT || q >= self.nodes.len() {
            return None;
        }
        self.path(q)
            .find_map(|a| self.nodes[a].spec.usage_half_life_ms)
    }

    pub fn is_leaf(&self, q: usize) -> bool {
        self.nodes[q].children.is_empty()
    }
}

/// What is wrong with a queue on its own.
fn own_problem(spec: &QueueSpec) -> Option<QueueProblem> {
    if !(spec.weight.is_finite() && spec.weight > 0.0) {
        return Some(QueueProblem::BadWeight(spec.weight));
    }
    for (d, resource) in DIM_NAMES.iter().enumerate() {
        if let (Some(g), Some(l)) = (spec.guaranteed.dims[d], spec.limit.dims[d])
            && g > l
        {
            return Some(QueueProblem::OverLimit {
                resource: resource.to_string(),
                guaranteed: show_amount(d, g),
                limit: show_amount(d, l),
            });
        }
    }
    for (model, g) in &spec.guaranteed.models {
        if let Some(l) = spec.limit.model(model).or(spec.limit.dims[0])
            && *g > l
        {
            return Some(QueueProblem::OverLimit {
                resource: format!("nvidia.com/gpu.{model}"),
                guaranteed: show_amount(0, *g),
                limit: show_amount(0, l),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, parent: Option<&str>, gpus: Option<u64>) -> QueueSpec {
        let mut s = QueueSpec::open(name);
        s.parent = parent.map(str::to_string);
        s.guaranteed.dims[0] = gpus.map(|g| g * 1000);
        s
    }

    #[test]
    fn default_is_added_and_children_link() {
        let t = QueueTree::build(vec![q("a", None, Some(8)), q("a1", Some("a"), Some(4))]);
        assert_eq!(t.len(), 4);
        let a = t.index("a").unwrap();
        let a1 = t.index("a1").unwrap();
        assert_eq!(t.nodes[a1].parent, a);
        assert_eq!(t.nodes[a].children, vec![a1]);
        assert!(t.index(DEFAULT_QUEUE).is_some());
        assert_eq!(t.path(a1).collect::<Vec<_>>(), vec![a1, a]);
    }

    #[test]
    fn children_past_their_parent_are_rejected_with_a_reason() {
        let t = QueueTree::build(vec![
            q("a", None, Some(8)),
            q("a1", Some("a"), Some(6)),
            q("a2", Some("a"), Some(4)),
            q("a2x", Some("a2"), None),
        ]);
        assert!(t.nodes[t.index("a1").unwrap()].problem.is_none());
        let p = t.nodes[t.index("a2").unwrap()].problem.clone().unwrap();
        assert_eq!(
            p.to_string(),
            "the guarantees of the children of a add up to 10 nvidia.com/gpu, more than its own guarantee of 8"
        );
        assert_eq!(
            t.nodes[t.index("a2x").unwrap()].problem,
            Some(QueueProblem::ParentRejected("a2".into()))
        );
    }

    #[test]
    fn unknown_parents_cycles_and_limits_are_problems() {
        let mut over = q("o", None, Some(4));
        over.limit.dims[0] = Some(2000);
        let t = QueueTree::build(vec![
            q("x", Some("nope"), None),
            q("c1", Some("c2"), None),
            q("c2", Some("c1"), None),
            over,
        ]);
        let problem = |n: &str| t.nodes[t.index(n).unwrap()].problem.clone();
        assert_eq!(
            problem("x"),
            Some(QueueProblem::UnknownParent("nope".into()))
        );
        assert_eq!(problem("c1"), Some(QueueProblem::Cycle));
        assert_eq!(problem("c2"), Some(QueueProblem::Cycle));
        assert_eq!(
            problem("o").unwrap().to_string(),
            "its guarantee of 4 nvidia.com/gpu is above its limit of 2"
        );
    }
}
