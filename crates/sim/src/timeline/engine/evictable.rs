//! What running pods hold by priority, cluster-wide and per node, so that preemption can
//! tell at once that no eviction could make room (core's [`preempt::room_possible`] on
//! each node with what pods of lower priority hold there): the victim search runs only
//! where some node passes. A failed attempt of a high-priority pod otherwise grouped every
//! running pod (thousands) for a search that could not succeed, attempt after attempt.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuplace_core::ClusterState;
use gpuplace_core::preempt::{self, Amounts, amounts_of};
use gpuplace_model::Request;

/// Where evictions could make room for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// On no node: no victim search.
    Nowhere,
    /// Possibly on any node (a pod asking no GPU): the search looks at every candidate.
    Anywhere,
    /// On the nodes marked (at least one): candidates elsewhere cannot help.
    On(Arc<[bool]>),
}

impl Room {
    /// Whether evictions could make room anywhere.
    pub(super) fn possible(&self) -> bool {
        *self != Room::Nowhere
    }

    /// Whether node `n`'s pods may be victims that help.
    pub(super) fn on(&self, n: usize) -> bool {
        match self {
            Room::Nowhere => false,
            Room::Anywhere => true,
            Room::On(nodes) => nodes.get(n).copied().unwrap_or(false),
        }
    }
}

/// Running pods by priority.
#[derive(Debug, Default)]
pub(super) struct ByPriority {
    /// Running pods per priority.
    pods: BTreeMap<i32, usize>,
    /// Per node, what running pods hold per priority (few levels: a short list).
    held: Vec<Vec<(i32, Amounts)>>,
    /// Bumped on every change of the above.
    generation: u64,
    /// Answers of [`Self::room`] for the state and tallies of `memo_key`
    /// (the state's identity and journal length, this generation): a round's failed
    /// attempts ask again and again while nothing changes.
    memo_key: (u64, usize, u64),
    memo: Vec<Answer>,
}

/// One answer of [`ByPriority::room`]: for a priority, a request's amounts and the
/// models it allows.
#[derive(Debug)]
struct Answer {
    priority: i32,
    need: Amounts,
    models: Vec<String>,
    room: Room,
}

impl ByPriority {
    pub(super) fn new(nodes: usize) -> ByPriority {
        ByPriority {
            pods: BTreeMap::new(),
            held: vec![Vec::new(); nodes],
            ..ByPriority::default()
        }
    }

    /// A pod of `priority` asking `request` started on `node`.
    pub(super) fn started(&mut self, node: usize, priority: i32, request: &Request) {
        *self.pods.entry(priority).or_default() += 1;
        self.generation += 1;
        let add = amounts_of(request);
        if let Some(levels) = self.held.get_mut(node) {
            match levels.iter_mut().find(|(p, _)| *p == priority) {
                Some((_, held)) => {
                    for (h, a) in held.iter_mut().zip(add) {
                        *h += a;
                    }
                }
                None => levels.push((priority, add)),
            }
        }
    }

    /// A pod that [`Self::started`] so left.
    pub(super) fn left(&mut self, node: usize, priority: i32, request: &Request) {
        if let Some(count) = self.pods.get_mut(&priority) {
            *count = count.saturating_sub(1);
        }
        self.generation += 1;
        let sub = amounts_of(request);
        if let Some(levels) = self.held.get_mut(node)
            && let Some((_, held)) = levels.iter_mut().find(|(p, _)| *p == priority)
        {
            for (h, s) in held.iter_mut().zip(sub) {
                *h = h.saturating_sub(s);
            }
        }
    }

    /// Whether no running pod is below `priority`.
    pub(super) fn none_below(&self, priority: i32) -> bool {
        self.pods.range(..priority).all(|(_, n)| *n == 0)
    }

    /// The nodes that could take `request` once pods below `priority` on them are gone
    /// (core's [`preempt::room_possible`]; a pod asking no GPU: anywhere).
    pub(super) fn room(&mut self, state: &ClusterState, priority: i32, request: &Request) -> Room {
        let need = amounts_of(request);
        if need[0] == 0 {
            return Room::Anywhere;
        }
        let key = (state.instance(), state.journal_len(), self.generation);
        if key != self.memo_key {
            self.memo_key = key;
            self.memo.clear();
        }
        if let Some(known) = self.memo.iter().find(|a| {
            a.priority == priority && a.need == need && a.models == request.allowed_models
        }) {
            return known.room.clone();
        }
        let nodes: Vec<bool> = self
            .held
            .iter()
            .enumerate()
            .map(|(n, levels)| {
                let mut below = [0u64; 3];
                for (_, held) in levels.iter().filter(|(p, _)| *p < priority) {
                    for (b, h) in below.iter_mut().zip(held) {
                        *b += h;
                    }
                }
                preempt::room_possible(state, n, &below, request)
            })
            .collect();
        let room = if nodes.contains(&true) {
            Room::On(nodes.into())
        } else {
            Room::Nowhere
        };
        self.memo.push(Answer {
            priority,
            need,
            models: request.allowed_models.clone(),
            room: room.clone(),
        });
        room
    }

