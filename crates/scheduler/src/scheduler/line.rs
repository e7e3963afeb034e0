//! The line of every waiting unit (those in backoff too, not only the round's due ones),
//! for a waiting pod's true place in the cluster's line and in its queue's, and for its
//! expected start: the line projected forward by core ([`project_line`]) over the running
//! pods' expected ends, declared (`gpuplace.io/expected-duration`, `activeDeadlineSeconds`)
//! or learnt from what pods of the same queue and shape ran before ([`RunHistory`]).
//!
//! Built once a round, and only when a pod of it is told why it waits; the projection
//! covers the first [`PROJECTED`] pods of the line (pods further back are told "unknown").

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::waiting::history::{RunHistory, WAIT_CLASSES, wait_class};
use gpuplace_core::waiting::{Ahead, Ending, Place, Position, Span, Start, project, project_line};
use gpuplace_model::Request;

use crate::k8s::job::Jobs;
use crate::k8s::pod_info::PodInfo;
use crate::snapshot::Snapshot;

pub use gpuplace_core::waiting::told::{AHEAD_OF_MASKED, FirstTold, PROJECTED};

/// A pod's place in the line.
#[derive(Clone, Copy, Debug)]
struct Placed {
    /// Its unit's index in the cluster's line.
    unit: usize,
    /// Its unit's place in its queue's line.
    in_queue: Option<Place>,
    /// Its index among the projected pods.
    pod: Option<usize>,
}

/// A pod of the line as projected: what it asks, its priority, how long it runs.
struct Projected {
    request: Request,
    priority: i32,
    runs: Option<Span>,
    /// Pods of its wait class before it in the line.
    ahead: usize,
}

/// The round's line.
pub(super) struct Line {
    places: HashMap<String, Placed>,
    units: usize,
    /// The projected pods, in line order.
    requests: Vec<Projected>,
    /// Their expected starts, once projected.
    starts: Option<Vec<Start>>,
    /// The running pods' expected ends, once read.
    endings: Option<Vec<Owned>>,
}

/// What the run history knows a pod by: its queue (else namespace) and its GPUs.
pub(super) fn run_class(pod: &PodInfo) -> String {
    let queue = pod
        .labels
        .get(crate::k8s::queue::QUEUE_LABEL)
        .unwrap_or(&pod.key.namespace);
    let shape = pod.demand.as_ref().map_or(String::new(), |d| {
        crate::status::gpus_text(d.request.gpu_count, d.request.gpu_milli)
    });
    format!("{queue}|{shape}")
}

/// What a pod's run is expected from: the run history and its declarations (its own, its
/// Job's deadline).
pub(super) struct Runs<'a> {
    pub history: &'a RunHistory,
    pub jobs: &'a Jobs,
}

impl Runs<'_> {
    /// How much longer `pod`, started at `since_ms` (`now_ms` for a pod not started), runs
    /// at `now_ms`.
    fn remaining(&self, pod: &PodInfo, since_ms: i64, now_ms: i64) -> Option<Span> {
        let elapsed = now_ms.saturating_sub(since_ms).max(0) as u64;
        let declared = self.jobs.declared_run(pod, since_ms);
        self.history.remaining(&run_class(pod), elapsed, declared)
    }
}

impl Line {
    /// The line of `waiting` (units as the round forms them, in their order), each pod's
    /// queue from `queue_of`; a nominee (`nominee` says which) keeps its place in the line
    /// but is not projected (its places are held in the state already).
    pub fn new(
        waiting: &[Arc<PodInfo>],
        queue_of: &dyn Fn(&PodInfo) -> Option<usize>,
        nominee: &dyn Fn(&str) -> bool,
        runs: &Runs<'_>,
        now_ms: i64,
    ) -> Line {
        let units = super::units::form(waiting, |_| true);
        let mut places = HashMap::new();
        let mut requests = Vec::new();
        let mut queue_seen: HashMap<Option<usize>, usize> = HashMap::new();
        let mut of_class = [0usize; WAIT_CLASSES];
        let mut unit_queue = Vec::with_capacity(units.len());
        for (i, unit) in units.iter().enumerate() {
            let pods = unit.pods();
            let q = queue_of(pods[0]);
            let at = queue_seen.entry(q).or_default();
            *at += 1;
            unit_queue.push((q, *at));
            for pod in pods {
                let index = match &pod.demand {
                    Ok(d) if requests.len() < PROJECTED && !nominee(&pod.key.uid) => {
                        let class = wait_class(d.request.gpu_count, d.request.gpu_milli);
                        requests.push(Projected {
                            request: d.request.clone(),
                            priority: pod.priority,
                            runs: runs.remaining(pod, now_ms, now_ms),
                            ahead: of_class[class],
                        });
                        of_class[class] += 1;
                        Some(requests.len() - 1)
                    }
                    _ => None,
                };
                places.insert(
                    pod.key.uid.clone(),
                    Placed {
                        unit: i,
                        in_queue: None,
                        pod: index,
                    },
                );
            }
        }
        for placed in places.values_mut() {
            let (q, at) = unit_queue[placed.unit];
            placed.in_queue = q.map(|q| Place {
                at,
                of: queue_seen.get(&Some(q)).copied().unwrap_or(at),
            });
        }
        Line {
            places,
            units: units.len(),
            requests,
            starts: None,
            endings: None,
        }
    }

