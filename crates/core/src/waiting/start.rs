//! When a waiting pod is expected to start: the line projected forward. The running pods
//! end at their expected ends (declared, else learnt: [`super::history`]), one after the
//! other on a copy of the cluster; after each end, the units ahead of the pod in the line
//! that now fit take their places (and end in turn after their expected run), then the pod
//! is tried. Played [`PLAYS`] times, each end drawn at random from its span (its 10th, 50th
//! and 90th percentile), and the pod is told the median of its starts, with the 10th to
//! 90th percentile as its spread (the drivers tell the range from how projections turned
//! out: [`super::history::RunHistory::calibrated`]): a pod that waits for the first of
//! many nodes to empty starts with the first of many uncertain ends, sooner than the first
//! of their medians.
//!
//! As the scheduler preempts, a unit that does not fit when a pod ends on a node takes that
//! node if evicting pods of lower priority there makes room (the lowest priority first,
//! then the latest started); the evicted pods free their places at once and are not
//! played again. Where no end makes room, the projection does not preempt: what could
//! preempt now the scheduler has (its nominee is told its victims' leaving, not a start).
//!
//! What the projection does not know it leaves out: a running pod with no expected end
//! never frees its place, a unit ahead with no expected run never ends. Bounded: at most
//! [`MAX_STEPS`] ends are played out per play (past them the start is unknown).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use gpuplace_model::Request;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::Start;
use crate::policy::Policy;
use crate::state::ClusterState;

/// Ends played out at most per play.
pub const MAX_STEPS: usize = 4_096;
/// Plays of the line, each with its own draw of every end.
pub const PLAYS: usize = 7;

/// Earliest, likeliest and latest: of a time (ms since the epoch) or of a duration (ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Span {
    pub earliest_ms: i64,
    pub at_ms: i64,
    pub latest_ms: i64,
}

impl Span {
    /// One value, no spread.
    pub fn exactly(ms: i64) -> Span {
        Span {
            earliest_ms: ms,
            at_ms: ms,
            latest_ms: ms,
        }
    }

    /// Every bound moved by `by`.
    pub fn shifted(self, by: i64) -> Span {
        Span {
            earliest_ms: self.earliest_ms + by,
            at_ms: self.at_ms + by,
            latest_ms: self.latest_ms + by,
        }
    }

    /// A draw from the span at quantile `u` (0..=1): through its 10th, 50th and 90th
    /// percentile, straight between them and a quarter of the neighbouring gap past them.
    fn draw(self, u: f64) -> i64 {
        let (e, m, l) = (
            self.earliest_ms as f64,
            self.at_ms as f64,
            self.latest_ms as f64,
        );
        let v = if u < 0.1 {
            e - (m - e) * (0.1 - u) / 0.4
        } else if u < 0.5 {
            e + (m - e) * (u - 0.1) / 0.4
        } else if u < 0.9 {
            m + (l - m) * (u - 0.5) / 0.4
        } else {
            l + (l - m) * (u - 0.9) / 0.4
        };
        v.round() as i64
    }

    /// Whether `ms` lies within the span.
    pub fn holds(&self, ms: i64) -> bool {
        self.earliest_ms <= ms && ms <= self.latest_ms
    }
}

/// A running pod: where it is, its priority (what may preempt it) and when it is expected
/// to end.
#[derive(Clone, Debug)]
pub struct Ending<'a> {
    pub node: usize,
    pub request: &'a Request,
    pub gpus: &'a [(usize, u32)],
    pub priority: i32,
    pub end: Span,
}

/// A unit of the line: what it asks, on which nodes (`None`: any), its priority (whom it
/// may preempt), and how long it is expected to run once started (`None`: unknown; it
/// never ends).
#[derive(Clone, Debug)]
pub struct Ahead<'a> {
    pub request: &'a Request,
    pub allowed: Option<&'a [bool]>,
    pub priority: i32,
    pub runs: Option<Span>,
}

