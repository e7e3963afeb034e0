//! Fair shares, per resource, down the tree: each queue's share is divided among its
//! children (and its own pods, as one more child of weight 1 and no guarantee) by first
//! giving each its guarantee as far as it asks for it (scaled down together when the
//! share cannot cover every guarantee), then the rest by weight, max-min fair (water
//! filling): no child gets more than it asks for or past its limit, and what one cannot
//! use goes to the others by their weights.

use super::tree::{QueueTree, ROOT};
use super::{DIMS, Res};

/// Fair shares when each queue's demand is what its pods hold (`held`) plus what its
/// waiting pods ask for (`pending`), both by queue index.
pub fn fair_shares_of(
    tree: &QueueTree,
    capacity: &[u64; DIMS],
    held: &[Res],
    pending: &[Res],
) -> Vec<[u64; DIMS]> {
    let demand: Vec<Res> = held
        .iter()
        .zip(pending)
        .map(|(h, p)| {
            let mut d = h.clone();
            d.add(p);
            d
        })
        .collect();
    fair_shares(tree, capacity, &demand)
}

/// Each queue's fair share of every resource, given the cluster's `capacity` and what each
/// queue's own pods hold and wait for (`demand`, by queue index; the root's is ignored).
pub fn fair_shares(tree: &QueueTree, capacity: &[u64; DIMS], demand: &[Res]) -> Vec<[u64; DIMS]> {
    let mut shares = vec![[0u64; DIMS]; tree.len()];
    for d in 0..DIMS {
        let wants = subtree_demand(tree, demand, d);
        let mut share = vec![0f64; tree.len()];
        share[ROOT] = capacity[d] as f64;
        divide(tree, demand, d, &wants, ROOT, &mut share);
        for (q, s) in share.iter().enumerate() {
            shares[q][d] = s.max(0.0).floor() as u64;
        }
    }
    shares
}

/// What each subtree asks for of resource `d`, capped at its limit (queues that serve no
/// pod ask for nothing).
fn subtree_demand(tree: &QueueTree, demand: &[Res], d: usize) -> Vec<f64> {
    let mut wants = vec![0f64; tree.len()];
    // Children have no fixed index order relative to parents: go by depth, deepest first.
    let mut order: Vec<(usize, usize)> =
        (1..tree.len()).map(|q| (tree.path(q).count(), q)).collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    for (_, q) in order {
        let node = &tree.nodes[q];
        if node.problem.is_some() {
            wants[q] = 0.0;
            continue;
        }
        let own = demand.get(q).map_or(0, |r| r.dims[d]) as f64;
        let mut w = wants[q] + own;
        if let Some(limit) = node.spec.limit.dims[d] {
            w = w.min(limit as f64);
        }
        wants[q] = w;
        let p = node.parent;
        if p != ROOT && tree.nodes[p].problem.is_none() {
            wants[p] += w;
        } else if p == ROOT {
            wants[ROOT] += w;
        }
    }
    wants
}

/// One claimant of a parent's share: a child queue, or the parent's own pods.
struct Claim {
    queue: Option<usize>,
    wants: f64,
    guarantee: f64,
    weight: f64,
    got: f64,
}

fn divide(tree: &QueueTree, demand: &[Res], d: usize, wants: &[f64], p: usize, share: &mut [f64]) {
    let mut claims: Vec<Claim> = tree.nodes[p]
        .children
        .iter()
        .filter(|&&c| tree.nodes[c].problem.is_none())
        .map(|&c| Claim {
            queue: Some(c),
            wants: wants[c],
            guarantee: tree.nodes[c].spec.guaranteed.floor(d) as f64,
            weight: tree.nodes[c].spec.weight,
            got: 0.0,
        })
        .collect();
    if p != ROOT {
        let own = demand.get(p).map_or(0, |r| r.dims[d]) as f64;
        if own > 0.0 {
            claims.push(Claim {
                queue: None,
                wants: own,
                guarantee: 0.0,
                weight: 1.0,
                got: 0.0,
            });
        }
    }
    let total = share[p];
    // Guarantees first, as far as asked for.
    let guaranteed: f64 = claims.iter().map(|c| c.guarantee.min(c.wants)).sum();
    let scale = if guaranteed > total && guaranteed > 0.0 {
        total / guaranteed
    } else {
        1.0
    };
    for c in &mut claims {
        c.got = c.guarantee.min(c.wants) * scale;
    }
    let mut rest = total - claims.iter().map(|c| c.got).sum::<f64>();
    // Then the rest by weight, water filling.
    while rest > 1e-9 {
        let active: Vec<usize> = (0..claims.len())
            .filter(|&i| claims[i].wants - claims[i].got > 1e-9)
            .collect();
        if active.is_empty() {
            break;
        }
        let weights: f64 = active.iter().map(|&i| claims[i].weight).sum();
        let level = rest / weights;
        let mut filled = false;
        for &i in &active {
            let room = claims[i].wants - claims[i].got;
            if room <= level * claims[i].weight {
                claims[i].got = claims[i].wants;
                rest -= room;
                filled = true;
            }
        }
        if !filled {
            for &i in &active {
                claims[i].got += level * claims[i].weight;
            }
            rest = 0.0;
        }
    }
    for c in claims {
        if let Some(q) = c.queue {
            share[q] = c.got;
            divide(tree, demand, d, wants, q, share);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tree::QueueSpec;
    use super::*;

    fn gpus(n: u64) -> Res {
        Res {
            dims: [n * 1000, 0, 0],
            models: Vec::new(),
        }
    }

    #[test]
    fn guarantees_first_then_weights() {
        let mut a = QueueSpec::open("a");
        a.guaranteed.dims[0] = Some(4000);
        let mut b = QueueSpec::open("b");
        b.weight = 3.0;
        let tree = QueueTree::build(vec![a, b]);
        let (ia, ib) = (tree.index("a").unwrap(), tree.index("b").unwrap());
        let mut demand = vec![Res::default(); tree.len()];
        demand[ia] = gpus(100);
        demand[ib] = gpus(100);
        let s = fair_shares(&tree, &[16_000, 0, 0], &demand);
        // a: 4 guaranteed + 1/4 of 12; b: 3/4 of 12.
        assert_eq!(s[ia][0], 7000);
        assert_eq!(s[ib][0], 9000);
        // What b does not want goes to a.
        demand[ib] = gpus(2);
        let s = fair_shares(&tree, &[16_000, 0, 0], &demand);
        assert_eq!(s[ib][0], 2000);
        assert_eq!(s[ia][0], 14_000);
    }

    #[test]
    fn limits_cap_and_children_split_their_parents_share() {
        let mut a = QueueSpec::open("a");
        a.limit.dims[0] = Some(6000);
        let mut a1 = QueueSpec::open("a1");
        a1.parent = Some("a".into());
        let mut a2 = QueueSpec::open("a2");
        a2.parent = Some("a".into());
        let tree = QueueTree::build(vec![a, a1, a2, QueueSpec::open("b")]);
        let mut demand = vec![Res::default(); tree.len()];
        for n in ["a1", "a2", "b"] {
            demand[tree.index(n).unwrap()] = gpus(10);
        }
        let s = fair_shares(&tree, &[16_000, 0, 0], &demand);
        assert_eq!(s[tree.index("a").unwrap()][0], 6000);
        assert_eq!(s[tree.index("a1").unwrap()][0], 3000);
        assert_eq!(s[tree.index("b").unwrap()][0], 10_000);
    }
}
