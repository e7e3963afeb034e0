//! When a waiting pod is expected to start: the line projected forward. The running pods
//! end at their expected ends (declared, else learnt: [`super::history`]), one after the
//! other on a copy of the cluster; after each end, the units ahead of the pod in the line
//! that now fit take their places (and end in turn after their expected run), then the pod
//! is tried. Done three times (every end at its earliest, likeliest and latest) for a range.
//!
//! What the projection does not know it leaves out: a running pod with no expected end
//! never frees its place, a unit ahead with no expected run never ends. Bounded: at most
//! [`MAX_STEPS`] ends are played out per scenario (past them the start is unknown).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use gpuplace_model::Request;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::Start;
use crate::policy::Policy;
use crate::state::ClusterState;

/// Ends played out at most per scenario.
pub const MAX_STEPS: usize = 4_096;

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

    fn pick(self, scenario: Scenario) -> i64 {
        match scenario {
            Scenario::Earliest => self.earliest_ms,
            Scenario::Likeliest => self.at_ms,
            Scenario::Latest => self.latest_ms,
        }
    }

    /// Whether `ms` lies within the span.
    pub fn holds(&self, ms: i64) -> bool {
        self.earliest_ms <= ms && ms <= self.latest_ms
    }
}

#[derive(Clone, Copy)]
enum Scenario {
    Earliest,
    Likeliest,
    Latest,
}

/// A running pod: where it is and when it is expected to end.
#[derive(Clone, Debug)]
pub struct Ending<'a> {
    pub node: usize,
    pub request: &'a Request,
    pub gpus: &'a [(usize, u32)],
    pub end: Span,
}

/// A unit ahead of the pod in the line: what it asks, on which nodes (`None`: any), and
/// how long it is expected to run once started (`None`: unknown; it never ends).
#[derive(Clone, Debug)]
pub struct Ahead<'a> {
    pub request: &'a Request,
    pub allowed: Option<&'a [bool]>,
    pub runs: Option<Span>,
}

/// When a pod asking `request` on the nodes of `allowed` (all when `None`), behind `ahead`
/// in the line, is expected to start on `state` as the pods of `endings` end: a span (at
/// `now_ms` when it fits already), or unknown when nothing known frees a place of its
/// shape.
pub fn project(
    state: &ClusterState,
    request: &Request,
    allowed: Option<&[bool]>,
    ahead: &[Ahead<'_>],
    endings: &[Ending<'_>],
    now_ms: i64,
) -> Start {
    let mut line = ahead.to_vec();
    line.push(Ahead {
        request,
        allowed,
        runs: None,
    });
    project_line(state, &line, endings, now_ms)
        .pop()
        .unwrap_or(Start::Unknown)
}

/// When each unit of `line` (in its order) is expected to start: the line projected
/// forward over `endings`, three times (earliest, likeliest, latest). A unit that does not
/// fit when its turn comes is passed over (as the scheduler passes over it), not waited for.
pub fn project_line(
    state: &ClusterState,
    line: &[Ahead<'_>],
    endings: &[Ending<'_>],
    now_ms: i64,
) -> Vec<Start> {
    let runs: Vec<Vec<Option<i64>>> = [Scenario::Earliest, Scenario::Likeliest, Scenario::Latest]
        .into_iter()
        .map(|scenario| play(state, line, endings, now_ms, scenario))
        .collect();
    (0..line.len())
        .map(|u| match (runs[0][u], runs[1][u], runs[2][u]) {
            (Some(a), Some(b), Some(c)) => Start::At(Span {
                earliest_ms: a.min(b).min(c),
                at_ms: b,
                latest_ms: a.max(b).max(c),
            }),
            _ => Start::Unknown,
        })
        .collect()
}

/// A place taken on the copy, to give back at its end.
struct Held<'a> {
    node: usize,
    request: &'a Request,
    gpus: Vec<(usize, u32)>,
}

/// Units of one shape (request and nodes) not placed yet, in line order.
struct Shape<'a> {
    request: &'a Request,
    allowed: Option<&'a [bool]>,
    units: std::collections::VecDeque<usize>,
}

/// One scenario being played out on a copy of the cluster.
struct Play<'a, 'r> {
    copy: ClusterState,
    rng: ChaCha8Rng,
    line: &'r [Ahead<'a>],
    shapes: Vec<Shape<'a>>,
    held: Vec<Held<'a>>,
    ends: BinaryHeap<Reverse<(i64, usize)>>,
    scenario: Scenario,
    /// When each unit started.
    started: Vec<Option<i64>>,
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
            let end = t + runs.pick(self.scenario).max(0);
            self.ends.push(Reverse((end, self.held.len())));
        }
        self.held.push(Held {
            node: n,
            request: a.request,
            gpus,
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
        let mut open: Vec<bool> = vec![true; self.shapes.len()];
        loop {
            let next = (0..self.shapes.len())
                .filter(|&s| open[s])
                .filter_map(|s| self.shapes[s].units.front().map(|&u| (u, s)))
                .min();
            let Some((u, s)) = next else {
                return;
            };
            match self.fits(s, only) {
                Some(n) if self.place(n, u, t) => {
                    self.shapes[s].units.pop_front();
                }
                _ => open[s] = false,
            }
        }
    }

    fn done(&self) -> bool {
        self.shapes.iter().all(|s| s.units.is_empty())
    }
}

/// One scenario played out: when each unit starts (`None`: not within what is known).
fn play<'a>(
    state: &ClusterState,
    line: &[Ahead<'a>],
    endings: &[Ending<'a>],
    now_ms: i64,
    scenario: Scenario,
) -> Vec<Option<i64>> {
    let mut shapes: Vec<Shape<'a>> = Vec::new();
    for (u, a) in line.iter().enumerate() {
        match shapes
            .iter_mut()
            .find(|s| s.request == a.request && s.allowed == a.allowed)
        {
            Some(s) => s.units.push_back(u),
            None => shapes.push(Shape {
                request: a.request,
                allowed: a.allowed,
                units: [u].into(),
            }),
        }
    }
    let mut play = Play {
        copy: state.clone(),
        rng: ChaCha8Rng::seed_from_u64(0),
        line,
        shapes,
        held: endings
            .iter()
            .map(|e| Held {
                node: e.node,
                request: e.request,
                gpus: e.gpus.to_vec(),
            })
            .collect(),
        ends: endings
            .iter()
            .enumerate()
            .map(|(i, e)| Reverse((e.end.pick(scenario).max(now_ms), i)))
            .collect(),
        scenario,
        started: vec![None; line.len()],
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
        let n = h.node;
        if play.copy.release(n, h.request, &h.gpus).is_ok() {
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
