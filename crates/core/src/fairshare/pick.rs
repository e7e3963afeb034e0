//! The order pending work is served in: from the root down, the child queue furthest below
//! its due is chosen (first those below their guarantee, by the dominant resource's part of
//! the guarantee held; then by the dominant resource's part of the fair share held), until
//! a queue with waiting units; its next unit (the caller pushes them in priority, then
//! arrival order) is served. Allocation follows what the caller places, so one round serves
//! the queues by turns as their shares fill.

use std::collections::VecDeque;

use super::tree::{QueueTree, ROOT};
use super::{DIMS, Res, show_amount};
use crate::state::ClusterState;

/// A queue (the unit's own or an ancestor) whose limit the unit would pass.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("queue {queue} is at its limit of {limit}")]
pub struct LimitHit {
    pub queue: String,
    /// The limit as people read it (`16 GPUs`, `32 CPUs`, `64Gi memory`, `4 A100 GPUs`).
    pub limit: String,
}

/// Serves waiting units of type `U` queue by queue.
#[derive(Debug)]
pub struct Picker<'t, U> {
    tree: &'t QueueTree,
    /// What each queue and everything under it holds.
    alloc: Vec<Res>,
    fair: Vec<[u64; DIMS]>,
    waiting: Vec<VecDeque<U>>,
    /// Units waiting in each queue and under it.
    count: Vec<usize>,
    /// With usage over time: by queue, its decayed mean less what it held when the round
    /// began; its standing is then what it holds now plus this (what it used over the
    /// recent past, and what this round gave it). `None`: standing by the allocation now.
    past: Option<Vec<[f64; DIMS]>>,
}

impl<'t, U> Picker<'t, U> {
    /// `held`: what each queue's own pods hold (by queue index); `fair`: the queues' fair
    /// shares ([`super::fair_shares`]).
    pub fn new(tree: &'t QueueTree, held: &[Res], fair: Vec<[u64; DIMS]>) -> Picker<'t, U> {
        Picker {
            tree,
            alloc: tree.subtree_totals(held),
            fair,
            waiting: (0..tree.len()).map(|_| VecDeque::new()).collect(),
            count: vec![0; tree.len()],
            past: None,
        }
    }

    /// Orders by usage over time: `means` are the queues' decayed means
    /// ([`super::Ledger::means`], by queue index, each over everything under the queue).
    /// Guarantees stay by the allocation now (a queue below its guarantee is served first
    /// whatever it used); among the rest a queue stands at its decayed mean plus what it
    /// is given from now on, against its fair share.
    /// A queue without a half-life (`None`) stands by its allocation now.
    pub fn with_usage(mut self, means: &[Option<[f64; DIMS]>]) -> Picker<'t, U> {
        self.past = Some(
            (0..self.tree.len())
                .map(|q| match means.get(q).copied().flatten() {
                    Some(mean) => std::array::from_fn(|d| mean[d] - self.alloc[q].dims[d] as f64),
                    None => [0.0; DIMS],
                })
                .collect(),
        );
        self
    }

    /// `q`'s fair share (GPU milli, CPU milli, memory MiB).
    pub fn fair_share(&self, q: usize) -> [u64; DIMS] {
        self.fair.get(q).copied().unwrap_or([0; DIMS])
    }

    /// Whether the order counts usage over time.
    pub fn uses_usage(&self) -> bool {
        self.past.is_some()
    }

    /// How far `q` stands past its fair share: its dominant resource's standing over its
    /// share (infinite with no share).
    pub fn over_share(&self, q: usize) -> f64 {
        (0..DIMS)
            .filter_map(|d| {
                let fair = self.fair.get(q).map_or(0, |f| f[d]);
                let standing = self.standing(q, d);
                match (fair, standing > 0.0) {
                    (0, true) => Some(f64::INFINITY),
                    (0, false) => None,
                    (f, _) => Some(standing / f as f64),
                }
            })
            .fold(0.0, f64::max)
    }

    /// Queue `q`'s standing in resource `d`: what it holds, or with usage over time, its
    /// decayed mean plus what it was given since.
    pub fn standing(&self, q: usize, d: usize) -> f64 {
        let held = self.alloc[q].dims[d] as f64;
        match &self.past {
            Some(past) => (held + past[q][d]).max(0.0),
            None => held,
        }
    }

