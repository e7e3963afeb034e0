//! Tenants' standing in the timeline replay: what each queue holds and waits for, and what
//! operators would measure: Jain's index of each queue's allocation over its entitlement
//! while the cluster is contended, how long a queue waits from asking for its guarantee to
//! having it, and each queue's waits. The serving order, limits and reclaim are in
//! [`super::fair_round`].
//!
//! A queue's entitlement is its share of the GPUs by the tree's rules (guarantees as far
//! as asked, then weighted max-min, no more than it asks or its limit allows) given every
//! queue's demand: what it holds plus what it waits for. The cluster is contended while
//! the queues together ask for more GPUs than it has; then not everyone can have what it
//! asks, and the entitlements say who should. The index is taken over the queues'
//! allocation integrated over the contended time divided by their entitlement integrated
//! over the same time: 1 when every queue got the same fraction of its due, lower as some
//! got more than theirs at others' cost. It is measured the same way when the queues do
//! not serve (`queues_serve: false`), for the same arrivals served by priority then
//! arrival.

use std::sync::Arc;

use gpuplace_core::fairshare::{DIMS, QueueTree, Res, fair_shares_of};
use serde::Serialize;

use crate::timeline::options::Ms;
use crate::timeline::tenants::Tenants;

/// The tenants' standing during a replay.
pub(crate) struct FairState {
    pub(crate) tree: Arc<QueueTree>,
    pub(crate) queue_of: Arc<Vec<usize>>,
    /// By queue: held by its running pods, asked by its waiting ones.
    pub(crate) held: Vec<Res>,
    pub(crate) pending: Vec<Res>,
    /// By queue: the largest GPU request seen (a queue "has" its guarantee once the next
    /// pod would pass it).
    pub(crate) largest: Vec<u64>,
    capacity: [u64; DIMS],
    measure: Measure,
}

/// Integrals over the measurement window.
#[derive(Default)]
struct Measure {
    last: Option<Ms>,
    window_ms: f64,
    /// Time the cluster was contended.
    contended_ms: f64,
    alloc_ms: Vec<f64>,
    fair_ms: Vec<f64>,
    /// By queue, over the contended time: allocation and entitlement.
    contended_alloc_ms: Vec<f64>,
    contended_fair_ms: Vec<f64>,
    below_since: Vec<Option<Ms>>,
    to_guarantee_s: Vec<Vec<f64>>,
    reclaimed: Vec<u64>,
}

/// One queue's figures over a replay's window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueRun {
    pub name: String,
    pub guaranteed_gpus: f64,
    pub mean_allocated_gpus: f64,
    pub mean_fair_share_gpus: f64,
    /// While the cluster was contended: mean GPUs held and mean entitlement (none when it
    /// never was).
    pub contended_allocated_gpus: Option<f64>,
    pub contended_entitled_gpus: Option<f64>,
    /// Its pods' waits in the window, seconds.
    pub wait_p50_s: f64,
    pub wait_p99_s: f64,
    /// Times it went from below its guarantee (asking for it) to having it, seconds.
    pub to_guarantee_s: Vec<f64>,
    pub reclaimed_pods: u64,
}

/// The tenants' figures over a replay's window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TenantRun {
    /// Jain's index of each leaf queue's allocation over its entitlement while the cluster
    /// was contended (see the module's text); none when it never was.
    pub jain: Option<f64>,
    /// Share of the window the cluster was contended, %.
    pub contended_pct: f64,
    pub queues: Vec<QueueRun>,
}

impl FairState {
    pub(crate) fn new(tenants: &Tenants, capacity: [u64; DIMS]) -> FairState {
        let n = tenants.tree.len();
        FairState {
            tree: Arc::new(tenants.tree.clone()),
            queue_of: Arc::new(tenants.queue_of.clone()),
            held: vec![Res::default(); n],
            pending: vec![Res::default(); n],
            largest: vec![0; n],
            capacity,
            measure: Measure {
                alloc_ms: vec![0.0; n],
                fair_ms: vec![0.0; n],
                contended_alloc_ms: vec![0.0; n],
                contended_fair_ms: vec![0.0; n],
                below_since: vec![None; n],
                to_guarantee_s: vec![Vec::new(); n],
                reclaimed: vec![0; n],
                ..Measure::default()
            },
        }
    }

    pub(crate) fn queue_of_pod(&self, pod: u32) -> usize {
        self.queue(pod)
    }

    pub(crate) fn queue(&self, pod: u32) -> usize {
        self.queue_of.get(pod as usize).copied().unwrap_or(0)
    }

    pub(crate) fn shares(&self) -> Vec<[u64; DIMS]> {
        fair_shares_of(&self.tree, &self.capacity, &self.held, &self.pending)
    }