/// When `pod` (its run is not read), behind `ahead` in the line, is expected to start on
/// `state` as the pods of `endings` end: a span (at `now_ms` when it fits already), or
/// unknown when nothing known frees a place of its shape.
pub fn project(
    state: &ClusterState,
    pod: Ahead<'_>,
    ahead: &[Ahead<'_>],
    endings: &[Ending<'_>],
    now_ms: i64,
) -> Start {
    let mut line = ahead.to_vec();
    line.push(Ahead { runs: None, ..pod });
    project_line(state, &line, endings, now_ms)
        .pop()
        .unwrap_or(Start::Unknown)
}

/// When each unit of `line` (in its order) is expected to start: the line projected
/// forward over `endings` [`PLAYS`] times, each end drawn from its span, and each unit's
/// starts read as their 10th, 50th and 90th percentile (unknown when fewer than half the
/// plays start it). A unit that does not fit when its turn comes is passed over (as the
/// scheduler passes over it), not waited for.
pub fn project_line(
    state: &ClusterState,
    line: &[Ahead<'_>],
    endings: &[Ending<'_>],
    now_ms: i64,
) -> Vec<Start> {
    // The lowest priority among the pods played: no unit of it preempts.
    let lowest = (endings.iter().map(|e| e.priority))
        .chain(line.iter().map(|a| a.priority))
        .min()
        .unwrap_or(0);
    let plays: Vec<Vec<Option<i64>>> = (0..PLAYS as u64)
        .map(|seed| play(state, line, endings, lowest, now_ms, seed))
        .collect();
    (0..line.len())
        .map(|u| {
            let mut starts: Vec<i64> = plays.iter().filter_map(|p| p[u]).collect();
            // Unknown when fewer than half the plays start it.
            if starts.len() * 2 < PLAYS {
                return Start::Unknown;
            }
            starts.sort_unstable();
            // Nearest ranks over every play, a play that never starts it counted last.
            let rank = |q: usize| starts[((PLAYS - 1) * q / 100).min(starts.len() - 1)];
            Start::At(Span {
                earliest_ms: rank(10),
                at_ms: rank(50),
                latest_ms: rank(90),
            })
        })
        .collect()
}

/// A place taken on the copy, to give back at its end.
struct Held<'a> {
    node: usize,
    request: &'a Request,
    /// A running pod's own (borrowed), or those a unit took on the copy.
    gpus: Cow<'a, [(usize, u32)]>,
    priority: i32,
    /// Ended, or evicted by a unit that preempted it: its place is free already.
    gone: bool,
}

/// Units of one shape (request, nodes and priority) not placed yet, in line order.
struct Shape<'a> {
    request: &'a Request,
    allowed: Option<&'a [bool]>,
    priority: i32,
    units: std::collections::VecDeque<usize>,
}

/// One play on a copy of the cluster.
struct Play<'a, 'r> {
    copy: ClusterState,
    rng: ChaCha8Rng,
    line: &'r [Ahead<'a>],
    shapes: Vec<Shape<'a>>,
    held: Vec<Held<'a>>,
    ends: BinaryHeap<Reverse<(i64, usize)>>,
    /// The play's draws of the ends.
    draws: ChaCha8Rng,
    /// When each unit started.
    started: Vec<Option<i64>>,
    /// [`Play::fill`]'s shapes by their next unit (kept to spare an allocation a fill).
    next: BinaryHeap<Reverse<(usize, usize)>>,
    /// The places held on each node (indices into `held`), for preemption.
    on_node: Vec<Vec<usize>>,
    /// The lowest priority among the pods played (no unit of it preempts).
    lowest: i32,
}

fn may(mask: Option<&[bool]>, n: usize) -> bool {
    mask.is_none_or(|m| m.get(n).copied().unwrap_or(false))
}

impl<'a> Play<'a, '_> {
    /// Unit `u` takes its place on node `n` at `t`, ending after its run.
    fn place(&mut self, n: usize, u: usize, t: i64) -> bool {
        let a = &self.line[u];
        let gpus = gpus_for(&self.copy, &mut self.rng, n, a.request);
        if self.copy.apply(n, a.request, &gpus).is_err() {
            return false;
        }
        if let Some(runs) = a.runs {
            let u = self.draws.random::<f64>();
            let end = t + runs.draw(u).max(0);
            self.ends.push(Reverse((end, self.held.len())));
        }
        self.on_node[n].push(self.held.len());
        self.held.push(Held {
            node: n,
            request: a.request,
            gpus: Cow::Owned(gpus),
            priority: a.priority,
            gone: false,
        });
        self.started[u] = Some(t);
        true
    }

    /// Where shape `s`'s next unit fits: on node `only`, else the first node.
    fn fits(&self, s: usize, only: Option<usize>) -> Option<usize> {
        let shape = &self.shapes[s];
        let ok = |n: usize| may(shape.allowed, n) && self.copy.fit(n, shape.request).is_ok();
        match only {
            Some(n) => ok(n).then_some(n),
            None => (0..self.copy.len()).find(|&n| ok(n)),
        }
    }

    /// The units that fit (on node `only`, else anywhere) take their places at `t`, the
    /// earliest in line first. A shape that does not fit stays out until the next end
    /// (placing only takes room).
    fn fill(&mut self, only: Option<usize>, t: i64) {
        let mut next = std::mem::take(&mut self.next);
        next.clear();
        next.extend(
            (self.shapes.iter().enumerate())
                .filter_map(|(s, shape)| shape.units.front().map(|&u| Reverse((u, s)))),
        );
        while let Some(Reverse((u, s))) = next.pop() {
            // A shape that does not fit is not pushed again: it stays out.
            let placed = match self.fits(s, only) {
                Some(n) => self.place(n, u, t),
                None => only.is_some_and(|n| self.preempt(n, s, u, t)),
            };
            if placed {
                self.shapes[s].units.pop_front();
                if let Some(&v) = self.shapes[s].units.front() {
                    next.push(Reverse((v, s)));
                }
            }
        }
        self.next = next;
    }

    /// Unit `u` of shape `s` takes node `n` at `t` by evicting pods of lower priority there
    /// (the lowest priority first, then the latest placed) until it fits; nothing is
    /// evicted when even all of them would not make room.
    fn preempt(&mut self, n: usize, s: usize, u: usize, t: i64) -> bool {
        let shape = &self.shapes[s];
        let (priority, request) = (shape.priority, shape.request);
        if priority <= self.lowest || !may(shape.allowed, n) {
            return false;
        }
        let held = &self.held;
        let mut victims: Vec<usize> = (self.on_node[n].iter().copied())
            .filter(|&h| !held[h].gone && held[h].priority < priority)
            .collect();
        victims.sort_unstable_by_key(|&h| (held[h].priority, Reverse(h)));
        let mut taken = 0;
        let mut fits = false;
        for &h in &victims {
            let v = &self.held[h];
            if self.copy.release(n, v.request, &v.gpus).is_err() {
                break;
            }
            taken += 1;
            if self.copy.fit(n, request).is_ok() {
                fits = true;
                break;
            }
        }
        if fits && self.place(n, u, t) {
            for &h in &victims[..taken] {
                self.held[h].gone = true;
            }
            self.on_node[n].retain(|&h| !self.held[h].gone);
            return true;
        }
        // Given back as they were.
        for &h in victims[..taken].iter().rev() {
            let v = &self.held[h];
            let _ = self.copy.apply(n, v.request, &v.gpus);
        }
        false
    }

    fn done(&self) -> bool {
        self.shapes.iter().all(|s| s.units.is_empty())
    }
}

