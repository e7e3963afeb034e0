//! Which parked pods a departure wakes: the one rule the scheduler's queue and the
//! timeline both follow (gpuplace's discipline; kube-scheduler's twin wakes every parked
//! pod at any event, as v1.26 does).
//!
//! A pod parks when an attempt found no place, no victims and no moves for it. Until the
//! cluster changes it would fail the same way, so the drivers wake it only when a pod
//! leaves a node where it could start afterwards: where what is free, with what running
//! pods below its priority hold (evictions could free it), covers its request, per GPU
//! too, on a GPU model it allows. What pods of its priority or higher, pods already
//! leaving and nominees hold is out of its reach. That bound is necessary, not
//! sufficient: a pod it wakes may still fail. Since the pod's last attempt, a node no pod
//! left only filled up (or had room taken by higher priorities), so the nodes pods left
//! are the only ones to look at.
//!
//! The bound reads one node, so what a pod waits for elsewhere is not covered: such a
//! pod wakes at every departure ([`Reach::anywhere`]).

use gpuplace_model::Request;

use crate::preempt::{Amounts, amounts_of, free_amounts, refuses_model};
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

/// What running pods below a waiting pod's priority hold on one node (not leaving):
/// evicting them could free it for the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Below {
    /// GPU milli, CPU milli and memory MiB in all.
    pub amounts: Amounts,
    /// Milli per GPU, by the GPU's position on the node (shorter: the rest hold none).
    pub gpu_milli: Vec<u32>,
}

impl Below {
    /// Counts a pod that asks `request` and holds `gpus` (position, milli).
    pub fn add(&mut self, request: &Request, gpus: &[(usize, u32)]) {
        for (b, a) in self.amounts.iter_mut().zip(amounts_of(request)) {
            *b += a;
        }
        for &(g, milli) in gpus {
            if self.gpu_milli.len() <= g {
                self.gpu_milli.resize(g + 1, 0);
            }
            self.gpu_milli[g] += milli;
        }
    }
}

/// How many pods asking `request`, at some priority, could start on node `n` as the state
/// stands (what left is free; what leaving pods and nominees hold is not), evicting what
/// pods below that priority hold there (`below`): none where the node's GPU model is not
/// allowed; else as many as its free GPU milli, CPU and memory with `below` cover, and as
/// its GPUs' room (free with `below`) holds the request's milli per GPU (a whole GPU: all
/// of it). An upper bound, not a promise. Unbounded where GPUs are time-sliced (a
/// request takes another share per node there, so its amounts bound nothing).
pub fn slots_on(state: &ClusterState, n: usize, below: &Below, request: &Request) -> usize {
    if state.any_time_sliced() {
        return usize::MAX;
    }
    if refuses_model(state, n, request) {
        return 0;
    }
    let s = state.node(n);
    let free = free_amounts(state, n);
    let need = amounts_of(request);
    let mut slots = usize::MAX;
    for d in 0..3 {
        if let Some(fit) = (free[d] + below.amounts[d]).checked_div(need[d]) {
            slots = slots.min(usize::try_from(fit).unwrap_or(usize::MAX));
        }
    }
    if request.gpu_count == 0 || request.gpu_milli == 0 {
        return slots;
    }
    let below_on = |g: usize| below.gpu_milli.get(g).copied().unwrap_or(0);
    let per_gpu: u32 = s
        .gpu_free
        .iter()
        .enumerate()
        .map(|(g, &f)| (f + below_on(g)) / request.gpu_milli)
        .sum();
    slots.min((per_gpu / request.gpu_count) as usize)
}

/// Whether one pod asking `request` could start on node `n` ([`slots_on`]).
pub fn may_start_on(state: &ClusterState, n: usize, below: &Below, request: &Request) -> bool {
    slots_on(state, n, below, request) > 0
}

