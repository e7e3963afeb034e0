//! Usage over time: what each queue (and everything under it) has held, decayed with a
//! half-life, so that a queue that ran 64 GPUs all night stands behind one that ran none
//! when both ask at 9 am.
//!
//! A queue's usage is its allocation integrated over time with exponential decay: held
//! constant at `a` for `dt`, usage `u` becomes `u·2^(-dt/h) + a·h/ln2·(1 - 2^(-dt/h))`
//! (resource-seconds: GPU-seconds, CPU-seconds, MiB-seconds). Its **decayed mean**,
//! `u·ln2/h`, is in the resource's own unit (GPUs), the allocation it has held on average
//! over the recent past (a queue that held `a` for much longer than `h` has mean `a`); it is
//! what fair order compares against fair shares ([`super::Picker::with_usage`]). A
//! half-life of 0 keeps no usage: the mean is the allocation now (the standing of a queue
//! without usage over time).
//!
//! Pure: the caller says how much time passed and what each queue held in it.

use super::DIMS;
use super::tree::{QueueTree, ROOT};

/// The longest half-life a queue may set (a year).
pub const MAX_HALF_LIFE_MS: u64 = 365 * 24 * 3600 * 1000;

/// Why a half-life cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HalfLifeError {
    #[error("{0:?} is not a duration (a number and a unit: 90s, 30m, 1h, 1h30m, 2d, 0)")]
    NotDuration(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is more than a year")]
    TooLong(String),
}

/// Reads a half-life as Kubernetes writes durations (Go's form: `1h30m`, `90s`, `1.5h`,
/// `500ms`, `0`), in milliseconds.
pub fn parse_half_life(text: &str) -> Result<u64, HalfLifeError> {
    let t = text.trim();
    let bad = || HalfLifeError::NotDuration(text.to_string());
    if t.starts_with('-') {
        return Err(HalfLifeError::Negative(text.to_string()));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    if t == "0" {
        return Ok(0);
    }
    if t.is_empty() {
        return Err(bad());
    }
    let mut ms = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_end);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let scale = match unit {
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3600e3,
            "d" => 86_400e3,
            _ => return Err(bad()),
        };
        ms += value * scale;
        rest = next;
    }
    if !ms.is_finite() {
        return Err(bad());
    }
    if ms > MAX_HALF_LIFE_MS as f64 {
        return Err(HalfLifeError::TooLong(text.to_string()));
    }
    Ok(ms.round() as u64)
}

/// A half-life as people write it (`1h`, `30m`, `1h30m`, `90s`, `0`).
pub fn show_half_life(ms: u64) -> String {
    if ms == 0 {
        return "0".into();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, sec) = (s / 3600, s % 3600 / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sec > 0 {
        out.push_str(&format!("{sec}s"));
    }
    out
}

/// One queue's usage: decayed resource-seconds per resource (milli-GPU-seconds,
/// milli-CPU-seconds, MiB-seconds) at some moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub dims: [f64; DIMS],
}

impl Usage {
    /// The usage `dt_ms` later, having held `held` all that time, with half-life
    /// `half_life_ms` (0: none kept).
    pub fn after(&self, held: &[u64; DIMS], dt_ms: u64, half_life_ms: u64) -> Usage {
        if half_life_ms == 0 {
            return Usage::default();
        }
        let h = half_life_ms as f64 / 1e3;
        let keep = (-(dt_ms as f64 / 1e3) / h).exp2();
        let gain = h / std::f64::consts::LN_2 * (1.0 - keep);
        Usage {
            dims: std::array::from_fn(|d| self.dims[d] * keep + held[d] as f64 * gain),
        }
    }

    /// The usage `dt_ms` later, the allocation having gone from `from` to `to` evenly over
    /// that time (what a scheduler that saw neither end of a gap assumes of it).
    pub fn after_ramp(
        &self,
        from: &[u64; DIMS],
        to: &[u64; DIMS],
        dt_ms: u64,
        half_life_ms: u64,
    ) -> Usage {
        if half_life_ms == 0 {
            return Usage::default();
        }
        if dt_ms == 0 {
            return *self;
        }
        let lambda = std::f64::consts::LN_2 / (half_life_ms as f64 / 1e3);
        let t = dt_ms as f64 / 1e3;
        let keep = (-lambda * t).exp();
        let gain = (1.0 - keep) / lambda;
        // The slope's part: the integral of s/t under the decay, over [0, t].
        let slope = 1.0 / lambda - gain / (lambda * t);
        Usage {
            dims: std::array::from_fn(|d| {
                let (a0, a1) = (from[d] as f64, to[d] as f64);
                self.dims[d] * keep + a0 * gain + (a1 - a0) * slope
            }),
        }
    }

