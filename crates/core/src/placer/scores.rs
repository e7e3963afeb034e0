//! Scores per node for callers that rank nodes themselves (the scheduler extender's
//! prioritize): the same scores [`Placer::choose`] compares.

use gpuplace_model::Request;

use super::Placer;
use crate::devices::preference_bonus;
use crate::fit::FitFailure;
use crate::policy::{Policy, simple_score};
use crate::state::ClusterState;

impl Placer {
    /// The policy's score of each of `nodes` for `request`, as [`Placer::choose`] ranks
    /// them (higher is better; a topology preference's bonus included), or why the node
    /// does not fit. For callers that rank nodes themselves (the scheduler extender).
    pub fn score_nodes(
        &mut self,
        state: &ClusterState,
        request: &Request,
        nodes: &[usize],
    ) -> Vec<Result<i64, FitFailure>> {
        let shape = match self.policy {
            Policy::Fgd if self.cache_enabled && self.weights.is_empty() => self.shape_id(request),
            _ => None,
        };
        if self.cache.len() < state.len() {
            self.cache.resize(state.len(), Vec::new());
        }
        nodes
            .iter()
            .map(|&n| {
                if n >= state.len() {
                    return Err(FitFailure::NoGpus);
                }
                state.fit(n, request)?;
                let score = match self.policy {
                    _ if !self.weights.is_empty() => self.weighted_score(state, n, request).0,
                    Policy::Fgd => self.fgd_cached(state, n, request, shape).0,
                    Policy::Gpuplace(ideas) => self.gpuplace_score(ideas, state, n, request).0,
                    policy => simple_score(policy, n, state.inventory(n), state.node(n), request),
                };
                Ok(score + preference_bonus(state, n, request))
            })
            .collect()
    }
}
