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
    #[cfg(test)]
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
    /// Per node, what leaving pods offered as room that frees itself hold per priority
    /// (the room check counts them, a departure's wake-up does not, as the scheduler's).
    freeing: Vec<Vec<(i32, Amounts)>>,
    /// Bumped on every change of the above.
    generation: u64,
    /// The nodes whose tallies changed, in order (cleared past [`CHANGES_MAX`], with
    /// `epoch` bumped: every answer is then made again).
    changed: Vec<u32>,
    epoch: u64,
    /// Answers of [`Self::room`], each kept up to date by looking again only at the nodes
    /// that changed since it was last asked (in the state's journal or in `changed`): a
    /// state changes between most attempts, and looking at every node each time was half
    /// of a replay's time.
    answers: Vec<Answer>,
    /// Where each answer is in `answers`, by priority, amounts and a hash of the models (a
    /// scan of the answers, comparing their models, was a fourth of this check's time at
    /// load 1.2: fgd, seed 42, `perf`).
    index: std::collections::HashMap<AnswerKey, usize, foldhash::fast::FixedState>,
    /// A refresh looks at a node changed many times since its answer was last asked once.
    looked: super::once::OncePerPass,
}

/// An answer's place in [`ByPriority::index`]: its priority, the request's amounts and a
/// hash of the models it allows (a hit is checked against the answer itself).
type AnswerKey = (i32, Amounts, u64);

fn answer_key(priority: i32, need: Amounts, models: &[String]) -> AnswerKey {
    use std::hash::BuildHasher;
    let models = if models.is_empty() {
        0
    } else {
        foldhash::fast::FixedState::default().hash_one(models)
    };
    (priority, need, models)
}

/// Tally changes kept before the answers are made again from scratch.
const CHANGES_MAX: usize = 1 << 20;

/// Answers kept at most (one per priority, request amounts and models asked).
const ANSWERS_MAX: usize = 4_096;

/// One answer of [`ByPriority::room`]: for a priority, a request's amounts and the
/// models it allows, per node, as of the marks.
#[derive(Debug)]
struct Answer {
    priority: i32,
    need: Amounts,
    models: Vec<String>,
    /// Per node, whether room is possible there; how many nodes pass.
    nodes: Vec<bool>,
    passing: usize,
    /// `nodes` shared with the callers, made again when a node's answer changed.
    shared: Option<Arc<[bool]>>,
    /// How far the answer is up to date with the state and the tallies.
    marks: Marks,
}

/// How far an answer is up to date: a log (the state's journal, the tallies' `changed`)
/// in one life of it (the state's identity, the tallies' epoch), and how much of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    life: u64,
    read: usize,
}

/// An answer's [`Mark`]s on the state and on the tallies.
#[derive(Clone, Copy, Debug)]
pub(super) struct Marks {
    state: Mark,
    tallies: Mark,
}

impl ByPriority {
    pub(super) fn new(nodes: usize) -> ByPriority {
        ByPriority {
            pods: BTreeMap::new(),
            held: vec![Vec::new(); nodes],
            freeing: vec![Vec::new(); nodes],
            ..ByPriority::default()
        }
    }

    /// A pod of `priority` asking `request` started on `node`.
    pub(super) fn started(&mut self, node: usize, priority: i32, request: &Request) {
        self.count(node, priority, true);
        add(&mut self.held, node, priority, amounts_of(request));
    }

    /// A pod that [`Self::started`] so left.
    pub(super) fn left(&mut self, node: usize, priority: i32, request: &Request) {
        self.count(node, priority, false);
        sub(&mut self.held, node, priority, amounts_of(request));
    }

    /// A leaving pod's place (`amounts` on `node`, of its pod's `priority`) is offered to
    /// the victim search as room that frees itself (`true`), or no longer (`false`): the
    /// room check counts it as a pod of that priority there.
    pub(super) fn freeing(&mut self, node: usize, priority: i32, amounts: Amounts, on: bool) {
        self.count(node, priority, on);
        if on {
            add(&mut self.freeing, node, priority, amounts);
        } else {
            sub(&mut self.freeing, node, priority, amounts);
        }
    }