    /// The decayed mean: the allocation held on average over the recent past, in the
    /// resources' units (milli-GPU, milli-CPU, MiB). With no half-life, `held`.
    pub fn mean(&self, half_life_ms: u64, held: &[u64; DIMS]) -> [f64; DIMS] {
        if half_life_ms == 0 {
            return held.map(|h| h as f64);
        }
        let per = std::f64::consts::LN_2 / (half_life_ms as f64 / 1e3);
        self.dims.map(|u| u * per)
    }

    /// The usage with the same mean under another half-life (a queue's half-life changed).
    pub fn rescaled(&self, from_ms: u64, to_ms: u64) -> Usage {
        if from_ms == 0 || to_ms == 0 {
            return Usage::default();
        }
        let k = to_ms as f64 / from_ms as f64;
        Usage {
            dims: self.dims.map(|u| u * k),
        }
    }
}

/// Every queue's usage, advanced as time passes: the one record a scheduler (or the
/// timeline) keeps, by queue index of one tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    /// By queue index (the root's unused).
    pub usage: Vec<Usage>,
    /// By queue index: what each queue and everything under it held since the last
    /// advance.
    pub held: Vec<[u64; DIMS]>,
    /// By queue index: its half-life.
    pub half_life_ms: Vec<u64>,
}

impl Ledger {
    /// A ledger for `tree` with no usage yet (`default_ms`: the half-life of queues that
    /// set none, nor their parents).
    pub fn new(tree: &QueueTree, default_ms: u64) -> Ledger {
        Ledger {
            usage: vec![Usage::default(); tree.len()],
            held: vec![[0; DIMS]; tree.len()],
            half_life_ms: (0..tree.len())
                .map(|q| tree.half_life_ms(q).unwrap_or(default_ms))
                .collect(),
        }
    }

    /// `dt_ms` passed holding what [`Ledger::hold`] last set.
    pub fn advance(&mut self, dt_ms: u64) {
        for q in 1..self.usage.len() {
            self.usage[q] = self.usage[q].after(&self.held[q], dt_ms, self.half_life_ms[q]);
        }
    }

    /// From now on each queue holds `alloc[q]` (everything under it included).
    pub fn hold(&mut self, alloc: impl IntoIterator<Item = [u64; DIMS]>) {
        for (q, a) in alloc.into_iter().enumerate().take(self.held.len()) {
            self.held[q] = a;
        }
    }

    /// Every queue's decayed mean, `None` for queues without a half-life (and the root):
    /// what fair order compares ([`super::Picker::with_usage`]).
    pub fn means(&self) -> Vec<Option<[f64; DIMS]>> {
        (0..self.usage.len())
            .map(|q| {
                (q != ROOT && self.half_life_ms[q] > 0)
                    .then(|| self.usage[q].mean(self.half_life_ms[q], &self.held[q]))
            })
            .collect()
    }

