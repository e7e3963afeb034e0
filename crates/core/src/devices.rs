//! Which GPUs of the chosen node a request gets: the policy's GPU for a share, the best
//! linked set for whole GPUs, within the pod's requirements; and the score tier of nodes
//! that can meet a topology preference.

use gpuplace_model::{GpuTopology, Request};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::policy::Policy;
use crate::state::{ClusterState, NodeState};
use crate::{require, topology};

/// The GPUs (position, milli) for `request` on node `n`; `hint` is the policy's GPU for a
/// share when it has one.
pub(crate) fn choose_gpus(
    policy: Policy,
    rng: &mut ChaCha8Rng,
    state: &ClusterState,
    n: usize,
    request: &Request,
    hint: u32,
) -> Vec<(usize, u32)> {
    choose_gpus_on(policy, rng, state, n, state.node(n), request, hint)
}

/// [`choose_gpus`] on node `n` were it in state `node`.
pub(crate) fn choose_gpus_on(
    policy: Policy,
    rng: &mut ChaCha8Rng,
    state: &ClusterState,
    n: usize,
    node: &NodeState,
    request: &Request,
    hint: u32,
) -> Vec<(usize, u32)> {
    let request = &*state.effective(n, request);
    if request.gpu_count == 0 {
        return Vec::new();
    }
    if policy == Policy::KubeDra {
        return allocator_gpus(state, n, node, request);
    }
    let need = &request.need;
    if request.is_fractional() {
        let mut g = match policy {
            Policy::Fgd | Policy::Gpuplace(_) => hint as usize,
            Policy::Random | Policy::KubeDefault => {
                let fitting: Vec<usize> = (0..node.gpu_free.len())
                    .filter(|&g| node.gpu_free[g] >= request.gpu_milli)
                    .collect();
                fitting[rng.random_range(0..fitting.len())]
            }
            Policy::WorstFit | Policy::Spread => most_free_fitting(node, request.gpu_milli),
            _ => least_free_fitting(node, request.gpu_milli),
        };
        if !need.is_empty() {
            // A GPU the requirements rule out is replaced by the fullest one they allow.
            let usable = state.usable_gpus_on(n, node, request);
            if !usable.contains(&g)
                && let Some(&u) = usable.iter().min_by_key(|&&u| (node.gpu_free[u], u))
            {
                g = u;
            }
        }
        return vec![(g, request.gpu_milli)];
    }
    let available = state.usable_gpus_on(n, node, request);
    let count = request.gpu_count as usize;
    if policy == Policy::KubeDefault {
        let picked = crate::policy::kube_default::whole_gpus(rng, &available, count);
        return picked.into_iter().map(|g| (g, request.gpu_milli)).collect();
    }
    let (links, rules) = (state.links(n), state.pair_rules(n));
    let set = match (need.topology, need.prefer) {
        (GpuTopology::Any, GpuTopology::Any) => topology::select(links, &available, &[], count),
        (GpuTopology::Any, preferred) => {
            require::select(links, rules, preferred, &available, count)
                .or_else(|| topology::select(links, &available, &[], count))
        }
        (required, _) => require::select(links, rules, required, &available, count),
    };
    set.map(|s| {
        s.positions
            .into_iter()
            .map(|g| (g, request.gpu_milli))
            .collect()
    })
    .unwrap_or_default()
}

/// `kube-dra`'s GPUs for `request` on node `n` in state `node`: kube-scheduler's allocator
/// takes the first matching devices with room, in the slice's order, and for a required
/// topology (a `matchAttribute` constraint) the first set in that order that meets it.
fn allocator_gpus(
    state: &ClusterState,
    n: usize,
    node: &NodeState,
    request: &Request,
) -> Vec<(usize, u32)> {
    let usable = state.usable_gpus_on(n, node, request);
    let count = request.gpu_count as usize;
    let picked = match request.need.topology {
        GpuTopology::Any => crate::policy::kube_default::first_devices(&usable, count),
        required => require::first_set(
            state.links(n),
            state.pair_rules(n),
            required,
            &usable,
            count,
        )
        .unwrap_or_default(),
    };
    picked.into_iter().map(|g| (g, request.gpu_milli)).collect()
}

/// Nodes that can give a multi-GPU request its preferred topology rank above every node
/// that cannot (a tier on top of the policy's score).
pub(crate) fn preference_bonus(state: &ClusterState, n: usize, request: &Request) -> i64 {
    let need = &request.need;
    if need.prefer == GpuTopology::Any || need.topology != GpuTopology::Any || request.gpu_count < 2
    {
        return 0;
    }
    let usable = state.usable_gpus(n, request);
    if require::exists(
        state.links(n),
        state.pair_rules(n),
        need.prefer,
        &usable,
        request.gpu_count as usize,
    ) {
        PREFERENCE_TIER
    } else {
        0
    }
}

/// Above any policy's own score range.
const PREFERENCE_TIER: i64 = 1 << 40;

pub(crate) fn first_fitting(node: &NodeState, milli: u32) -> usize {
    node.gpu_free.iter().position(|&f| f >= milli).unwrap_or(0)
}

/// The fitting GPU with the least free milli (lowest index on ties).
fn least_free_fitting(node: &NodeState, milli: u32) -> usize {
    (0..node.gpu_free.len())
        .filter(|&g| node.gpu_free[g] >= milli)
        .min_by_key(|&g| (node.gpu_free[g], g))
        .unwrap_or(0)
}

/// The fitting GPU with the most free milli (lowest index on ties).
fn most_free_fitting(node: &NodeState, milli: u32) -> usize {
    (0..node.gpu_free.len())
        .filter(|&g| node.gpu_free[g] >= milli)
        .min_by_key(|&g| (std::cmp::Reverse(node.gpu_free[g]), g))
        .unwrap_or(0)
}
