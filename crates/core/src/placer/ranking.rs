//! The node-class index's passes: every class evaluated once per decision, or a ranking of
//! the best classes per request kept across decisions (only classes touched since are
//! evaluated again), and the explanation when nothing fits. Both give exactly the decision
//! a scan of every node gives (see the invariants proptest and the trace test).

use gpuplace_model::Request;

use super::Placer;
use super::ranked::{
    Ask, Best, RANKED, RANKINGS, Ranking, Standing, Statics, fit_remembered, type_allowed,
};
use crate::classes::NodeClasses;
use crate::devices::preference_bonus;
use crate::fit::Unschedulable;
use crate::policy::{Policy, simple_score};
use crate::state::ClusterState;

impl Placer {
    /// Class `id`'s standing for `request` and its GPU hint; `None` when it does not fit or
    /// no member is allowed.
    fn eval_class(
        &mut self,
        classes: &mut NodeClasses,
        state: &ClusterState,
        ask: &Ask<'_>,
        id: u32,
        statics: &mut Statics,
    ) -> Option<(Standing, u32)> {
        let (request, allowed, shape) = (ask.request, ask.allowed, ask.shape);
        let class = classes.class(id);
        let &(_, any) = class.members.first()?;
        let representative = any as usize;
        if ask
            .types
            .is_some_and(|types| !type_allowed(types, state.node_type(representative)))
        {
            return None;
        }
        fit_remembered(state, representative, request, statics).ok()?;
        let member = *match allowed {
            None => class.members.first(),
            Some(mask) => class
                .members
                .iter()
                .find(|(_, n)| mask.get(*n as usize).copied().unwrap_or(false)),
        }?;
        let cached = shape.and_then(|s| class.scores.get(s as usize).copied().flatten());
        let (score, gpu) = match cached {
            Some(hit) => hit,
            None => {
                let computed = match self.policy {
                    _ if !self.weights.is_empty() => {
                        self.weighted_score(state, representative, request)
                    }
                    Policy::Fgd => self.fgd_score(state, representative, request),
                    Policy::Gpuplace(ideas) => {
                        self.gpuplace_score(ideas, state, representative, request)
                    }
                    policy => (
                        simple_score(
                            policy,
                            representative,
                            state.inventory(representative),
                            state.node(representative),
                            request,
                        ),
                        0,
                    ),
                };
                if let Some(s) = shape {
                    let scores = &mut classes.class_mut(id).scores;
                    if scores.len() <= s as usize {
                        scores.resize(s as usize + 1, None);
                    }
                    scores[s as usize] = Some(computed);
                }
                computed
            }
        };
        let score = score + preference_bonus(state, representative, request);
        Some(((score, std::cmp::Reverse(member)), gpu))
    }

    /// Every live class evaluated; the `keep` best (best first), and whether those are all
    /// the classes that fit.
    pub(super) fn scan_classes(
        &mut self,
        classes: &mut NodeClasses,
        state: &ClusterState,
        ask: &Ask<'_>,
        keep: usize,
        statics: &mut Statics,
    ) -> (Vec<(Standing, u32, u32)>, bool) {
        let request = ask.request;
        let mut top: Vec<(Standing, u32, u32)> = Vec::with_capacity(keep + 1);
        let mut fitting = 0usize;
        for i in 0..classes.live().len() {
            if !classes.summaries()[i].may_fit(request) {
                continue;
            }
            let id = classes.live()[i];
            let Some((standing, gpu)) = self.eval_class(classes, state, ask, id, statics) else {
                continue;
            };
            fitting += 1;
            if top.len() == keep && top.last().is_some_and(|l| l.0 >= standing) {
                continue;
            }
            let at = top.partition_point(|e| e.0 > standing);
            top.insert(at, (standing, gpu, id));
            top.truncate(keep);
        }
        (top, fitting <= keep)
    }