    /// Where pod `uid` stands (`None`: not in the line).
    pub fn position(&self, uid: &str) -> Option<Position> {
        let placed = self.places.get(uid)?;
        Some(Position {
            in_cluster: Place {
                at: placed.unit + 1,
                of: self.units,
            },
            in_queue: placed.in_queue,
        })
    }

    /// Pods of `uid`'s wait class before it in the projected line (0 when not projected).
    pub fn ahead_of_class(&self, uid: &str) -> usize {
        (self.places.get(uid).and_then(|p| p.pod))
            .and_then(|i| self.requests.get(i))
            .map_or(0, |p| p.ahead)
    }

    /// When pod `uid` is expected to start: the line projected once a round; a pod its
    /// filters keep off some nodes (`mask`) is projected on its own, behind the
    /// [`AHEAD_OF_MASKED`] pods ahead of it.
    pub fn start(
        &mut self,
        uid: &str,
        mask: Option<&[bool]>,
        snapshot: &Snapshot,
        runs: &Runs<'_>,
        now_ms: i64,
    ) -> Start {
        let Some(index) = self.places.get(uid).and_then(|p| p.pod) else {
            return Start::Unknown;
        };
        if let Some(mask) = mask.filter(|m| m.iter().any(|ok| !ok)) {
            let from = index.saturating_sub(AHEAD_OF_MASKED);
            let ahead = as_ahead(&self.requests[from..index]);
            let owned = self
                .endings
                .get_or_insert_with(|| endings(snapshot, runs, now_ms));
            let ends: Vec<Ending<'_>> = owned.iter().map(Owned::ending).collect();
            let own = &self.requests[index];
            let pod = Ahead {
                request: &own.request,
                allowed: Some(mask),
                priority: own.priority,
                runs: None,
            };
            return project(&snapshot.state, pod, &ahead, &ends, now_ms);
        }
        let requests = &self.requests;
        let owned = self
            .endings
            .get_or_insert_with(|| endings(snapshot, runs, now_ms));
        let starts = self.starts.get_or_insert_with(|| {
            let line = as_ahead(requests);
            let ends: Vec<Ending<'_>> = owned.iter().map(Owned::ending).collect();
            project_line(&snapshot.state, &line, &ends, now_ms)
        });
        starts.get(index).cloned().unwrap_or(Start::Unknown)
    }
}

/// The projected pods as core's projection reads them (on any node).
fn as_ahead(requests: &[Projected]) -> Vec<Ahead<'_>> {
    requests
        .iter()
        .map(|p| Ahead {
            request: &p.request,
            allowed: None,
            priority: p.priority,
            runs: p.runs,
        })
        .collect()
}

/// A running pod's place and expected end.
struct Owned {
    node: usize,
    request: Request,
    gpus: Vec<(usize, u32)>,
    priority: i32,
    end: Span,
}

impl Owned {
    fn ending(&self) -> Ending<'_> {
        Ending {
            node: self.node,
            request: &self.request,
            gpus: &self.gpus,
            priority: self.priority,
            end: self.end,
        }
    }
}

/// The running pods of `snapshot` whose end is expected: declared (scaled by how
/// declarations turned out), else learnt from their class's run times.
fn endings(snapshot: &Snapshot, runs: &Runs<'_>, now_ms: i64) -> Vec<Owned> {
    let mut out = Vec::new();
    for pod in snapshot.placed.iter().flatten() {
        let Some(held) = snapshot.held.get(&pod.key.uid) else {
            continue;
        };
        let since = pod
            .started
            .or(pod.created)
            .map_or(now_ms, |t| t.as_millisecond());
        let Some(left) = runs.remaining(pod, since, now_ms) else {
            continue;
        };
        out.push(Owned {
            node: held.node,
            request: held.request.clone(),
            gpus: held.gpus.clone(),
            priority: pod.priority,
            end: left.shifted(now_ms),
        });
    }
    out
}