    /// One more (`true`) or one fewer pod of `priority` on `node`.
    fn count(&mut self, node: usize, priority: i32, more: bool) {
        let count = self.pods.entry(priority).or_default();
        *count = if more {
            *count + 1
        } else {
            count.saturating_sub(1)
        };
        self.note_change(node);
    }

    /// What running pods below `priority` hold on node `n`.
    pub(super) fn below(&self, n: usize, priority: i32) -> Amounts {
        sum_below(&self.held[n], priority)
    }

    /// Whether no running pod is below `priority`.
    pub(super) fn none_below(&self, priority: i32) -> bool {
        self.pods.range(..priority).all(|(_, n)| *n == 0)
    }

    fn note_change(&mut self, node: usize) {
        self.generation += 1;
        if self.changed.len() >= CHANGES_MAX {
            self.changed.clear();
            self.epoch += 1;
        }
        self.changed.push(node as u32);
    }

    /// Whether room is possible on node `n` for `request` once pods below `priority` there
    /// are gone (core's [`preempt::room_possible`]).
    fn possible_on(
        &self,
        state: &ClusterState,
        n: usize,
        priority: i32,
        request: &Request,
    ) -> bool {
        let mut below = self.below(n, priority);
        for (b, f) in below.iter_mut().zip(sum_below(&self.freeing[n], priority)) {
            *b += f;
        }
        preempt::room_possible(state, n, &below, request)
    }

    /// The nodes that could take `request` once pods below `priority` on them are gone
    /// (core's [`preempt::room_possible`]; a pod asking no GPU: anywhere).
    pub(super) fn room(&mut self, state: &ClusterState, priority: i32, request: &Request) -> Room {
        let need = amounts_of(request);
        if need[0] == 0 {
            return Room::Anywhere;
        }
        let marks = self.marks(state);
        let key = answer_key(priority, need, &request.allowed_models);
        let found = self.index.get(&key).copied().filter(|&i| {
            self.answers.get(i).is_some_and(|a| {
                a.priority == priority && a.need == need && a.models == request.allowed_models
            })
        });
        let i = match found {
            Some(i)
                if self.answers[i].marks.state.life == marks.state.life
                    && self.answers[i].marks.tallies.life == marks.tallies.life =>
            {
                self.refresh(i, state, request);
                i
            }
            _ => {
                if let Some(i) = found {
                    self.forget_answer(i);
                }
                if self.answers.len() >= ANSWERS_MAX {
                    self.answers.clear();
                    self.index.clear();
                }
                let nodes: Vec<bool> = (0..self.held.len())
                    .map(|n| self.possible_on(state, n, priority, request))
                    .collect();
                self.answers.push(Answer {
                    priority,
                    need,
                    models: request.allowed_models.clone(),
                    passing: nodes.iter().filter(|&&p| p).count(),
                    nodes,
                    shared: None,
                    marks,
                });
                self.index.insert(key, self.answers.len() - 1);
                self.answers.len() - 1
            }
        };
        let answer = &mut self.answers[i];
        if answer.passing == 0 {
            return Room::Nowhere;
        }
        let shared = answer
            .shared
            .get_or_insert_with(|| Arc::from(answer.nodes.as_slice()));
        Room::On(Arc::clone(shared))
    }

    /// Takes answer `i` out (the last answer takes its place, and its index entry with it).
    fn forget_answer(&mut self, i: usize) {
        let last = self.answers.len() - 1;
        self.answers.swap_remove(i);
        if let Some(moved) = self.answers.get(i) {
            let key = answer_key(moved.priority, moved.need, &moved.models);
            if self.index.get(&key) == Some(&last) {
                self.index.insert(key, i);
            }
        }
    }

    /// Brings answer `i` up to date: only the nodes changed since its marks are looked at
    /// again.
    fn refresh(&mut self, i: usize, state: &ClusterState, request: &Request) {
        let priority = self.answers[i].priority;
        let mut looked = std::mem::take(&mut self.looked);
        looked.begin(self.held.len());
        let nodes: Vec<u32> = match self.changed_since(state, self.answers[i].marks) {
            Some(changed) => changed.filter(|&n| looked.first(n as usize)).collect(),
            None => (0..self.held.len() as u32).collect(),
        };
        self.looked = looked;
        for n in nodes {
            let n = n as usize;
            if n >= self.held.len() {
                continue;
            }
            let now = self.possible_on(state, n, priority, request);
            let answer = &mut self.answers[i];
            if answer.nodes[n] != now {
                answer.nodes[n] = now;
                if now {
                    answer.passing += 1;
                } else {
                    answer.passing -= 1;
                }
                answer.shared = None;
            }
        }
        self.answers[i].marks = self.marks(state);
    }