/// The units of `line` by shape (request, nodes and priority), each in line order.
fn shapes_of<'a>(line: &[Ahead<'a>]) -> Vec<Shape<'a>> {
    let mut shapes: Vec<Shape<'a>> = Vec::new();
    for (u, a) in line.iter().enumerate() {
        match shapes
            .iter_mut()
            .find(|s| s.request == a.request && s.allowed == a.allowed && s.priority == a.priority)
        {
            Some(s) => s.units.push_back(u),
            None => shapes.push(Shape {
                request: a.request,
                allowed: a.allowed,
                priority: a.priority,
                units: [u].into(),
            }),
        }
    }
    shapes
}

/// One play (its draws seeded by `seed`; no unit of priority `lowest` preempts): when each
/// unit starts (`None`: not within what is known).
fn play<'a>(
    state: &ClusterState,
    line: &[Ahead<'a>],
    endings: &[Ending<'a>],
    lowest: i32,
    now_ms: i64,
    seed: u64,
) -> Vec<Option<i64>> {
    let mut draws = ChaCha8Rng::seed_from_u64(seed);
    let shapes = shapes_of(line);
    let mut on_node = vec![Vec::new(); state.len()];
    for (i, e) in endings.iter().enumerate() {
        if let Some(list) = on_node.get_mut(e.node) {
            list.push(i);
        }
    }
    let mut play = Play {
        copy: state.unmeasured_copy(),
        rng: ChaCha8Rng::seed_from_u64(0),
        line,
        shapes,
        held: endings
            .iter()
            .map(|e| Held {
                node: e.node,
                request: e.request,
                gpus: Cow::Borrowed(e.gpus),
                priority: e.priority,
                gone: false,
            })
            .collect(),
        ends: endings
            .iter()
            .enumerate()
            .map(|(i, e)| Reverse((e.end.draw(draws.random::<f64>()).max(now_ms), i)))
            .collect(),
        draws,
        started: vec![None; line.len()],
        next: BinaryHeap::new(),
        on_node,
        lowest,
    };
    let mut t = now_ms;
    play.fill(None, t);
    for _ in 0..MAX_STEPS {
        if play.done() {
            break;
        }
        let Some(Reverse((at, i))) = play.ends.pop() else {
            break;
        };
        t = t.max(at);
        let h = &play.held[i];
        if h.gone {
            // Evicted before its end: its place was freed then.
            continue;
        }
        let n = h.node;
        if play.copy.release(n, h.request, &h.gpus).is_ok() {
            play.held[i].gone = true;
            if let Some(list) = play.on_node.get_mut(n) {
                list.retain(|&h| h != i);
            }
            // Only node `n` changed.
            play.fill(Some(n), t);
        }
    }
    play.started
}

/// The GPUs a unit ahead takes on node `n` (best-fit's, as the projection needs only
/// where room goes, not which policy would place it).
fn gpus_for(
    state: &ClusterState,
    rng: &mut ChaCha8Rng,
    n: usize,
    request: &Request,
) -> Vec<(usize, u32)> {
    let hint = crate::devices::first_fitting(state.node(n), request.gpu_milli) as u32;
    crate::devices::choose_gpus(Policy::BestFit, rng, state, n, request, hint)
}
