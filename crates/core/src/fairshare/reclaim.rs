//! Reclaim: which queues' pods a waiting pod may take back, and how much of each.
//!
//! A pod of queue `q` may reclaim from queue `v` when, below their lowest common ancestor,
//! every queue on `q`'s side stays within its guarantee with the pod added (and at least one
//! of them guarantees a resource the pod asks for), and every queue on `v`'s side is
//! reclaimable and keeps at least its guarantee after what is taken. So reclaim never takes
//! a queue below its guarantee, and what it gives lies within the taker's guarantee: the
//! pods it starts can never be reclaimed back while both queues stay within their shares
//! (no oscillation).

use std::collections::HashMap;

use super::tree::{QueueTree, ROOT};
use super::{DIMS, Res};

/// What a pod of one queue may reclaim.
#[derive(Clone, Debug)]
pub struct Entitlement<'t> {
    tree: &'t QueueTree,
    alloc: Vec<Res>,
    /// The pod's queue, then its ancestors (the root excluded).
    path: Vec<usize>,
    /// How many of `path` (from the pod's queue up) stay within their guarantee with the
    /// pod added.
    within: usize,
    /// The first position on `path` with a guarantee that covers the pod.
    covered_from: Option<usize>,
}

/// What reclaiming takes from one queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    pub queue: usize,
    pub res: Res,
}

