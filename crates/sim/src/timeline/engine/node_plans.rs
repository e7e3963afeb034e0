//! Preemption's plans for pods alone, kept node by node. A pod alone is judged on each
//! node from that node alone (its candidates, its terminating pods, its free devices; core's
//! [`preempt::plans_on`], which draws no random number), so what the search for an ask
//! (request, priority, queue) found on a node, a plan and its cost or nothing, holds until
//! that node changes. A search then plans only the nodes that changed since and picks the
//! cheapest of all ([`preempt::cheaper`], as [`preempt::find`] does). Under a backlog a
//! pod waiting for room searched every node again at each retry though a round changes a
//! few, and pods of one shape preempting one after another each searched every node.
//!
//! A node is changed when the state's journal or the running pods' tallies name it
//! ([`ByPriority::changed_since`]). What a node's answer reads beyond them is kept out:
//! a node holding a member of a unit with members elsewhere, or a pod whose Binding has
//! not landed ([`super::groups::Groups::unsure`]), is not kept.

use std::collections::BTreeMap;

use gpuplace_core::ClusterState;
use gpuplace_core::preempt::{self, Cost, Preemption, Ranked};

use super::evictable::{ByPriority, Marks, SearchAsk};

/// Asks kept at most (each one byte per node and its plans).
const ASKS_MAX: usize = 1_024;

/// What a search found on a node for an ask, while the node is unchanged (a plan's cost
/// is in [`Kept::plans`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Unknown,
    Nothing,
    Plan,
}

/// Each ask's nodes.
#[derive(Debug, Default)]
pub(super) struct NodePlans {
    asks: Vec<Kept>,
}

#[derive(Debug)]
struct Kept {
    ask: SearchAsk,
    nodes: Vec<Known>,
    /// How many of `nodes` are unknown (none: a retry reads no node).
    unknown: usize,
    /// The unknown nodes, and some known since (skipped): a retry reads these, not every
    /// node (under churn a few change between two retries of an ask).
    pending: Vec<u32>,
    /// The cost of each plan kept, by node.
    plans: BTreeMap<u32, Cost>,
    marks: Marks,
    /// The workload fragmentation was measured against (a plan's cost reads it).
    workload: u64,
}

impl Kept {
    fn new(ask: SearchAsk, nodes: usize, marks: Marks, state: &ClusterState) -> Kept {
        Kept {
            ask,
            nodes: vec![Known::Unknown; nodes],
            unknown: nodes,
            pending: (0..nodes as u32).collect(),
            plans: BTreeMap::new(),
            marks,
            workload: state.workload_generation(),
        }
    }

    /// Node `n` is now known as `known` (a plan of `cost`); out of range is ignored.
    fn set(&mut self, n: usize, known: Known, cost: Option<Cost>) {
        let Some(slot) = self.nodes.get_mut(n) else {
            return;
        };
        let was = std::mem::replace(slot, known);
        self.unknown = self.unknown + usize::from(known == Known::Unknown)
            - usize::from(was == Known::Unknown);
        if known == Known::Unknown && was != Known::Unknown {
            self.pending.push(n as u32);
        }
        let key = n as u32;
        match (known, cost) {
            (Known::Plan, Some(cost)) => {
                self.plans.insert(key, cost);
            }
            _ if was == Known::Plan => {
                self.plans.remove(&key);
            }
            _ => {}
        }
    }
}

/// What is known for an ask over the nodes of a search.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Looked {
    /// The nodes to plan again (changed since, or never planned); empty when none.
    pub(super) unknown: Vec<bool>,
    pub(super) any_unknown: bool,
    /// The cheapest plan kept on the other nodes.
    pub(super) best_kept: Option<Ranked>,
}

impl NodePlans {
    /// What is known for `ask` on the nodes marked in `room`, each node changed since it
    /// was planned forgotten first.
    pub(super) fn look(
        &mut self,
        ask: SearchAsk,
        room: &[bool],
        state: &ClusterState,
        tallies: &ByPriority,
    ) -> Looked {
        let i = self.entry(ask, room.len(), state, tallies);
        let kept = &mut self.asks[i];
        let mut unknown = Vec::new();
        let mut left = 0;
        if kept.unknown > 0 {
            unknown = vec![false; room.len()];
            for n in std::mem::take(&mut kept.pending) {
                let n = n as usize;
                let listed = unknown.get(n).copied().unwrap_or(true);
                if listed || kept.nodes.get(n) != Some(&Known::Unknown) {
                    continue;
                }
                if room[n] {
                    unknown[n] = true;
                    left += 1;
                    // Unknown until the search that follows says.
                    kept.pending.push(n as u32);
                } else {
                    // Out of the room (the node's own free amounts, model and
                    // candidates' tallies): no plan there until the node changes.
                    kept.set(n, Known::Nothing, None);
                }
            }
        }
        let mut best_kept: Option<Ranked> = None;
        for (&n, &cost) in &kept.plans {
            let plan = Ranked {
                cost,
                node: n as usize,
            };
            let on = room.get(plan.node).copied().unwrap_or(false);
            if on && best_kept.is_none_or(|b| preempt::cheaper(state, plan, b)) {
                best_kept = Some(plan);
            }
        }
        let looked = Looked {
            any_unknown: left > 0,
            unknown,
            best_kept,
        };
        #[cfg(test)]
        SPARED.with(|s| s.set(s.get() + looked.spared(room)));
        looked
    }

