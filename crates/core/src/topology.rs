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

    /// Every pair score, row by row.
    pub fn scores(&self) -> &[u32] {
        &self.score
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
    if base.is_empty() && wanted == 1 {
        // One GPU: every choice scores 0 inside the set, so the exact search keeps the one
        // with the smallest cut to the others (the first on ties); found directly.
        let cut = |a: usize| -> u64 {
            optional
                .iter()
                .filter(|&&b| b != a)
                .map(|&b| u64::from(links.pair(a, b)))
                .sum()
        };
        let pick = optional
            .iter()
            .copied()
            .min_by_key(|&a| (cut(a), a))
            .unwrap_or_default();
        return Some(DeviceSet {
            positions: vec![pick],
            score: links.set_score(&[pick]),
        });
    }
    let pool: Vec<usize> = base.iter().chain(&optional).copied().collect();
    let chosen = if optional.len() <= EXACT_LIMIT {
        exact(links, &base, &optional, wanted)
    } else {
        greedy(links, &base, &optional, wanted, &pool)
    };
    let mut positions = chosen;
    positions.sort_unstable();
    let score = links.set_score(&positions);
    Some(DeviceSet { positions, score })
}

/// Exhaustive search over combinations in lexicographic order, pruned by an upper bound.
struct Search {
    /// Optional candidates' count.
    n: usize,
    wanted: usize,
    /// Pair scores among optional candidates, `pair[i * n + j]`.
    pair: Vec<u64>,
    /// Pair score sum from each candidate to the base (fixed members).
    to_base: Vec<u64>,
    /// Pair score sum from each candidate to the picks so far (kept incrementally).
    to_picks: Vec<u64>,
    /// Pair score sum from each candidate to every other optional candidate.
    degree: Vec<u64>,
    /// `top[c * (wanted + 1) + k]`: sum of candidate c's k largest pair scores to other
    /// optional candidates.
    top: Vec<u64>,
    /// The nearest earlier candidate that is interchangeable with this one (same pair
    /// scores to everything else): a set holding this one but not its twin ties with the
    /// lexicographically smaller set that swaps them, so it never needs visiting.
    twin: Vec<Option<usize>>,
    picks: Vec<usize>,
    scratch: Vec<u64>,
    /// Best (internal score, relative cut, picks) so far.
    best: Option<(u64, i64, Vec<usize>)>,
}

impl Search {
    /// Twice an upper bound on what `left` more picks from candidates `start..` can add.
    /// A new pick c adds its pairs to the members so far, plus half of each pair with
    /// another new pick (the other half is the other pick's), and those are at most its
    /// `left - 1` largest pair scores.
    fn bound2(&mut self, start: usize, left: usize) -> u64 {
        let stride = self.wanted + 1;
        self.scratch.clear();
        for c in start..self.n {
            self.scratch
                .push(2 * (self.to_base[c] + self.to_picks[c]) + self.top[c * stride + left - 1]);
        }
        if left < self.scratch.len() {
            self.scratch
                .select_nth_unstable_by(left - 1, |a, b| b.cmp(a));
        }
        self.scratch.iter().take(left).sum()
    }

    /// `inner`: pair scores among the picks; `cross`: between picks and the base.
    fn run(&mut self, start: usize, inner: u64, cross: u64, degree: u64) {
        if self.picks.len() == self.wanted {
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
                self.best = Some((score, cut, self.picks.clone()));
            }
            return;
        }
        let left = self.wanted - self.picks.len();
        if let Some((best, _, _)) = self.best
            && 2 * (inner + cross) + self.bound2(start, left) < 2 * best
        {
            return;
        }
        for i in start..self.n {
            if self.n - i < left {
                break;
            }
            if self.twin[i].is_some_and(|t| t >= start) {
                continue;
            }
            let (gain_inner, gain_cross) = (self.to_picks[i], self.to_base[i]);
            for j in 0..self.n {
                self.to_picks[j] += self.pair[i * self.n + j];
            }
            self.picks.push(i);
            self.run(
                i + 1,
                inner + gain_inner,
                cross + gain_cross,
                degree + self.degree[i],
            );
            self.picks.pop();
            for j in 0..self.n {
                self.to_picks[j] -= self.pair[i * self.n + j];
            }
        }
    }
}

fn exact(links: &LinkMatrix, base: &[usize], optional: &[usize], wanted: usize) -> Vec<usize> {
    let n = optional.len();
    let mut pair = vec![0u64; n * n];
    for (i, &a) in optional.iter().enumerate() {
        for (j, &b) in optional.iter().enumerate() {
            if i != j {
                pair[i * n + j] = u64::from(links.pair(a, b));
            }
        }
    }
    let base_rows: Vec<Vec<u32>> = optional
        .iter()
        .map(|&a| base.iter().map(|&b| links.pair(a, b)).collect())
        .collect();
    let to_base = optional
        .iter()
        .map(|&a| base.iter().map(|&b| u64::from(links.pair(a, b))).sum())
        .collect();
    let degree = (0..n)
        .map(|i| pair[i * n..(i + 1) * n].iter().sum())
        .collect();
    let stride = wanted + 1;
    let mut top = vec![0u64; n * stride];
    for c in 0..n {
        let mut scores: Vec<u64> = pair[c * n..(c + 1) * n].to_vec();
        scores.sort_unstable_by(|a, b| b.cmp(a));
        for k in 1..stride {
            top[c * stride + k] = top[c * stride + k - 1] + scores.get(k - 1).copied().unwrap_or(0);
        }
    }
    let twin = (0..n)
        .map(|j| {
            (0..j).rev().find(|&i| {
                base_rows[i] == base_rows[j]
                    && (0..n).all(|x| x == i || x == j || pair[i * n + x] == pair[j * n + x])
            })
        })
        .collect();
    let mut search = Search {
        n,
        wanted,
        twin,
        pair,
        to_base,
        to_picks: vec![0; n],
        degree,
        top,
        picks: Vec::with_capacity(wanted),
        scratch: Vec::with_capacity(n),
        best: None,
    };
    search.run(0, 0, 0, 0);
    let mut set = base.to_vec();
    if let Some((_, _, picks)) = search.best {
        set.extend(picks.into_iter().map(|i| optional[i]));
    }
    set
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
