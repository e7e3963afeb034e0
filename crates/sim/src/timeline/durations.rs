//! How long each pod runs in the timeline replay.
//!
//! A pod of an openb pod list runs for `deletion_time - creation_time` (see
//! [`crate::TracePod::duration_s`]). Pods without timestamps (the `multigpu*` lists, the
//! built-in workload) draw a duration from the default openb list's duration quantiles,
//! interpolated log-linearly, by a hash of their name: the same pod gets the same duration
//! in every seed and policy. Then the duration is multiplied by `scale`, raised to `min_s`
//! (zero and very short durations: a pod that is admitted, starts its containers and ends
//! still holds its GPUs for that long) and cut to `max_s` when one is set.

/// Quantiles of `deletion_time - creation_time` over `openb_pod_list_default.csv` (fraction,
/// seconds; the zero minimum is written as 1 s so that it interpolates in log space).
const OPENB_QUANTILES: [(f64, f64); 17] = [
    (0.0, 1.0),
    (0.05, 48.0),
    (0.1, 80.0),
    (0.2, 146.0),
    (0.3, 202.0),
    (0.4, 301.0),
    (0.5, 540.0),
    (0.6, 883.0),
    (0.7, 1_422.0),
    (0.8, 2_700.0),
    (0.9, 6_574.0),
    (0.95, 16_377.0),
    (0.98, 40_752.0),
    (0.99, 93_426.0),
    (0.995, 566_821.0),
    (0.999, 8_772_762.0),
    (1.0, 12_537_496.0),
];

/// The duration model's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DurationModel {
    /// Multiplies every duration (`--duration-scale`).
    pub scale: f64,
    /// The shortest run, seconds (`--min-duration`).
    pub min_s: f64,
    /// The longest run, seconds (`--max-duration`); `None`: no cap.
    pub max_s: Option<f64>,
}

impl Default for DurationModel {
    fn default() -> Self {
        DurationModel {
            scale: 1.0,
            min_s: 60.0,
            max_s: None,
        }
    }
}

/// A duration model that cannot run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DurationError {
    #[error("--duration-scale must be above 0 and at most {MAX_SCALE}, got {0}")]
    Scale(f64),
    #[error("--min-duration must be between 1 and {MAX_MIN_S} seconds (a year), got {0}")]
    Min(f64),
    #[error("--max-duration ({max}) must be at least --min-duration ({min})")]
    Max { min: f64, max: f64 },
}

/// The largest `--duration-scale`.
pub const MAX_SCALE: f64 = 1000.0;
/// The largest `--min-duration`, seconds (a year).
pub const MAX_MIN_S: f64 = 31_536_000.0;

impl DurationModel {
    pub fn validate(&self) -> Result<(), DurationError> {
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= MAX_SCALE) {
            return Err(DurationError::Scale(self.scale));
        }
        if !(self.min_s.is_finite() && (1.0..=MAX_MIN_S).contains(&self.min_s)) {
            return Err(DurationError::Min(self.min_s));
        }
        if let Some(max) = self.max_s
            && !(max.is_finite() && max >= self.min_s)
        {
            return Err(DurationError::Max {
                min: self.min_s,
                max,
            });
        }
        Ok(())
    }

    /// The run time in milliseconds of a pod called `name` whose trace duration is
    /// `recorded` seconds (`None`: drawn from the openb quantiles).
    pub fn millis(&self, name: &str, recorded: Option<u64>) -> u64 {
        let raw = match recorded {
            Some(s) => s as f64,
            None => drawn(name),
        };
        let mut seconds = (raw * self.scale).max(self.min_s);
        if let Some(max) = self.max_s {
            seconds = seconds.min(max);
        }
        (seconds * 1000.0).round() as u64
    }
}

/// A duration (seconds) from the openb quantiles at a point fixed by `name`'s hash.
fn drawn(name: &str) -> f64 {
    // Splitmix the name's hash so similar names land far apart.
    let mut z = crate::trace::name_hash(name).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    quantile(u)
}

/// The openb duration at quantile `u` (0..=1), interpolated in log space.
fn quantile(u: f64) -> f64 {
    let u = u.clamp(0.0, 1.0);
    for pair in OPENB_QUANTILES.windows(2) {
        let ((p0, d0), (p1, d1)) = (pair[0], pair[1]);
        if u <= p1 {
            let f = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
            return (d0.ln() + f * (d1.ln() - d0.ln())).exp();
        }
    }
    OPENB_QUANTILES[OPENB_QUANTILES.len() - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_durations_are_scaled_floored_and_capped() {
        let model = DurationModel::default();
        assert_eq!(
            model.millis("p", Some(0)),
            60_000,
            "zero is raised to the floor"
        );
        assert_eq!(model.millis("p", Some(540)), 540_000);
        let model = DurationModel {
            scale: 0.5,
            min_s: 10.0,
            max_s: Some(100.0),
        };
        assert_eq!(model.millis("p", Some(30)), 15_000);
        assert_eq!(model.millis("p", Some(4)), 10_000);
        assert_eq!(model.millis("p", Some(1_000)), 100_000);
    }

    #[test]
    fn drawn_durations_follow_the_openb_quantiles() {
        assert!((quantile(0.5) - 540.0).abs() < 1e-6);
        assert!((quantile(0.85) - (2_700f64 * 6_574.0).sqrt()).abs() < 1.0);
        let model = DurationModel {
            min_s: 1.0,
            ..DurationModel::default()
        };
        let mut drawn: Vec<u64> = (0..20_000)
            .map(|i| model.millis(&format!("pod-{i}"), None) / 1000)
            .collect();
        drawn.sort_unstable();
        let median = drawn[drawn.len() / 2] as f64;
        let p90 = drawn[drawn.len() * 9 / 10] as f64;
        assert!((450.0..650.0).contains(&median), "{median}");
        assert!((5_000.0..8_500.0).contains(&p90), "{p90}");
        assert_eq!(model.millis("same", None), model.millis("same", None));
    }

    #[test]
    fn bad_settings_are_refused_with_the_flag_named() {
        let bad = DurationModel {
            scale: 0.0,
            ..DurationModel::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("--duration-scale")
        );
        let bad = DurationModel {
            max_s: Some(5.0),
            ..DurationModel::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("--max-duration")
        );
        assert!(DurationModel::default().validate().is_ok());
    }
}
