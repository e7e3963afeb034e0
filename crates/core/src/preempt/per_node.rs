//! Indices grouped by node in two flat lists (a victim search visits a few hundred nodes
//! of thousands: a list per node was an allocation per node touched, the largest share of
//! a preempting replay's allocations).

/// Indices grouped by node: node `n`'s are `items[start[n]..start[n + 1]]`.
pub(super) struct PerNode {
    start: Vec<u32>,
    items: Vec<u32>,
}

impl PerNode {
    /// From `entries` (node, index), read twice (a count, then the fill); entries of a
    /// node past `nodes` are left out. Each node's items keep the entries' order.
    pub(super) fn build<I>(nodes: usize, entries: impl Fn() -> I) -> PerNode
    where
        I: Iterator<Item = (usize, usize)>,
    {
        let mut start = vec![0u32; nodes + 1];
        for (n, _) in entries().filter(|&(n, _)| n < nodes) {
            start[n + 1] += 1;
        }
        for n in 0..nodes {
            start[n + 1] += start[n];
        }
        let mut next: Vec<u32> = start[..nodes].to_vec();
        let mut items = vec![0u32; start[nodes] as usize];
        for (n, i) in entries().filter(|&(n, _)| n < nodes) {
            items[next[n] as usize] = i as u32;
            next[n] += 1;
        }
        PerNode { start, items }
    }

    /// Node `n`'s indices (none past the last node).
    pub(super) fn on(&self, n: usize) -> &[u32] {
        match (self.start.get(n), self.start.get(n + 1)) {
            (Some(&a), Some(&b)) => &self.items[a as usize..b as usize],
            _ => &[],
        }
    }
}

/// Which node each candidate unit and terminating pod touches (indices into the victim
/// search's units and terminating pods).
pub(super) struct ByNode {
    pub(super) units: PerNode,
    pub(super) freeing: PerNode,
}

impl ByNode {
    /// The candidate units with a member on node `n`.
    pub(super) fn units(&self, n: usize) -> &[u32] {
        self.units.on(n)
    }

    /// The terminating pods on node `n`.
    pub(super) fn freeing(&self, n: usize) -> &[u32] {
        self.freeing.on(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_nodes_indices_in_the_order_given() {
        let entries = [(2, 0), (0, 0), (2, 1), (9, 2), (0, 3)];
        let by = PerNode::build(3, || entries.iter().copied());
        assert_eq!(by.on(0), &[0, 3]);
        assert_eq!(by.on(1), &[] as &[u32]);
        assert_eq!(by.on(2), &[0, 1]);
        assert_eq!(by.on(7), &[] as &[u32], "no such node");
    }
}
