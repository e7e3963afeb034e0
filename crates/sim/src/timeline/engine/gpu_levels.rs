//! What running pods hold on each GPU, per node and priority: what core's wake rule
//! ([`gpuplace_core::wake`]) needs to know of a node pods left (a whole GPU is free for a
//! pod only where no pod of its priority or higher keeps a share of it).

use gpuplace_core::wake::Below;

use super::evictable::ByPriority;

/// Per node, per priority (a short list: few levels), the milli held on each GPU.
#[derive(Debug, Default)]
pub(super) struct GpuLevels {
    nodes: Vec<Vec<(i32, Vec<u32>)>>,
}

impl GpuLevels {
    pub(super) fn new(nodes: usize) -> GpuLevels {
        GpuLevels {
            nodes: vec![Vec::new(); nodes],
        }
    }

    /// A pod of `priority` holding `gpus` (position, milli) started on `node`.
    pub(super) fn started(&mut self, node: usize, priority: i32, gpus: &[(usize, u32)]) {
        let Some(levels) = self.nodes.get_mut(node) else {
            return;
        };
        let at = match levels.iter().position(|(p, _)| *p == priority) {
            Some(at) => at,
            None => {
                levels.push((priority, Vec::new()));
                levels.len() - 1
            }
        };
        let held = &mut levels[at].1;
        for &(g, milli) in gpus {
            if held.len() <= g {
                held.resize(g + 1, 0);
            }
            held[g] += milli;
        }
    }

    /// A pod that [`Self::started`] so left.
    pub(super) fn left(&mut self, node: usize, priority: i32, gpus: &[(usize, u32)]) {
        let Some((_, held)) = self
            .nodes
            .get_mut(node)
            .and_then(|l| l.iter_mut().find(|(p, _)| *p == priority))
        else {
            return;
        };
        for &(g, milli) in gpus {
            if let Some(h) = held.get_mut(g) {
                *h = h.saturating_sub(milli);
            }
        }
    }

    /// What running pods below `priority` hold on node `n` (with their amounts from
    /// `tallies`).
    pub(super) fn below(&self, tallies: &ByPriority, n: usize, priority: i32) -> Below {
        let mut gpu_milli: Vec<u32> = Vec::new();
        for (_, held) in self.nodes[n].iter().filter(|(p, _)| *p < priority) {
            if gpu_milli.len() < held.len() {
                gpu_milli.resize(held.len(), 0);
            }
            for (b, h) in gpu_milli.iter_mut().zip(held) {
                *b += h;
            }
        }
        Below {
            amounts: tallies.below(n, priority),
            gpu_milli,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_counts_lower_priorities_per_gpu() {
        let mut levels = GpuLevels::new(2);
        levels.started(0, 1, &[(0, 300), (1, 1000)]);
        levels.started(0, 5, &[(0, 200)]);
        levels.started(1, 5, &[(3, 1000)]);
        let tallies = ByPriority::new(2);
        assert_eq!(levels.below(&tallies, 0, 9).gpu_milli, vec![500, 1000]);
        assert_eq!(levels.below(&tallies, 0, 2).gpu_milli, vec![300, 1000]);
        levels.left(0, 1, &[(0, 300), (1, 1000)]);
        assert_eq!(levels.below(&tallies, 0, 2).gpu_milli, vec![0, 0]);
        assert_eq!(levels.below(&tallies, 1, 5).gpu_milli, Vec::<u32>::new());
    }
}
