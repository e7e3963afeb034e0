//! GPU sets that meet a topology requirement: every pair NVLink-linked, behind one PCIe
//! switch, or on one NUMA node. Among the sets that qualify, the same objective as
//! [`topology::select`]: largest internal pair score, then the smallest cut to the free
//! GPUs left behind, then the lowest positions.

use gpuplace_model::{GpuTopology, NodeInventory};

use crate::topology::{self, DeviceSet, LinkMatrix};

/// What decides whether two GPUs of one node may share a container under a requirement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairRules {
    /// NUMA node per GPU position; `None` where unknown. A node that reports no NUMA node
    /// for any GPU is one NUMA domain (a single-socket machine).
    numa: Vec<Option<u32>>,
}

impl PairRules {
    pub fn from_inventory(node: &NodeInventory) -> PairRules {
        let unknown = node.gpus.iter().all(|g| g.numa_node.is_none());
        PairRules {
            numa: node
                .gpus
                .iter()
                .map(|g| if unknown { Some(0) } else { g.numa_node })
                .collect(),
        }
    }

    /// Whether positions `a` and `b` may be in one set under `topology`.
    pub fn compatible(
        &self,
        links: &LinkMatrix,
        topology: GpuTopology,
        a: usize,
        b: usize,
    ) -> bool {
        match topology {
            GpuTopology::Any => true,
            GpuTopology::Nvlink => links.pair(a, b) >= 100,
            GpuTopology::PcieSwitch => links.pair(a, b) % 100 >= 50,
            GpuTopology::Numa => {
                let na = self.numa.get(a).copied().flatten();
                na.is_some() && na == self.numa.get(b).copied().flatten()
            }
        }
    }
}

/// Whether every pair of `set` meets `topology`.
pub fn meets(links: &LinkMatrix, rules: &PairRules, topology: GpuTopology, set: &[usize]) -> bool {
    set.iter().enumerate().all(|(i, &a)| {
        set[i + 1..]
            .iter()
            .all(|&b| rules.compatible(links, topology, a, b))
    })
}

/// The best set of `size` positions from `available` meeting `topology`; `None` when no
/// such set exists.
pub fn select(
    links: &LinkMatrix,
    rules: &PairRules,
    topology: GpuTopology,
    available: &[usize],
    size: usize,
) -> Option<DeviceSet> {
    let mut pool = available.to_vec();
    pool.sort_unstable();
    pool.dedup();
    if pool.len() < size {
        return None;
    }
    if size <= 1 || topology == GpuTopology::Any || meets(links, rules, topology, &pool) {
        // Every set qualifies: the unconstrained exact search.
        return topology::select(links, &pool, &[], size);
    }
    let mut search = Search {
        links,
        rules,
        topology,
        pool: &pool,
        size,
        picks: Vec::with_capacity(size),
        best: None,
    };
    search.run(0);
    search
        .best
        .map(|(score, _, positions)| DeviceSet { positions, score })
}

/// The first set of `size` positions from `available` meeting `topology`, in
/// lexicographic order of positions: what an allocator that walks the devices in order and
/// backtracks takes (kube-scheduler's, for a `matchAttribute` constraint); `None` when no
/// such set exists.
pub fn first_set(
    links: &LinkMatrix,
    rules: &PairRules,
    topology: GpuTopology,
    available: &[usize],
    size: usize,
) -> Option<Vec<usize>> {
    let mut pool = available.to_vec();
    pool.sort_unstable();
    pool.dedup();
    if pool.len() < size {
        return None;
    }
    let mut picks = Vec::with_capacity(size);
    first(links, rules, topology, &pool, size, 0, &mut picks).then_some(picks)
}

/// Whether some set of `size` positions from `available` meets `topology` (stops at the
/// first one found).
pub fn exists(
    links: &LinkMatrix,
    rules: &PairRules,
    topology: GpuTopology,
    available: &[usize],
    size: usize,
) -> bool {
    if available.len() < size {
        return false;
    }
    if size <= 1 || topology == GpuTopology::Any {
        return true;
    }
    let mut picks = Vec::with_capacity(size);
    first(links, rules, topology, available, size, 0, &mut picks)
}

fn first(
    links: &LinkMatrix,
    rules: &PairRules,
    topology: GpuTopology,
    pool: &[usize],
    size: usize,
    start: usize,
    picks: &mut Vec<usize>,
) -> bool {
    if picks.len() == size {
        return true;
    }
    for i in start..pool.len() {
        if pool.len() - i < size - picks.len() {
            return false;
        }
        let c = pool[i];
        if picks
            .iter()
            .all(|&p| rules.compatible(links, topology, p, c))
        {
            picks.push(c);
            if first(links, rules, topology, pool, size, i + 1, picks) {
                return true;
            }
            picks.pop();
        }
    }
    false
}

/// Every qualifying set, enumerated in lexicographic order with the compatibility of each
/// new member checked against the members so far (exact, as brute force).
struct Search<'a> {
    links: &'a LinkMatrix,
    rules: &'a PairRules,
    topology: GpuTopology,
    pool: &'a [usize],
    size: usize,
    picks: Vec<usize>,
    /// (internal score, cut to the rest of the pool, positions).
    best: Option<(u64, u64, Vec<usize>)>,
}

impl Search<'_> {
    fn run(&mut self, start: usize) {
        if self.picks.len() == self.size {
            let score = self.links.set_score(&self.picks);
            let cut: u64 = self
                .picks
                .iter()
                .flat_map(|&a| {
                    self.pool
                        .iter()
                        .filter(|b| !self.picks.contains(b))
                        .map(move |&b| (a, b))
                })
                .map(|(a, b)| u64::from(self.links.pair(a, b)))
                .sum();
            let better = match &self.best {
                None => true,
                Some((s, c, _)) => score > *s || (score == *s && cut < *c),
            };
            if better {
                self.best = Some((score, cut, self.picks.clone()));
            }
            return;
        }
        for i in start..self.pool.len() {
            if self.pool.len() - i < self.size - self.picks.len() {
                return;
            }
            let c = self.pool[i];
            if self
                .picks
                .iter()
                .all(|&p| self.rules.compatible(self.links, self.topology, p, c))
            {
                self.picks.push(c);
                self.run(i + 1);
                self.picks.pop();
            }
        }
    }
}