/// How many pods asking `request` the departures from `left` (nodes, repeats allowed)
/// could let start: [`slots_on`] summed over those nodes (`below(n)`: what running pods
/// below their priority hold on node `n`). Since such a pod's last attempt, a node no
/// pod left only filled up, so no more of them can start; the drivers wake that many
/// of the waiting pods of the request and priority, first in queue order.
pub fn slots(
    state: &ClusterState,
    left: &[usize],
    mut below: impl FnMut(usize) -> Below,
    request: &Request,
) -> usize {
    let mut nodes: Vec<usize> = left.iter().copied().filter(|&n| n < state.len()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|n| slots_on(state, n, &below(n), request))
        .fold(0, usize::saturating_add)
}

/// Whether a pod leaving any of `left` could let one pod asking `request` start
/// ([`slots`]).
pub fn helped_by(
    state: &ClusterState,
    left: &[usize],
    below: impl FnMut(usize) -> Below,
    request: &Request,
) -> bool {
    slots(state, left, below, request) > 0
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

    fn below(amounts: Amounts, gpu_milli: &[u32]) -> Below {
        Below {
            amounts,
            gpu_milli: gpu_milli.to_vec(),
        }
    }

    /// Node a (8 A100) with `milli` taken on each GPU.
    fn taken(milli: u32) -> ClusterState {
        let mut s = state();
        let mut share = gpus(1, None);
        share.gpu_milli = milli;
        for g in 0..8 {
            s.apply(0, &share, &[(g, milli)]).expect("fits");
        }
        s
    }

    #[test]
    fn room_is_what_is_free_with_what_lower_priorities_hold() {
        let s = state();
        let none = Below::default();
        assert!(may_start_on(&s, 0, &none, &gpus(8, None)));
        assert!(!may_start_on(&s, 1, &none, &gpus(8, None)));
        let full = taken(1000);
        assert!(!may_start_on(&full, 0, &none, &gpus(1, None)));
        let four = below([4_000, 4_000, 4_096], &[1000, 1000, 1000, 1000]);
        assert!(may_start_on(&full, 0, &four, &gpus(4, None)));
        assert!(!may_start_on(&full, 0, &four, &gpus(5, None)));
    }

    #[test]
    fn a_share_kept_on_every_gpu_leaves_no_whole_gpu() {
        let peppered = taken(100);
        let none = Below::default();
        assert!(!may_start_on(&peppered, 0, &none, &gpus(1, None)));
        let mut share = gpus(1, None);
        share.gpu_milli = 900;
        assert!(may_start_on(&peppered, 0, &none, &share));
        share.gpu_milli = 901;
        assert!(!may_start_on(&peppered, 0, &none, &share));
        let one = below([100, 1_000, 1_024], &[100]);
        assert!(may_start_on(&peppered, 0, &one, &gpus(1, None)));
        share.gpu_milli = 460;
        assert_eq!(slots_on(&peppered, 0, &none, &share), 8, "one per GPU");
        share.gpu_milli = 400;
        assert_eq!(slots_on(&peppered, 0, &none, &share), 16, "two per GPU");
        share.cpu_milli = 10_000;
        assert_eq!(slots_on(&peppered, 0, &none, &share), 2, "CPU for two");
    }

    #[test]
    fn slots_add_up_over_distinct_nodes_left() {
        let s = state();
        let none = |_| Below::default();
        assert_eq!(slots(&s, &[0, 0, 1], none, &gpus(2, None)), 4 + 2);
        assert_eq!(slots(&s, &[1], none, &gpus(8, None)), 0);
    }

    #[test]
    fn a_model_the_pod_refuses_never_helps() {
        let s = state();
        let none = |_| Below::default();
        assert!(!may_start_on(
            &s,
            1,
            &Below::default(),
            &gpus(1, Some("A100"))
        ));
        assert!(helped_by(&s, &[1, 0], none, &gpus(1, Some("A100"))));
        assert!(!helped_by(&s, &[1, 1], none, &gpus(1, Some("A100"))));
        assert!(!helped_by(&s, &[7], none, &gpus(1, None)), "no such node");
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
