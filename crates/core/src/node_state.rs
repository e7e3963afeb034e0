//! What is free on one node (the state of each node of a [`crate::ClusterState`]).

/// Dynamic state of one node (the default: nothing free, no GPUs; a scratch buffer).
#[derive(Clone, Debug, Default)]
pub struct NodeState {
    pub cpu_free: u64,
    pub memory_free: u64,
    /// Free milli per GPU, by position in the inventory's `gpus`.
    pub gpu_free: Vec<u32>,
    /// Usable milli per GPU: the GPU's capacity, or 0 while it is unhealthy.
    pub gpu_capacity: Vec<u32>,
    /// Bumped on every change, so caches keyed by it stay exact.
    pub version: u64,
    /// GPU pod classes on the node and their counts (0 = fractional, k = k whole GPUs).
    pub classes: Vec<(u32, u32)>,
    /// Fragmentation of this node under the bound target workload (milli-GPU).
    pub frag: f64,
}

impl NodeState {
    /// Total free milli-GPU on healthy GPUs.
    pub fn gpu_idle(&self) -> u64 {
        self.gpu_free.iter().map(|&m| u64::from(m)).sum()
    }

    /// GPUs whose whole capacity is free.
    pub fn fully_free_gpus(&self) -> usize {
        self.gpu_free
            .iter()
            .zip(&self.gpu_capacity)
            .filter(|(f, c)| **c > 0 && f == c)
            .count()
    }
}
