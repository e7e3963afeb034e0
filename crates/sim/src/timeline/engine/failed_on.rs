//! Victim searches of pods alone that found nothing, remembered node by node: where the
//! search for an ask (request, priority, queue) found no victims that make room, it finds
//! none again until something there changes. A single pod's search judges each node on
//! that node alone (its candidates, its terminating pods, its free devices; core's
//! [`gpuplace_core::preempt::find`] draws no random numbers for a pod alone), so a
//! search need look only at the nodes that changed since. Under a backlog a pod waiting
//! for room searched every node again at each retry, though a round changes a few: that
//! was most of a preempting replay's time.
//!
//! A node is changed when the state's journal or the running pods' tallies name it
//! ([`ByPriority::changed_since`]). What a node's answer reads beyond them is kept out:
//! a node holding a member of a unit with members elsewhere, or a pod whose Binding has
//! not landed ([`Groups::unsure`]), is not remembered.

use gpuplace_core::ClusterState;

use super::evictable::{ByPriority, Marks, SearchAsk};

/// Asks remembered at most (each one flag per node).
const ASKS_MAX: usize = 1_024;

/// The nodes where searches found nothing, per ask.
#[derive(Debug, Default)]
pub(super) struct FailedOn {
    asks: Vec<Remembered>,
}

#[cfg(test)]
thread_local! {
    /// Nodes [`FailedOn::narrow`] spared a search on this thread (tests count them).
    pub(crate) static SKIPPED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What [`FailedOn::narrow`] leaves of a search's nodes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Narrowed {
    /// Every node it was given.
    All,
    /// Those marked.
    To(Vec<bool>),
    /// None: the search found nothing on each since it last changed.
    Nothing,
}

/// One ask's failed nodes, as of its marks.
#[derive(Debug)]
struct Remembered {
    ask: SearchAsk,
    failed: Vec<bool>,
    count: usize,
    marks: Marks,
}

impl FailedOn {
    /// The nodes of `room` where the search for `ask` may find victims: those it has not
    /// failed on since they last changed.
    pub(super) fn narrow(
        &mut self,
        ask: SearchAsk,
        room: &[bool],
        state: &ClusterState,
        tallies: &ByPriority,
    ) -> Narrowed {
        let Some(i) = self.asks.iter().position(|r| r.ask == ask) else {
            return Narrowed::All;
        };
        let r = &mut self.asks[i];
        match tallies.changed_since(state, r.marks) {
            Some(changed) => {
                for n in changed {
                    if let Some(f) = r.failed.get_mut(n as usize)
                        && *f
                    {
                        *f = false;
                        r.count -= 1;
                    }
                }
                r.marks = tallies.marks(state);
            }
            None => {
                self.asks.swap_remove(i);
                return Narrowed::All;
            }
        }
        if r.count == 0 {
            return Narrowed::All;
        }
        let nodes: Vec<bool> = (room.iter().zip(&r.failed))
            .map(|(&on, &failed)| on & !failed)
            .collect();
        // Counted as numbers (a search for the first `true` was a tenth of a replay).
        let left = nodes.iter().map(|&on| usize::from(on)).sum::<usize>();
        #[cfg(test)]
        SKIPPED.with(|s| {
            let given = room.iter().filter(|&&on| on).count();
            s.set(s.get() + (given - left) as u64);
        });
        match left {
            0 => Narrowed::Nothing,
            _ => Narrowed::To(nodes),
        }
    }

    /// The search for `ask` over `searched` (the nodes it looked at) found nothing;
    /// `unsure` lists nodes whose answer reads more than their own changes.
    pub(super) fn failed(
        &mut self,
        ask: SearchAsk,
        searched: &[bool],
        unsure: &[u32],
        state: &ClusterState,
        tallies: &ByPriority,
    ) {
        let marks = tallies.marks(state);
        let i = match self.asks.iter().position(|r| r.ask == ask) {
            Some(i) => i,
            None => {
                if self.asks.len() >= ASKS_MAX {
                    self.asks.clear();
                }
                self.asks.push(Remembered {
                    ask,
                    failed: vec![false; searched.len()],
                    count: 0,
                    marks,
                });
                self.asks.len() - 1
            }
        };
        let r = &mut self.asks[i];
        r.marks = marks;
        for (f, &s) in r.failed.iter_mut().zip(searched) {
            if s && !*f {
                *f = true;
                r.count += 1;
            }
        }
        for &n in unsure {
            if let Some(f) = r.failed.get_mut(n as usize)
                && *f
            {
                *f = false;
                r.count -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn a_failed_node_is_skipped_until_it_changes_and_unsure_nodes_are_not_kept() {
        let mut st = state(4);
        let mut tallies = ByPriority::new(4);
        let mut memo = FailedOn::default();
        let room = [true, true, true, false];
        assert_eq!(memo.narrow(ask(1), &room, &st, &tallies), Narrowed::All);
        memo.failed(ask(1), &room, &[1], &st, &tallies);
        assert_eq!(
            memo.narrow(ask(1), &room, &st, &tallies),
            Narrowed::To(vec![false, true, false, false]),
            "node 1 was unsure"
        );
        // Another ask knows nothing.
        assert_eq!(memo.narrow(ask(2), &room, &st, &tallies), Narrowed::All);
        // A change of node 0's state, and a pod starting on node 2, bring them back.
        let one = Request {
            cpu_milli: 1_000,
            memory_mib: 1_024,
            gpu_count: 1,
            gpu_milli: 1_000,
            ..Request::default()
        };
        st.apply(0, &one, &[(0, 1000)]).expect("apply");
        tallies.started(2, 0, &one);
        assert_eq!(memo.narrow(ask(1), &room, &st, &tallies), Narrowed::All);
        memo.failed(ask(1), &room, &[], &st, &tallies);
        assert_eq!(memo.narrow(ask(1), &room, &st, &tallies), Narrowed::Nothing);
        // Another state value (a copy): everything is looked at again.
        let copy = st.clone();
        assert_eq!(memo.narrow(ask(1), &room, &copy, &tallies), Narrowed::All);
    }
}
