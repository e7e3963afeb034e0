//! Preemption's victim search: priorities, disruption budgets, gangs, topology, pods
//! already terminating, and (proptest) that every plan fits and evicts no unit it could
//! spare, that `room_possible` never rules out a node a plan uses, and that the cheapest
//! of the nodes' own plans (`plans_on`, `cheapest`) is `find`'s.

use gpuplace_core::preempt::{
    Amounts, Candidates, Holder, amounts_of, cheapest, find, find_for_all, plans_on, room_possible,
};
use gpuplace_core::{ClusterState, Placer, Policy};
use gpuplace_model::{GpuTopology, NodeInventory, Request};
use proptest::prelude::*;

use crate::common::{dgx1, gpus};

fn node(name: &str) -> NodeInventory {
    NodeInventory::uniform(name, 64_000, 1 << 18, 8, "A100")
}

/// What a placed pod holds (the records candidates borrow from).
#[derive(Clone, Debug)]
struct Held {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    budgets: Vec<usize>,
}

impl Held {
    fn holder(&self) -> Holder<'_> {
        Holder {
            node: self.node,
            request: &self.request,
            gpus: &self.gpus,
            budgets: self.budgets.clone(),
        }
    }
}

/// Places `request` on `node` with `positions` and returns what it holds.
fn hold(state: &mut ClusterState, node: usize, request: Request, positions: &[usize]) -> Held {
    let gpus: Vec<(usize, u32)> = positions.iter().map(|&g| (g, request.gpu_milli)).collect();
    state.apply(node, &request, &gpus).expect("fits");
    Held {
        node,
        request,
        gpus,
        budgets: vec![],
    }
}

/// Candidates of units (priority, members), terminating pods and budgets.
fn cands<'a>(
    units: &[(i32, Vec<&'a Held>)],
    freeing: &[&'a Held],
    budgets: &[i32],
) -> Candidates<'a> {
    let mut c = Candidates {
        budgets: budgets.to_vec(),
        freeing: freeing.iter().map(|h| h.holder()).collect(),
        ..Default::default()
    };
    for (i, (priority, members)) in units.iter().enumerate() {
        c.push_unit(*priority, i as i64, members.iter().map(|h| h.holder()));
    }
    c
}

#[test]
fn evicts_the_lowest_priority_pods_it_needs_and_no_more() {
    let mut state = ClusterState::new(vec![node("a")]).unwrap();
    let low = hold(&mut state, 0, gpus(4, 1000), &[0, 1, 2, 3]);
    let mid = hold(&mut state, 0, gpus(4, 1000), &[4, 5, 6, 7]);
    let candidates = cands(&[(5, vec![&mid]), (1, vec![&low])], &[], &[]);
    let plan = find(&state, &gpus(4, 1000), &candidates, None, &[]).expect("a plan");
    assert_eq!(
        plan.units,
        vec![1],
        "the priority-1 pod goes, the priority-5 one stays"
    );
    assert_eq!(plan.cost.victims, 1);
    assert_eq!(plan.cost.top_priority, Some(1));
    let mut got: Vec<usize> = plan.gpus.iter().map(|&(g, _)| g).collect();
    got.sort();
    assert_eq!(
        got,
        vec![0, 1, 2, 3],
        "exactly the devices the victim frees"
    );
    // Eight GPUs need both.
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[]).expect("a plan");
    assert_eq!(plan.units, vec![0, 1]);
    // Nothing the victims hold is enough for nine.
    assert!(find(&state, &gpus(9, 1000), &candidates, None, &[]).is_none());
}

#[test]
fn prefers_the_node_where_no_disruption_budget_is_broken() {
    let mut state = ClusterState::new(vec![node("a"), node("b")]).unwrap();
    let mut covered = hold(&mut state, 0, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    covered.budgets = vec![0];
    let free = hold(&mut state, 1, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    // The covered pod has the lower priority, but its budget allows no disruption.
    let candidates = cands(&[(1, vec![&covered]), (2, vec![&free])], &[], &[0]);
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[]).unwrap();
    assert_eq!((plan.node, plan.units.clone()), (1, vec![1]));
    assert_eq!(plan.cost.budget_violations, 0);
    // With one disruption allowed, the lower priority wins again.
    let candidates = cands(&[(1, vec![&covered]), (2, vec![&free])], &[], &[1]);
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[]).unwrap();
    assert_eq!(plan.node, 0);
}