    /// Queues `unit` in queue `q` (after the ones pushed before it). The root takes none.
    pub fn push(&mut self, q: usize, unit: U) {
        if q == ROOT || q >= self.tree.len() {
            return;
        }
        self.waiting[q].push_back(unit);
        for a in self.tree.path(q) {
            self.count[a] += 1;
        }
        self.count[ROOT] += 1;
    }

    /// The next unit to serve and its queue.
    pub fn pop(&mut self) -> Option<(usize, U)> {
        if self.count[ROOT] == 0 {
            return None;
        }
        let mut at = ROOT;
        loop {
            if at != ROOT && !self.waiting[at].is_empty() {
                break;
            }
            let child = self.tree.nodes[at]
                .children
                .iter()
                .copied()
                .filter(|&c| self.count[c] > 0)
                .min_by(|&a, &b| self.key(a).total_cmp_key(&self.key(b)).then(a.cmp(&b)))?;
            at = child;
        }
        let unit = self.waiting[at].pop_front()?;
        for a in self.tree.path(at) {
            self.count[a] -= 1;
        }
        self.count[ROOT] -= 1;
        Some((at, unit))
    }

    /// How far `q` is from its due: below its guarantee first (by the dominant part of
    /// the guarantee held), then by the dominant part held of its fair share above its
    /// guarantee. The
    /// guarantee counts as far as the fair share grants it: where guarantees together
    /// pass the capacity they are scaled down in the share ([`super::fair_shares`]), and
    /// a queue served past its scaled guarantee would take what the others' shares are due
    /// (a dimension the queue asks nothing of is no guarantee to fill).
    fn key(&self, q: usize) -> Key {
        let guaranteed = &self.tree.nodes[q].spec.guaranteed;
        let alloc = &self.alloc[q].dims;
        let mut below = false;
        let mut of_guarantee = 0f64;
        for (d, &held) in alloc.iter().enumerate() {
            let granted = self.fair.get(q).map_or(0, |f| f[d]);
            if let Some(g) = guaranteed.dims[d]
                .map(|g| g.min(granted))
                .filter(|&g| g > 0)
            {
                below |= held < g;
                of_guarantee = of_guarantee.max(held as f64 / g as f64);
            }
        }
        if below {
            return Key {
                tier: 0,
                ratio: of_guarantee,
            };
        }
        // Past the guarantee, the part of the share above it held: the shares hand out what
        // the guarantees leave by weight (water filling), so serving by this part is what
        // converges to them. By the whole share held, a queue whose share is mostly its
        // guarantee stood near 1 while queues of small shares took the last GPUs (a queue
        // guaranteed 8 of a 10.1 share ended at 8 once four small queues took theirs).
        let mut of_fair = 0f64;
        let mut any = false;
        for d in 0..DIMS {
            let fair = self.fair.get(q).map_or(0, |f| f[d]);
            if fair > 0 {
                any = true;
                let g = guaranteed.dims[d].map_or(0, |g| g.min(fair)) as f64;
                let standing = self.standing(q, d);
                let part = if (fair as f64) > g {
                    (standing - g).max(0.0) / (fair as f64 - g)
                } else {
                    // All of the share is guaranteed: due nothing more past it.
                    standing / fair as f64
                };
                of_fair = of_fair.max(part);
            }
        }
        Key {
            tier: 1,
            ratio: if any { of_fair } else { f64::INFINITY },
        }
    }

    /// Records that a unit of `q` was placed holding `res`.
    pub fn placed(&mut self, q: usize, res: &Res) {
        for a in self.tree.path(q) {
            self.alloc[a].add(res);
        }
    }

    /// Records that pods of `q` holding `res` were taken off (reclaimed, preempted).
    pub fn removed(&mut self, q: usize, res: &Res) {
        for a in self.tree.path(q) {
            self.alloc[a].sub(res);
        }
    }

    /// What `q` and everything under it holds.
    pub fn alloc(&self, q: usize) -> &Res {
        &self.alloc[q]
    }

    /// Every queue's allocation (by index; the root's is empty).
    pub fn allocations(&self) -> &[Res] {
        &self.alloc
    }

