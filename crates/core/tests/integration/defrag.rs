//! Defragmentation's plans: make-room and rebalance never double-book a GPU, give every
//! moved pod a place, make the pending pod fit and never move what may not move.

use std::sync::Arc;

use crate::common::{dgx1, gpus};
use gpuplace_core::defrag::{self, Limits, Movables};
use gpuplace_core::preempt::Holder;
use gpuplace_core::{ClusterState, Placer, Policy, TargetWorkload};
use gpuplace_model::{GpuTopology, NodeInventory, Request};
use proptest::prelude::*;

/// A pod as placed: node, request, GPUs, movable.
struct Pod {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    movable: bool,
}

fn place(state: &mut ClusterState, node: usize, request: Request, movable: bool) -> Option<Pod> {
    let mut mask = vec![false; state.len()];
    mask[node] = true;
    let d = Placer::new(Policy::BestFit, 0)
        .choose(state, &request, Some(&mask))
        .ok()?;
    state.apply(d.node, &request, &d.gpus).ok()?;
    Some(Pod {
        node: d.node,
        request,
        gpus: d.gpus,
        movable,
    })
}

fn movables(pods: &[Pod], budget: Option<i32>) -> (Movables<'_>, Vec<usize>) {
    let mut m = Movables::default();
    let mut index = Vec::new();
    if let Some(b) = budget {
        m.candidates.budgets.push(b);
    }
    for (i, p) in pods.iter().enumerate().filter(|(_, p)| p.movable) {
        m.push_unit(
            i as i64,
            [(
                Holder {
                    node: p.node,
                    request: &p.request,
                    gpus: &p.gpus,
                    budgets: if budget.is_some() { vec![0] } else { vec![] },
                },
                None,
            )],
        );
        index.push(i);
    }
    (m, index)
}

fn cluster(nodes: usize) -> ClusterState {
    let inv: Vec<NodeInventory> = (0..nodes).map(|i| dgx1(&format!("n{i}"))).collect();
    let mut state = ClusterState::new(inv).unwrap();
    let shapes = [gpus(1, 500), gpus(1, 1000), gpus(2, 1000), gpus(8, 1000)];
    state.set_workload(Arc::new(TargetWorkload::from_requests(&shapes, 1.0)));
    state
}

#[test]
fn one_small_pod_per_node_moves_onto_another_to_free_a_whole_node() {
    let mut state = cluster(2);
    let pods: Vec<Pod> = (0..2)
        .map(|n| place(&mut state, n, gpus(1, 1000), true).unwrap())
        .collect();
    let eight = gpus(8, 1000);
    assert!((0..2).all(|n| state.fit(n, &eight).is_err()));
    let (m, _) = movables(&pods, None);
    let mut placer = Placer::new(Policy::BestFit, 0);
    let plan =
        defrag::make_room(&mut placer, &mut state, &eight, None, &m, Limits::default()).unwrap();
    assert_eq!(plan.cost.pods_moved, 1);
    assert_eq!(plan.cost.milli_moved, 1000);
    assert_eq!(plan.moves.len(), 1);
    // The moved pod goes to the other node.
    assert_ne!(plan.moves[0].to, plan.placements[0].node);
    let mut after = state.clone();
    defrag::apply_plan(&mut after, &[&eight], &m, &plan).unwrap();
    assert_eq!(after.gpu_allocated_milli(), 10_000);
}

#[test]
fn a_budget_with_no_disruption_left_moves_nothing() {
    let mut state = cluster(2);
    let pods: Vec<Pod> = (0..2)
        .map(|n| place(&mut state, n, gpus(1, 1000), true).unwrap())
        .collect();
    let (m, _) = movables(&pods, Some(0));
    let mut placer = Placer::new(Policy::BestFit, 0);
    let plan = defrag::make_room(
        &mut placer,
        &mut state,
        &gpus(8, 1000),
        None,
        &m,
        Limits::default(),
    );
    assert!(plan.is_none());
}

#[test]
fn nothing_is_planned_when_a_moved_pod_would_have_no_place() {
    // One node: the pod in the way can only go where the 8-GPU pod goes.
    let mut state = cluster(1);
    let pods = vec![place(&mut state, 0, gpus(1, 1000), true).unwrap()];
    let (m, _) = movables(&pods, None);
    let mut placer = Placer::new(Policy::BestFit, 0);
    let plan = defrag::make_room(
        &mut placer,
        &mut state,
        &gpus(8, 1000),
        None,
        &m,
        Limits::default(),
    );
    assert!(plan.is_none());
}