    /// Where the state's journal and the tallies' changes stand now.
    pub(super) fn marks(&self, state: &ClusterState) -> Marks {
        Marks {
            state: Mark {
                life: state.instance(),
                read: state.journal_len(),
            },
            tallies: Mark {
                life: self.epoch,
                read: self.changed.len(),
            },
        }
    }

    /// The nodes whose state or tallies changed since `marks` (repeats possible), or
    /// `None` when either log began again since (every node may have changed).
    pub(super) fn changed_since<'s>(
        &'s self,
        state: &'s ClusterState,
        marks: Marks,
    ) -> Option<impl Iterator<Item = u32> + 's> {
        let now = self.marks(state);
        let same_lives =
            now.state.life == marks.state.life && now.tallies.life == marks.tallies.life;
        (same_lives && marks.state.read <= now.state.read && marks.tallies.read <= now.tallies.read)
            .then(|| {
                (state.changes_since(marks.state.read).iter())
                    .chain(self.changed.get(marks.tallies.read..).unwrap_or(&[]))
                    .copied()
            })
    }

    /// Bumped whenever a pod starts or leaves.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

/// Adds `amounts` of `priority` to node `node`'s levels in `levels`.
fn add(levels: &mut [Vec<(i32, Amounts)>], node: usize, priority: i32, amounts: Amounts) {
    let Some(levels) = levels.get_mut(node) else {
        return;
    };
    match levels.iter_mut().find(|(p, _)| *p == priority) {
        Some((_, held)) => {
            for (h, a) in held.iter_mut().zip(amounts) {
                *h += a;
            }
        }
        None => levels.push((priority, amounts)),
    }
}

/// Takes `amounts` of `priority` off node `node`'s levels in `levels`.
fn sub(levels: &mut [Vec<(i32, Amounts)>], node: usize, priority: i32, amounts: Amounts) {
    if let Some(levels) = levels.get_mut(node)
        && let Some((_, held)) = levels.iter_mut().find(|(p, _)| *p == priority)
    {
        for (h, s) in held.iter_mut().zip(amounts) {
            *h = h.saturating_sub(s);
        }
    }
}

/// What `levels` hold below `priority`.
fn sum_below(levels: &[(i32, Amounts)], priority: i32) -> Amounts {
    let mut below = [0u64; 3];
    for (_, held) in levels.iter().filter(|(p, _)| *p < priority) {
        for (b, h) in below.iter_mut().zip(held) {
            *b += h;
        }
    }
    below
}

/// Reclaim's victim searches of pods alone that found nothing, while nothing they read
/// changed: the state (its identity and journal), the running pods (their generation),
/// the time (a pod decided becomes a candidate once its Binding lands) and the queues'
/// standing (`E`: what each holds, which says whom a queue may take from). A round's
/// failed attempts of pods of one request search again and again for the same nothing.
/// (Preemption's plans are kept node by node: [`super::node_plans`].)
#[derive(Debug, Default)]
pub(super) struct FailedSearches<E> {
    at: SearchedAt,
    standing: E,
    asks: Vec<SearchAsk>,
}

/// What a victim search read besides its ask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SearchedAt {
    pub(super) state: u64,
    pub(super) journal: usize,
    pub(super) running: u64,
    pub(super) now_ms: u64,
}

/// Whom a victim search was for: its request, its priority and its queue when the queues
/// serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SearchAsk {
    pub(super) request: u32,
    pub(super) priority: i32,
    pub(super) queue: Option<usize>,
}

