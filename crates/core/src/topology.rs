//! Choosing which GPUs of a node a multi-GPU request gets.
//!
//! Objective, in order: (1) the largest sum of pair scores inside the set (NVIDIA's
//! objective: PCIe level 10..60 plus 100 per NVLink link); (2) the smallest sum of pair
//! scores between the set and the free GPUs left behind, so a one-GPU pick or an odd
//! request does not break up a well-connected pair needlessly; (3) the lowest indexes.
//! The search is exact: combinations are enumerated with pruning on the best achievable
//! internal score, which is fast for the 16 GPUs of the largest boxes.

use gpuplace_model::NodeInventory;

/// Pair scores between a node's GPUs, by position in the inventory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkMatrix {
    n: usize,
    score: Vec<u32>,
    any: bool,
}

impl LinkMatrix {
    /// Scores from the inventory's links (pairs without a link score 0).
    pub fn from_inventory(node: &NodeInventory) -> Self {
        let n = node.gpus.len();
        let mut score = vec![0; n * n];
        let position = |index: u32| node.gpus.iter().position(|g| g.index == index);
        let mut any = false;
        for link in &node.links {
            if let (Some(a), Some(b)) = (position(link.a), position(link.b)) {
                score[a * n + b] = link.score();
                score[b * n + a] = link.score();
                any |= link.score() > 0;
            }
        }
        LinkMatrix { n, score, any }
    }

    /// Pair score between positions `a` and `b`.
    pub fn pair(&self, a: usize, b: usize) -> u32 {
        self.score[a * self.n + b]
    }

    /// Whether any pair has a non-zero score.
    pub fn has_topology(&self) -> bool {
        self.any
    }

    /// Sum of pair scores inside `set`.
    pub fn set_score(&self, set: &[usize]) -> u64 {
        let mut total = 0u64;
        for (i, &a) in set.iter().enumerate() {
            for &b in &set[i + 1..] {
                total += u64::from(self.pair(a, b));
            }
        }
        total
    }
}

/// The chosen positions and their internal score.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSet {
    pub positions: Vec<usize>,
    pub score: u64,
}

/// Above this many optional candidates the exact search gives way to a greedy one.
const EXACT_LIMIT: usize = 20;

/// Picks `size` positions from `available` that include all of `must`.
/// Returns `None` when `size` is smaller than `must`, or not enough GPUs are available.
pub fn select(
    links: &LinkMatrix,
    available: &[usize],
    must: &[usize],
    size: usize,
) -> Option<DeviceSet> {
    if must.len() > size {
        return None;
    }
    let mut optional: Vec<usize> = available
        .iter()
        .copied()
        .filter(|p| !must.contains(p))
        .collect();
    optional.sort_unstable();
    optional.dedup();
    let wanted = size - must.len();
    if optional.len() < wanted {
        return None;
    }
    let mut base: Vec<usize> = must.to_vec();
    base.sort_unstable();
    if !links.has_topology() || wanted == 0 {
        let mut positions = base;
        positions.extend_from_slice(&optional[..wanted]);
        positions.sort_unstable();
        let score = links.set_score(&positions);
        return Some(DeviceSet { positions, score });
    }
    let pool: Vec<usize> = base.iter().chain(&optional).copied().collect();
    let chosen = if optional.len() <= EXACT_LIMIT {
        exact(links, &base, &optional, wanted, &pool)
    } else {
        greedy(links, &base, &optional, wanted, &pool)
    };
    let mut positions = chosen;
    positions.sort_unstable();
    let score = links.set_score(&positions);
    Some(DeviceSet { positions, score })
}

/// Exhaustive search over combinations in lexicographic order, pruned by an upper bound.
struct Search<'a> {
    links: &'a LinkMatrix,
    optional: &'a [usize],
    wanted: usize,
    /// Sum of pair scores from each optional candidate to the rest of the pool.
    degree: Vec<u64>,
    /// `top[i][k]`: sum of the k largest best-pair scores among candidates `i..`.
    top: Vec<Vec<u64>>,
    /// Largest set size minus one: the most pairs one pick can join.
    fan: u64,
    current: Vec<usize>,
    base_len: usize,
    /// Best (internal score, relative cut, positions) so far.
    best: Option<(u64, i64, Vec<usize>)>,
}

impl Search<'_> {
    /// `inner`: pair scores among the picks; `cross`: between picks and the base.
    fn run(&mut self, start: usize, picked: usize, inner: u64, cross: u64, degree: u64) {
        if picked == self.wanted {
            let score = inner + cross;
            // Cut to the free GPUs left behind, less a constant shared by every candidate:
            // picks to unpicked optionals (degree - 2 inner) plus base to unpicked optionals
            // (constant - cross).
            let cut = degree as i64 - 2 * inner as i64 - cross as i64;
            let better = match &self.best {
                None => true,
                Some((s, c, _)) => score > *s || (score == *s && cut < *c),
            };
            if better {
                self.best = Some((score, cut, self.current.clone()));
            }
            return;
        }
        let left = self.wanted - picked;
        for i in start..self.optional.len() {
            if self.optional.len() - i < left {
                break;
            }
            if let Some((best, _, _)) = &self.best
                && inner + cross + self.top[i][left] * self.fan < *best
            {
                return;
            }
            let candidate = self.optional[i];
            let pair = |m: &usize| u64::from(self.links.pair(*m, candidate));
            let with_base: u64 = self.current[..self.base_len].iter().map(pair).sum();
            let with_picks: u64 = self.current[self.base_len..].iter().map(pair).sum();
            self.current.push(candidate);
            self.run(
                i + 1,
                picked + 1,
                inner + with_picks,
                cross + with_base,
                degree + self.degree[i],
            );
            self.current.pop();
        }
    }
}