    /// The best class for `request` with no mask, from the ranking kept since the last
    /// decision for the same request: only the classes touched since are evaluated again.
    /// Exact: every class outside the ranking stands below its bound (or does not fit).
    ///
    /// With `within` (a test of a class's first member), the best class that passes it,
    /// read from the same ranking: the first of its best classes that passes, `Some(None)`
    /// when none passes and no other class fits; `None` (undecided) when none of its best
    /// classes passes but others stand below its bound. Exact for a request that scores as
    /// `request` wherever it passes (its requirements only rule nodes out).
    pub(super) fn ranked_best(
        &mut self,
        classes: &mut NodeClasses,
        state: &ClusterState,
        request: &Request,
        shape: Option<u32>,
        types: Option<(&std::sync::Arc<[u64]>, u64)>,
        within: Option<&dyn Fn(usize) -> bool>,
    ) -> Option<Option<Best>> {
        let ask = Ask {
            request,
            allowed: None,
            shape,
            types: types.map(|(t, _)| &t[..]),
        };
        let epoch = classes.epoch();
        // The kept key is put back with the ranking (requests without requirements clone
        // no heap data).
        let key = (request.clone(), types.map(|(_, id)| id));
        let (key, kept) = match self.rankings.remove_entry(&key) {
            Some((key, r)) => (key, Some(r).filter(|r| r.epoch == epoch)),
            None => (key, None),
        };
        // What the hardware allows does not change: kept even when the ranking is rebuilt.
        let mut statics = Statics::new();
        let mut ranking = match kept {
            Some(mut r) => {
                let (touched, end) = classes.touched_since(r.pos);
                let mut ids = std::mem::take(&mut self.touched_ids);
                ids.clear();
                self.touched_gen = self.touched_gen.wrapping_add(1);
                if self.touched_gen == 0 {
                    // Wrapped: forget every mark (0 is never a live generation).
                    self.touched_mark.iter_mut().for_each(|m| *m = 0);
                    self.touched_gen = 1;
                }
                let generation = self.touched_gen;
                for &id in touched {
                    let i = id as usize;
                    if self.touched_mark.len() <= i {
                        self.touched_mark.resize(i + 1, 0);
                    }
                    if self.touched_mark[i] != generation {
                        self.touched_mark[i] = generation;
                        ids.push(id);
                    }
                }
                r.pos = end;
                let kept = if ids.len() * 4 > classes.live().len() {
                    statics = std::mem::take(&mut r.statics);
                    None
                } else {
                    let mark = &self.touched_mark;
                    r.top
                        .retain(|e| mark.get(e.2 as usize) != Some(&generation));
                    for &id in &ids {
                        if !classes.is_live(id) {
                            continue;
                        }
                        let Some((standing, gpu)) =
                            self.eval_class(classes, state, &ask, id, &mut r.statics)
                        else {
                            continue;
                        };
                        if r.bound.is_some_and(|b| standing < b) {
                            continue;
                        }
                        let at = r.top.partition_point(|e| e.0 > standing);
                        r.top.insert(at, (standing, gpu, id));
                    }
                    if r.top.len() > 4 * RANKED {
                        r.top.truncate(RANKED);
                        r.bound = r.top.last().map(|e| e.0);
                    }
                    (!r.top.is_empty() || r.bound.is_none()).then_some(r)
                };
                self.touched_ids = ids;
                kept
            }
            None => None,
        };
        if ranking.is_none() {
            let (top, complete) = self.scan_classes(classes, state, &ask, RANKED, &mut statics);
            ranking = Some(Ranking {
                statics,
                epoch,
                pos: classes.touched_since(usize::MAX).1,
                bound: if complete {
                    None
                } else {
                    top.last().map(|e| e.0)
                },
                top,
            });
        }
        let ranking = ranking?;
        let best = ranking
            .top
            .iter()
            .find(|((_, std::cmp::Reverse((_, n))), _, _)| {
                within.is_none_or(|passes| passes(*n as usize))
            })
            .map(|&((score, std::cmp::Reverse(member)), gpu, _)| (score, member, gpu));
        let decided = best.is_some() || ranking.bound.is_none();
        if self.rankings.len() >= RANKINGS {
            self.rankings.clear();
        }
        self.rankings.insert(key, ranking);
        decided.then_some(best)
    }

