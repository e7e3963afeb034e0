//! What ran before, to expect how long a pod runs: by class (its queue and shape, as the
//! driver names it) the run times of the latest pods that ended, and over every class how
//! far actual run times were from declared ones (users declare more than they use, and
//! some jobs fail early). The expected remaining run of a pod that has run `elapsed` is
//! read from the pods that ran longer than that (so a pod that outlived the typical run is
//! not expected to end at once), as its 10th, 50th and 90th percentile.
//!
//! Bounded: [`KEEP`] run times a class, [`MAX_CLASSES`] classes (new classes past it are
//! not learnt; they fall back to every class's run times).

use std::collections::{HashMap, VecDeque};

use super::Span;

/// Run times kept per class.
pub const KEEP: usize = 256;
/// Classes learnt at most.
pub const MAX_CLASSES: usize = 4_096;
/// Samples needed before a class (or the ratio) is trusted.
pub const MIN_SAMPLES: usize = 8;

/// The latest values of one class, in arrival order and sorted.
#[derive(Clone, Debug, Default)]
struct Runs {
    recent: VecDeque<u64>,
    sorted: Vec<u64>,
}

impl Runs {
    fn add(&mut self, v: u64) {
        if self.recent.len() == KEEP
            && let Some(old) = self.recent.pop_front()
            && let Ok(i) = self.sorted.binary_search(&old)
        {
            self.sorted.remove(i);
        }
        self.recent.push_back(v);
        let i = self.sorted.partition_point(|&x| x < v);
        self.sorted.insert(i, v);
    }

    /// The 10th, 50th and 90th percentile of the values above `above`, less `above`;
    /// `None` with fewer than [`MIN_SAMPLES`] values in all or none above.
    fn beyond(&self, above: u64) -> Option<[u64; 3]> {
        if self.sorted.len() < MIN_SAMPLES {
            return None;
        }
        let from = self.sorted.partition_point(|&x| x <= above);
        let rest = &self.sorted[from..];
        if rest.is_empty() {
            return None;
        }
        let q = |p: usize| rest[(rest.len() - 1) * p / 100] - above;
        Some([q(10), q(50), q(90)])
    }
}

/// Run times by class, and actual over declared (per mille) over all classes.
#[derive(Clone, Debug, Default)]
pub struct RunHistory {
    classes: HashMap<String, Runs>,
    all: Runs,
    ratios: Runs,
}

impl RunHistory {
    /// A pod of `class` ran `ran_ms`, having declared `declared_ms`.
    pub fn ran(&mut self, class: &str, ran_ms: u64, declared_ms: Option<u64>) {
        if let Some(d) = declared_ms.filter(|d| *d > 0) {
            self.ratios.add(ran_ms.saturating_mul(1000) / d);
        }
        self.all.add(ran_ms);
        if let Some(runs) = self.classes.get_mut(class) {
            runs.add(ran_ms);
        } else if self.classes.len() < MAX_CLASSES {
            self.classes
                .entry(class.to_string())
                .or_default()
                .add(ran_ms);
        }
    }

    /// Pods learnt from.
    pub fn len(&self) -> usize {
        self.all.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How much longer a pod of `class` that has run `elapsed_ms` is expected to run: by
    /// what it declared (`declared_ms`, scaled by how actual runs compared with declared
    /// ones, once that is known), else by its class's run times, else every class's. `None`
    /// when nothing is known.
    pub fn remaining(
        &self,
        class: &str,
        elapsed_ms: u64,
        declared_ms: Option<u64>,
    ) -> Option<Span> {
        if let Some(d) = declared_ms.filter(|d| *d > 0) {
            // Ratios (per mille) past what it ran already.
            let above = elapsed_ms.saturating_mul(1000) / d;
            return Some(match self.ratios.beyond(above) {
                Some([lo, mid, hi]) => {
                    let ms = |r: u64| (r.saturating_mul(d) / 1000) as i64;
                    span(ms(lo), ms(mid), ms(hi))
                }
                // Unlearnt (or it ran past every ratio seen): its word, else soon.
                None => Span::exactly(d.saturating_sub(elapsed_ms) as i64),
            });
        }
        let runs = self
            .classes
            .get(class)
            .and_then(|r| r.beyond(elapsed_ms))
            .or_else(|| self.all.beyond(elapsed_ms))?;
        Some(span(runs[0] as i64, runs[1] as i64, runs[2] as i64))
    }
}

fn span(earliest_ms: i64, at_ms: i64, latest_ms: i64) -> Span {
    Span {
        earliest_ms,
        at_ms,
        latest_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_runs_are_read_from_the_pods_that_ran_longer() {
        let mut h = RunHistory::default();
        assert_eq!(h.remaining("a", 0, None), None);
        for m in 1..=100u64 {
            h.ran("a", m * 60_000, None);
        }
        let fresh = h.remaining("a", 0, None).unwrap();
        assert_eq!(fresh.at_ms, 50 * 60_000);
        assert!(fresh.earliest_ms < fresh.at_ms && fresh.at_ms < fresh.latest_ms);
        // Having run 80 minutes, it is among the longer ones: ~10 more, at most 20.
        let late = h.remaining("a", 80 * 60_000, None).unwrap();
        assert_eq!(late.at_ms, 10 * 60_000);
        assert!(late.latest_ms <= 20 * 60_000);
        // Another class falls back to every class's.
        assert_eq!(h.remaining("b", 0, None), Some(fresh));
        // Past everything seen: unknown.
        assert_eq!(h.remaining("a", 101 * 60_000, None), None);
    }

    #[test]
    fn a_declared_run_is_scaled_by_how_declarations_turned_out() {
        let mut h = RunHistory::default();
        // Unlearnt: its word.
        assert_eq!(
            h.remaining("a", 10_000, Some(60_000)),
            Some(Span::exactly(50_000))
        );
        // Users declared twice what they ran.
        for _ in 0..20 {
            h.ran("a", 30_000, Some(60_000));
        }
        assert_eq!(
            h.remaining("a", 0, Some(120_000)),
            Some(Span::exactly(60_000))
        );
    }

    #[test]
    fn history_is_bounded() {
        let mut h = RunHistory::default();
        for i in 0..(KEEP as u64 * 3) {
            h.ran("a", i, None);
        }
        assert_eq!(h.len(), KEEP);
        for c in 0..(MAX_CLASSES + 10) {
            h.ran(&format!("c{c}"), 1, None);
        }
        assert!(h.classes.len() <= MAX_CLASSES);
    }
}