    /// The first queue on `q`'s path whose limit `res` more would pass.
    pub fn limit_hit(&self, q: usize, res: &Res) -> Option<LimitHit> {
        for a in self.tree.path(q) {
            let limit = &self.tree.nodes[a].spec.limit;
            for d in 0..DIMS {
                if let Some(l) = limit.dims[d]
                    && res.dims[d] > 0
                    && self.alloc[a].dims[d].saturating_add(res.dims[d]) > l
                {
                    return Some(LimitHit {
                        queue: self.tree.name(a).to_string(),
                        limit: describe(d, l, None),
                    });
                }
            }
            for (model, amount) in &res.models {
                if let Some(l) = limit.model(model)
                    && self.alloc[a].model(model).saturating_add(*amount) > l
                {
                    return Some(LimitHit {
                        queue: self.tree.name(a).to_string(),
                        limit: describe(0, l, Some(model)),
                    });
                }
            }
        }
        None
    }

    /// The milli-GPU of `model` that `q` may still take under every per-model limit on its
    /// path (`None`: no such limit).
    pub fn model_room(&self, q: usize, model: &str) -> Option<u64> {
        self.tree
            .path(q)
            .filter_map(|a| {
                let l = self.tree.nodes[a].spec.limit.model(model)?;
                Some(l.saturating_sub(self.alloc[a].model(model)))
            })
            .min()
    }

    /// The nodes of `state` whose GPU model `q` may still take `gpu_milli` more of under
    /// the per-model limits on its path: what placement narrows to. `None` when no queue has
    /// per-model limits or the unit asks for no GPU (every node then).
    pub fn model_mask(&self, q: usize, gpu_milli: u64, state: &ClusterState) -> Option<Vec<bool>> {
        if gpu_milli == 0 || !self.has_model_limits() {
            return None;
        }
        Some(
            (0..state.len())
                .map(|n| {
                    let model = state.inventory(n).gpu_model();
                    self.model_room(q, model)
                        .is_none_or(|room| room >= gpu_milli)
                })
                .collect(),
        )
    }

    /// Whether some queue has per-model limits (placement then checks models per node).
    pub fn has_model_limits(&self) -> bool {
        self.tree
            .nodes
            .iter()
            .any(|n| !n.spec.limit.models.is_empty())
    }

    pub fn tree(&self) -> &'t QueueTree {
        self.tree
    }
}

/// `16 GPUs`, `32 CPUs`, `64Gi memory`, `4 A100 GPUs`.
fn describe(dim: usize, amount: u64, model: Option<&str>) -> String {
    let n = show_amount(dim, amount);
    match (dim, model) {
        (0, Some(m)) => format!("{n} {m} GPU{}", if amount == 1000 { "" } else { "s" }),
        (0, None) => format!("{n} GPU{}", if amount == 1000 { "" } else { "s" }),
        (1, _) => format!("{n} CPU{}", if amount == 1000 { "" } else { "s" }),
        _ => format!("{n} memory"),
    }
}

/// A child's place in the order (less is served first).
#[derive(Clone, Copy, Debug)]
struct Key {
    tier: u8,
    ratio: f64,
}