    /// Whether any queue keeps usage.
    pub fn decays(&self) -> bool {
        self.half_life_ms.iter().skip(1).any(|&h| h > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairshare::QueueSpec;

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        assert_eq!(parse_half_life("1h"), Ok(3_600_000));
        assert_eq!(parse_half_life("1h30m"), Ok(5_400_000));
        assert_eq!(parse_half_life("1.5h"), Ok(5_400_000));
        assert_eq!(parse_half_life("90s"), Ok(90_000));
        assert_eq!(parse_half_life("250ms"), Ok(250));
        // Days, as people write a long run (Go's durations stop at hours).
        assert_eq!(parse_half_life("1d"), Ok(86_400_000));
        assert_eq!(parse_half_life("2d12h"), Ok(216_000_000));
        assert_eq!(parse_half_life("0"), Ok(0));
        assert_eq!(parse_half_life("0s"), Ok(0));
        assert!(matches!(
            parse_half_life("-1h"),
            Err(HalfLifeError::Negative(_))
        ));
        assert!(matches!(
            parse_half_life("9000h"),
            Err(HalfLifeError::TooLong(_))
        ));
        for bad in ["", "1", "h", "1w", "one hour", "1h 30m", "1..5h"] {
            assert!(
                matches!(parse_half_life(bad), Err(HalfLifeError::NotDuration(_))),
                "{bad:?}"
            );
        }
        for ms in [0, 250, 90_000, 3_600_000, 5_400_000, 3_661_000] {
            assert_eq!(parse_half_life(&show_half_life(ms)), Ok(ms));
        }
    }

    #[test]
    fn usage_halves_with_the_half_life_and_tends_to_the_held_mean() {
        let hour = 3_600_000;
        let u = Usage {
            dims: [1000.0, 0.0, 0.0],
        };
        let later = u.after(&[0; DIMS], hour, hour);
        assert!((later.dims[0] - 500.0).abs() < 1e-9);
        // Holding 8 GPUs for ten half-lives: the mean is within 0.1% of 8.
        let long = Usage::default().after(&[8000, 0, 0], 10 * hour, hour);
        let mean = long.mean(hour, &[8000, 0, 0])[0];
        assert!((mean - 8000.0).abs() / 8000.0 < 1e-3, "{mean}");
        // Stepwise equals at once.
        let mut stepped = Usage::default();
        for _ in 0..60 {
            stepped = stepped.after(&[4000, 0, 0], 60_000, hour);
        }
        let at_once = Usage::default().after(&[4000, 0, 0], hour, hour);
        assert!((stepped.dims[0] - at_once.dims[0]).abs() < 1e-6);
        // No half-life: no usage, the mean is the allocation now.
        assert_eq!(long.after(&[8000, 0, 0], hour, 0), Usage::default());
        assert_eq!(Usage::default().mean(0, &[3000, 0, 0]), [3000.0, 0.0, 0.0]);
        // A ramp from 8 to 0 GPUs over an hour: between holding 0 and holding 8, and the
        // same as many small steps down.
        let ramp = Usage::default().after_ramp(&[8000, 0, 0], &[0; DIMS], hour, hour);
        let mut steps = Usage::default();
        for i in 0..3600u64 {
            let held = 8000 - (8000 * (2 * i + 1)) / 7200;
            steps = steps.after(&[held, 0, 0], 1000, hour);
        }
        assert!(
            (ramp.dims[0] - steps.dims[0]).abs() / steps.dims[0] < 1e-3,
            "{ramp:?} {steps:?}"
        );
        let flat = Usage::default().after_ramp(&[8000, 0, 0], &[8000, 0, 0], hour, hour);
        let held = Usage::default().after(&[8000, 0, 0], hour, hour);
        assert!((flat.dims[0] - held.dims[0]).abs() < 1e-6);
        // A changed half-life keeps the mean.
        let r = long.rescaled(hour, 2 * hour);
        assert!((r.mean(2 * hour, &[0; DIMS])[0] - mean).abs() < 1e-6);
    }

    #[test]
    fn a_ledger_takes_each_queues_half_life_from_its_tree() {
        let mut org = QueueSpec::open("org");
        org.usage_half_life_ms = Some(3_600_000);
        let mut team = QueueSpec::open("team");
        team.parent = Some("org".into());
        let tree = QueueTree::build(vec![org, team, QueueSpec::open("other")]);
        let mut l = Ledger::new(&tree, 0);
        let (org, team, other) = (
            tree.index("org").unwrap(),
            tree.index("team").unwrap(),
            tree.index("other").unwrap(),
        );
        assert_eq!(l.half_life_ms[team], 3_600_000);
        assert_eq!(l.half_life_ms[other], 0);
        assert!(l.decays());
        let mut alloc = vec![[0; DIMS]; tree.len()];
        alloc[org] = [2000, 0, 0];
        alloc[team] = [2000, 0, 0];
        alloc[other] = [2000, 0, 0];
        l.hold(alloc.iter().copied());
        l.advance(3_600_000);
        let means = l.means();
        // An hour at 2 GPUs with a 1 h half-life: half of the way to 2.
        let team_mean = means[team].unwrap()[0];
        assert!((team_mean - 1000.0).abs() < 1.0, "{team_mean}");
        assert_eq!(means[other], None);
    }
}
