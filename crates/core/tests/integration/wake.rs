//! core's wake rule (proptest): a pod that fits nowhere and can make room nowhere stays
//! so after pods leave some nodes whenever `helped_by` says the departures cannot help it,
//! and no more copies of it fit than the `slots` the departures opened. The scheduler
//! and the timeline leave such pods parked; this says they lose nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

use gpuplace_core::preempt::{Candidates, Holder, find};
use gpuplace_core::wake::{Below, helped_by, slots};
use gpuplace_core::{ClusterState, Placer, Policy};
use gpuplace_model::{NodeInventory, Request};
use proptest::prelude::*;

use crate::common::{dgx1, gpus};

/// A placed pod: its node, request, GPUs and priority.
#[derive(Clone, Debug)]
struct Placed {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    priority: i32,
}

/// Whether `request` at `priority` could start now: it fits a node, or evicting pods
/// below its priority makes room (core's victim search).
fn could_start(state: &ClusterState, placed: &[Placed], request: &Request, priority: i32) -> bool {
    if (0..state.len()).any(|n| state.fit(n, request).is_ok()) {
        return true;
    }
    let mut candidates = Candidates::default();
    for (i, p) in placed
        .iter()
        .enumerate()
        .filter(|(_, p)| p.priority < priority)
    {
        let holder = Holder {
            node: p.node,
            request: &p.request,
            gpus: &p.gpus,
            budgets: vec![],
        };
        candidates.push_unit(p.priority, i as i64, [holder]);
    }
    find(state, request, &candidates, None, &[]).is_some()
}

fn below(placed: &[Placed], n: usize, priority: i32) -> Below {
    let mut below = Below::default();
    for p in placed
        .iter()
        .filter(|p| p.node == n && p.priority < priority)
    {
        below.add(&p.request, &p.gpus);
    }
    below
}

/// How many cases checked a departure the rule called no help, and one it called help.
static NO_HELP: AtomicUsize = AtomicUsize::new(0);
static HELP: AtomicUsize = AtomicUsize::new(0);

type Pods = Vec<Vec<(u8, u32, i32, bool)>>;

fn arbitrary_case() -> impl Strategy<Value = (Pods, u32, u32, i32)> {
    // Per node: pods as (GPU count, milli, priority, leaves); the waiting pod's GPU count
    // and milli (a share below 1000) and priority.
    (
        prop::collection::vec(
            prop::collection::vec((1u8..5, 100u32..1001, 0i32..5, any::<bool>()), 4..14),
            1..5,
        ),
        1u32..9,
        100u32..1001,
        0i32..6,
    )
}

proptest! {
    // Most random clusters leave room for the pod somewhere: those are rejected.
    #![proptest_config(ProptestConfig {
        cases: 400,
        max_global_rejects: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_departure_the_rule_calls_no_help_leaves_the_pod_unable_to_start(
        (nodes, count, milli, priority) in arbitrary_case()
    ) {
        let inventories: Vec<NodeInventory> =
            (0..nodes.len()).map(|i| dgx1(&format!("n{i}"))).collect();
        let mut state = ClusterState::new(inventories).unwrap();
        let mut placed: Vec<Placed> = Vec::new();
        let mut leaves: Vec<bool> = Vec::new();
        for (n, pods) in nodes.iter().enumerate() {
            let mut only = vec![false; nodes.len()];
            only[n] = true;
            for &(k, m, p, leaving) in pods {
                let request = if m < 1000 { gpus(1, m) } else { gpus(u32::from(k), 1000) };
                let Ok(d) = Placer::new(Policy::BestFit, 0).choose(&state, &request, Some(&only))
                else { continue };
                state.apply(d.node, &request, &d.gpus).expect("fits");
                placed.push(Placed { node: d.node, request, gpus: d.gpus, priority: p });
                leaves.push(leaving);
            }
        }
        let request = if milli < 1000 && count == 1 { gpus(1, milli) } else { gpus(count, 1000) };
        // Parked: it could not start before the departures.
        prop_assume!(!could_start(&state, &placed, &request, priority));
        let mut left = Vec::new();
        let mut stay = Vec::new();
        for (p, leaving) in placed.into_iter().zip(leaves) {
            if leaving {
                state.release(p.node, &p.request, &p.gpus).expect("held");
                left.push(p.node);
            } else {
                stay.push(p);
            }
        }
        let helped = helped_by(&state, &left, |n| below(&stay, n, priority), &request);
        // As many copies as fit one after another without evictions: no more than the
        // slots the departures opened.
        let bound = slots(&state, &left, |n| below(&stay, n, priority), &request);
        let mut filled = state.clone();
        let mut fitted = 0;
        while let Ok(d) = Placer::new(Policy::BestFit, 0).choose(&filled, &request, None) {
            filled.apply(d.node, &request, &d.gpus).expect("fits");
            fitted += 1;
        }
        prop_assert!(fitted <= bound, "{} fitted, {} slots", fitted, bound);
        if helped {
            HELP.fetch_add(1, Ordering::Relaxed);
        } else {
            NO_HELP.fetch_add(1, Ordering::Relaxed);
            prop_assert!(
                !could_start(&state, &stay, &request, priority),
                "left {:?}: the rule said no help, yet it could start", left
            );
        }
    }
}

#[test]
fn the_rule_is_checked_both_ways() {
    // Runs the proptest's cases in this test's thread too, then reads the counts (the
    // proptest may run in parallel with this one; its own run is what is counted here).
    a_departure_the_rule_calls_no_help_leaves_the_pod_unable_to_start();
    let (no, yes) = (
        NO_HELP.load(Ordering::Relaxed),
        HELP.load(Ordering::Relaxed),
    );
    println!("wake rule: {no} cases of no help checked, {yes} of help");
    assert!(no >= 50 && yes >= 50, "no help {no}, help {yes}");
}
