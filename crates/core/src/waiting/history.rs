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
#[derive(Clone, Debug)]
struct Runs<T = u64> {
    recent: VecDeque<T>,
    sorted: Vec<T>,
}

impl<T> Default for Runs<T> {
    fn default() -> Self {
        Runs {
            recent: VecDeque::new(),
            sorted: Vec::new(),
        }
    }
}

impl<T: Ord + Copy> Runs<T> {
    fn add(&mut self, v: T) {
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

    /// The `p`th percentile (nearest rank); `None` with fewer than [`MIN_SAMPLES`] values.
    fn percentile(&self, p: usize) -> Option<T> {
        (self.sorted.len() >= MIN_SAMPLES).then(|| self.sorted[(self.sorted.len() - 1) * p / 100])
    }
}

impl Runs<u64> {
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

/// Bands of declared runs whose ratios are learnt apart: declared runs double from one
/// band to the next, from under 2 minutes to over 22 days.
pub const BANDS: usize = 16;

/// The band of a declared run of `declared_ms`.
fn band(declared_ms: u64) -> usize {
    let minutes = (declared_ms / 60_000).max(1);
    (minutes.ilog2() as usize).min(BANDS - 1)
}

/// Run times by class, and actual over declared (per mille) over all classes, and by
/// band of declared run: how far a declaration is off depends on how long it is (the
/// longer a declared run, the likelier its user over-declared), so a long declaration
/// is scaled by what long declarations turned out to be.
#[derive(Clone, Debug, Default)]
pub struct RunHistory {
    classes: HashMap<String, Runs>,
    all: Runs,
    ratios: Runs,
    ratio_bands: [Runs; BANDS],
    /// How projected waits turned out, by [`wait_class`]: ln((actual + floor) / (projected +
    /// floor)), in thousandths.
    waits: [Runs<i64>; WAIT_CLASSES],
}

/// The classes of waits learnt apart: a share of a GPU, one GPU, two to four, more.
pub const WAIT_CLASSES: usize = 4;

/// The wait class of a pod asking `gpu_count` GPUs of `gpu_milli` each.
pub fn wait_class(gpu_count: u32, gpu_milli: u32) -> usize {
    match (gpu_count, gpu_milli) {
        (0..=1, m) if m < 1000 => 0,
        (0..=1, _) => 1,
        (2..=4, _) => 2,
        _ => 3,
    }
}

/// Added to a wait before ratios are taken, so that "now" (0) has one.
const WAIT_FLOOR_MS: f64 = 60_000.0;

/// The told range: the 5th to 95th percentile of how projections turned out.
const RANGE_PERCENTILES: (usize, usize) = (5, 95);

impl RunHistory {
    /// A pod of `class` ran `ran_ms`, having declared `declared_ms`.
    pub fn ran(&mut self, class: &str, ran_ms: u64, declared_ms: Option<u64>) {
        if let Some(d) = declared_ms.filter(|d| *d > 0) {
            let ratio = ran_ms.saturating_mul(1000) / d;
            self.ratios.add(ratio);
            self.ratio_bands[band(d)].add(ratio);
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

    /// A pod of wait class `class` (see [`wait_class`]) that was projected to wait
    /// `projected_ms` started after `actual_ms`.
    pub fn waited(&mut self, class: usize, projected_ms: u64, actual_ms: u64) {
        let ratio = (actual_ms as f64 + WAIT_FLOOR_MS) / (projected_ms as f64 + WAIT_FLOOR_MS);
        if let Some(waits) = self.waits.get_mut(class) {
            waits.add((ratio.ln() * 1000.0).round() as i64);
        }
    }

    /// The range to tell around a projected wait of `projected` (ms from now): the 5th to
    /// 95th percentile of how projections of `class` turned out (actual over projected),
    /// applied to its likeliest, which stays the projection's; the projection's own range
    /// until [`MIN_SAMPLES`] pods of the class started. The projection leaves out what it
    /// cannot know (pods yet to arrive, the order attempts really take, ends that are not
    /// independent), and what it left out shows in how its waits turned out.
    pub fn calibrated(&self, class: usize, projected: Span) -> Span {
        let Some(waits) = self.waits.get(class) else {
            return projected;
        };
        let (lo, hi) = RANGE_PERCENTILES;
        let (Some(lo), Some(hi)) = (waits.percentile(lo), waits.percentile(hi)) else {
            return projected;
        };
        let base = projected.at_ms.max(0) as f64 + WAIT_FLOOR_MS;
        let at = |r: i64| ((base * (r as f64 / 1000.0).exp()) - WAIT_FLOOR_MS).max(0.0) as i64;
        span(
            at(lo).min(projected.at_ms),
            projected.at_ms,
            at(hi).max(projected.at_ms),
        )
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
            let ratios = self.ratio_bands[band(d)]
                .beyond(above)
                .or_else(|| self.ratios.beyond(above));
            return Some(match ratios {
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
    fn the_range_told_is_how_projections_turned_out() {
        let mut h = RunHistory::default();
        let ten = Span::exactly(10 * 60_000);
        // Unlearnt: the projection as it is.
        assert_eq!(h.calibrated(3, ten), ten);
        // 8-GPU pods projected to wait 10 minutes waited 10 to 30 (plus the minute's floor).
        for m in [10u64, 12, 14, 16, 18, 20, 22, 24, 26, 30] {
            h.waited(wait_class(8, 1000), 10 * 60_000, m * 60_000);
        }
        let told = h.calibrated(3, ten);
        assert_eq!(
            told.at_ms,
            10 * 60_000,
            "the likeliest stays the projection's"
        );
        assert!(told.earliest_ms == 10 * 60_000, "{told:?}");
        // The 95th percentile by nearest rank among ten: the ninth, 26 minutes.
        assert!(told.latest_ms.abs_diff(26 * 60_000) < 1_000, "{told:?}");
        // Another class is not told from it.
        assert_eq!(h.calibrated(wait_class(1, 500), ten), ten);
    }

    #[test]
    fn long_declarations_are_scaled_by_what_long_declarations_turned_out() {
        let mut h = RunHistory::default();
        // Ten-minute declarations were right; ten-hour ones ran a tenth of them.
        for _ in 0..10 {
            h.ran("a", 10 * 60_000, Some(10 * 60_000));
            h.ran("a", 3_600_000, Some(36_000_000));
        }
        assert_eq!(
            h.remaining("a", 0, Some(10 * 60_000)).unwrap().at_ms,
            600_000
        );
        assert_eq!(
            h.remaining("a", 0, Some(36_000_000)).unwrap().at_ms,
            3_600_000
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
