//! Queues' fair shares, serving order and reclaim on random trees: shares never pass a
//! parent's share, a limit or the demand; siblings with unmet demand get equal shares per
//! weight above their guarantees; serving one-GPU units by the picker converges to the fair
//! shares and never passes a limit; reclaim never takes a queue below its guarantee, and
//! what it gives cannot be reclaimed back; after one round (units in the picker's order,
//! each placed on free capacity or reclaiming), no queue below its guarantee is left with
//! waiting work that free capacity or a permitted reclaim could have served.

use gpuplace_core::fairshare::{
    Entitlement, Loss, Picker, QueueSpec, QueueTree, ROOT, Res, fair_shares,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    specs: Vec<QueueSpec>,
    /// Demand in GPUs per spec (the same order).
    demand: Vec<u64>,
    capacity: u64,
}

fn gpu(n: u64) -> Res {
    Res {
        dims: [n * 1000, 0, 0],
        models: Vec::new(),
    }
}

fn case() -> impl Strategy<Value = Case> {
    (2usize..14, 8u64..96).prop_flat_map(|(n, capacity)| {
        (
            prop::collection::vec(
                (
                    0usize..100,
                    prop::option::of(0u64..12),
                    prop::option::of(1u64..40),
                    1u32..5,
                    0u64..40,
                    any::<bool>(),
                ),
                n,
            ),
            Just(capacity),
        )
            .prop_map(|(raw, capacity)| {
                let mut depth = vec![0usize; raw.len()];
                let mut specs = Vec::new();
                let mut demand = Vec::new();
                for (i, (parent, g, l, w, d, reclaimable)) in raw.into_iter().enumerate() {
                    let mut s = QueueSpec::open(&format!("q{i:02}"));
                    // A parent among the earlier queues at depth < 2, or the root.
                    let p = parent % (i + 1);
                    if p < i && depth[p] < 2 {
                        s.parent = Some(format!("q{p:02}"));
                        depth[i] = depth[p] + 1;
                    }
                    s.guaranteed.dims[0] = g.map(|g| g * 1000);
                    s.limit.dims[0] = l.map(|l| l * 1000);
                    s.weight = f64::from(w);
                    s.reclaimable = reclaimable;
                    specs.push(s);
                    demand.push(d);
                }
                Case {
                    specs,
                    demand,
                    capacity,
                }
            })
    })
}

/// Own demand by tree index (inner queues take no pods).
fn demands(tree: &QueueTree, c: &Case) -> Vec<Res> {
    let mut out = vec![Res::default(); tree.len()];
    for (s, d) in c.specs.iter().zip(&c.demand) {
        let q = tree.index(&s.name).unwrap();
        if tree.is_leaf(q) && tree.nodes[q].problem.is_none() {
            out[q] = gpu(*d);
        }
    }
    out
}

