//! One placement decision: filter every node, score the ones that fit, break ties at random
//! (seeded), then choose the exact GPUs on the winner.

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_model::{DeviceShare, GpuNeed, Placement, Request};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::classes::NodeClasses;
use crate::devices::{choose_gpus, first_fitting, preference_bonus};
use crate::fit::Unschedulable;
use crate::frag::Shape;
use crate::policy::{Policy, simple_score};
use crate::state::ClusterState;
use ranked::Ranking;

/// Where a request goes: node index, GPUs as (position, milli), and the winning score.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub node: usize,
    pub gpus: Vec<(usize, u32)>,
    pub score: i64,
}

impl Decision {
    /// The decision with node name and device IDs, for adapters to record.
    pub fn to_placement(&self, state: &ClusterState) -> Placement {
        let inventory = state.inventory(self.node);
        Placement {
            node: inventory.name.clone(),
            devices: self
                .gpus
                .iter()
                .map(|&(g, milli)| DeviceShare {
                    index: inventory.gpus[g].index,
                    id: inventory.gpus[g].id.clone(),
                    milli,
                })
                .collect(),
            score: self.score,
        }
    }
}

/// A cached FGD score of one request shape on one node version.
#[derive(Clone, Copy)]
struct CachedScore {
    version: u64,
    score: i64,
    gpu: u32,
}

const EMPTY: CachedScore = CachedScore {
    version: u64::MAX,
    score: 0,
    gpu: 0,
};

/// Shapes beyond this many are scored without the cache (bounds its memory).
const MAX_CACHED_SHAPES: usize = 512;

/// How equal top scores are broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TieBreak {
    /// The tied node that comes first in a random node order fixed by the seed. This is
    /// what the FGD authors' simulator does (it renames nodes with a random numeric prefix
    /// and its forked kube-scheduler takes the first top-scoring node in name order), and
    /// it packs: ties keep landing on the same nodes instead of spreading.
    #[default]
    NodeOrder,
    /// Uniformly at random among the tied nodes (stock kube-scheduler's reservoir sampling).
    Uniform,
}

/// A request without its hardware-only requirements, the node types they allow (a bit per
/// type), and that set of types' id (equal sets, equal ids).
type Reduced = (Request, Arc<[u64]>, u64);

/// Node types allowed (a bit per type) and the set's id.
type TypeSet = (Arc<[u64]>, u64);

/// A ranking's key: the request, and the id of the node types allowed when it was reduced.
type RankKey = (Request, Option<u64>);

/// Places requests on a [`ClusterState`] with one policy and a seeded tie-break.
pub struct Placer {
    policy: Policy,
    tie_break: TieBreak,
    seed: u64,
    rng: ChaCha8Rng,
    shape_ids: HashMap<Shape, u32, foldhash::fast::RandomState>,
    /// `cache[node][shape]`, valid while the node's version matches.
    cache: Vec<Vec<CachedScore>>,
    scratch: Vec<u32>,
    cache_enabled: bool,
    /// Nodes grouped by identical state (see [`NodeClasses`]); used when the policy and
    /// tie-break do not depend on which node of a class is scored.
    classes: NodeClasses,
    index_enabled: bool,
    /// A weighted sum of policies' scores instead of `policy` alone (empty: `policy`).
    weights: Vec<(Policy, i64)>,
    /// Per request: the best classes found last time, kept true across placements.
    rankings: HashMap<RankKey, Ranking, foldhash::fast::RandomState>,
    /// Per set of hardware-only requirements (models, memory): the node types they allow
    /// and that set's id, when they allow every GPU of a type or none (`None` otherwise);
    /// for the state instance `reduced_for`.
    reduced: HashMap<GpuNeed, Option<TypeSet>, foldhash::fast::RandomState>,
    reduced_for: u64,
    /// Ids of the sets of node types reductions allowed; ids are never reused, so a
    /// ranking's key never names another set.
    type_sets: HashMap<Arc<[u64]>, u64, foldhash::fast::RandomState>,
    next_type_set: u64,
    /// Shape ids of requests without model restrictions, by (CPU, milli, count): found
    /// without building a [`Shape`].
    plain_shape_ids: HashMap<(u64, u32, u32), u32, foldhash::fast::RandomState>,
    /// Scratch for the classes touched since a ranking was made.
    touched_ids: Vec<u32>,
    /// Per class id, the generation in which it was last seen touched (deduplicates the
    /// touched ids without sorting them).
    touched_mark: Vec<u32>,
    touched_gen: u32,
    /// kube-scheduler's rotating, partial scan (`kube-default` only; see [`sampled`]).
    sampling: Option<Sampling>,
}

