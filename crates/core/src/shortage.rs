//! Why a GPU request that fits nowhere does not, in GPUs: the cluster has too few GPUs free
//! for it (capacity), or enough in total but on every node too few (fragmentation), with
//! the sizes of the blocks. Pure: read from the state, over the nodes the pod may use.

use gpuplace_model::{GpuTopology, Request};

use crate::state::ClusterState;

/// Why the GPUs a request asks for are not on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shortage {
    /// Fewer GPUs with room for it free on the `allowed` nodes it may use than it asks.
    Capacity {
        free: u32,
        asked: u32,
        allowed: usize,
    },
    /// Enough free in total, but no node has as many.
    Fragmentation {
        free: u32,
        asked: u32,
        /// Nodes with at least one such GPU free, of the `allowed` it may use.
        nodes: usize,
        allowed: usize,
        /// The most on one node (linked as the request's topology asks), and that node
        /// (the first of equals).
        largest: u32,
        largest_node: usize,
        /// How the request's GPUs must be linked (a block counts only GPUs so linked).
        topology: GpuTopology,
    },
}

/// The GPU shortage behind a request that fits nowhere, over the nodes `allowed` lets it
/// use (`None`: every node): counted are the healthy GPUs of a model it accepts with room
/// for it (a whole GPU free; for a share, its milli free). `None` when it asks for no GPU
/// or some node has enough such GPUs (then something else stops it: CPU, memory, topology),
/// or it may use no node at all (its filters, not GPUs, stop it).
pub fn shortage(
    state: &ClusterState,
    request: &Request,
    allowed: Option<&[bool]>,
) -> Option<Shortage> {
    let asked = request.gpu_count;
    if asked == 0 {
        return None;
    }
    let (mut free, mut nodes, mut largest, mut largest_node) = (0u32, 0usize, 0u32, 0usize);
    let mut may_use = 0usize;
    for n in 0..state.len() {
        if allowed.is_some_and(|a| !a.get(n).copied().unwrap_or(false)) {
            continue;
        }
        may_use += 1;
        let here = usable(state, n, request);
        if here.is_empty() {
            continue;
        }
        free += here.len() as u32;
        nodes += 1;
        let block = block(state, n, request, &here);
        if block > largest {
            (largest, largest_node) = (block, n);
        }
    }
    if largest >= asked || may_use == 0 {
        None
    } else if free < asked {
        Some(Shortage::Capacity {
            free,
            asked,
            allowed: may_use,
        })
    } else {
        Some(Shortage::Fragmentation {
            free,
            asked,
            nodes,
            allowed: may_use,
            largest,
            largest_node,
            topology: request.need.topology,
        })
    }
}

/// Positions of node `n`'s GPUs that could take one of `request`'s GPUs now.
fn usable(state: &ClusterState, n: usize, request: &Request) -> Vec<usize> {
    let node = state.node(n);
    let gpus = &state.inventory(n).gpus;
    let whole = request.gpu_milli >= 1000;
    node.gpu_free
        .iter()
        .zip(&node.gpu_capacity)
        .zip(gpus)
        .enumerate()
        .filter(|(_, ((free, cap), gpu))| {
            **cap > 0
                && request.allows_model(&gpu.model)
                && if whole {
                    *free == *cap
                } else {
                    **free >= request.gpu_milli
                }
        })
        .map(|(p, _)| p)
        .collect()
}

/// The most of `usable` (positions on node `n`) one container of `request` could take
/// together: all of them, or with a topology, the largest set (up to what it asks) whose
/// GPUs are so linked.
fn block(state: &ClusterState, n: usize, request: &Request, usable: &[usize]) -> u32 {
    let topology = request.need.topology;
    let most = usable.len().min(request.gpu_count as usize);
    if topology == GpuTopology::Any || most <= 1 {
        return usable.len() as u32;
    }
    let (links, rules) = (state.links(n), state.pair_rules(n));
    (1..=most)
        .rev()
        .find(|&k| crate::require::exists(links, rules, topology, usable, k))
        .unwrap_or(1) as u32
}