/// What each subtree asks for, capped by limits.
fn wants(tree: &QueueTree, own: &[Res], q: usize) -> u64 {
    let mut w = own[q].dims[0];
    for &c in &tree.nodes[q].children {
        if tree.nodes[c].problem.is_none() {
            w += wants(tree, own, c);
        }
    }
    tree.nodes[q].spec.limit.dims[0].map_or(w, |l| w.min(l))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn shares_respect_parents_limits_demand_and_weights(c in case()) {
        let tree = QueueTree::build(c.specs.clone());
        let own = demands(&tree, &c);
        let shares = fair_shares(&tree, &[c.capacity * 1000, 0, 0], &own);
        for p in 0..tree.len() {
            let kids: Vec<usize> = tree.nodes[p].children.iter().copied()
                .filter(|&k| tree.nodes[k].problem.is_none()).collect();
            let sum: u64 = kids.iter().map(|&k| shares[k][0]).sum();
            prop_assert!(sum <= shares[p][0] + kids.len() as u64, "children past parent {p}");
            for &k in &kids {
                let w = wants(&tree, &own, k);
                prop_assert!(shares[k][0] <= w + 1, "share past demand/limit");
                if let Some(l) = tree.nodes[k].spec.limit.dims[0] {
                    prop_assert!(shares[k][0] <= l);
                }
            }
            // Max-min by weight: a child left wanting gets at least as much per weight
            // above its guarantee as any sibling, when guarantees all fit.
            let guaranteed: u64 = kids.iter()
                .map(|&k| tree.nodes[k].spec.guaranteed.floor(0).min(wants(&tree, &own, k)))
                .sum();
            if guaranteed <= shares[p][0] {
                for &k in &kids {
                    let gk = tree.nodes[k].spec.guaranteed.floor(0).min(wants(&tree, &own, k));
                    prop_assert!(shares[k][0] + 1 >= gk, "guarantee not given");
                    if shares[k][0] + 2 >= wants(&tree, &own, k) {
                        continue;
                    }
                    let per_k = (shares[k][0].saturating_sub(gk)) as f64
                        / tree.nodes[k].spec.weight;
                    for &j in &kids {
                        let gj = tree.nodes[j].spec.guaranteed.floor(0).min(wants(&tree, &own, j));
                        let per_j = (shares[j][0].saturating_sub(gj)) as f64
                            / tree.nodes[j].spec.weight;
                        prop_assert!(per_k + 2.0 >= per_j, "{k} left wanting below {j}");
                    }
                }
            }
        }
        let top: u64 = tree.nodes[ROOT].children.iter().map(|&k| shares[k][0]).sum();
        prop_assert!(top <= c.capacity * 1000 + tree.len() as u64);
    }

    #[test]
    fn serving_converges_to_fair_shares_within_limits(c in case()) {
        let tree = QueueTree::build(c.specs.clone());
        let own = demands(&tree, &c);
        let shares = fair_shares(&tree, &[c.capacity * 1000, 0, 0], &own);
        let mut picker = Picker::new(&tree, &vec![Res::default(); tree.len()], shares.clone());
        for (q, d) in own.iter().enumerate() {
            for _ in 0..d.dims[0] / 1000 {
                picker.push(q, ());
            }
        }
        let mut free = c.capacity;
        while free > 0 {
            let Some((q, ())) = picker.pop() else { break };
            if picker.limit_hit(q, &gpu(1)).is_some() {
                continue;
            }
            picker.placed(q, &gpu(1));
            free -= 1;
        }
        for (q, share) in shares.iter().enumerate().skip(1) {
            let held = picker.alloc(q).dims[0];
            if let Some(l) = tree.nodes[q].spec.limit.dims[0] {
                prop_assert!(held <= l, "limit passed");
            }
            // Whole GPUs against real-valued shares: within a GPU per level below the root.
            let depth = tree.path(q).count() as u64;
            let slack = 1000 * depth + 1000;
            prop_assert!(held + slack >= share[0],
                "queue {q} holds {held}, fair share {}", share[0]);
        }
    }

    #[test]
    fn reclaim_never_below_guarantee_and_never_back(
        c in case(),
        held_seed in prop::collection::vec(0u64..16, 14),
        take in prop::collection::vec((0usize..14, 1u64..6), 1..4),
        taker in 0usize..14,
        ask in 1u64..4,
    ) {
        let tree = QueueTree::build(c.specs.clone());
        let mut held_own = vec![Res::default(); tree.len()];
        for (i, s) in c.specs.iter().enumerate() {
            let q = tree.index(&s.name).unwrap();
            if tree.is_leaf(q) && tree.nodes[q].problem.is_none() {
                held_own[q] = gpu(held_seed[i % held_seed.len()]);
            }
        }
        let picker: Picker<'_, ()> =
            Picker::new(&tree, &held_own, vec![[0; 3]; tree.len()]);
        let alloc = picker.allocations().to_vec();
        let q = 1 + taker % (tree.len() - 1);
        let Some(e) = Entitlement::new(&tree, &alloc, q, &gpu(ask)) else { return Ok(()) };
        let losses: Vec<Loss> = take.iter()
            .map(|&(v, n)| Loss { queue: 1 + v % (tree.len() - 1), res: gpu(n) })
            .filter(|l| e.may_take_from(l.queue) && held_own[l.queue].dims[0] >= l.res.dims[0])
            .collect();
        if losses.is_empty() || e.check(&losses).is_err() {
            return Ok(());
        }
        // Nobody below its guarantee on the victims' sides; the taker within its own.
        let mut after = held_own.clone();
        for l in &losses {
            after[l.queue].sub(&l.res);
        }
        after[q].add(&gpu(ask));
        let p2: Picker<'_, ()> = Picker::new(&tree, &after, vec![[0; 3]; tree.len()]);
        for l in &losses {
            for a in tree.path(l.queue) {
                if tree.path(q).any(|b| b == a) {
                    break;
                }
                let g = tree.nodes[a].spec.guaranteed.floor(0);
                prop_assert!(p2.alloc(a).dims[0] >= g.min(alloc[a].dims[0]),
                    "queue {a} taken below its guarantee");
            }
        }
        // No way back: a pod of a victim queue cannot take anything from the taker.
        for l in &losses {
            if let Some(back) = Entitlement::new(&tree, p2.allocations(), l.queue, &gpu(1)) {
                let r = back.check(&[Loss { queue: q, res: gpu(1) }]);
                prop_assert!(!back.may_take_from(q) || r.is_err(), "reclaimed back");
            }
        }
    }

    #[test]
    fn below_guarantee_is_served_or_reclaims_within_one_round(
        c in case(),
        held_seed in prop::collection::vec(0u64..12, 14),
        spare in 0u64..4,
    ) {
        let tree = QueueTree::build(c.specs.clone());
        // What each leaf holds (one-GPU pods), as far as the cluster goes; then what waits.
        let mut held_own = vec![0u64; tree.len()];
        let mut used = 0;
        for (i, s) in c.specs.iter().enumerate() {
            let q = tree.index(&s.name).unwrap();
            if tree.is_leaf(q) && tree.nodes[q].problem.is_none() {
                let h = held_seed[i % held_seed.len()].min(c.capacity.saturating_sub(used));
                held_own[q] = h;
                used += h;
            }
        }
        let mut free = spare.min(c.capacity - used);
        let own = demands(&tree, &c);
        let start: Vec<Res> = held_own.iter().map(|&h| gpu(h)).collect();
        let shares = fair_shares(&tree, &[c.capacity * 1000, 0, 0], &own);
        let mut picker = Picker::new(&tree, &start, shares);
        let mut waiting = vec![0u64; tree.len()];
        for (q, d) in own.iter().enumerate() {
            for _ in 0..d.dims[0] / 1000 {
                picker.push(q, ());
            }
        }
        // The round: each unit placed on free capacity, else it reclaims one GPU from a
        // queue it may take from (the check deciding), else it waits.
        while let Some((q, ())) = picker.pop() {
            if picker.limit_hit(q, &gpu(1)).is_some() {
                continue;
            }
            if free > 0 {
                free -= 1;
                picker.placed(q, &gpu(1));
                held_own[q] += 1;
                continue;
            }
            let victim = Entitlement::new(&tree, picker.allocations(), q, &gpu(1))
                .and_then(|e| victim_of(&e, &held_own));
            match victim {
                Some(v) => {
                    picker.removed(v, &gpu(1));
                    held_own[v] -= 1;
                    picker.placed(q, &gpu(1));
                    held_own[q] += 1;
                }
                None => waiting[q] += 1,
            }
        }
        // Nobody left waiting below its guarantee could have been served.
        for (q, &w) in waiting.iter().enumerate().skip(1) {
            if w == 0 || picker.limit_hit(q, &gpu(1)).is_some() {
                continue;
            }
            prop_assert!(free == 0, "queue {q} waits with {free} GPUs free");
            if let Some(e) = Entitlement::new(&tree, picker.allocations(), q, &gpu(1)) {
                prop_assert!(victim_of(&e, &held_own).is_none(),
                    "queue {q} below its guarantee waits though it could reclaim");
            }
        }
    }
}

/// A leaf the entitlement may take one GPU from, keeping every queue at its guarantee.
fn victim_of(e: &Entitlement<'_>, held_own: &[u64]) -> Option<usize> {
    (1..held_own.len()).find(|&v| {
        held_own[v] > 0
            && e.may_take_from(v)
            && e.check(&[Loss {
                queue: v,
                res: gpu(1),
            }])
            .is_ok()
    })
}