    /// Integrates the standing since the last call up to `now` (from `from` on).
    pub(crate) fn advance(&mut self, now: Ms, from: Ms) {
        let last = self.measure.last.replace(now).unwrap_or(now);
        let start = last.max(from);
        let dt = now.0.saturating_sub(start.0) as f64;
        let fair = self.shares();
        if dt > 0.0 {
            let asked: u64 = (1..self.tree.len())
                .filter(|&q| self.tree.is_leaf(q))
                .map(|q| self.held[q].dims[0] + self.pending[q].dims[0])
                .sum();
            let contended = asked > self.capacity[0];
            for (q, share) in fair.iter().enumerate().skip(1) {
                let held = self.subtree_held(q);
                self.measure.alloc_ms[q] += held as f64 * dt;
                self.measure.fair_ms[q] += share[0] as f64 * dt;
                if contended {
                    self.measure.contended_alloc_ms[q] += held as f64 * dt;
                    self.measure.contended_fair_ms[q] += share[0] as f64 * dt;
                }
            }
            if contended {
                self.measure.contended_ms += dt;
            }
            self.measure.window_ms += dt;
        }
        if now >= from {
            self.track_guarantees(now);
        }
    }

    fn subtree_held(&self, q: usize) -> u64 {
        if self.tree.is_leaf(q) {
            return self.held[q].dims[0];
        }
        (1..self.tree.len())
            .filter(|&l| self.tree.is_leaf(l) && self.tree.path(l).any(|a| a == q))
            .map(|l| self.held[l].dims[0])
            .sum()
    }

    /// A leaf is below its guarantee while it holds less than it is guaranteed and asks
    /// for, by more than its largest pod.
    fn track_guarantees(&mut self, now: Ms) {
        for q in 1..self.tree.len() {
            let g = self.tree.nodes[q].spec.guaranteed.floor(0);
            if g == 0 || !self.tree.is_leaf(q) {
                continue;
            }
            let held = self.held[q].dims[0];
            let wants = (held + self.pending[q].dims[0]).min(g);
            let below = held + self.largest[q].max(1) <= wants;
            match (below, self.measure.below_since[q]) {
                (true, None) => self.measure.below_since[q] = Some(now),
                (false, Some(since)) => {
                    self.measure.below_since[q] = None;
                    self.measure.to_guarantee_s[q].push((now.0 - since.0) as f64 / 1e3);
                }
                _ => {}
            }
        }
    }

    /// Counts `pods` reclaimed from queue `q`.
    pub(crate) fn reclaimed(&mut self, q: usize, pods: u64) {
        self.measure.reclaimed[q] += pods;
    }

    /// Jain's index of the leaves' contended allocation over their contended entitlement.
    fn jain(&self) -> Option<f64> {
        let m = &self.measure;
        if m.contended_ms <= 0.0 {
            return None;
        }
        let xs: Vec<f64> = (1..self.tree.len())
            .filter(|&q| self.tree.is_leaf(q) && m.contended_fair_ms[q] > 0.0)
            .map(|q| m.contended_alloc_ms[q] / m.contended_fair_ms[q])
            .collect();
        let sum: f64 = xs.iter().sum();
        let squares: f64 = xs.iter().map(|x| x * x).sum();
        if xs.len() < 2 || squares <= 0.0 {
            return Some(1.0);
        }
        Some(sum * sum / (xs.len() as f64 * squares))
    }

    /// The figures over the window; `waits`: by queue, its measured pods' waits (s).
    pub(crate) fn report(&self, waits: &[Vec<f64>]) -> TenantRun {
        let w = self.measure.window_ms.max(1.0);
        let contended = self.measure.contended_ms;
        let per_contended = |v: f64| (contended > 0.0).then(|| v / contended / 1e3);
        let rank = |q: usize, p: f64| {
            let mut v = waits.get(q).cloned().unwrap_or_default();
            v.sort_by(f64::total_cmp);
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
            v.get(i).copied().unwrap_or(0.0)
        };
        TenantRun {
            jain: self.jain(),
            contended_pct: 100.0 * self.measure.contended_ms / w,
            queues: (1..self.tree.len())
                .filter(|&q| self.queue_of.contains(&q) || !self.tree.is_leaf(q))
                .map(|q| QueueRun {
                    name: self.tree.name(q).to_string(),
                    guaranteed_gpus: self.tree.nodes[q].spec.guaranteed.floor(0) as f64 / 1e3,
                    mean_allocated_gpus: self.measure.alloc_ms[q] / w / 1e3,
                    mean_fair_share_gpus: self.measure.fair_ms[q] / w / 1e3,
                    contended_allocated_gpus: per_contended(self.measure.contended_alloc_ms[q]),
                    contended_entitled_gpus: per_contended(self.measure.contended_fair_ms[q]),
                    wait_p50_s: rank(q, 0.5),
                    wait_p99_s: rank(q, 0.99),
                    to_guarantee_s: self.measure.to_guarantee_s[q].clone(),
                    reclaimed_pods: self.measure.reclaimed[q],
                })
                .collect(),
        }
    }
}