/// Where kube-scheduler's next scan starts, and how much of the cluster it scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sampling {
    /// `percentageOfNodesToScore`: 0 is adaptive, 100 or more scores every node.
    percentage: u32,
    /// `nextStartNodeIndex`.
    next_start: usize,
}

/// Why a set of policy weights is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WeightError {
    #[error(
        "policy {0} cannot be weighted (its score depends on the node's position or on chance)"
    )]
    NotWeightable(Policy),
    #[error(
        "policy {0} cannot be weighted (it scores a share by the whole cluster's gaps, not by one node)"
    )]
    ClusterWide(Policy),
    #[error("weight of policy {0} must be between 1 and 100")]
    OutOfRange(Policy),
    #[error("policy {0} is weighted twice")]
    Repeated(Policy),
}

/// FGD's score for a fragmentation drop: trunc(100 * sigmoid(delta / 1000)).
fn fgd_points(before: f64, after: f64) -> i64 {
    let x = (before - after) / 1000.0;
    (100.0 / (1.0 + (-x).exp())) as i64
}

impl Placer {
    pub fn new(policy: Policy, seed: u64) -> Self {
        Placer {
            policy,
            tie_break: TieBreak::default(),
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            shape_ids: HashMap::default(),
            cache: Vec::new(),
            scratch: Vec::new(),
            cache_enabled: true,
            classes: NodeClasses::default()
                .with_pod_classes(matches!(policy, Policy::GpuClustering)),
            index_enabled: true,
            weights: Vec::new(),
            rankings: HashMap::default(),
            reduced: HashMap::default(),
            reduced_for: 0,
            type_sets: HashMap::default(),
            next_type_set: 0,
            plain_shape_ids: HashMap::default(),
            touched_ids: Vec::new(),
            touched_mark: Vec::new(),
            touched_gen: 0,
            sampling: policy.is_kube_scheduler().then(Sampling::default),
        }
    }

    /// The seed of the tie-break order.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Uses `tie_break` for equal top scores (the `random` policy always picks uniformly).
    pub fn with_tie_break(mut self, tie_break: TieBreak) -> Self {
        self.tie_break = tie_break;
        self
    }

    /// Turns the per-node score cache off (for benchmarks that measure what it saves).
    pub fn with_cache(mut self, enabled: bool) -> Self {
        self.cache_enabled = enabled;
        self
    }

    /// Turns the node-class index off: every decision scans every node (the reference the
    /// index is tested against, and the baseline benchmarks compare with).
    pub fn with_index(mut self, enabled: bool) -> Self {
        self.index_enabled = enabled;
        self
    }

    /// Scores nodes by `sum(weight * score)` over `weights` (kube-scheduler's plugin
    /// weights). The placer's own policy still picks the GPU for a fractional request.
    pub fn with_weights(mut self, weights: &[(Policy, i64)]) -> Result<Self, WeightError> {
        for (i, &(policy, weight)) in weights.iter().enumerate() {
            if matches!(policy, Policy::FirstFit | Policy::Random) {
                return Err(WeightError::NotWeightable(policy));
            }
            if matches!(policy, Policy::Gpuplace(_)) {
                return Err(WeightError::ClusterWide(policy));
            }
            if !(1..=100).contains(&weight) {
                return Err(WeightError::OutOfRange(policy));
            }
            if weights[..i].iter().any(|(p, _)| *p == policy) {
                return Err(WeightError::Repeated(policy));
            }
        }
        self.weights = weights.to_vec();
        let clustering = self.policy == Policy::GpuClustering
            || weights.iter().any(|(p, _)| *p == Policy::GpuClustering);
        self.classes = NodeClasses::default().with_pod_classes(clustering);
        Ok(self)
    }