#[test]
fn a_gang_member_goes_only_with_its_whole_gang_and_counts_as_all_of_them() {
    let mut state = ClusterState::new(vec![node("a"), node("b"), node("c")]).unwrap();
    // A two-member gang (one on a, one on b) and a lone pod on c, all priority 1.
    let m1 = hold(&mut state, 0, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let m2 = hold(&mut state, 1, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let lone = hold(&mut state, 2, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let candidates = cands(&[(1, vec![&m1, &m2]), (1, vec![&lone])], &[], &[]);
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[]).unwrap();
    assert_eq!((plan.node, plan.units.clone()), (2, vec![1]));
    // Without the lone pod, the whole gang goes (two victims).
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[false, true]).unwrap();
    assert_eq!(plan.units, vec![0]);
    assert_eq!(plan.cost.victims, 2);
}

#[test]
fn a_topology_requirement_chooses_victims_that_free_a_linked_set() {
    let mut state = ClusterState::new(vec![dgx1("d")]).unwrap();
    // Eight one-GPU pods; the ones on GPUs 0, 1, 5, 6 have the lowest priority, but no
    // four of 0, 1, 5, 6 are all NVLinked (1-5 and 0-6 are not). GPUs 4-7 are a quad.
    let priorities = [1, 1, 3, 3, 2, 1, 1, 2];
    let held: Vec<Held> = (0..8)
        .map(|g| hold(&mut state, 0, gpus(1, 1000), &[g]))
        .collect();
    let units: Vec<(i32, Vec<&Held>)> = (0..8).map(|g| (priorities[g], vec![&held[g]])).collect();
    let candidates = cands(&units, &[], &[]);
    let mut request = gpus(4, 1000);
    request.need.topology = GpuTopology::Nvlink;
    let plan = find(&state, &request, &candidates, None, &[]).unwrap();
    let mut got: Vec<usize> = plan.gpus.iter().map(|&(g, _)| g).collect();
    got.sort();
    let links = state.links(0);
    for (i, &a) in got.iter().enumerate() {
        for &b in &got[i + 1..] {
            assert!(links.pair(a, b) >= 100, "{a}-{b} not NVLinked in {got:?}");
        }
    }
    assert_eq!(plan.cost.victims, 4);
    assert_eq!(
        got,
        vec![4, 5, 6, 7],
        "the quad with the cheapest victims (2,1,1,2)"
    );
    assert_eq!(plan.cost.top_priority, Some(2));
}

#[test]
fn pods_already_terminating_make_room_without_victims() {
    let mut state = ClusterState::new(vec![node("a"), node("b")]).unwrap();
    let going = hold(&mut state, 0, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let victim = hold(&mut state, 1, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let candidates = cands(&[(0, vec![&victim])], &[&going], &[]);
    let plan = find(&state, &gpus(8, 1000), &candidates, None, &[]).unwrap();
    assert_eq!(plan.node, 0);
    assert!(plan.units.is_empty());
    assert_eq!(plan.cost.top_priority, None);
    // A mask that rules node a out leaves the eviction on b.
    let plan = find(
        &state,
        &gpus(8, 1000),
        &candidates,
        Some(&[false, true]),
        &[],
    )
    .unwrap();
    assert_eq!((plan.node, plan.units), (1, vec![0]));
}

#[test]
fn a_gang_preempts_for_all_its_members_or_not_at_all() {
    let mut state = ClusterState::new(vec![node("a"), node("b"), node("c")]).unwrap();
    let a = hold(&mut state, 0, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let b = hold(&mut state, 1, gpus(4, 1000), &[0, 1, 2, 3]);
    let c = hold(&mut state, 2, gpus(8, 1000), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let candidates = cands(&[(1, vec![&a]), (1, vec![&b]), (9, vec![&c])], &[], &[]);
    let mut placer = Placer::new(Policy::BestFit, 1);
    let eight = gpus(8, 1000);
    let four = gpus(4, 1000);
    // 8 + 4: the 4 fits on b as it is; the 8 evicts a. Unit 2 (priority 9) is not
    // the caller's to offer here, but the search would never need it.
    let plan = find_for_all(
        &mut placer,
        &state,
        &[(&eight, None), (&four, None)],
        &candidates,
        &[],
    )
    .unwrap();
    assert_eq!(plan.units, vec![0]);
    assert_eq!(plan.placements[0].0, 0);
    assert_eq!(plan.placements[1].0, 1);
    // With a and b excluded, the 8 evicts c instead (the search spares what it is told
    // to) and the 4 still fits on b's node.
    let plan = find_for_all(
        &mut placer,
        &state,
        &[(&eight, None), (&four, None)],
        &candidates,
        &[true, true, false],
    )
    .unwrap();
    assert_eq!(plan.units, vec![2]);
    assert_eq!(plan.placements[0].0, 2);
    assert_eq!(plan.placements[1].0, 1);
    // Three eights: a, b and c would all have to go, and with c spared by the mask none is
    // planned.
    let mask = [true, true, false];
    assert!(
        find_for_all(
            &mut placer,
            &state,
            &[
                (&eight, Some(&mask)),
                (&eight, Some(&mask)),
                (&eight, Some(&mask))
            ],
            &candidates,
            &[]
        )
        .is_none()
    );
}

/// A pod already terminating frees its devices once: the gang member that counts on them
/// takes them, and the next member evicts what it needs instead of counting them again
/// (which planned both members on the same GPU, so the gang found no plan at all while
/// an earlier leader's victim was terminating).
#[test]
fn a_terminating_pod_frees_its_devices_for_one_gang_member_only() {
    let mut state = ClusterState::new(vec![node("a")]).unwrap();
    let gone = hold(&mut state, 0, gpus(4, 1000), &[0, 1, 2, 3]);
    let low = hold(&mut state, 0, gpus(4, 1000), &[4, 5, 6, 7]);
    let candidates = cands(&[(1, vec![&low])], &[&gone], &[]);
    let mut placer = Placer::new(Policy::BestFit, 1);
    let four = gpus(4, 1000);
    let plan = find_for_all(
        &mut placer,
        &state,
        &[(&four, None), (&four, None)],
        &candidates,
        &[],
    )
    .expect("the terminating pod's four and the victim's four");
    assert_eq!(plan.units, vec![0]);
    let mut taken: Vec<usize> = plan
        .placements
        .iter()
        .flat_map(|(_, g)| g.iter().map(|&(g, _)| g))
        .collect();
    taken.sort();
    assert_eq!(taken, (0..8).collect::<Vec<_>>(), "no GPU planned twice");
    // Three fours: what is terminating and every victim make room for two only.
    assert!(
        find_for_all(
            &mut placer,
            &state,
            &[(&four, None), (&four, None), (&four, None)],
            &candidates,
            &[],
        )
        .is_none()
    );
}

/// Per node, pods as (GPU count, milli, priority).
type Pods = Vec<Vec<(u8, u32, i32)>>;

fn arbitrary_cluster() -> impl Strategy<Value = (Pods, u32, bool)> {
    // Per node: pods as (GPU count or share, milli, priority); the request's GPU count;
    // whether it needs NVLink.
    (
        prop::collection::vec(
            prop::collection::vec((1u8..5, 100u32..1001, 0i32..5), 4..14),
            1..5,
        ),
        1u32..9,
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_plan_fits_and_spares_every_unit_it_can(
        (nodes, count, nvlink) in arbitrary_cluster()
    ) {
        let inventories: Vec<NodeInventory> =
            (0..nodes.len()).map(|i| dgx1(&format!("n{i}"))).collect();
        let mut state = ClusterState::new(inventories).unwrap();
        let mut held = Vec::new();
        for (n, pods) in nodes.iter().enumerate() {
            for &(k, milli, priority) in pods {
                let request = if milli < 1000 { gpus(1, milli) } else { gpus(u32::from(k), 1000) };
                let Ok(d) = Placer::new(Policy::BestFit, 0).choose(&state, &request, Some(&{
                    let mut m = vec![false; nodes.len()]; m[n] = true; m
                })) else { continue };
                let h = hold(&mut state, d.node, request, &d.gpus.iter().map(|&(g, _)| g).collect::<Vec<_>>());
                held.push((priority, h));
            }
        }
        let units: Vec<(i32, Vec<&Held>)> = held.iter().map(|(p, h)| (*p, vec![h])).collect();
        let candidates = cands(&units, &[], &[]);
        let mut request = gpus(count, 1000);
        if nvlink {
            request.need.topology = GpuTopology::Nvlink;
        }
        if (0..state.len()).any(|n| state.fit(n, &request).is_ok()) {
            // The scheduler preempts only for a pod that fits nowhere as things are.
            return Ok(());
        }
        // room_possible is necessary: a plan's node passes it, and a search over only the
        // candidates on passing nodes finds the same plan (the timeline searches so).
        let evictable = |n: usize| -> Amounts {
            let mut sum = [0u64; 3];
            for m in candidates.holders.iter().filter(|m| m.node == n) {
                for (s, a) in sum.iter_mut().zip(amounts_of(m.request)) {
                    *s += a;
                }
            }
            sum
        };
        let passing: Vec<bool> = (0..state.len())
            .map(|n| room_possible(&state, n, &evictable(n), &request))
            .collect();
        // Made at their index in the whole list, as the timeline's units keep their
        // creation times; `kept[i]`: the whole list's index of narrowed unit i.
        let kept: Vec<usize> = (0..units.len())
            .filter(|&u| units[u].1.iter().any(|h| passing[h.node]))
            .collect();
        let mut narrowed = Candidates::default();
        for &u in &kept {
            narrowed.push_unit(units[u].0, u as i64, units[u].1.iter().map(|h| h.holder()));
        }
        let found = find(&state, &request, &candidates, None, &[]);
        let found_narrowed = find(&state, &request, &narrowed, None, &[]);
        prop_assert_eq!(found.is_some(), found_narrowed.is_some());
        if let (Some(all), Some(few)) = (&found, &found_narrowed) {
            prop_assert!(passing[all.node]);
            prop_assert_eq!(all.node, few.node);
            prop_assert_eq!(&all.gpus, &few.gpus);
            let mut few_units: Vec<usize> = few.units.iter().map(|&u| kept[u]).collect();
            let mut all_units = all.units.clone();
            few_units.sort_unstable();
            all_units.sort_unstable();
            prop_assert_eq!(all_units, few_units);
        }
        // Each node's plan, asked of the nodes in two parts (a driver that keeps each
        // node's plan asks only the changed ones), and the cheapest of them: find's plan.
        let part = |odd: bool| -> Vec<bool> { (0..state.len()).map(|n| (n % 2 == 1) == odd).collect() };
        let mut plans = plans_on(&state, &request, &candidates, &part(true));
        plans.extend(plans_on(&state, &request, &candidates, &part(false)));
        prop_assert_eq!(cheapest(&state, plans), found.clone());
        let Some(plan) = found else {
            // No plan: then not even evicting everything on a node lets it fit.
            for n in 0..state.len() {
                let mut s = state.clone();
                for m in candidates.holders.iter().filter(|m| m.node == n) {
                    s.release(m.node, m.request, m.gpus).unwrap();
                }
                prop_assert!(s.fit(n, &request).is_err());
            }
            return Ok(());
        };
        let evicted = |spare: Option<usize>| {
            let mut s = state.clone();
            for &u in plan.units.iter().filter(|&&u| Some(u) != spare) {
                for m in candidates.members(u) {
                    s.release(m.node, m.request, m.gpus).unwrap();
                }
            }
            s
        };
        let after = evicted(None);
        prop_assert!(after.fit(plan.node, &request).is_ok());
        prop_assert_eq!(plan.gpus.len(), count as usize);
        for &(g, m) in &plan.gpus {
            prop_assert!(after.node(plan.node).gpu_free[g] >= m);
        }
        if nvlink {
            let positions: Vec<usize> = plan.gpus.iter().map(|&(g, _)| g).collect();
            prop_assert!(gpuplace_core::require::meets(
                after.links(plan.node), after.pair_rules(plan.node), GpuTopology::Nvlink, &positions));
        }
        for &u in &plan.units {
            prop_assert!(evicted(Some(u)).fit(plan.node, &request).is_err(),
                "unit {} could have been spared", u);
        }
    }
}