#[test]
fn limits_bound_the_pods_moved() {
    let mut state = cluster(2);
    let mut pods = Vec::new();
    for n in 0..2 {
        for _ in 0..2 {
            pods.push(place(&mut state, n, gpus(1, 1000), true).unwrap());
        }
    }
    let (m, _) = movables(&pods, None);
    let mut placer = Placer::new(Policy::BestFit, 0);
    let one = Limits {
        max_pods: 1,
        max_milli: u64::MAX,
    };
    assert!(defrag::make_room(&mut placer, &mut state, &gpus(8, 1000), None, &m, one).is_none());
    let plan = defrag::make_room(
        &mut placer,
        &mut state,
        &gpus(8, 1000),
        None,
        &m,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(plan.cost.pods_moved, 2);
}

#[test]
fn rebalance_gathers_scattered_shares_and_lowers_fragmentation() {
    let mut state = cluster(4);
    let mut pods = Vec::new();
    for n in 0..4 {
        pods.push(place(&mut state, n, gpus(1, 500), true).unwrap());
    }
    let (m, _) = movables(&pods, None);
    let mut placer = Placer::new(Policy::Fgd, 0);
    let plan = defrag::rebalance(&mut placer, &state, &m, Limits::default(), 1.0);
    assert!(!plan.moves.is_empty());
    assert!(plan.frag_after < plan.frag_before);
}

/// Per node, pods as (GPU count, milli, movable).
type Pods = Vec<Vec<(u8, u32, bool)>>;

/// A cluster of `nodes.len()` nodes with `nodes`' pods placed (those that fit).
fn placed(nodes: &Pods) -> (ClusterState, Vec<Pod>) {
    let mut state = cluster(nodes.len());
    let mut pods = Vec::new();
    for (n, list) in nodes.iter().enumerate() {
        for &(k, milli, movable) in list {
            let request = if milli < 1000 {
                gpus(1, milli)
            } else {
                gpus(u32::from(k), 1000)
            };
            if let Some(p) = place(&mut state, n, request, movable) {
                pods.push(p);
            }
        }
    }
    (state, pods)
}

fn arbitrary_cluster() -> impl Strategy<Value = (Pods, u32, bool, usize)> {
    (
        prop::collection::vec(
            prop::collection::vec((1u8..4, 100u32..1001, prop::bool::weighted(0.7)), 3..12),
            2..6,
        ),
        2u32..9,
        any::<bool>(),
        1usize..9,
    )
}

/// Every holder's final place, checked by building the state again from nothing: pods that
/// did not move where they were, moved pods where the plan says, the pending pod on top.
fn rebuilt(
    nodes: usize,
    pods: &[Pod],
    index: &[usize],
    moves: &[defrag::Move],
) -> Result<ClusterState, TestCaseError> {
    let mut s = cluster(nodes);
    for (i, p) in pods.iter().enumerate() {
        let moved = moves.iter().find(|m| index[m.holder] == i);
        prop_assert!(p.movable || moved.is_none(), "pod {} may not move", i);
        let (node, g) = moved.map_or((p.node, &p.gpus), |m| (m.to, &m.gpus));
        prop_assert!(
            s.apply(node, &p.request, g).is_ok(),
            "pod {} double-booked",
            i
        );
    }
    Ok(s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn make_room_plans_are_whole_and_book_nothing_twice(
        (nodes, count, nvlink, max_pods) in arbitrary_cluster()
    ) {
        let (mut state, pods) = placed(&nodes);
        let mut request = gpus(count, 1000);
        if nvlink {
            request.need.topology = GpuTopology::Nvlink;
        }
        if (0..state.len()).any(|n| state.fit(n, &request).is_ok()) {
            return Ok(());
        }
        let (m, index) = movables(&pods, None);
        let limits = Limits { max_pods, max_milli: u64::MAX };
        let mut placer = Placer::new(Policy::BestFit, 1);
        let (allocated, frag) = (state.gpu_allocated_milli(), state.total_frag());
        let plan = defrag::make_room(&mut placer, &mut state, &request, None, &m, limits);
        // Trying plans leaves the state as it was.
        prop_assert_eq!(state.gpu_allocated_milli(), allocated);
        prop_assert!((state.total_frag() - frag).abs() < 1e-6);
        let Some(plan) = plan else {
            return Ok(());
        };
        prop_assert!(plan.cost.pods_moved as usize <= max_pods);
        // Every moved unit's members have exactly one move, and nothing else moves.
        let mut moved: Vec<usize> = plan.moves.iter().map(|mv| mv.holder).collect();
        moved.sort_unstable();
        let mut expected: Vec<usize> = plan.units.iter()
            .flat_map(|&u| m.candidates.units[u].members.clone()).collect();
        expected.sort_unstable();
        prop_assert_eq!(&moved, &expected);
        let mut after = rebuilt(nodes.len(), &pods, &index, &plan.moves)?;
        let p = &plan.placements[0];
        prop_assert!(after.apply(p.node, &request, &p.gpus).is_ok(), "pending pod double-booked");
        prop_assert_eq!(p.gpus.len(), count as usize);
        if nvlink {
            let positions: Vec<usize> = p.gpus.iter().map(|&(g, _)| g).collect();
            prop_assert!(gpuplace_core::require::meets(
                after.links(p.node), after.pair_rules(p.node), GpuTopology::Nvlink, &positions));
        }
        let mut applied = state.clone();
        prop_assert!(defrag::apply_plan(&mut applied, &[&request], &m, &plan).is_ok());
        prop_assert_eq!(applied.gpu_allocated_milli(), after.gpu_allocated_milli());
    }

    #[test]
    fn rebalance_moves_are_whole_and_never_raise_fragmentation(
        (nodes, _count, _nvlink, max_pods) in arbitrary_cluster()
    ) {
        let (state, pods) = placed(&nodes);
        let (m, index) = movables(&pods, None);
        let limits = Limits { max_pods, max_milli: u64::MAX };
        let mut placer = Placer::new(Policy::Fgd, 1);
        let plan = defrag::rebalance(&mut placer, &state, &m, limits, 1.0);
        prop_assert!(plan.moves.len() <= max_pods);
        prop_assert!(plan.frag_after <= plan.frag_before + 1e-6);
        let after = rebuilt(nodes.len(), &pods, &index, &plan.moves)?;
        prop_assert!((after.total_frag() - plan.frag_after).abs() < 1e-3);
    }

    /// The timeline keeps one FGD placer from look to look and plans on its own state:
    /// each look's plan is a fresh placer's on a copy, and the state is left exactly as
    /// it was (nodes and the running fragmentation total, to the bit).
    #[test]
    fn rebalance_in_place_with_a_kept_placer_plans_as_a_fresh_one_on_a_copy(
        (nodes, _count, _nvlink, max_pods) in arbitrary_cluster()
    ) {
        let (mut state, pods) = placed(&nodes);
        let (m, _) = movables(&pods, None);
        let limits = Limits { max_pods, max_milli: u64::MAX };
        let mut kept = Placer::new(Policy::Fgd, 1);
        // Three looks, the state changed between them (a pod leaves, another comes).
        for look in 0..3 {
            let fresh = defrag::rebalance(&mut Placer::new(Policy::Fgd, 1), &state, &m, limits, 1.0);
            // Each node's amounts and fragmentation (its bits), as text.
            let seen = |s: &ClusterState| -> Vec<String> {
                (0..s.len())
                    .map(|n| {
                        let x = s.node(n);
                        let (free, cap) = (&x.gpu_free, &x.gpu_capacity);
                        format!("{free:?} {cap:?} {} {} {}", x.cpu_free, x.memory_free, x.frag.to_bits())
                    })
                    .collect()
            };
            let nodes_before = seen(&state);
            let sum = state.frag_sum();
            let plan = defrag::rebalance_in_place(&mut kept, &mut state, &m, limits, 1.0);
            prop_assert_eq!(&plan, &fresh);
            prop_assert_eq!(state.frag_sum().to_bits(), sum.to_bits());
            prop_assert_eq!(seen(&state), nodes_before);
            if let Some(p) = pods.first() {
                let _ = if look == 0 {
                    state.release(p.node, &p.request, &p.gpus)
                } else {
                    state.apply(p.node, &p.request, &p.gpus)
                };
            }
        }
    }
}

#[test]
fn equal_plans_are_broken_by_node_name_not_by_the_drivers_order() {
    // Two nodes alike, listed "n1" first: one pod on each; the plan frees "n0".
    let inv = vec![dgx1("n1"), dgx1("n0"), dgx1("spare")];
    let mut state = ClusterState::new(inv).unwrap();
    let pods: Vec<Pod> = (0..2)
        .map(|n| place(&mut state, n, gpus(1, 1000), true).unwrap())
        .collect();
    let filler = gpus(8, 1000);
    let mut full = vec![false; 3];
    full[2] = true;
    let d = Placer::new(Policy::BestFit, 0)
        .choose(&state, &gpus(7, 1000), Some(&full))
        .unwrap();
    state.apply(d.node, &gpus(7, 1000), &d.gpus).unwrap();
    assert!((0..3).all(|n| state.fit(n, &filler).is_err()));
    let (m, _) = movables(&pods, None);
    let mut placer = Placer::new(Policy::BestFit, 0);
    let plan = defrag::make_room(
        &mut placer,
        &mut state,
        &filler,
        None,
        &m,
        Limits::default(),
    )
    .unwrap();
    assert_eq!(
        state.inventory(plan.placements[0].node).name,
        "n0",
        "{plan:?}"
    );
}
