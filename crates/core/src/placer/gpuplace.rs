//! The `gpuplace` policy's score: FGD's fragmentation drop (with multi-GPU shapes counted
//! once per GPU they ask), minus the GPU milli the placement strands, minus the growth of
//! GPU milli the node's CPU cannot feed, minus the milli taken out of a model's reserve for
//! restricted pods, minus (for a share) the growth of the cluster's gap imbalance; on FGD's
//! sigmoid and points.

use gpuplace_model::Request;

use super::Placer;
use crate::devices::first_fitting;
use crate::policy::Ideas;
use crate::state::ClusterState;

/// Milli-GPU one unit of the sum of squared gap counts is worth. Large enough that the
/// balance decides between GPUs of different gap sizes, yet a share still goes where it
/// strands nothing when the counts are close.
const BALANCE_WEIGHT: f64 = 20.0;

impl Placer {
    /// The score of node `n` for `request` and, for a share, the best GPU position.
    pub(super) fn gpuplace_score(
        &mut self,
        ideas: Ideas,
        state: &ClusterState,
        n: usize,
        request: &Request,
    ) -> (i64, u32) {
        let request = &*state.effective(n, request);
        let Some(workload) = state.workload() else {
            return (0, first_fitting(state.node(n), request.gpu_milli) as u32);
        };
        let node = state.node(n);
        let model = state.inventory(n).gpu_model();
        let cpu_after = node.cpu_free - request.cpu_milli;
        let stranded_before = if ideas.stranded {
            workload.stranded_of(model, node.cpu_free, &node.gpu_free) as f64
        } else {
            0.0
        };
        let unfed_before = if ideas.unfed {
            workload.unfed_of(node.cpu_free, &node.gpu_free)
        } else {
            0.0
        };
        let multi_before = if ideas.multi {
            workload.multi_fragmentation_of(model, node.cpu_free, &node.gpu_free)
        } else {
            0.0
        };
        // Milli a pod that could run on other models takes out of this model's reserve.
        let cut = if ideas.reserve && request.gpu_count > 0 {
            state.reserve().cut(n, request, state.gpu_idle_milli())
        } else {
            0.0
        };
        let drop = |after: &[u32]| {
            let mut d = node.frag - workload.fragmentation_of(model, cpu_after, after) - cut;
            if ideas.stranded {
                d -= workload.stranded_of(model, cpu_after, after) as f64 - stranded_before;
            }
            if ideas.unfed {
                d -= workload.unfed_of(cpu_after, after) - unfed_before;
            }
            if ideas.multi {
                d -= workload.multi_fragmentation_of(model, cpu_after, after) - multi_before;
            }
            d
        };
        self.scratch.clear();
        self.scratch.extend_from_slice(&node.gpu_free);
        let (value, gpu) = if request.is_fractional() {
            // GPUs with equal free milli score the same; the lowest index among the best.
            let mut best: Option<(f64, usize)> = None;
            for g in 0..node.gpu_free.len() {
                let free = node.gpu_free[g];
                if free < request.gpu_milli || node.gpu_free[..g].contains(&free) {
                    continue;
                }
                let left = free - request.gpu_milli;
                self.scratch[g] = left;
                let mut value = drop(&self.scratch);
                self.scratch[g] = free;
                if ideas.balance {
                    let squares = state.gaps().square_change(node.gpu_capacity[g], free, left);
                    value -= BALANCE_WEIGHT * squares as f64;
                }
                if best.is_none_or(|(v, _)| value > v) {
                    best = Some((value, g));
                }
            }
            match best {
                Some(b) => b,
                None => return (0, 0),
            }
        } else {
            super::take_whole(&mut self.scratch, request);
            (drop(&self.scratch), 0)
        };
        let points = if ideas.fine { 1000.0 } else { 100.0 };
        let primary = (points / (1.0 + (-value / 1000.0).exp())) as i64;
        (primary, gpu as u32)
    }
}