impl<'t> Entitlement<'t> {
    /// What a pod of `q` asking `res` may reclaim, given what each queue and everything
    /// under it holds (`alloc`, as [`super::Picker::allocations`] gives it); `None` when it
    /// may reclaim from nobody.
    pub fn new(tree: &'t QueueTree, alloc: &[Res], q: usize, res: &Res) -> Option<Entitlement<'t>> {
        if q == ROOT || q >= tree.len() || tree.nodes[q].problem.is_some() {
            return None;
        }
        let path: Vec<usize> = tree.path(q).collect();
        let mut within = 0;
        let mut covered_from = None;
        for (i, &a) in path.iter().enumerate() {
            let g = &tree.nodes[a].spec.guaranteed;
            let held = &alloc[a];
            let fits = (0..DIMS).all(|d| {
                g.dims[d].is_none_or(|g| res.dims[d] == 0 || held.dims[d] + res.dims[d] <= g)
            }) && res
                .models
                .iter()
                .all(|(m, amount)| g.model(m).is_none_or(|g| held.model(m) + amount <= g));
            if !fits {
                break;
            }
            if covered_from.is_none() && (0..DIMS).any(|d| res.dims[d] > 0 && g.floor(d) > 0) {
                covered_from = Some(i);
            }
            within = i + 1;
        }
        covered_from?;
        Some(Entitlement {
            tree,
            alloc: alloc.to_vec(),
            path,
            within,
            covered_from,
        })
    }

    /// The queues on `v`'s side below its lowest common ancestor with the pod's queue, if
    /// the pod may reclaim from `v` at all.
    fn side(&self, v: usize) -> Option<Vec<usize>> {
        if v == ROOT || v >= self.tree.len() {
            return None;
        }
        let v_path: Vec<usize> = self.tree.path(v).collect();
        // The common ancestor: the first of v's path that is on ours (or the root).
        let (v_below, ours_below) = match v_path.iter().position(|a| self.path.contains(a)) {
            Some(i) => {
                let lca = v_path[i];
                let j = self.path.iter().position(|&a| a == lca)?;
                (i, j)
            }
            None => (v_path.len(), self.path.len()),
        };
        if v_below == 0 || ours_below > self.within {
            // v is the pod's queue or an ancestor of it, or the pod's side is past its
            // guarantees below the common ancestor.
            return None;
        }
        if self.covered_from.is_none_or(|c| c >= ours_below) {
            return None;
        }
        let side = v_path[..v_below].to_vec();
        side.iter()
            .all(|&a| self.tree.nodes[a].spec.reclaimable)
            .then_some(side)
    }

    /// [`Self::may_take_from`] for every queue, by index: what a driver reads per
    /// candidate pod (asked once per queue, not per pod).
    pub fn takeable(&self) -> Vec<bool> {
        (0..self.tree.len())
            .map(|v| self.may_take_from(v))
            .collect()
    }

    /// Whether the pod may take anything from queue `v`'s pods.
    pub fn may_take_from(&self, v: usize) -> bool {
        let Some(side) = self.side(v) else {
            return false;
        };
        side.iter().all(|&a| {
            let g = &self.tree.nodes[a].spec.guaranteed;
            let held = &self.alloc[a].dims;
            if g.dims.iter().any(Option::is_some) {
                (0..DIMS).any(|d| g.dims[d].is_some_and(|g| held[d] > g))
            } else {
                held.iter().any(|&h| h > 0)
            }
        })
    }

    /// Whether taking `losses` (per victim queue) keeps every queue at or above its
    /// guarantee; `Err` names a victim queue whose side would go below.
    pub fn check(&self, losses: &[Loss]) -> Result<(), usize> {
        let mut taken: HashMap<usize, Res> = HashMap::new();
        for loss in losses {
            let side = self.side(loss.queue).ok_or(loss.queue)?;
            for a in side {
                taken.entry(a).or_default().add(&loss.res);
            }
        }
        for loss in losses {
            let side = self.side(loss.queue).ok_or(loss.queue)?;
            for a in side {
                let g = &self.tree.nodes[a].spec.guaranteed;
                let t = &taken[&a];
                let held = &self.alloc[a];
                let below = (0..DIMS).any(|d| {
                    g.dims[d].is_some_and(|g| t.dims[d] > 0 && held.dims[d] < g + t.dims[d])
                }) || t.models.iter().any(|(m, amount)| {
                    g.model(m)
                        .is_some_and(|g| *amount > 0 && held.model(m) < g + amount)
                });
                if below {
                    return Err(loss.queue);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tree::QueueSpec;
    use super::*;

    fn gpu(n: u64) -> Res {
        Res {
            dims: [n * 1000, 0, 0],
            models: Vec::new(),
        }
    }

    fn tree() -> QueueTree {
        let mut specs = Vec::new();
        for (name, parent, g) in [
            ("a", None, 8),
            ("a1", Some("a"), 4),
            ("a2", Some("a"), 4),
            ("b", None, 8),
        ] {
            let mut s = QueueSpec::open(name);
            s.parent = parent.map(str::to_string);
            s.guaranteed.dims[0] = Some(g * 1000);
            specs.push(s);
        }
        QueueTree::build(specs)
    }

    fn alloc(t: &QueueTree, own: &[(&str, u64)]) -> Vec<Res> {
        let mut held = vec![Res::default(); t.len()];
        for (n, g) in own {
            for a in t.path(t.index(n).unwrap()) {
                held[a].add(&gpu(*g));
            }
        }
        held
    }

    #[test]
    fn takes_only_above_guarantees_and_within_the_takers() {
        let t = tree();
        let i = |n: &str| t.index(n).unwrap();
        // a1 holds 10 (a2 idle), b holds 6: a1 is over; b below its guarantee.
        let held = alloc(&t, &[("a1", 10), ("b", 6)]);
        let e = Entitlement::new(&t, &held, i("b"), &gpu(1)).unwrap();
        assert!(e.may_take_from(i("a1")));
        assert!(
            e.check(&[Loss {
                queue: i("a1"),
                res: gpu(2)
            }])
            .is_ok()
        );
        // a (10 held, 8 guaranteed) cannot lose 3, nor a1 (10 held, 4 guaranteed... a's 8 binds).
        assert_eq!(
            e.check(&[Loss {
                queue: i("a1"),
                res: gpu(3)
            }]),
            Err(i("a1"))
        );
        // a2 may take from its sibling within a even though a is above its guarantee.
        let e = Entitlement::new(&t, &held, i("a2"), &gpu(2)).unwrap();
        assert!(e.may_take_from(i("a1")));
        assert!(
            e.check(&[Loss {
                queue: i("a1"),
                res: gpu(6)
            }])
            .is_ok()
        );
        assert!(
            e.check(&[Loss {
                queue: i("a1"),
                res: gpu(7)
            }])
            .is_err()
        );
        // a1, above its guarantee, reclaims nothing.
        assert!(Entitlement::new(&t, &held, i("a1"), &gpu(1)).is_none());
        // b would pass its guarantee with 3 more.
        assert!(Entitlement::new(&t, &held, i("b"), &gpu(3)).is_none());
    }

    #[test]
    fn queues_without_guarantees_reclaim_nothing_and_non_reclaimable_keep_theirs() {
        let mut specs = vec![QueueSpec::open("free"), QueueSpec::open("keep")];
        specs[1].reclaimable = false;
        let mut g = QueueSpec::open("g");
        g.guaranteed.dims[0] = Some(4000);
        specs.push(g);
        let t = QueueTree::build(specs);
        let i = |n: &str| t.index(n).unwrap();
        let held = alloc(&t, &[("free", 4), ("keep", 4)]);
        assert!(Entitlement::new(&t, &held, i("free"), &gpu(1)).is_none());
        let e = Entitlement::new(&t, &held, i("g"), &gpu(1)).unwrap();
        assert!(e.may_take_from(i("free")));
        assert!(!e.may_take_from(i("keep")));
        let takeable = e.takeable();
        assert!(takeable[i("free")] && !takeable[i("keep")]);
    }
}
