//! Scores per node for callers that rank nodes themselves (the scheduler extender's
//! prioritize): the same scores [`Placer::choose`] compares.

use gpuplace_model::Request;

use super::{Placer, TieBreak, splitmix64};
use crate::devices::preference_bonus;
use crate::fit::FitFailure;
use crate::policy::{Policy, simple_score};
use crate::state::ClusterState;

impl Placer {
    /// The policy's score of each of `nodes` for `request`, as [`Placer::choose`] ranks
    /// them (higher is better; a topology preference's bonus included), or why the node
    /// does not fit. For callers that rank nodes themselves (the scheduler extender).
    ///
    /// Where `choose` evaluates each class of identical nodes once (the node-class index),
    /// so does this: thousands of candidates in a handful of states cost a handful of
    /// evaluations.
    pub fn score_nodes(
        &mut self,
        state: &ClusterState,
        request: &Request,
        nodes: &[usize],
    ) -> Vec<Result<i64, FitFailure>> {
        self.judge_nodes(state, request, nodes, true)
    }

    /// Whether `request` fits each of `nodes` (as [`ClusterState::fit`]), each class of
    /// identical nodes checked once.
    pub fn fit_nodes(
        &mut self,
        state: &ClusterState,
        request: &Request,
        nodes: &[usize],
    ) -> Vec<Result<(), FitFailure>> {
        self.judge_nodes(state, request, nodes, false)
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect()
    }

    /// Fit, and the score when `scored`, per node (one evaluation per class where the
    /// index applies).
    fn judge_nodes(
        &mut self,
        state: &ClusterState,
        request: &Request,
        nodes: &[usize],
        scored: bool,
    ) -> Vec<Result<i64, FitFailure>> {
        let shape = match self.policy {
            Policy::Fgd if self.cache_enabled && self.weights.is_empty() => self.shape_id(request),
            _ => None,
        };
        if self.cache.len() < state.len() {
            self.cache.resize(state.len(), Vec::new());
        }
        let indexable = self.index_enabled
            && self.tie_break == TieBreak::NodeOrder
            && !matches!(self.policy, Policy::FirstFit | Policy::Random);
        if !indexable {
            return nodes
                .iter()
                .map(|&n| self.score_one(state, n, request, shape, scored))
                .collect();
        }
        let mut classes = std::mem::take(&mut self.classes);
        let seed = self.seed;
        classes.sync(state, |n| splitmix64(state.name_hash(n) ^ seed));
        // Per class id: its score, once a member has been evaluated (`known`). Kept apart
        // from the flag so that each node's answer is one plain copy: an `Option` around
        // the `Result` made the compiler copy it through the stack in overlapping pieces
        // (measured: ~12 ns per node at 5,000 nodes).
        let mut memo: Vec<Result<i64, FitFailure>> = Vec::new();
        let mut known: Vec<bool> = Vec::new();
        let of_nodes = classes.of_nodes();
        let mut scores = Vec::with_capacity(nodes.len());
        for &n in nodes {
            let Some(&class) = of_nodes.get(n).filter(|_| n < state.len()) else {
                scores.push(Err(FitFailure::NoGpus));
                continue;
            };
            let at = class as usize;
            if memo.len() <= at {
                memo.resize(at + 1, Err(FitFailure::NoGpus));
                known.resize(at + 1, false);
            }
            if !known[at] {
                memo[at] = self.score_one(state, n, request, shape, scored);
                known[at] = true;
            }
            scores.push(memo[at]);
        }
        self.classes = classes;
        scores
    }

    fn score_one(
        &mut self,
        state: &ClusterState,
        n: usize,
        request: &Request,
        shape: Option<u32>,
        scored: bool,
    ) -> Result<i64, FitFailure> {
        if n >= state.len() {
            return Err(FitFailure::NoGpus);
        }
        state.fit(n, request)?;
        if !scored {
            return Ok(0);
        }
        let score = match self.policy {
            _ if !self.weights.is_empty() => self.weighted_score(state, n, request).0,
            Policy::Fgd => self.fgd_cached(state, n, request, shape).0,
            Policy::Gpuplace(ideas) => self.gpuplace_score(ideas, state, n, request).0,
            policy => simple_score(policy, n, state.inventory(n), state.node(n), request),
        };
        Ok(score + preference_bonus(state, n, request))
    }
}