impl Shortage {
    /// The sentence for a pod's message; node `largest_node` named by `name_of`.
    pub fn sentence(&self, name_of: impl Fn(usize) -> String) -> String {
        match self {
            Shortage::Capacity {
                free,
                asked,
                allowed,
            } => format!(
                "Capacity: {free} GPU(s) with room for it free on the {allowed} node(s) it may use, {asked} asked."
            ),
            Shortage::Fragmentation {
                free,
                asked,
                nodes,
                allowed,
                largest,
                largest_node,
                topology,
            } => {
                let linked = match topology {
                    GpuTopology::Any => String::new(),
                    GpuTopology::Nvlink => " linked by NVLink".into(),
                    GpuTopology::PcieSwitch => " behind one PCIe switch".into(),
                    GpuTopology::Numa => " on one NUMA node".into(),
                };
                format!(
                    "Fragmentation: {free} GPU(s) with room for it free across {nodes} of the {allowed} node(s) it may use, {asked} asked on one node{linked}; the largest block is {largest} on node {}.",
                    name_of(*largest_node)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::NodeInventory;

    fn gpus(count: u32, milli: u32) -> Request {
        Request {
            cpu_milli: 100,
            memory_mib: 0,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: vec![],
            need: Default::default(),
        }
    }

    fn cluster() -> ClusterState {
        let mut s = ClusterState::new(vec![
            NodeInventory::uniform("a", 64_000, 1024, 4, "A100"),
            NodeInventory::uniform("b", 64_000, 1024, 4, "A100"),
            NodeInventory::uniform("c", 64_000, 1024, 4, "T4"),
        ])
        .unwrap();
        // a: 2 whole free (one GPU half used, one used); b: 3 free; c: 1 free.
        s.apply(0, &gpus(1, 500), &[(0, 500)]).unwrap();
        s.apply(0, &gpus(1, 1000), &[(1, 1000)]).unwrap();
        s.apply(1, &gpus(1, 1000), &[(0, 1000)]).unwrap();
        s.apply(2, &gpus(3, 1000), &[(0, 1000), (1, 1000), (2, 1000)])
            .unwrap();
        s
    }

    #[test]
    fn enough_in_total_but_not_on_one_node_is_fragmentation_with_the_largest_block() {
        let s = cluster();
        let f = shortage(&s, &gpus(4, 1000), None).unwrap();
        assert_eq!(
            f,
            Shortage::Fragmentation {
                free: 6,
                asked: 4,
                nodes: 3,
                allowed: 3,
                largest: 3,
                largest_node: 1,
                topology: GpuTopology::Any,
            }
        );
        assert!(
            f.sentence(|n| format!("n{n}"))
                .contains("the largest block is 3 on node n1")
        );
    }

    #[test]
    fn too_few_in_total_is_capacity_and_a_node_with_enough_is_no_gpu_shortage() {
        let s = cluster();
        assert_eq!(
            shortage(&s, &gpus(8, 1000), None),
            Some(Shortage::Capacity {
                free: 6,
                asked: 8,
                allowed: 3
            })
        );
        assert_eq!(shortage(&s, &gpus(3, 1000), None), None);
        assert_eq!(shortage(&s, &gpus(0, 0), None), None);
        // Only the nodes the pod may use count; so do its models.
        let only_a_and_c = [true, false, true];
        assert_eq!(
            shortage(&s, &gpus(3, 1000), Some(&only_a_and_c)),
            Some(Shortage::Fragmentation {
                free: 3,
                asked: 3,
                nodes: 2,
                allowed: 2,
                largest: 2,
                largest_node: 0,
                topology: GpuTopology::Any,
            })
        );
        let mut t4_only = gpus(2, 1000);
        t4_only.allowed_models = vec!["T4".into()];
        assert_eq!(
            shortage(&s, &t4_only, None),
            Some(Shortage::Capacity {
                free: 1,
                asked: 2,
                allowed: 3
            })
        );
        // A pod its filters keep off every node lacks no GPU.
        assert_eq!(shortage(&s, &gpus(8, 1000), Some(&[false; 3])), None);
        // A share counts GPUs with its milli free: a's half-used GPU too.
        assert_eq!(shortage(&s, &gpus(1, 500), None), None);
    }
}