    /// The weighted score of node `n`, with the GPU hint of the FGD term if there is one.
    fn weighted_score(&mut self, state: &ClusterState, n: usize, request: &Request) -> (i64, u32) {
        let request = &*state.effective(n, request);
        let mut total = 0;
        let mut hint = None;
        for i in 0..self.weights.len() {
            let (policy, weight) = self.weights[i];
            let score = match policy {
                Policy::Fgd => {
                    let (score, gpu) = self.fgd_score(state, n, request);
                    hint = Some(gpu);
                    score
                }
                policy => simple_score(policy, n, state.inventory(n), state.node(n), request),
            };
            total += weight * score;
        }
        let hint = hint.unwrap_or_else(|| first_fitting(state.node(n), request.gpu_milli) as u32);
        (total, hint)
    }

    /// Classes of identical nodes the index holds (benchmarks report it).
    pub fn class_count(&self) -> usize {
        self.classes.live().len()
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Position of node `n` in this placer's seeded node order.
    fn rank(&self, state: &ClusterState, n: usize) -> (u64, usize) {
        (splitmix64(state.name_hash(n) ^ self.seed), n)
    }

    /// Chooses and applies; the state changes only on success.
    pub fn place(
        &mut self,
        state: &mut ClusterState,
        request: &Request,
    ) -> Result<Decision, Unschedulable> {
        let decision = self.choose(state, request, None)?;
        // `choose` only returns GPUs that fit, so this cannot overcommit; if it ever would,
        // the request is reported unschedulable rather than corrupting the state.
        match state.apply(decision.node, request, &decision.gpus) {
            Ok(()) => Ok(decision),
            Err(_) => {
                let mut why = Unschedulable::new(state.len());
                why.asked = crate::fit::Asked::of(request);
                Err(why)
            }
        }
    }

    /// Picks a node and GPUs for `request` without changing the state. `allowed`, when
    /// given, masks nodes that filters outside core have already rejected.
    pub fn choose(
        &mut self,
        state: &ClusterState,
        request: &Request,
        allowed: Option<&[bool]>,
    ) -> Result<Decision, Unschedulable> {
        if self.sampling.is_some() && self.weights.is_empty() {
            return self.choose_sampled(state, request, allowed);
        }
        let indexable = self.index_enabled
            && self.tie_break == TieBreak::NodeOrder
            && !matches!(self.policy, Policy::FirstFit | Policy::Random);
        if indexable {
            if let Some((score, node, hint)) = self.choose_indexed(state, request, allowed) {
                let gpus = choose_gpus(self.policy, &mut self.rng, state, node, request, hint);
                return Ok(Decision { node, gpus, score });
            }
            // Nothing fits: the reason of each class of identical nodes, once per class.
            return Err(self.explain_indexed(state, request, allowed));
        }
        let shape = match self.policy {
            Policy::Fgd if self.cache_enabled && self.weights.is_empty() => self.shape_id(request),
            _ => None,
        };
        if self.cache.len() < state.len() {
            self.cache.resize(state.len(), Vec::new());
        }
        let mut why = Unschedulable::new(state.len());
        why.asked = crate::fit::Asked::of(request);
        let mut best: Option<(i64, usize, u32)> = None;
        let mut ties = 0u32;
        let uniform = self.tie_break == TieBreak::Uniform || self.policy == Policy::Random;
        for n in 0..state.len() {
            if allowed.is_some_and(|mask| !mask.get(n).copied().unwrap_or(false)) {
                continue;
            }
            if let Err(reason) = state.fit(n, request) {
                why.add(reason);
                continue;
            }
            let (score, gpu) = match self.policy {
                _ if !self.weights.is_empty() => self.weighted_score(state, n, request),
                Policy::Fgd => self.fgd_cached(state, n, request, shape),
                Policy::Gpuplace(ideas) => self.gpuplace_score(ideas, state, n, request),
                policy => (
                    simple_score(policy, n, state.inventory(n), state.node(n), request),
                    0,
                ),
            };
            let score = score + preference_bonus(state, n, request);
            match best {
                Some((top, _, _)) if score < top => {}
                Some((top, held, _)) if score == top => {
                    if uniform {
                        // Reservoir sampling: each tied node ends up chosen with equal chance.
                        ties += 1;
                        if self.rng.random_range(0..ties) == 0 {
                            best = Some((score, n, gpu));
                        }
                    } else if self.rank(state, n) < self.rank(state, held) {
                        best = Some((score, n, gpu));
                    }
                }
                _ => {
                    best = Some((score, n, gpu));
                    ties = 1;
                }
            }
        }
        let (score, node, hint) = match best {
            Some(b) => b,
            None => {
                if let Some(mask) = allowed {
                    why.nodes = why.nodes.min(mask.len());
                }
                return Err(why);
            }
        };
        let gpus = choose_gpus(self.policy, &mut self.rng, state, node, request, hint);
        Ok(Decision { node, gpus, score })
    }

    /// The scan's answer computed once per class of identical nodes: the best score, and
    /// among equal scores the first node in the seeded order that the mask allows.
    fn choose_indexed(
        &mut self,
        state: &ClusterState,
        request: &Request,
        allowed: Option<&[bool]>,
    ) -> Option<(i64, usize, u32)> {
        let mut classes = std::mem::take(&mut self.classes);
        let seed = self.seed;
        classes.sync(state, |n| splitmix64(state.name_hash(n) ^ seed));
        // A share's `gpuplace` score depends on the cluster's gap counts, which every share
        // placed anywhere changes: such requests are evaluated afresh on every class (no
        // cached score, no kept ranking); the class index still spares identical nodes.
        let global = self.global_score(state, request);
        let shape = match self.policy {
            Policy::Fgd | Policy::Gpuplace(_)
                if self.cache_enabled && self.weights.is_empty() && !global =>
            {
                self.shape_id(request)
            }
            _ => None,
        };
        let best = match allowed {
            None if !global => match self.reduce(state, request) {
                // Requests that differ only in which node types their requirements allow
                // share one ranking, with the unconstrained request's evaluation; the
                // unconstrained request's own ranking answers first when its best classes
                // include an allowed one.
                Some((plain, types, id)) => {
                    let allowed = |n: usize| ranked::type_allowed(&types, state.node_type(n));
                    match self.ranked_best(&mut classes, state, &plain, shape, None, Some(&allowed))
                    {
                        Some(best) => best,
                        None => self
                            .ranked_best(
                                &mut classes,
                                state,
                                &plain,
                                shape,
                                Some((&types, id)),
                                None,
                            )
                            .flatten(),
                    }
                }
                // Other requirements (a topology) leave every score as it is where the
                // request fits: the unconstrained request's best classes answer when one of
                // them fits the request.
                None if request.gpu_count > 0
                    && !request.need.is_empty()
                    && request.need.prefer == gpuplace_model::GpuTopology::Any =>
                {
                    let plain = without_need(request);
                    let fits = |n: usize| state.fit(n, request).is_ok();
                    match self.ranked_best(&mut classes, state, &plain, shape, None, Some(&fits)) {
                        Some(best) => best,
                        None => self
                            .ranked_best(&mut classes, state, request, shape, None, None)
                            .flatten(),
                    }
                }
                None => self
                    .ranked_best(&mut classes, state, request, shape, None, None)
                    .flatten(),
            },
            _ => {
                let mut statics = Vec::new();
                let ask = ranked::Ask {
                    request,
                    allowed,
                    shape,
                    types: None,
                };
                let (top, _) = self.scan_classes(&mut classes, state, &ask, 1, &mut statics);
                top.first()
                    .map(|&((score, std::cmp::Reverse(member)), gpu, _)| (score, member, gpu))
            }
        };
        self.classes = classes;
        let (score, (_, n), gpu) = best?;
        let n = n as usize;
        // A class of nodes with symmetric GPUs holds nodes with the same shares in other
        // positions, and its cached hint may come from another member: the GPU of a share is
        // found again on the chosen node, as a scan would find it there.
        let gpu = if state.effective(n, request).is_fractional() && !state.symmetry(n).is_trivial()
        {
            match self.policy {
                _ if !self.weights.is_empty() => self.weighted_score(state, n, request).1,
                Policy::Fgd => self.fgd_score(state, n, request).1,
                Policy::Gpuplace(ideas) => self.gpuplace_score(ideas, state, n, request).1,
                _ => gpu,
            }
        } else {
            gpu
        };
        Some((score, n, gpu))
    }

    /// Whether `request`'s score depends on more than its node's state (a share under
    /// `gpuplace`'s gap balance, a whole GPU being a share on a time-sliced node; a GPU pod
    /// that pays for a model's reserve, which depends on the whole cluster's free milli).
    fn global_score(&self, state: &ClusterState, request: &Request) -> bool {
        let Policy::Gpuplace(ideas) = self.policy else {
            return false;
        };
        let share = request.is_fractional()
            || (state.any_time_sliced()
                && request.gpu_count == 1
                && request.gpu_milli == gpuplace_model::MILLI_PER_GPU);
        let pays =
            request.gpu_count > 0 && request.allowed_models.len() != 1 && state.reserve().active();
        (ideas.balance && share) || (ideas.reserve && pays)
    }

    fn shape_id(&mut self, request: &Request) -> Option<u32> {
        let next = (self.shape_ids.len() + self.plain_shape_ids.len()) as u32;
        let id = if request.allowed_models.is_empty() {
            let key = (request.cpu_milli, request.gpu_milli, request.gpu_count);
            *self.plain_shape_ids.entry(key).or_insert(next)
        } else {
            *self.shape_ids.entry(Shape::of(request)).or_insert(next)
        };
        ((id as usize) < MAX_CACHED_SHAPES).then_some(id)
    }

    fn fgd_cached(
        &mut self,
        state: &ClusterState,
        n: usize,
        request: &Request,
        shape: Option<u32>,
    ) -> (i64, u32) {
        let version = state.node(n).version;
        if let Some(id) = shape {
            let row = &self.cache[n];
            if let Some(hit) = row.get(id as usize).filter(|c| c.version == version) {
                return (hit.score, hit.gpu);
            }
        }
        let (score, gpu) = self.fgd_score(state, n, request);
        if let Some(id) = shape {
            let row = &mut self.cache[n];
            if row.len() <= id as usize {
                row.resize(id as usize + 1, EMPTY);
            }
            row[id as usize] = CachedScore {
                version,
                score,
                gpu,
            };
        }
        (score, gpu)
    }

    /// FGD score of node `n` and, for a fractional request, the best GPU position.
    fn fgd_score(&mut self, state: &ClusterState, n: usize, request: &Request) -> (i64, u32) {
        let request = &*state.effective(n, request);
        let Some(workload) = state.workload() else {
            return (0, first_fitting(state.node(n), request.gpu_milli) as u32);
        };
        let node = state.node(n);
        let model = state.inventory(n).gpu_model();
        // The state keeps each node's fragmentation up to date incrementally; without the
        // cache it is recomputed, as a from-scratch scorer would.
        let before = if self.cache_enabled {
            node.frag
        } else {
            workload.fragmentation_of(model, node.cpu_free, &node.gpu_free)
        };
        let cpu_after = node.cpu_free - request.cpu_milli;
        self.scratch.clear();
        self.scratch.extend_from_slice(&node.gpu_free);
        if request.is_fractional() {
            // GPUs with equal free milli score the same; the paper keeps the lowest index
            // among the best.
            let mut best: Option<(i64, usize)> = None;
            for g in 0..node.gpu_free.len() {
                let free = node.gpu_free[g];
                if free < request.gpu_milli || node.gpu_free[..g].contains(&free) {
                    continue;
                }
                self.scratch[g] = free - request.gpu_milli;
                let after = workload.fragmentation_of(model, cpu_after, &self.scratch);
                self.scratch[g] = free;
                let score = fgd_points(before, after);
                if best.is_none_or(|(s, _)| score > s) {
                    best = Some((score, g));
                }
            }
            match best {
                Some((score, g)) => (score, g as u32),
                None => (0, 0),
            }
        } else {
            take_whole(&mut self.scratch, request);
            let after = workload.fragmentation_of(model, cpu_after, &self.scratch);
            (fgd_points(before, after), 0)
        }
    }
}

/// `request` without its GPU requirements (its node-selector models kept).
fn without_need(request: &Request) -> Request {
    Request {
        need: GpuNeed::default(),
        allowed_models: request.allowed_models.clone(),
        ..*request
    }
}

/// Takes `request`'s GPUs from `free` as FGD scores a whole-GPU pod: the first GPUs (by
/// position) with the share free.
fn take_whole(free: &mut [u32], request: &Request) {
    let mut wanted = request.gpu_count;
    for f in free.iter_mut() {
        if wanted == 0 {
            break;
        }
        if *f >= request.gpu_milli {
            *f -= request.gpu_milli;
            wanted -= 1;
        }
    }
}

/// A 64-bit mix (splitmix64's finaliser): a fixed, well-spread order from any key.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

mod gpuplace;
mod ranked;
mod ranking;
mod sampled;
mod scores;

#[cfg(test)]
mod tests;