impl Key {
    fn total_cmp_key(&self, other: &Key) -> std::cmp::Ordering {
        self.tier
            .cmp(&other.tier)
            .then(self.ratio.total_cmp(&other.ratio))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tree::QueueSpec;
    use super::*;

    fn gpu(n: u64) -> Res {
        Res {
            dims: [n * 1000, 0, 0],
            models: Vec::new(),
        }
    }

    #[test]
    fn serves_below_guarantee_first_then_by_fair_share() {
        let mut a = QueueSpec::open("a");
        a.guaranteed.dims[0] = Some(2000);
        let b = QueueSpec::open("b");
        let tree = QueueTree::build(vec![a, b]);
        let (ia, ib) = (tree.index("a").unwrap(), tree.index("b").unwrap());
        let mut held = vec![Res::default(); tree.len()];
        held[ib] = gpu(4);
        let mut demand = held.clone();
        demand[ia] = gpu(8);
        demand[ib] = gpu(8);
        let fair = super::super::fair_shares(&tree, &[8000, 0, 0], &demand);
        let mut p = Picker::new(&tree, &held, fair);
        for i in 0..4 {
            p.push(ia, ("a", i));
            p.push(ib, ("b", i));
        }
        let mut served = Vec::new();
        while let Some((q, u)) = p.pop() {
            p.placed(q, &gpu(1));
            served.push(u.0);
            if served.len() == 6 {
                break;
            }
        }
        // a is below its guarantee twice, then a has 2 of 5 and b 4 of 3: a again.
        assert_eq!(served, vec!["a", "a", "a", "a", "b", "b"]);
    }

    #[test]
    fn with_usage_a_queue_that_used_more_is_served_after_an_idle_one_but_guarantees_stay_hard() {
        let mut g = QueueSpec::open("g");
        g.guaranteed.dims[0] = Some(2000);
        let tree = QueueTree::build(vec![QueueSpec::open("busy"), QueueSpec::open("idle"), g]);
        let (busy, idle, gq) = (
            tree.index("busy").unwrap(),
            tree.index("idle").unwrap(),
            tree.index("g").unwrap(),
        );
        // Nobody holds anything now; busy held 6 GPUs on average lately, g 8.
        let held = vec![Res::default(); tree.len()];
        let mut demand = held.clone();
        for q in [busy, idle, gq] {
            demand[q] = gpu(8);
        }
        let fair = super::super::fair_shares(&tree, &[12_000, 0, 0], &demand);
        let mut means = vec![Some([0.0; DIMS]); tree.len()];
        means[busy] = Some([6000.0, 0.0, 0.0]);
        means[gq] = Some([8000.0, 0.0, 0.0]);
        let mut p = Picker::new(&tree, &held, fair).with_usage(&means);
        for i in 0..8 {
            p.push(busy, ("busy", i));
            p.push(idle, ("idle", i));
            p.push(gq, ("g", i));
        }
        let mut served = Vec::new();
        for _ in 0..10 {
            let (q, u) = p.pop().unwrap();
            p.placed(q, &gpu(1));
            served.push(u.0);
        }
        // g's guarantee first whatever it used; then idle until it stands where busy
        // does (6 GPUs of usage), then by turns.
        assert_eq!(&served[..2], ["g", "g"]);
        assert_eq!(&served[2..8], ["idle"; 6]);
        assert!(served[8..].contains(&"busy"), "{served:?}");
        assert!(!served.contains(&"g") || served.iter().filter(|s| **s == "g").count() == 2);
        // Without usage, the three take turns after g's guarantee.
        let fair = super::super::fair_shares(&tree, &[12_000, 0, 0], &demand);
        let mut plain = Picker::new(&tree, &held, fair);
        for i in 0..4 {
            plain.push(busy, ("busy", i));
            plain.push(idle, ("idle", i));
        }
        let first: Vec<&str> = (0..4)
            .map(|_| {
                let (q, u) = plain.pop().unwrap();
                plain.placed(q, &gpu(1));
                u.0
            })
            .collect();
        assert_eq!(first, ["busy", "idle", "busy", "idle"]);
    }

    #[test]
    fn limits_name_the_queue_and_amount() {
        let mut a = QueueSpec::open("team-a");
        a.limit.dims[0] = Some(16_000);
        let mut a1 = QueueSpec::open("a1");
        a1.parent = Some("team-a".into());
        a1.limit.models = vec![("A100".into(), 4000)];
        let tree = QueueTree::build(vec![a, a1]);
        let i = tree.index("a1").unwrap();
        let mut held = vec![Res::default(); tree.len()];
        held[i] = Res {
            dims: [15_000, 0, 0],
            models: vec![("A100".into(), 3000)],
        };
        let p: Picker<'_, ()> = Picker::new(&tree, &held, vec![[0; DIMS]; tree.len()]);
        assert_eq!(p.limit_hit(i, &gpu(1)), None);
        assert_eq!(
            p.limit_hit(i, &gpu(2)).unwrap().to_string(),
            "queue team-a is at its limit of 16 GPUs"
        );
        let two_a100 = Res {
            dims: [1000, 0, 0],
            models: vec![("A100".into(), 2000)],
        };
        assert_eq!(
            p.limit_hit(i, &two_a100).unwrap().to_string(),
            "queue a1 is at its limit of 4 A100 GPUs"
        );
        assert_eq!(p.model_room(i, "A100"), Some(1000));
        assert_eq!(p.model_room(i, "V100"), None);
        let state = crate::ClusterState::new(vec![
            gpuplace_model::NodeInventory::uniform("a", 64_000, 1024, 8, "A100"),
            gpuplace_model::NodeInventory::uniform("v", 64_000, 1024, 8, "V100"),
        ])
        .unwrap();
        // One A100 GPU of room: one fits there, two only on the V100 node.
        assert_eq!(p.model_mask(i, 1000, &state), Some(vec![true, true]));
        assert_eq!(p.model_mask(i, 2000, &state), Some(vec![false, true]));
        assert_eq!(p.model_mask(i, 0, &state), None);
    }
}
