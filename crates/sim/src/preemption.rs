//! Priority preemption in the replay (`gpuplace simulate --preempt`): a pod that fits
//! nowhere evicts pods of lower priority chosen by the scheduler's own victim search
//! ([`gpuplace_core::preempt`]); victims are lost (the replay never retries a pod), and
//! what they cost is counted: pods and GPUs preempted, and the work lost.
//!
//! Priorities come from the trace's `qos` column (LS and Guaranteed 2, Burstable 1, BE 0)
//! or, for traces without it, from `--high-priority F`: a fraction F of pods, chosen by a
//! hash of their name, get priority 3.
//!
//! Work lost is measured on the replay's own clock (one tick per arrival): each victim's
//! GPUs times the ticks it ran before eviction, as a percentage of the cluster's GPU
//! capacity times the replay's length: the share of all GPU time spent on work thrown away.

use gpuplace_core::ClusterState;
use gpuplace_core::preempt::{Candidates, Holder, find};
use gpuplace_model::Request;

use crate::workload::Workload;

pub use crate::trace::qos_priority;

/// Gives a fraction (0-1) of the pods, chosen by a hash of their names, priority 3.
pub fn raise_priority(workload: &mut Workload, fraction: f64) -> Result<usize, String> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(format!(
            "--high-priority must be between 0 and 1, got {fraction}"
        ));
    }
    let mut raised = 0;
    for pod in &mut workload.pods {
        if (crate::trace::name_hash(&pod.name) % 10_000) as f64 / 10_000.0 < fraction {
            pod.priority = 3;
            raised += 1;
        }
    }
    Ok(raised)
}

/// A pod placed in the replay.
struct Placed {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    priority: i32,
    at: u64,
}

/// What preemption cost in one replay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PreemptionCost {
    pub pods: usize,
    pub gpu_milli: u64,
    /// Milli-GPU times ticks of the victims' run before eviction.
    pub lost: u128,
}

/// Placed pods, to find victims among.
#[derive(Default)]
pub struct Ledger {
    placed: Vec<Option<Placed>>,
    /// Placed pods per priority (no search when none is lower than the preemptor).
    by_priority: std::collections::BTreeMap<i32, usize>,
    pub cost: PreemptionCost,
}

impl Ledger {
    /// Records a placement made at tick `at`.
    pub fn record(
        &mut self,
        node: usize,
        request: &Request,
        gpus: &[(usize, u32)],
        priority: i32,
        at: u64,
    ) {
        *self.by_priority.entry(priority).or_default() += 1;
        self.placed.push(Some(Placed {
            node,
            request: request.clone(),
            gpus: gpus.to_vec(),
            priority,
            at,
        }));
    }

    /// Tries to place `request` of `priority` by evicting lower-priority pods; on success
    /// the state and the ledger are updated and the cost counted.
    pub fn preempt(
        &mut self,
        state: &mut ClusterState,
        request: &Request,
        priority: i32,
        now: u64,
    ) -> bool {
        if self.by_priority.range(..priority).all(|(_, n)| *n == 0) {
            return false;
        }
        let mut ids = Vec::new();
        let mut candidates = Candidates::default();
        for (id, p) in self.placed.iter().enumerate() {
            if let Some(p) = p.as_ref().filter(|p| p.priority < priority) {
                ids.push(id);
                // The static replay has no clock: pods were made in list order.
                candidates.push_unit(
                    p.priority,
                    id as i64,
                    [Holder {
                        node: p.node,
                        request: &p.request,
                        gpus: &p.gpus,
                        budgets: Vec::new(),
                    }],
                );
            }
        }
        let plan = find(state, request, &candidates, None, &[]);
        drop(candidates);
        let Some(plan) = plan else {
            return false;
        };
        let mut taken = Vec::new();
        for &u in &plan.units {
            if let Some(p) = self.placed[ids[u]].take() {
                if state.release(p.node, &p.request, &p.gpus).is_err() {
                    // Cannot happen (the ledger mirrors the state); keep the state as is.
                    self.placed[ids[u]] = Some(p);
                    continue;
                }
                taken.push(p);
            }
        }
        if state.apply(plan.node, request, &plan.gpus).is_err() {
            // Undo: the victims stay.
            for p in taken {
                let _ = state.apply(p.node, &p.request, &p.gpus);
                self.placed.push(Some(p));
            }
            return false;
        }
        for p in taken {
            if let Some(n) = self.by_priority.get_mut(&p.priority) {
                *n = n.saturating_sub(1);
            }
            let milli: u64 = p.gpus.iter().map(|&(_, m)| u64::from(m)).sum();
            self.cost.pods += 1;
            self.cost.gpu_milli += milli;
            self.cost.lost += u128::from(milli) * u128::from(now.saturating_sub(p.at));
        }
        self.record(plan.node, request, &plan.gpus, priority, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::NodeInventory;

    fn req(count: u32) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 10,
            gpu_count: count,
            gpu_milli: 1000,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    #[test]
    fn qos_values_map_to_priorities_and_others_are_refused() {
        assert_eq!(qos_priority("LS"), Ok(2));
        assert_eq!(qos_priority("BE"), Ok(0));
        assert_eq!(qos_priority("Burstable"), Ok(1));
        assert!(qos_priority("gold").unwrap_err().contains("\"gold\""));
    }

    #[test]
    fn a_high_priority_pod_evicts_and_the_cost_is_counted() {
        let mut state =
            ClusterState::new(vec![NodeInventory::uniform("a", 64_000, 1 << 20, 2, "T4")]).unwrap();
        let mut ledger = Ledger::default();
        state.apply(0, &req(1), &[(0, 1000)]).unwrap();
        ledger.record(0, &req(1), &[(0, 1000)], 0, 1);
        state.apply(0, &req(1), &[(1, 1000)]).unwrap();
        ledger.record(0, &req(1), &[(1, 1000)], 2, 2);
        // Equal priority: nothing to evict.
        assert!(!ledger.preempt(&mut state, &req(1), 0, 5));
        assert!(ledger.preempt(&mut state, &req(1), 1, 5));
        assert_eq!(ledger.cost.pods, 1);
        assert_eq!(ledger.cost.gpu_milli, 1000);
        assert_eq!(ledger.cost.lost, 4000);
        assert_eq!(state.node(0).gpu_free, vec![0, 0]);
        // Nothing below priority 1 is left.
        assert!(!ledger.preempt(&mut state, &req(1), 1, 6));
        assert!(ledger.preempt(&mut state, &req(2), 3, 7));
        assert_eq!(ledger.cost.pods, 3);
    }
}