/// The starts projected lately, by pod UID (a pod the last projection did not cover is
/// projected at the next one, within core's
/// [`gpuplace_core::waiting::told::PROJECT_EVERY_MS`]).
#[derive(Default)]
pub(super) struct Starts {
    inner: std::sync::Mutex<StartsInner>,
}

#[derive(Default)]
struct StartsInner {
    at: Option<std::time::Instant>,
    by_uid: std::collections::HashMap<String, Start>,
    /// Each pod's first projected start, to learn from at its Binding.
    first: std::collections::HashMap<String, FirstTold>,
}

/// Pods whose first projection is kept at most (past it the record starts again).
const MAX_FIRST_TOLD: usize = 100_000;

impl Starts {
    /// Keeps `first` as pod `uid`'s first projection, unless one is kept already.
    pub(super) fn remember(&self, uid: &str, first: FirstTold) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.first.len() >= MAX_FIRST_TOLD && !inner.first.contains_key(uid) {
            inner.first.clear();
        }
        inner.first.entry(uid.to_string()).or_insert(first);
    }

    /// Forgets pod `uid`'s first projection if it was made at `since_ms` or later (by the
    /// attempt that nominated it: a start it will not learn from).
    pub(super) fn forget_told_since(&self, uid: &str, since_ms: i64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.first.get(uid).is_some_and(|f| f.told_ms >= since_ms) {
            inner.first.remove(uid);
        }
    }

    /// Pod `uid`'s first projection, taken (it was bound or is gone).
    pub(super) fn take_first(&self, uid: &str) -> Option<FirstTold> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.first.remove(uid)
    }

    /// Pod `uid`'s start: as projected while core keeps a projection
    /// ([`gpuplace_core::waiting::told::kept_after`]) before `now` (the round's
    /// time), else by `project` in the round that starts a new period (the line is
    /// projected once in it); a pod first told in a later round of the period waits for
    /// the next.
    pub(super) fn get(
        &self,
        uid: &str,
        now: std::time::Instant,
        project: impl FnOnce() -> Start,
    ) -> Start {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = inner.at.is_some_and(|at| {
            let elapsed = now.saturating_duration_since(at).as_millis();
            gpuplace_core::waiting::told::kept_after(elapsed.min(u64::MAX as u128) as u64)
        });
        if let Some(start) = inner.by_uid.get(uid).filter(|_| fresh) {
            return start.clone();
        }
        if fresh && inner.at != Some(now) {
            // Projected in an earlier round without it: told at the next projection.
            return Start::Unknown;
        }
        if !fresh {
            inner.by_uid.clear();
            inner.at = Some(now);
        }
        let start = project();
        inner.by_uid.insert(uid.to_string(), start.clone());
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_core::waiting::Span;
    use std::time::{Duration, Instant};

    #[test]
    fn the_line_is_projected_at_most_once_a_period() {
        let starts = Starts::default();
        let t0 = Instant::now();
        let at = |ms| Start::At(Span::exactly(ms));
        assert_eq!(starts.get("a", t0, || at(1)), at(1));
        // The same round: another pod is projected too (the round's line is projected).
        assert_eq!(starts.get("b", t0, || at(2)), at(2));
        // A later round of the period: kept; a pod not covered waits for the next.
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(starts.get("a", t1, || at(9)), at(1));
        assert_eq!(starts.get("c", t1, || at(9)), Start::Unknown);
        // The next period: projected again.
        let t2 = t0 + Duration::from_millis(gpuplace_core::waiting::told::PROJECT_EVERY_MS);
        assert_eq!(starts.get("c", t2, || at(3)), at(3));
        assert_eq!(starts.get("a", t2, || at(4)), at(4));
    }
}

#[cfg(test)]
mod nominee_tests {
    use super::*;

    fn first(told_ms: i64) -> FirstTold {
        FirstTold {
            told_ms,
            projected_ms: told_ms + 60_000,
            drained_ms: None,
            class: 1,
        }
    }

    #[test]
    fn what_the_nominating_attempt_told_is_not_learnt_an_earlier_telling_is() {
        let starts = Starts::default();
        // Told in the attempt that nominated it: forgotten.
        starts.remember("a", first(5_002));
        starts.forget_told_since("a", 5_000);
        assert_eq!(starts.take_first("a"), None);
        // Told earlier, nominated later: the first telling stands (its wait turned out so).
        starts.remember("b", first(1_000));
        starts.forget_told_since("b", 5_000);
        assert_eq!(starts.take_first("b"), Some(first(1_000)));
    }
}
