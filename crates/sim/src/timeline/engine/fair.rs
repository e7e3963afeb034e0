//! Queues in the timeline replay: what each tenant holds and waits for, the order due
//! units are served in (core's [`Picker`], as the scheduler serves them), limits, reclaim
//! for a queue below its guarantee (core's [`Entitlement`] over the same victim search as
//! preemption), and what operators would measure: Jain's index of allocation against fair
//! share over time, and how long a queue waits from asking for its guarantee to having it.

use std::sync::Arc;

use gpuplace_core::fairshare::{DIMS, Entitlement, Loss, Picker, QueueTree, Res, fair_shares};
use gpuplace_core::preempt;
use serde::Serialize;

use super::super::options::Ms;
use super::super::tenants::Tenants;
use super::Engine;

/// Plans tried per reclaim before giving up (each drops one queue's pods on one node).
const MAX_PLANS: usize = 32;

/// The tenants' standing during a replay.
pub(crate) struct FairState {
    tree: Arc<QueueTree>,
    queue_of: Arc<Vec<usize>>,
    /// By queue: held by its running pods, asked by its waiting ones.
    held: Vec<Res>,
    pending: Vec<Res>,
    /// By queue: the largest GPU request seen (a queue "has" its guarantee once the next
    /// pod would pass it).
    largest: Vec<u64>,
    capacity: [u64; DIMS],
    measure: Measure,
}

/// Integrals over the measurement window.
#[derive(Default)]
struct Measure {
    last: Option<Ms>,
    window_ms: f64,
    jain_ms: f64,
    alloc_ms: Vec<f64>,
    fair_ms: Vec<f64>,
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
    /// Times it went from below its guarantee (asking for it) to having it, seconds.
    pub to_guarantee_s: Vec<f64>,
    pub reclaimed_pods: u64,
}