impl<E> FailedSearches<E> {
    /// Whether the search for `ask` found nothing at `at` with `standing` (forgetting
    /// every answer when either moved on).
    pub(super) fn known_with<S>(&mut self, at: SearchedAt, standing: &S, ask: SearchAsk) -> bool
    where
        S: ToOwned<Owned = E> + ?Sized,
        E: PartialEq<S>,
    {
        if at != self.at || self.standing != *standing {
            self.at = at;
            self.standing = standing.to_owned();
            self.asks.clear();
        }
        self.asks.contains(&ask)
    }

    /// The search for `ask` found nothing where [`Self::known_with`] was last asked.
    pub(super) fn failed(&mut self, ask: SearchAsk) {
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

    #[test]
    fn an_answer_follows_the_states_changes_and_the_tallies() {
        let nodes = vec![
            NodeInventory::uniform("a", 64_000, 1 << 20, 8, "V100"),
            NodeInventory::uniform("b", 64_000, 1 << 20, 8, "V100"),
        ];
        let mut state = ClusterState::new(nodes).expect("state");
        let mut by = ByPriority::new(2);
        by.started(0, 0, &asking(4, 8_000));
        let wide = asking(12, 1_000);
        assert!(by.room(&state, 1, &wide).on(0));
        // A GPU taken on a (in the state alone): 4 evictable and 7 free fall short.
        state
            .apply(0, &asking(1, 1_000), &[(7, 1_000)])
            .expect("apply");
        assert_eq!(by.room(&state, 1, &wide), Room::Nowhere);
        // Low pods on b: room there, asked again without the state changing.
        by.started(1, 0, &asking(4, 1_000));
        let room = by.room(&state, 1, &wide);
        assert!(!room.on(0) && room.on(1));
        // The same as an answer made from scratch.
        let mut fresh = ByPriority::new(2);
        fresh.started(0, 0, &asking(4, 8_000));
        fresh.started(1, 0, &asking(4, 1_000));
        assert_eq!(fresh.room(&state, 1, &wide), room);
    }

    /// Seeded stress: answers kept up to date through many changes (each node looked at
    /// once however often it changed) equal answers made from scratch.
    #[test]
    fn kept_answers_equal_answers_made_from_scratch() {
        use rand::{RngExt, SeedableRng};
        let nodes: Vec<NodeInventory> = (0..6)
            .map(|i| NodeInventory::uniform(&format!("n{i}"), 32_000, 1 << 18, 4, "V100"))
            .collect();
        let mut compared = 0;
        for seed in 0..60u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut state = ClusterState::new(nodes.clone()).expect("state");
            let mut by = ByPriority::new(nodes.len());
            let mut running: Vec<(usize, i32, Request)> = Vec::new();
            // GPUs taken in the state alone: (node, the GPU).
            let mut taken: Vec<(usize, usize)> = Vec::new();
            for _ in 0..400 {
                match rng.random_range(0..5) {
                    0 => {
                        let r = asking(rng.random_range(0..3), 1_000 * rng.random_range(0..9));
                        let (n, p) = (rng.random_range(0..nodes.len()), rng.random_range(0..3));
                        by.started(n, p, &r);
                        running.push((n, p, r));
                    }
                    1 if !running.is_empty() => {
                        let (n, p, r) = running.swap_remove(rng.random_range(0..running.len()));
                        by.left(n, p, &r);
                    }
                    2 => {
                        let n = rng.random_range(0..nodes.len());
                        let g = rng.random_range(0..4);
                        if state.apply(n, &asking(1, 2_000), &[(g, 1_000)]).is_ok() {
                            taken.push((n, g));
                        }
                    }
                    3 if !taken.is_empty() => {
                        let (n, g) = taken.swap_remove(rng.random_range(0..taken.len()));
                        state
                            .release(n, &asking(1, 2_000), &[(g, 1_000)])
                            .expect("release");
                    }
                    _ => {
                        let request = asking(rng.random_range(1..6), 4_000);
                        let priority = rng.random_range(1..4);
                        let kept = by.room(&state, priority, &request);
                        let mut fresh = ByPriority::new(nodes.len());
                        for (n, p, r) in &running {
                            fresh.started(*n, *p, r);
                        }
                        assert_eq!(kept, fresh.room(&state, priority, &request), "seed {seed}");
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 4_000, "{compared}");
    }
}