    /// Why no node fits, as the scan would find it, with one fit check per class: the
    /// members of a class are identical, so they fail for the same reason.
    pub(super) fn explain_indexed(
        &mut self,
        state: &ClusterState,
        request: &Request,
        allowed: Option<&[bool]>,
    ) -> Unschedulable {
        let mut why = Unschedulable::new(state.len());
        why.asked = crate::fit::Asked::of(request);
        if let Some(mask) = allowed {
            why.nodes = why.nodes.min(mask.len());
        }
        let mut statics = Statics::new();
        for &id in self.classes.live() {
            let class = self.classes.class(id);
            let Some(&(_, any)) = class.members.first() else {
                continue;
            };
            let members = match allowed {
                None => class.members.len(),
                Some(mask) => class
                    .members
                    .iter()
                    .filter(|(_, n)| mask.get(*n as usize).copied().unwrap_or(false))
                    .count(),
            };
            if members == 0 {
                continue;
            }
            if let Err(reason) = fit_remembered(state, any as usize, request, &mut statics) {
                for _ in 0..members {
                    why.add(reason);
                }
            }
        }
        why
    }
}

impl Placer {
    /// `request` as the same request without its requirements plus the node types they
    /// allow, when its requirements are about hardware alone (models, memory; no topology)
    /// and allow either every GPU of a node type or none: then it fits and scores on every
    /// node exactly as the unconstrained request does on the allowed types.
    pub(super) fn reduce(
        &mut self,
        state: &ClusterState,
        request: &Request,
    ) -> Option<super::Reduced> {
        let need = &request.need;
        if need.is_empty()
            || request.gpu_count == 0
            || need.topology != gpuplace_model::GpuTopology::Any
            || need.prefer != gpuplace_model::GpuTopology::Any
        {
            return None;
        }
        if self.reduced_for != state.instance() {
            self.reduced.clear();
            self.type_sets.clear();
            self.reduced_for = state.instance();
        }
        // What a request's requirements allow depends on them alone: the cache is keyed by
        // them, and the request without them is made afresh (no heap data unless the pod
        // also names models in its node selector).
        let plain =
            |(types, id): (std::sync::Arc<[u64]>, u64)| (super::without_need(request), types, id);
        if let Some(hit) = self.reduced.get(need) {
            return hit.clone().map(plain);
        }
        let mut verdict: Vec<u8> = Vec::new();
        let mut mixed = false;
        for n in 0..state.len() {
            let t = state.node_type(n) as usize;
            if verdict.len() <= t {
                verdict.resize(t + 1, 0);
            }
            if verdict[t] != 0 {
                continue;
            }
            let gpus = &state.inventory(n).gpus;
            let ok = |g: &gpuplace_model::Gpu| {
                need.allows_model(&g.model) && need.allows_memory(g.memory_mib)
            };
            let allowed = gpus.iter().filter(|g| ok(g)).count();
            if allowed != 0 && allowed != gpus.len() {
                mixed = true;
                break;
            }
            // A node without GPUs fails a GPU request either way.
            verdict[t] = if allowed == gpus.len() { 1 } else { 2 };
        }
        let out = (!mixed).then(|| {
            let mut types = vec![0u64; verdict.len().div_ceil(64)];
            for (t, v) in verdict.iter().enumerate() {
                if *v == 1 {
                    types[t / 64] |= 1 << (t % 64);
                }
            }
            let types: std::sync::Arc<[u64]> = std::sync::Arc::from(types);
            let next = self.next_type_set;
            let id = *self.type_sets.entry(types.clone()).or_insert(next);
            self.next_type_set += u64::from(id == next);
            (types, id)
        });
        if self.reduced.len() >= 4096 {
            self.reduced.clear();
        }
        self.reduced.insert(need.clone(), out.clone());
        out.map(plain)
    }
}
