//! Which parked pods a departure wakes: the one rule the scheduler's queue and the
//! timeline both follow (gpuplace's discipline; kube-scheduler's twin wakes every parked
//! pod at any event, as v1.26 does).
//!
//! A pod parks when an attempt found no place, no victims and no moves for it. Until the
//! cluster changes it would fail the same way, so the drivers wake it only when a pod
//! leaves a node where it could start afterwards: where what pods of its priority or
//! higher keep holding (those still running, not leaving) leaves room for its request, on
//! a GPU model it allows. That bound is necessary, not sufficient: a pod it wakes may
//! still fail, a pod it leaves parked would have failed. Since the pod's last attempt, a
//! node no pod left only filled up (or had room taken by higher priorities), so the nodes
//! pods left are the only ones to look at.
//!
//! The bound reads one node, so what a pod waits for elsewhere is not covered: such a
//! pod wakes at every departure ([`Reach::anywhere`]).

use gpuplace_model::Request;

use crate::preempt::{Amounts, amounts_of};
use crate::state::ClusterState;

/// What a parked pod may wait for beyond room on one node. Any of these makes it wake at
/// every departure, wherever it happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// A gang member: its gang starts together, on several nodes.
    pub gang: bool,
    /// Nominated by preemption: it waits for its own victims, and its held places count
    /// as its own.
    pub nominated: bool,
    /// Queues order and limit it: a departure anywhere in its queue (or another) changes
    /// its share, its limit's headroom and what reclaim may take.
    pub queued: bool,
    /// Make-room or rebalance may move pods for it: a departure anywhere can make a
    /// target for a move.
    pub moves: bool,
    /// It has inter-pod terms (affinity, anti-affinity, spread), or a placed pod has
    /// anti-affinity: a departure changes what a node's zone or domain allows.
    pub inter_pod: bool,
    /// It needs volumes or DRA claims, which a departure elsewhere can release.
    pub claims: bool,
}

impl Reach {
    /// Whether the pod wakes at every departure.
    pub fn anywhere(&self) -> bool {
        let Reach {
            gang,
            nominated,
            queued,
            moves,
            inter_pod,
            claims,
        } = *self;
        gang || nominated || queued || moves || inter_pod || claims
    }
}

/// Whether `request`, at some priority, could start on node `n` once pods left it, where
/// `kept` is what pods of that priority or higher hold there and keep holding (running,
/// not leaving): the node's GPU model is allowed and its capacity less `kept` covers the
/// request in GPU milli, CPU and memory. Always true where GPUs are time-sliced (a request
/// takes another share per node there, so its amounts bound nothing).
pub fn may_start_on(state: &ClusterState, n: usize, kept: &Amounts, request: &Request) -> bool {
    if state.any_time_sliced() {
        return true;
    }
    let inventory = state.inventory(n);
    if !request.allowed_models.is_empty() && !request.allows_model(inventory.gpu_model()) {
        return false;
    }
    let capacity = [
        state
            .node(n)
            .gpu_capacity
            .iter()
            .map(|&m| u64::from(m))
            .sum(),
        inventory.cpu_milli,
        inventory.memory_mib,
    ];
    let need = amounts_of(request);
    (0..3).all(|d| capacity[d].saturating_sub(kept[d]) >= need[d])
}

/// Whether a pod leaving any of `left` (nodes, repeats allowed) could let `request` start
/// ([`may_start_on`]; `kept(n)`: what pods of its priority or higher keep on node `n`).
pub fn helped_by(
    state: &ClusterState,
    left: &[usize],
    mut kept: impl FnMut(usize) -> Amounts,
    request: &Request,
) -> bool {
    left.iter()
        .any(|&n| n < state.len() && may_start_on(state, n, &kept(n), request))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::NodeInventory;

    fn state() -> ClusterState {
        ClusterState::new(vec![
            NodeInventory::uniform("a", 32_000, 256_000, 8, "A100"),
            NodeInventory::uniform("b", 32_000, 256_000, 4, "V100"),
        ])
        .expect("a valid inventory")
    }

    fn gpus(n: u32, model: Option<&str>) -> Request {
        Request {
            cpu_milli: 1_000,
            memory_mib: 1_024,
            gpu_count: n,
            gpu_milli: 1_000,
            allowed_models: model.map(|m| vec![m.to_string()]).unwrap_or_default(),
            ..Default::default()
        }
    }

    #[test]
    fn room_counts_capacity_less_what_higher_priorities_keep() {
        let s = state();
        assert!(may_start_on(&s, 0, &[0; 3], &gpus(8, None)));
        assert!(may_start_on(&s, 0, &[4_000, 0, 0], &gpus(4, None)));
        assert!(!may_start_on(&s, 0, &[4_001, 0, 0], &gpus(4, None)));
        assert!(!may_start_on(&s, 0, &[0, 31_500, 0], &gpus(1, None)));
        assert!(!may_start_on(&s, 1, &[0; 3], &gpus(8, None)));
    }

    #[test]
    fn a_model_the_pod_refuses_never_helps() {
        let s = state();
        assert!(!may_start_on(&s, 1, &[0; 3], &gpus(1, Some("A100"))));
        assert!(helped_by(&s, &[1, 0], |_| [0; 3], &gpus(1, Some("A100"))));
        assert!(!helped_by(&s, &[1, 1], |_| [0; 3], &gpus(1, Some("A100"))));
        assert!(
            !helped_by(&s, &[7], |_| [0; 3], &gpus(1, None)),
            "no such node"
        );
    }

    #[test]
    fn any_reach_wakes_anywhere() {
        assert!(!Reach::default().anywhere());
        for reach in [
            Reach {
                gang: true,
                ..Default::default()
            },
            Reach {
                nominated: true,
                ..Default::default()
            },
            Reach {
                queued: true,
                ..Default::default()
            },
            Reach {
                moves: true,
                ..Default::default()
            },
            Reach {
                inter_pod: true,
                ..Default::default()
            },
            Reach {
                claims: true,
                ..Default::default()
            },
        ] {
            assert!(reach.anywhere(), "{reach:?}");
        }
    }
}
