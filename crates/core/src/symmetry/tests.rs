use super::*;
use gpuplace_model::{Link, NodeInventory, PcieLevel};
use proptest::prelude::*;

/// A node of `n` GPUs with `link(a, b) = (nvlinks, pcie)` and NUMA node `numa(g)`.
fn node(
    n: u32,
    link: impl Fn(u32, u32) -> (u32, PcieLevel),
    numa: impl Fn(u32) -> Option<u32>,
) -> (NodeInventory, LinkMatrix, PairRules) {
    let mut inv = NodeInventory::uniform("n", 64_000, 1 << 20, n, "V100");
    for g in &mut inv.gpus {
        g.numa_node = numa(g.index);
    }
    for a in 0..n {
        for b in a + 1..n {
            let (nvlinks, pcie) = link(a, b);
            inv.links.push(Link {
                a,
                b,
                nvlinks,
                pcie,
            });
        }
    }
    let links = LinkMatrix::from_inventory(&inv);
    let rules = PairRules::from_inventory(&inv);
    (inv, links, rules)
}

/// DGX-1's hybrid cube mesh as the benchmark writes it: each half all NVLinked, and g with
/// g + 4; PCIe one switch within a half, across sockets between halves.
fn cube_mesh() -> Symmetry {
    let (inv, links, rules) = node(
        8,
        |a, b| {
            let same = a / 4 == b / 4;
            let nv = if same || b == a + 4 { 2 } else { 0 };
            let pcie = if same {
                PcieLevel::SingleSwitch
            } else {
                PcieLevel::CrossCpu
            };
            (nv, pcie)
        },
        |g| Some(g / 4),
    );
    Symmetry::of(&inv, &links, &rules)
}

#[test]
fn hybrid_cube_mesh_has_48_symmetries_and_no_twins() {
    let s = cube_mesh();
    assert!(s.blocks.iter().all(|b| b.len() == 1));
    // The same permutation of both halves (4!), times swapping the halves.
    assert_eq!(s.maps.len(), 48);
    assert_eq!(s.maps[0], (0..8).collect::<Vec<u8>>());
    // A share on GPU 1 is the same state as one on GPU 6; not as 1 and 6 both used versus
    // 1 and 2 (1-6 is no NVLink pair, 1-2 is).
    let one = |g: usize| {
        let mut v = vec![1000u32; 8];
        v[g] = 500;
        v
    };
    assert_eq!(s.canonical(&one(1)), s.canonical(&one(6)));
    let two = |a: usize, b: usize| {
        let mut v = vec![1000u32; 8];
        v[a] = 0;
        v[b] = 0;
        v
    };
    assert_eq!(s.canonical(&two(1, 5)), s.canonical(&two(2, 6)));
    assert_ne!(s.canonical(&two(1, 6)), s.canonical(&two(1, 2)));
    assert!(!s.is_trivial());
}

#[test]
fn interchangeable_gpus_are_one_block_and_sorted() {
    let (inv, links, rules) = node(8, |_, _| (12, PcieLevel::SingleSwitch), |_| Some(0));
    let s = Symmetry::of(&inv, &links, &rules);
    assert_eq!(s.blocks.len(), 1);
    assert_eq!(s.maps.len(), 1);
    assert_eq!(
        s.canonical(&[3, 1, 2, 0, 9, 9, 4, 1]),
        vec![0, 1, 1, 2, 3, 4, 9, 9]
    );
}

#[test]
fn two_socket_nvswitch_box_has_two_blocks_that_trade_places() {
    let (inv, links, rules) = node(
        8,
        |a, b| {
            let pcie = if a / 4 == b / 4 {
                PcieLevel::SingleSwitch
            } else {
                PcieLevel::CrossCpu
            };
            (12, pcie)
        },
        |g| Some(g / 4),
    );
    let s = Symmetry::of(&inv, &links, &rules);
    assert_eq!(s.blocks.len(), 2);
    assert_eq!(s.maps.len(), 2);
    assert_eq!(
        s.canonical(&[5, 1, 1, 1, 0, 3, 2, 1]),
        s.canonical(&[0, 1, 2, 3, 1, 1, 5, 1])
    );
    assert_ne!(
        s.canonical(&[0, 0, 1, 1, 1, 1, 1, 1]),
        s.canonical(&[0, 1, 1, 1, 0, 1, 1, 1])
    );
}

#[test]
fn distinct_gpus_have_no_symmetry() {
    let mut inv = NodeInventory::uniform("n", 64_000, 1 << 20, 3, "V100");
    inv.gpus[1].memory_mib = 1;
    inv.gpus[2].memory_mib = 2;
    let (links, rules) = (
        LinkMatrix::from_inventory(&inv),
        PairRules::from_inventory(&inv),
    );
    let s = Symmetry::of(&inv, &links, &rules);
    assert!(s.is_trivial());
    assert_eq!(s.canonical(&[3, 2, 1]), vec![3, 2, 1]);
}

/// Every permutation of `0..n` (n small).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            out.push(q);
        }
    }
    out
}

proptest! {
    /// On random topologies of up to 6 GPUs, two states have one canonical form exactly when
    /// a permutation keeping every attribute and pair relation turns one into the other
    /// (brute force over all permutations).
    #[test]
    fn canonical_forms_are_equal_exactly_for_symmetric_states(
        n in 1usize..=6,
        scores in proptest::collection::vec(0u32..3, 15),
        numa in proptest::collection::vec(0u32..2, 6),
        memory in proptest::collection::vec(0u64..2, 6),
        x in proptest::collection::vec(0u32..3, 6),
        y in proptest::collection::vec(0u32..3, 6),
    ) {
        let levels = [PcieLevel::CrossCpu, PcieLevel::SingleSwitch, PcieLevel::SameBoard];
        let pair_at = |a: u32, b: u32| {
            let (a, b) = (a.min(b) as usize, a.max(b) as usize);
            a * 6 - a * (a + 1) / 2 + (b - a - 1)
        };
        let (mut inv, _, _) = node(
            n as u32,
            |a, b| (scores[pair_at(a, b)] % 2, levels[scores[pair_at(a, b)] as usize]),
            |g| Some(numa[g as usize]),
        );
        for g in &mut inv.gpus {
            g.memory_mib += memory[g.index as usize];
        }
        let links = LinkMatrix::from_inventory(&inv);
        let rules = PairRules::from_inventory(&inv);
        let s = Symmetry::of(&inv, &links, &rules);
        let keeps = |p: &[usize]| {
            (0..n).all(|a| {
                let (ga, gb) = (&inv.gpus[a], &inv.gpus[p[a]]);
                ga.memory_mib == gb.memory_mib
                    && (0..n).all(|b| {
                        links.pair(a, b) == links.pair(p[a], p[b])
                            && (numa[a] == numa[b]) == (numa[p[a]] == numa[p[b]])
                    })
            })
        };
        let (x, y) = (&x[..n], &y[..n]);
        let related = permutations(n)
            .iter()
            .filter(|p| keeps(p))
            .any(|p| (0..n).all(|i| y[i] == x[p[i]]));
        prop_assert_eq!(s.canonical(x) == s.canonical(y), related);
    }
}
