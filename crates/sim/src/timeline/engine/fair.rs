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

use std::cell::RefCell;
use std::sync::Arc;

use gpuplace_core::fairshare::{DIMS, Ledger, QueueTree, Res, fair_shares_of};
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
    /// Each queue's usage over time (decayed with its half-life), as the scheduler keeps it.
    pub(crate) ledger: Ledger,
    /// The last shares reckoned and what from: most events move no queue's figures, and
    /// reckoning them anew at each was a tenth of a replay with queues.
    memo: RefCell<SharesMemo>,
}

/// Fair shares and the held and pending figures they were reckoned from.
#[derive(Default)]
struct SharesMemo {
    held: Vec<Res>,
    pending: Vec<Res>,
    shares: Option<Vec<[u64; DIMS]>>,
}

/// The length of a window of Jain's index per window.
const JAIN_WINDOW_MS: u64 = 3_600_000;

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
    /// The current hour window (by its index from the window's start): contended time,
    /// each queue's contended allocation and entitlement; and each finished window's index.
    hour: u64,
    hour_contended_ms: f64,
    hour_alloc_ms: Vec<f64>,
    hour_fair_ms: Vec<f64>,
    hourly: Vec<f64>,
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
    /// Jain's index per hour of the window (the same measure over each hour that was
    /// contended for a tenth of it or more).
    pub jain_hourly: Vec<f64>,
    /// Share of the window the cluster was contended, %.
    pub contended_pct: f64,
    pub queues: Vec<QueueRun>,
}

impl FairState {
    /// `half_life_ms`: that of queues that set none (0: no usage over time).
    pub(crate) fn new(tenants: &Tenants, capacity: [u64; DIMS], half_life_ms: u64) -> FairState {
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
                hour_alloc_ms: vec![0.0; n],
                hour_fair_ms: vec![0.0; n],
                ..Measure::default()
            },
            ledger: Ledger::new(&tenants.tree, half_life_ms),
            memo: RefCell::default(),
        }
    }

    pub(crate) fn queue_of_pod(&self, pod: u32) -> usize {
        self.queue(pod)
    }

    pub(crate) fn queue(&self, pod: u32) -> usize {
        self.queue_of.get(pod as usize).copied().unwrap_or(0)
    }

    /// Each queue's fair share now (the capacity never changes in a run).
    pub(crate) fn shares(&self) -> Vec<[u64; DIMS]> {
        let mut memo = self.memo.borrow_mut();
        if let Some(shares) = &memo.shares
            && memo.held == self.held
            && memo.pending == self.pending
        {
            return shares.clone();
        }
        let shares = fair_shares_of(&self.tree, &self.capacity, &self.held, &self.pending);
        memo.held.clone_from(&self.held);
        memo.pending.clone_from(&self.pending);
        memo.shares = Some(shares.clone());
        shares
    }

    /// Integrates the standing since the last call up to `now` (from `from` on); the
    /// queues' usage over all of it (what they held before the window counts as it would
    /// on a cluster).
    pub(crate) fn advance(&mut self, now: Ms, from: Ms) {
        let last = self.measure.last.replace(now).unwrap_or(now);
        if self.ledger.decays() {
            let totals = self.tree.subtree_totals(&self.held);
            self.ledger.hold(totals.iter().map(|r| r.dims));
            self.ledger.advance(now.0.saturating_sub(last.0));
        }
        let mut start = last.max(from);
        // Split at the hour windows' ends, each window's index closed as it ends.
        while start < now {
            let hour = (start.0 - from.0) / JAIN_WINDOW_MS;
            let end = Ms((from.0 + (hour + 1) * JAIN_WINDOW_MS).min(now.0));
            self.integrate(start, end, from);
            start = end;
        }
        if now >= from {
            self.track_guarantees(now);
        }
    }

    /// Adds `[start, end)` (within one hour window) to the integrals.
    fn integrate(&mut self, start: Ms, end: Ms, from: Ms) {
        let hour = (start.0 - from.0) / JAIN_WINDOW_MS;
        if hour != self.measure.hour {
            self.close_hour();
            self.measure.hour = hour;
        }
        let dt = end.0.saturating_sub(start.0) as f64;
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
                    self.measure.hour_alloc_ms[q] += held as f64 * dt;
                    self.measure.hour_fair_ms[q] += share[0] as f64 * dt;
                }
            }
            if contended {
                self.measure.contended_ms += dt;
                self.measure.hour_contended_ms += dt;
            }
            self.measure.window_ms += dt;
        }
    }

    /// The current hour window's Jain's index, if it was contended for at least a tenth of
    /// an hour.
    fn hour_jain(&self) -> Option<f64> {
        let m = &self.measure;
        (m.hour_contended_ms >= JAIN_WINDOW_MS as f64 / 10.0)
            .then(|| jain_of(&self.tree, &m.hour_alloc_ms, &m.hour_fair_ms))
            .flatten()
    }

    /// Every hour window's index, the current one's included.
    fn hourly(&self) -> Vec<f64> {
        let mut out = self.measure.hourly.clone();
        out.extend(self.hour_jain());
        out
    }

    /// Ends the current hour window, keeping its index.
    fn close_hour(&mut self) {
        if let Some(j) = self.hour_jain() {
            self.measure.hourly.push(j);
        }
        let m = &mut self.measure;
        m.hour_contended_ms = 0.0;
        m.hour_alloc_ms.iter_mut().for_each(|x| *x = 0.0);
        m.hour_fair_ms.iter_mut().for_each(|x| *x = 0.0);
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
        jain_of(&self.tree, &m.contended_alloc_ms, &m.contended_fair_ms)
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
            jain_hourly: self.hourly(),
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

/// Jain's index of the leaves' `alloc` over `fair` (integrals by queue index); 1 with fewer
/// than two leaves entitled.
fn jain_of(tree: &QueueTree, alloc: &[f64], fair: &[f64]) -> Option<f64> {
    let xs: Vec<f64> = (1..tree.len())
        .filter(|&q| tree.is_leaf(q) && fair[q] > 0.0)
        .map(|q| alloc[q] / fair[q])
        .collect();
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if xs.len() < 2 || squares <= 0.0 {
        return Some(1.0);
    }
    Some(sum * sum / (xs.len() as f64 * squares))
}