    /// The search for `ask` planned the nodes marked in `planned` on the state
    /// [`Self::look`] last saw and found `plans` (the other nodes have none); `unsure`
    /// lists nodes whose answer reads more than their own changes (not kept).
    pub(super) fn learn(
        &mut self,
        ask: SearchAsk,
        planned: &[bool],
        plans: &[Preemption],
        unsure: &[u32],
    ) {
        let Some(kept) = self.asks.iter_mut().find(|k| k.ask == ask) else {
            return;
        };
        for (n, &on) in planned.iter().enumerate() {
            if on {
                kept.set(n, Known::Nothing, None);
            }
        }
        for plan in plans {
            kept.set(plan.node, Known::Plan, Some(plan.cost));
        }
        for &n in unsure {
            kept.set(n as usize, Known::Unknown, None);
        }
    }

    /// Forgets what `ask` knew (a kept plan did not hold: cannot happen).
    pub(super) fn forget(&mut self, ask: SearchAsk) {
        self.asks.retain(|k| k.ask != ask);
    }

    /// `ask`'s entry, up to date with the state and the tallies.
    fn entry(
        &mut self,
        ask: SearchAsk,
        nodes: usize,
        state: &ClusterState,
        tallies: &ByPriority,
    ) -> usize {
        let now = tallies.marks(state);
        if let Some(i) = self.asks.iter().position(|k| k.ask == ask) {
            let kept = &mut self.asks[i];
            let changes = (kept.workload == state.workload_generation())
                .then(|| tallies.changed_since(state, kept.marks))
                .flatten();
            match changes {
                Some(changed) => {
                    for n in changed {
                        kept.set(n as usize, Known::Unknown, None);
                    }
                    kept.marks = now;
                }
                None => *kept = Kept::new(ask, nodes, now, state),
            }
            return i;
        }
        if self.asks.len() >= ASKS_MAX {
            self.asks.clear();
        }
        self.asks.push(Kept::new(ask, nodes, now, state));
        self.asks.len() - 1
    }
}

#[cfg(test)]
thread_local! {
    /// Node plans [`NodePlans::look`] spared a search on this thread (tests count them).
    pub(crate) static SPARED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Searches a kept plan won on this thread (planned again on its node alone).
    pub(crate) static KEPT_WON: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
impl Looked {
    fn spared(&self, room: &[bool]) -> u64 {
        let on = room.iter().filter(|&&b| b).count();
        let unknown = self.unknown.iter().filter(|&&b| b).count();
        (on - unknown) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_core::TargetWorkload;
    use gpuplace_model::{NodeInventory, Request};

    fn state(nodes: usize) -> ClusterState {
        let inv: Vec<NodeInventory> = (0..nodes)
            .map(|i| NodeInventory::uniform(&format!("n{i}"), 8_000, 32_768, 2, "A100"))
            .collect();
        ClusterState::new(inv).expect("state")
    }

    fn ask(request: u32) -> SearchAsk {
        SearchAsk {
            request,
            priority: 2,
            queue: None,
        }
    }

    fn plan(node: usize, victims: u32) -> Preemption {
        let cost = Cost {
            victims,
            ..Cost::default()
        };
        Preemption {
            node,
            units: Vec::new(),
            gpus: Vec::new(),
            cost,
        }
    }

    #[test]
    fn a_node_is_planned_again_only_once_it_changes_and_the_cheapest_kept_is_told() {
        let mut st = state(4);
        let mut tallies = ByPriority::new(4);
        let mut plans = NodePlans::default();
        let room = [true, true, true, false];
        let first = plans.look(ask(1), &room, &st, &tallies);
        assert_eq!(first.unknown, room.to_vec());
        // Node 0: nothing; node 1: a plan of 2 victims (unsure: not kept); node 2: 1 victim.
        let found = [plan(1, 2), plan(2, 1)];
        plans.learn(ask(1), &room, &found, &[1]);
        let again = plans.look(ask(1), &room, &st, &tallies);
        assert_eq!(again.unknown, vec![false, true, false, false]);
        assert_eq!(again.spared(&room), 2);
        let one = Cost {
            victims: 1,
            ..Cost::default()
        };
        let node_2 = Ranked { cost: one, node: 2 };
        assert_eq!(again.best_kept, Some(node_2));
        // Another ask knows nothing.
        assert!(plans.look(ask(2), &room, &st, &tallies).unknown[0]);
        // Node 2's state changes, a pod starts on node 0: both are planned again.
        let r = Request {
            cpu_milli: 1_000,
            memory_mib: 1_024,
            gpu_count: 1,
            gpu_milli: 1_000,
            ..Request::default()
        };
        st.apply(2, &r, &[(0, 1000)]).expect("apply");
        tallies.started(0, 0, &r);
        let changed = plans.look(ask(1), &room, &st, &tallies);
        assert_eq!(changed.unknown, vec![true, true, true, false]);
        assert_eq!(changed.best_kept, None);
        // Another state value (a copy): everything is planned again.
        plans.learn(ask(1), &room, &[], &[]);
        assert!(!plans.look(ask(1), &room, &st, &tallies).any_unknown);
        let mut copy = st.clone();
        assert_eq!(
            plans.look(ask(1), &room, &copy, &tallies).unknown,
            room.to_vec()
        );
        // Another workload (fragmentation, in a plan's cost, is measured against it).
        plans.learn(ask(1), &room, &[], &[]);
        assert!(!plans.look(ask(1), &room, &copy, &tallies).any_unknown);
        let workload = TargetWorkload::from_requests([&r], 0.95);
        copy.set_workload(std::sync::Arc::new(workload));
        assert_eq!(
            plans.look(ask(1), &room, &copy, &tallies).unknown,
            room.to_vec()
        );
    }
}
