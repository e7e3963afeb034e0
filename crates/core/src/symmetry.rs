//! The symmetries of a node's GPUs, so that node states which differ only by a symmetry
//! share one class of the node-class index.
//!
//! A permutation of a node's GPU positions is a symmetry when it keeps every GPU's model,
//! memory and capacity, every pair's link score and whether a pair shares a NUMA domain:
//! then every fit, score and topology requirement reads the same on a state and on its
//! permuted copy (the GPUs themselves are chosen on the node, afterwards). A DGX-1's hybrid
//! cube mesh has 48 symmetries, a two-socket NVSwitch box 1,152, a box of interchangeable
//! GPUs all 8! of them.
//!
//! Symmetries are held in two parts: blocks of *twins* (GPUs any two of which may trade
//! places: equal attributes and equal relations to every other GPU), inside which a state is
//! simply sorted, and the symmetries that keep each block's order ("block maps"), one per
//! coset of the twins' permutations. The canonical form of a state is the least, over the
//! block maps, of the permuted state sorted within blocks: equal for two states exactly when
//! one is a symmetry of the other. Block maps beyond [`MAX_MAPS`] are not enumerated; the
//! form then still only equates states that are symmetric (it merges fewer of them).

use gpuplace_model::NodeInventory;

use crate::require::PairRules;
use crate::topology::LinkMatrix;

/// Block maps kept at most per node type (bounds the cost of one canonical form).
const MAX_MAPS: usize = 64;
/// Steps the search for block maps may take per node type (bounds it on any inventory).
const MAX_STEPS: usize = 100_000;

/// The symmetries of one node type's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Symmetry {
    /// Twin blocks: positions, ascending; every position in exactly one block.
    blocks: Vec<Vec<u8>>,
    /// Block maps (`map[i]` = the position whose state lands on `i`), the identity first.
    maps: Vec<Vec<u8>>,
    /// GPUs of the node type.
    gpus: usize,
}

impl Symmetry {
    /// The symmetries of `node`'s GPUs (positions in inventory order).
    pub fn of(node: &NodeInventory, links: &LinkMatrix, rules: &PairRules) -> Self {
        let n = node.gpus.len().min(usize::from(u8::MAX));
        let attr = |a: usize| {
            let g = &node.gpus[a];
            (
                &g.model,
                g.memory_mib,
                g.milli_capacity,
                g.numa_node.is_some(),
            )
        };
        let pair = |a: usize, b: usize| {
            (
                links.pair(a, b),
                rules.compatible(links, gpuplace_model::GpuTopology::Numa, a, b),
            )
        };
        // Twins: a and b trade places without changing any attribute or relation.
        let twins = |a: usize, b: usize| {
            attr(a) == attr(b) && (0..n).all(|c| c == a || c == b || pair(a, c) == pair(b, c))
        };
        let mut block_of = vec![usize::MAX; n];
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        for a in 0..n {
            if block_of[a] != usize::MAX {
                continue;
            }
            block_of[a] = blocks.len();
            let mut block = vec![a as u8];
            for (b, &owner) in block_of.iter().enumerate().skip(a + 1) {
                if owner == usize::MAX && twins(a, b) {
                    block.push(b as u8);
                }
            }
            for &b in &block {
                block_of[usize::from(b)] = blocks.len();
            }
            blocks.push(block);
        }
        // Block maps by backtracking: position i takes the state of `map[i]`; within a
        // block the order is kept, so each coset of the twins' permutations appears once.
        let mut maps = Vec::new();
        let mut map = Vec::with_capacity(n);
        let mut used = vec![false; n];
        let mut search = Search {
            n,
            attr: &attr,
            pair: &pair,
            block_of: &block_of,
            maps: &mut maps,
            steps: 0,
        };
        search.extend(&mut map, &mut used);
        Symmetry {
            blocks,
            maps,
            gpus: n,
        }
    }

    /// Whether some symmetry moves a GPU (states are then compared in canonical form and a
    /// share's GPU must be found again on the chosen node).
    pub fn is_trivial(&self) -> bool {
        self.maps.len() <= 1 && self.blocks.iter().all(|b| b.len() == 1)
    }

    /// Puts a node state given per position into its canonical form: equal for two states
    /// exactly when a symmetry turns one into the other (up to the enumeration bound).
    ///
    /// The state is first sorted within each twin block; a block map sends blocks onto
    /// blocks keeping their order, so the mapped copies are sorted within blocks too and
    /// are compared in place (most lose at the first position or two).
    pub fn canonicalize<T: Copy + Ord>(&self, state: &mut [T]) {
        if self.is_trivial() || state.len() != self.gpus {
            return;
        }
        for block in self.blocks.iter().filter(|b| b.len() > 1) {
            let (first, last) = (usize::from(block[0]), usize::from(block[block.len() - 1]));
            if last - first + 1 == block.len() {
                state[first..=last].sort_unstable();
            } else {
                let mut values: Vec<T> = block.iter().map(|&p| state[usize::from(p)]).collect();
                values.sort_unstable();
                for (&p, v) in block.iter().zip(values) {
                    state[usize::from(p)] = v;
                }
            }
        }
        let mut best = &self.maps[0];
        for map in &self.maps[1..] {
            for (&p, &q) in map.iter().zip(best.iter()) {
                match state[usize::from(p)].cmp(&state[usize::from(q)]) {
                    std::cmp::Ordering::Less => {
                        best = map;
                        break;
                    }
                    std::cmp::Ordering::Greater => break,
                    std::cmp::Ordering::Equal => {}
                }
            }
        }
        if !std::ptr::eq(best, &self.maps[0]) {
            let copy = state.to_vec();
            for (slot, &p) in state.iter_mut().zip(best.iter()) {
                *slot = copy[usize::from(p)];
            }
        }
    }

    /// [`Self::canonicalize`] of a copy.
    #[cfg(test)]
    pub fn canonical<T: Copy + Ord>(&self, state: &[T]) -> Vec<T> {
        let mut copy = state.to_vec();
        self.canonicalize(&mut copy);
        copy
    }
}

/// The backtracking search for block maps.
struct Search<'a, A, P> {
    n: usize,
    attr: &'a A,
    pair: &'a P,
    block_of: &'a [usize],
    maps: &'a mut Vec<Vec<u8>>,
    steps: usize,
}

impl<A, P, X, Y> Search<'_, A, P>
where
    A: Fn(usize) -> X,
    P: Fn(usize, usize) -> Y,
    X: PartialEq,
    Y: PartialEq,
{
    fn extend(&mut self, map: &mut Vec<u8>, used: &mut [bool]) {
        self.steps += 1;
        if self.maps.len() >= MAX_MAPS || self.steps > MAX_STEPS {
            return;
        }
        let i = map.len();
        if i == self.n {
            self.maps.push(map.clone());
            return;
        }
        // Identity first: candidates in ascending order.
        for c in 0..self.n {
            if used[c] || (self.attr)(i) != (self.attr)(c) {
                continue;
            }
            // Within a block the order is kept: i's block-mate before it maps below c, and
            // block-mates go to one block.
            let previous_mate = (0..i).rev().find(|&j| self.block_of[j] == self.block_of[i]);
            if let Some(j) = previous_mate {
                let m = usize::from(map[j]);
                if self.block_of[m] != self.block_of[c] || m > c {
                    continue;
                }
            }
            if (0..i).any(|j| (self.pair)(j, i) != (self.pair)(usize::from(map[j]), c)) {
                continue;
            }
            used[c] = true;
            map.push(c as u8);
            self.extend(map, used);
            map.pop();
            used[c] = false;
        }
    }
}

#[cfg(test)]
mod tests;