fn exact(
    links: &LinkMatrix,
    base: &[usize],
    optional: &[usize],
    wanted: usize,
    pool: &[usize],
) -> Vec<usize> {
    let best_pair: Vec<u64> = optional
        .iter()
        .map(|&a| {
            pool.iter()
                .filter(|&&b| b != a)
                .map(|&b| u64::from(links.pair(a, b)))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let degree = optional
        .iter()
        .map(|&a| {
            pool.iter()
                .filter(|&&b| b != a && !base.contains(&b))
                .map(|&b| u64::from(links.pair(a, b)))
                .sum()
        })
        .collect();
    let top = (0..=optional.len())
        .map(|i| {
            let mut rest = best_pair[i..].to_vec();
            rest.sort_unstable_by(|a, b| b.cmp(a));
            let mut sums = vec![0u64; wanted + 1];
            for k in 1..=wanted {
                sums[k] = sums[k - 1] + rest.get(k - 1).copied().unwrap_or(0);
            }
            sums
        })
        .collect();
    // The base's own pairs are shared by every candidate set; search on the added part.
    let mut search = Search {
        links,
        optional,
        wanted,
        degree,
        top,
        fan: (base.len() + wanted).saturating_sub(1) as u64,
        current: base.to_vec(),
        base_len: base.len(),
        best: None,
    };
    search.run(0, 0, 0, 0, 0);
    search
        .best
        .map(|(_, _, set)| set)
        .unwrap_or_else(|| base.to_vec())
}

fn greedy(
    links: &LinkMatrix,
    base: &[usize],
    optional: &[usize],
    wanted: usize,
    pool: &[usize],
) -> Vec<usize> {
    let mut set = base.to_vec();
    let mut left: Vec<usize> = optional.to_vec();
    for _ in 0..wanted {
        let pick = left
            .iter()
            .enumerate()
            .max_by_key(|&(_, &c)| {
                let gain: u64 = set.iter().map(|&m| u64::from(links.pair(m, c))).sum();
                let loss: u64 = pool
                    .iter()
                    .filter(|&&o| o != c && !set.contains(&o))
                    .map(|&o| u64::from(links.pair(c, o)))
                    .sum();
                (gain, std::cmp::Reverse(loss), std::cmp::Reverse(c))
            })
            .map(|(i, _)| i);
        match pick {
            Some(i) => set.push(left.remove(i)),
            None => break,
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::{Link, PcieLevel};

    /// Four GPUs: 0-1 and 2-3 NVLinked pairs; everything else across CPUs.
    fn two_pairs() -> LinkMatrix {
        let mut node = NodeInventory::uniform("n", 1, 1, 4, "A100");
        for a in 0..4u32 {
            for b in a + 1..4 {
                let paired = (a, b) == (0, 1) || (a, b) == (2, 3);
                node.links.push(Link {
                    a,
                    b,
                    nvlinks: if paired { 4 } else { 0 },
                    pcie: PcieLevel::CrossCpu,
                });
            }
        }
        LinkMatrix::from_inventory(&node)
    }

    #[test]
    fn pairs_stay_together() {
        let links = two_pairs();
        let set = select(&links, &[0, 1, 2, 3], &[], 2).unwrap();
        assert_eq!(set.positions, vec![0, 1]);
        assert_eq!(set.score, 410);
        // With 0 gone, a pair request takes the intact pair 2-3.
        let set = select(&links, &[1, 2, 3], &[], 2).unwrap();
        assert_eq!(set.positions, vec![2, 3]);
    }

    #[test]
    fn single_gpu_does_not_break_a_pair() {
        let links = two_pairs();
        // 1 is alone (its partner 0 is taken): picking it keeps the 2-3 pair whole.
        let set = select(&links, &[1, 2, 3], &[], 1).unwrap();
        assert_eq!(set.positions, vec![1]);
    }

    #[test]
    fn must_include_is_honoured() {
        let links = two_pairs();
        let set = select(&links, &[0, 1, 2, 3], &[2], 2).unwrap();
        assert_eq!(set.positions, vec![2, 3]);
        assert!(select(&links, &[0, 1], &[2, 3, 0], 2).is_none());
        assert!(select(&links, &[0], &[], 2).is_none());
    }

    #[test]
    fn no_topology_takes_lowest_indexes() {
        let node = NodeInventory::uniform("n", 1, 1, 8, "T4");
        let links = LinkMatrix::from_inventory(&node);
        let set = select(&links, &[7, 3, 5, 1], &[], 2).unwrap();
        assert_eq!(set.positions, vec![1, 3]);
    }
}