    /// Bumped whenever a pod starts or leaves.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

/// Victim searches of pods alone that found nothing, while nothing they read changed:
/// the state (its identity and journal), the running pods (their generation) and the time
/// (a pod decided becomes a candidate once its Binding lands). A round's failed attempts
/// of pods of one request search again and again for the same nothing.
#[derive(Debug, Default)]
pub(super) struct FailedSearches {
    key: (u64, usize, u64, u64),
    /// (request id, priority, queue when the queues serve).
    asks: Vec<(u32, i32, Option<usize>)>,
}

impl FailedSearches {
    /// Whether the search for `ask` found nothing under `key` (forgetting every answer
    /// when the key moved on).
    pub(super) fn known(
        &mut self,
        key: (u64, usize, u64, u64),
        ask: (u32, i32, Option<usize>),
    ) -> bool {
        if key != self.key {
            self.key = key;
            self.asks.clear();
        }
        self.asks.contains(&ask)
    }

    /// The search for `ask` found nothing under the key [`Self::known`] was last asked.
    pub(super) fn failed(&mut self, ask: (u32, i32, Option<usize>)) {
        self.asks.push(ask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::NodeInventory;

    fn asking(gpus: u32, cpu_milli: u64) -> Request {
        Request {
            cpu_milli,
            memory_mib: 1_000,
            gpu_count: gpus,
            gpu_milli: 1_000,
            ..Request::default()
        }
    }

    #[test]
    fn room_is_possible_only_where_lower_pods_and_free_resources_cover_the_request() {
        let nodes = vec![
            NodeInventory::uniform("a", 64_000, 1 << 20, 8, "V100"),
            NodeInventory::uniform("b", 64_000, 1 << 20, 8, "V100"),
        ];
        let state = ClusterState::new(nodes).expect("state");
        let mut by = ByPriority::new(2);
        assert!(by.none_below(5));
        // Node a: 4 GPUs and 8 cores of priority 0 (the state itself left all free here).
        let low = asking(4, 8_000);
        by.started(0, 0, &low);
        assert!(!by.none_below(1));
        assert!(by.none_below(0));
        let room = by.room(&state, 1, &asking(12, 1_000));
        assert!(room.possible());
        assert!(room.on(0) && !room.on(1), "nothing evictable on b");
        assert!(
            !by.room(&state, 0, &asking(1, 1_000)).possible(),
            "none below 0"
        );
        assert!(!by.room(&state, 1, &asking(13, 1_000)).possible());
        assert!(by.room(&state, 1, &asking(1, 72_000)).possible());
        assert!(
            !by.room(&state, 1, &asking(1, 72_001)).possible(),
            "CPU short"
        );
        by.left(0, 0, &low);
        assert!(by.none_below(1));
        assert!(!by.room(&state, 1, &asking(1, 1_000)).possible());
        assert!(by.room(&state, 1, &asking(0, 1_000)).possible());
        // A pod that allows only another model: no node could take it.
        by.started(1, 0, &low);
        let mut a100 = asking(1, 1_000);
        a100.allowed_models = vec!["A100".into()];
        assert!(!by.room(&state, 1, &a100).possible());
        a100.allowed_models.push("V100".into());
        assert!(by.room(&state, 1, &a100).possible());
    }

    #[test]
    fn a_pod_short_of_cpu_may_make_room_by_evicting_a_cpu_only_pod() {
        let nodes = vec![NodeInventory::uniform("a", 64_000, 1 << 20, 8, "V100")];
        let state = ClusterState::new(nodes).expect("state");
        let mut by = ByPriority::new(1);
        let wide = asking(1, 72_000);
        assert!(!by.room(&state, 1, &wide).possible());
        // A CPU-only pod of priority 0 holds 8 cores: evicting it could make room.
        by.started(0, 0, &asking(0, 8_000));
        assert!(by.room(&state, 1, &wide).possible());
    }
}