/// The tenants' figures over a replay's window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TenantRun {
    /// Time mean of Jain's index of each queue's allocation over its fair share (queues
    /// with a fair share only).
    pub jain: f64,
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

    fn queue(&self, pod: u32) -> usize {
        self.queue_of.get(pod as usize).copied().unwrap_or(0)
    }

    fn shares(&self) -> Vec<[u64; DIMS]> {
        let demand: Vec<Res> = self
            .held
            .iter()
            .zip(&self.pending)
            .map(|(h, p)| {
                let mut d = h.clone();
                d.add(p);
                d
            })
            .collect();
        fair_shares(&self.tree, &self.capacity, &demand)
    }

    /// Integrates the standing since the last call up to `now` (from `from` on).
    pub(crate) fn advance(&mut self, now: Ms, from: Ms) {
        let last = self.measure.last.replace(now).unwrap_or(now);
        let start = last.max(from);
        let dt = now.0.saturating_sub(start.0) as f64;
        let fair = self.shares();
        if dt > 0.0 {
            let mut xs = Vec::new();
            for (q, share) in fair.iter().enumerate().skip(1) {
                let held = self.subtree_held(q);
                self.measure.alloc_ms[q] += held as f64 * dt;
                self.measure.fair_ms[q] += share[0] as f64 * dt;
                if self.tree.is_leaf(q) && share[0] > 0 {
                    xs.push(held as f64 / share[0] as f64);
                }
            }
            let jain = if xs.len() < 2 {
                1.0
            } else {
                let sum: f64 = xs.iter().sum();
                let squares: f64 = xs.iter().map(|x| x * x).sum();
                if squares > 0.0 {
                    sum * sum / (xs.len() as f64 * squares)
                } else {
                    1.0
                }
            };
            self.measure.jain_ms += jain * dt;
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

    pub(crate) fn report(&self) -> TenantRun {
        let w = self.measure.window_ms.max(1.0);
        TenantRun {
            jain: if self.measure.window_ms > 0.0 {
                self.measure.jain_ms / w
            } else {
                1.0
            },
            queues: (1..self.tree.len())
                .filter(|&q| self.queue_of.contains(&q) || !self.tree.is_leaf(q))
                .map(|q| QueueRun {
                    name: self.tree.name(q).to_string(),
                    guaranteed_gpus: self.tree.nodes[q].spec.guaranteed.floor(0) as f64 / 1e3,
                    mean_allocated_gpus: self.measure.alloc_ms[q] / w / 1e3,
                    mean_fair_share_gpus: self.measure.fair_ms[q] / w / 1e3,
                    to_guarantee_s: self.measure.to_guarantee_s[q].clone(),
                    reclaimed_pods: self.measure.reclaimed[q],
                })
                .collect(),
        }
    }
}

impl Engine<'_> {
    fn fair_res(&self, job: u32, node: Option<usize>) -> (usize, Res) {
        let pod = self.jobs[job as usize].pod;
        let model = node.map(|n| self.state.inventory(n).gpu_model());
        let q = self.tenants.as_ref().map_or(0, |t| t.queue(pod));
        (q, Res::of(&self.pods[pod as usize].request, model))
    }

    pub(super) fn fair_enqueued(&mut self, job: u32) {
        let (q, res) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.largest[q] = t.largest[q].max(res.dims[0]);
            t.pending[q].add(&res);
        }
    }

    pub(super) fn fair_started(&mut self, job: u32, node: usize) {
        let (q, placed) = self.fair_res(job, Some(node));
        let (_, asked) = self.fair_res(job, None);
        if let Some(t) = &mut self.tenants {
            t.pending[q].sub(&asked);
            t.held[q].add(&placed);
        }
    }

    pub(super) fn fair_departed(&mut self, job: u32, node: usize) {
        let (q, placed) = self.fair_res(job, Some(node));
        if let Some(t) = &mut self.tenants {
            t.held[q].sub(&placed);
        }
    }

    /// The due units in the queues' order (without tenants, as given), each tried as the
    /// scheduler tries a pod: `first` places it (or preempts for it), then reclaim, then
    /// `last` (make room); says whether each started.
    pub(super) fn fair_round(
        &mut self,
        due: Vec<u32>,
        now: Ms,
        first: &mut dyn FnMut(&mut Self, u32, Ms) -> bool,
        last: &mut dyn FnMut(&mut Self, u32, Ms) -> bool,
    ) -> Vec<(u32, bool)> {
        let Some(t) = &self.tenants else {
            return due
                .into_iter()
                .map(|u| (u, first(self, u, now) || last(self, u, now)))
                .collect();
        };
        let tree = Arc::clone(&t.tree);
        let mut picker: Picker<'_, u32> = Picker::new(&tree, &t.held, t.shares());
        for u in due {
            let first = self.units[u as usize].jobs[0];
            let q = t.queue(self.jobs[first as usize].pod);
            picker.push(q, u);
        }
        let mut out = Vec::new();
        while let Some((q, unit)) = picker.pop() {
            let jobs = self.units[unit as usize].jobs.clone();
            let mut asked = Res::default();
            for &j in &jobs {
                asked.add(&self.fair_res(j, None).1);
            }
            if picker.limit_hit(q, &asked).is_some() {
                out.push((unit, false));
                continue;
            }
            let mut started = first(self, unit, now);
            if !started && jobs.len() == 1 {
                started = self.try_reclaim(jobs[0], q, &mut picker, now);
            }
            if !started {
                started = last(self, unit, now);
            }
            if started {
                for &j in &jobs {
                    let node = self.jobs[j as usize].node as usize;
                    picker.placed(q, &self.fair_res(j, Some(node)).1);
                }
            }
            out.push((unit, started));
        }
        out
    }

    /// Evicts pods of queues above their guarantee so that `job` of queue `q` starts.
    fn try_reclaim(&mut self, job: u32, q: usize, picker: &mut Picker<'_, u32>, now: Ms) -> bool {
        let Some(t) = &self.tenants else {
            return false;
        };
        let (tree, queue_of) = (Arc::clone(&t.tree), Arc::clone(&t.queue_of));
        let asked = self.fair_res(job, None).1;
        let Some(entitled) = Entitlement::new(&tree, picker.allocations(), q, &asked) else {
            return false;
        };
        let of = |pod: u32| queue_of.get(pod as usize).copied().unwrap_or(0);
        let groups = self.victim_groups(&|pod| entitled.may_take_from(of(pod)));
        if groups.is_empty() {
            return false;
        }
        let group_queue: Vec<usize> = groups
            .iter()
            .map(|g| of(self.jobs[g[0] as usize].pod))
            .collect();
        let found = {
            let candidates = self.candidates(&groups);
            let request = &self.pods[self.jobs[job as usize].pod as usize].request;
            let mut taken = vec![false; groups.len()];
            let mut found = None;
            for _ in 0..MAX_PLANS {
                let Some(plan) = preempt::find(&self.state, request, &candidates, None, &taken)
                else {
                    break;
                };
                let mut losses: Vec<Loss> = Vec::new();
                for &u in &plan.units {
                    for &r in &groups[u] {
                        let node = self.jobs[r as usize].node as usize;
                        let res = self.fair_res(r, Some(node)).1;
                        match losses.iter_mut().find(|l| l.queue == group_queue[u]) {
                            Some(l) => l.res.add(&res),
                            None => losses.push(Loss {
                                queue: group_queue[u],
                                res,
                            }),
                        }
                    }
                }
                match entitled.check(&losses) {
                    Ok(()) => {
                        found = Some((plan, losses));
                        break;
                    }
                    Err(v) => {
                        for (u, g) in groups.iter().enumerate() {
                            let here = g
                                .iter()
                                .any(|&r| self.jobs[r as usize].node as usize == plan.node);
                            if group_queue[u] == v && here {
                                taken[u] = true;
                            }
                        }
                    }
                }
            }
            found
        };
        let Some((plan, losses)) = found else {
            return false;
        };
        for &u in &plan.units {
            if let Some(t) = &mut self.tenants {
                t.measure.reclaimed[group_queue[u]] += groups[u].len() as u64;
            }
        }
        for loss in &losses {
            picker.removed(loss.queue, &loss.res);
        }
        self.evict_and_start(job, &groups, plan, now)
    }
}
