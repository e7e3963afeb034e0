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
    /// How each [`Estimator`]'s waits turned out, by [`wait_class`]: ln((actual + floor) /
    /// (told + floor)), in thousandths.
    waits: [[Runs<i64>; ESTIMATORS]; WAIT_CLASSES],
    /// The median of |each of `waits`| (`None` before [`MIN_SAMPLES`]), kept at each
    /// [`RunHistory::waited`]: read for every pod told, changed once a pod started.
    median_errors: [[Option<i64>; ESTIMATORS]; WAIT_CLASSES],
    /// When the latest pods of each wait class that had waited started (ms), oldest first.
    starts: [VecDeque<i64>; WAIT_CLASSES],
}

/// The ways a wait is reckoned, each learnt apart (by how its reckonings turned out): the
/// line projected over the running pods' ends; the line drained at the pace its class left
/// it lately (what the projection cannot see, pods yet to arrive that take room first or
/// evict pods to free it, shows in that pace); and "now" (where it does best, no start is
/// shown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    Projected = 0,
    Drained = 1,
    Now = 2,
}

/// How many [`Estimator`]s there are.
pub const ESTIMATORS: usize = 3;

/// Starts kept per wait class for its pace.
pub const PACE_KEEP: usize = 64;

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

    /// A pod of wait class `class` (see [`wait_class`]) whose wait `by` reckoned as
    /// `told_ms` started after `actual_ms`.
    pub fn waited(&mut self, class: usize, by: Estimator, told_ms: u64, actual_ms: u64) {
        let ratio = (actual_ms as f64 + WAIT_FLOOR_MS) / (told_ms as f64 + WAIT_FLOOR_MS);
        let (Some(waits), Some(medians)) =
            (self.waits.get_mut(class), self.median_errors.get_mut(class))
        else {
            return;
        };
        let runs = &mut waits[by as usize];
        runs.add((ratio.ln() * 1000.0).round() as i64);
        medians[by as usize] = (runs.recent.len() >= MIN_SAMPLES).then(|| {
            let mut abs: Vec<i64> = runs.recent.iter().map(|v| v.abs()).collect();
            let mid = abs.len() / 2;
            *abs.select_nth_unstable(mid).1
        });
    }

    /// A pod of wait class `class` that had waited started at `at_ms` (the class's pace).
    pub fn left_line(&mut self, class: usize, at_ms: i64) {
        if let Some(starts) = self.starts.get_mut(class) {
            if starts.len() == PACE_KEEP {
                starts.pop_front();
            }
            starts.push_back(at_ms);
        }
    }

    /// The wait of a pod of wait class `class` with `ahead` pods of its class before it in
    /// the line, at `now_ms`, were the line to drain at the pace its class left it lately
    /// (the latest [`PACE_KEEP`] starts, over the time from the oldest of them to now):
    /// likeliest the time `ahead + 1` starts take at that pace, and as its range the 5th
    /// to 95th percentile of that many starts' time were they to come at random at that
    /// pace (Poisson: a Gamma(k) wait, normal past a few); `None` before [`MIN_SAMPLES`]
    /// started.
    pub fn drained(&self, class: usize, ahead: usize, now_ms: i64) -> Option<Span> {
        let starts = self.starts.get(class)?;
        let oldest = *starts.front()?;
        if starts.len() < MIN_SAMPLES {
            return None;
        }
        let each = (now_ms - oldest).max(1) as f64 / starts.len() as f64;
        let k = (ahead + 1) as f64;
        // Gamma(k)'s 5th and 95th percentiles: 0.05 and 3.0 for k = 1, about k -/+ 1.645
        // sqrt(k) (and a little more above) as k grows.
        let lo = (k - 1.645 * k.sqrt()).max(0.05 * k);
        let hi = k + 1.645 * k.sqrt() + 0.7;
        let ms = |x: f64| (each * x) as i64;
        Some(span(ms(lo), ms(k), ms(hi)))
    }

    /// The median of |ln(actual / told)| (thousandths) of `by`'s latest reckonings of
    /// `class`'s waits; `None` before [`MIN_SAMPLES`].
    fn median_error(&self, class: usize, by: Estimator) -> Option<i64> {
        self.median_errors.get(class)?[by as usize]
    }

    /// Whether "now" reckoned `class`'s waits better lately than every reckoning of
    /// `reckonings` (each learnt from [`MIN_SAMPLES`] pods: one not yet learnt is given
    /// its chance): then a start cannot beat "unknown", and none is shown.
    pub fn now_does_best(&self, class: usize, reckonings: &[Estimator]) -> bool {
        let Some(now) = self.median_error(class, Estimator::Now) else {
            return false;
        };
        (reckonings.iter()).all(|&by| self.median_error(class, by).is_some_and(|m| now < m))
    }

    /// The range to tell around a wait of `told` (ms from now) that `by` reckoned: the
    /// 5th to 95th percentile of how its reckonings of `class` turned out (actual over
    /// told), applied to its likeliest, which stays the reckoning's, and never narrower
    /// than its own range; its own range until [`MIN_SAMPLES`] pods of the class started.
    /// A reckoning leaves out what it cannot know (pods yet to arrive, the order attempts
    /// really take, ends that are not independent), and what it left out shows in how its
    /// waits turned out.
    pub fn calibrated(&self, class: usize, by: Estimator, projected: Span) -> Span {
        let Some(waits) = self.waits.get(class).map(|w| &w[by as usize]) else {
            return projected;
        };
        let (lo, hi) = RANGE_PERCENTILES;
        let (Some(lo), Some(hi)) = (waits.percentile(lo), waits.percentile(hi)) else {
            return projected;
        };
        let base = projected.at_ms.max(0) as f64 + WAIT_FLOOR_MS;
        let at = |r: i64| ((base * (r as f64 / 1000.0).exp()) - WAIT_FLOOR_MS).max(0.0) as i64;
        // What the reckoning's own range says stays in: a learnt range narrower than it
        // (a class whose last reckonings happened to turn out close) would claim more
        // than the reckoning knows.
        span(
            at(lo).min(projected.earliest_ms),
            projected.at_ms,
            at(hi).max(projected.latest_ms),
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
        assert_eq!(h.calibrated(3, Estimator::Projected, ten), ten);
        // 8-GPU pods projected to wait 10 minutes waited 10 to 30 (plus the minute's floor).
        for m in [10u64, 12, 14, 16, 18, 20, 22, 24, 26, 30] {
            h.waited(
                wait_class(8, 1000),
                Estimator::Projected,
                10 * 60_000,
                m * 60_000,
            );
        }
        let told = h.calibrated(3, Estimator::Projected, ten);
        assert_eq!(
            told.at_ms,
            10 * 60_000,
            "the likeliest stays the projection's"
        );
        assert!(told.earliest_ms == 10 * 60_000, "{told:?}");
        // The 95th percentile by nearest rank among ten: the ninth, 26 minutes.
        assert!(told.latest_ms.abs_diff(26 * 60_000) < 1_000, "{told:?}");
        // Nor another estimator.
        assert_eq!(h.calibrated(3, Estimator::Drained, ten), ten);
        // Another class is not told from it.
        assert_eq!(
            h.calibrated(wait_class(1, 500), Estimator::Projected, ten),
            ten
        );
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

#[cfg(test)]
mod pace_tests {
    use super::*;

    #[test]
    fn the_line_drains_at_the_pace_its_class_left_it() {
        let mut h = RunHistory::default();
        let class = wait_class(8, 1000);
        assert_eq!(h.drained(class, 0, 0), None);
        // One 8-GPU pod left the line every 10 minutes for 100 minutes.
        for i in 0..10 {
            h.left_line(class, i * 600_000);
        }
        let at = |ahead, now| h.drained(class, ahead, now).map(|s| s.at_ms);
        // At 100 minutes: 10 starts over 100 minutes; five ahead, it is the sixth.
        assert_eq!(at(5, 6_000_000), Some(3_600_000));
        // An hour with no start slows the pace.
        assert_eq!(at(5, 9_600_000), Some(5_760_000));
        // The range: that many random starts at that pace (six: 2 to 10 in tens of
        // minutes).
        let six = h.drained(class, 5, 6_000_000).unwrap();
        assert!(
            (1_000_000..=1_800_000).contains(&six.earliest_ms),
            "{six:?}"
        );
        assert!((5_400_000..=6_600_000).contains(&six.latest_ms), "{six:?}");
        // Another class knows nothing of it.
        assert_eq!(h.drained(wait_class(1, 1000), 5, 6_000_000), None);
        // Bounded.
        for i in 0..(PACE_KEEP as i64 * 2) {
            h.left_line(class, i);
        }
        assert_eq!(h.starts[class].len(), PACE_KEEP);
    }

    #[test]
    fn no_start_is_shown_where_now_reckoned_best() {
        let mut h = RunHistory::default();
        let both = [Estimator::Projected, Estimator::Drained];
        assert!(!h.now_does_best(0, &both));
        // Pods of the class started at once; the reckonings said minutes.
        for _ in 0..10 {
            h.waited(0, Estimator::Projected, 600_000, 0);
            h.waited(0, Estimator::Now, 0, 0);
        }
        // The pace is not learnt yet: it is given its chance.
        assert!(!h.now_does_best(0, &both));
        assert!(h.now_does_best(0, &[Estimator::Projected]));
        for _ in 0..10 {
            h.waited(0, Estimator::Drained, 300_000, 0);
        }
        assert!(h.now_does_best(0, &both));
        // Where pods waited 25 minutes, a reckoning of 20 beats "now".
        for _ in 0..10 {
            h.waited(3, Estimator::Projected, 3_600_000, 1_500_000);
            h.waited(3, Estimator::Drained, 1_200_000, 1_500_000);
            h.waited(3, Estimator::Now, 0, 1_500_000);
        }
        assert!(!h.now_does_best(3, &both));
    }
}
