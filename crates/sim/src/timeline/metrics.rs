//! What the timeline replay measures: time-weighted integrals over the measurement window,
//! series over the whole run for plots, and per-class waits.

use gpuplace_model::{GpuTopology, Request};
use serde::Serialize;

use super::options::Ms;

/// The shape classes waits are reported by (a pod can be in two: `8` and `nvlink`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Class {
    /// A share of one GPU.
    Share,
    /// One whole GPU.
    One,
    /// Two to four GPUs.
    TwoToFour,
    /// Five to eight GPUs (the trace's 8-GPU pods).
    Eight,
    /// Any pod whose GPUs must be linked by NVLink.
    Nvlink,
}

impl Class {
    pub const ALL: [Class; 5] = [
        Class::Share,
        Class::One,
        Class::TwoToFour,
        Class::Eight,
        Class::Nvlink,
    ];

    /// The key in `--json` and the report.
    pub fn key(self) -> &'static str {
        match self {
            Class::Share => "share",
            Class::One => "1",
            Class::TwoToFour => "2-4",
            Class::Eight => "8",
            Class::Nvlink => "nvlink",
        }
    }

    /// How charts name the class.
    pub fn title(self) -> &'static str {
        match self {
            Class::Share => "GPU-share pods",
            Class::One => "1-GPU pods",
            Class::TwoToFour => "2-4 GPU pods",
            Class::Eight => "8-GPU pods",
            Class::Nvlink => "NVLink-required pods",
        }
    }

    /// The classes of `request` (none for a CPU-only pod).
    pub fn of(request: &Request) -> Vec<Class> {
        let mut out = Vec::new();
        match (request.gpu_count, request.gpu_milli) {
            (0, _) => return out,
            (1, m) if m < 1000 => out.push(Class::Share),
            (1, _) => out.push(Class::One),
            (2..=4, _) => out.push(Class::TwoToFour),
            _ => out.push(Class::Eight),
        }
        if request.need.topology == GpuTopology::Nvlink {
            out.push(Class::Nvlink);
        }
        out
    }
}

/// What the cluster holds at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Values {
    pub allocated_milli: u64,
    pub frag_milli: f64,
    /// GPU milli asked by the pods waiting.
    pub pending_milli: u64,
    /// Pods waiting.
    pub waiting: usize,
}

/// Series over the whole run (warm-up included) at evenly spaced times.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Series {
    pub t_s: Vec<f64>,
    pub allocation_pct: Vec<f64>,
    pub fragmentation_pct: Vec<f64>,
    /// GPUs asked by the waiting pods.
    pub pending_gpus: Vec<f64>,
}

/// Integrals over the measurement window, in value times milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Integrals {
    pub allocated: f64,
    pub frag: f64,
    pub pending: f64,
    pub waiting: f64,
}

/// Integrates the cluster's values over time.
#[derive(Clone, Debug)]
pub struct Recorder {
    from: Ms,
    to: Ms,
    last: Ms,
    capacity_milli: f64,
    pub window: Integrals,
    /// `allocated` over the whole run, for the conservation check.
    pub allocated_all: f64,
    grid: Vec<Ms>,
    next: usize,
    pub series: Series,
}

impl Recorder {
    /// Measures over `[from, to]`; samples `points` times evenly over `[0, to]`.
    pub fn new(from: Ms, to: Ms, capacity_milli: u64, points: usize) -> Recorder {
        let points = points.max(2);
        let grid = (0..points)
            .map(|i| Ms((to.0 as f64 * i as f64 / (points - 1) as f64).round() as u64))
            .collect();
        Recorder {
            from,
            to,
            last: Ms(0),
            capacity_milli: capacity_milli.max(1) as f64,
            window: Integrals::default(),
            allocated_all: 0.0,
            grid,
            next: 0,
            series: Series::default(),
        }
    }

    /// The values held from the last call until `now`.
    pub fn advance(&mut self, now: Ms, held: Values) {
        let now = now.min(self.to);
        if now <= self.last {
            self.sample(now, held);
            return;
        }
        let span = (now.0 - self.last.0) as f64;
        self.allocated_all += held.allocated_milli as f64 * span;
        let lo = self.last.max(self.from);
        if now > lo {
            let dt = (now.0 - lo.0) as f64;
            self.window.allocated += held.allocated_milli as f64 * dt;
            self.window.frag += held.frag_milli * dt;
            self.window.pending += held.pending_milli as f64 * dt;
            self.window.waiting += held.waiting as f64 * dt;
        }
        self.sample(now, held);
        self.last = now;
    }

    /// Grid points before `now` (and at it, once the run ends) take the values held.
    fn sample(&mut self, now: Ms, held: Values) {
        while let Some(&at) = self.grid.get(self.next)
            && (at < now || (at == now && now == self.to))
        {
            let s = &mut self.series;
            s.t_s.push(at.0 as f64 / 1000.0);
            s.allocation_pct
                .push(100.0 * held.allocated_milli as f64 / self.capacity_milli);
            s.fragmentation_pct
                .push(100.0 * held.frag_milli / self.capacity_milli);
            s.pending_gpus.push(held.pending_milli as f64 / 1000.0);
            self.next += 1;
        }
    }

    /// The window's length in milliseconds.
    pub fn window_ms(&self) -> f64 {
        self.to.0.saturating_sub(self.from.0) as f64
    }

    /// Time-weighted means over the window: (allocation %, fragmentation %, pending GPUs,
    /// pods waiting).
    pub fn means(&self) -> Means {
        let span = self.window_ms().max(1.0);
        Means {
            allocation_pct: 100.0 * self.window.allocated / span / self.capacity_milli,
            fragmentation_pct: 100.0 * self.window.frag / span / self.capacity_milli,
            pending_gpus: self.window.pending / span / 1000.0,
            waiting: self.window.waiting / span,
        }
    }
}

/// Time-weighted means over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Means {
    pub allocation_pct: f64,
    pub fragmentation_pct: f64,
    pub pending_gpus: f64,
    pub waiting: f64,
}

/// Waits of one class: percentiles in seconds, to each pod's Binding (pods that never
/// started count with their wait so far, pods whose user gave up with their wait until
/// then: lower bounds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Waits {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    /// Pods of the class that had not started by the end.
    pub never_started: usize,
    /// Pods of the class whose user deleted them while they waited (`--patience`).
    pub abandoned: usize,
}

impl Waits {
    /// Percentiles of `waits` (seconds; sorted here), nearest rank.
    pub fn of(mut waits: Vec<f64>, never_started: usize, abandoned: usize) -> Waits {
        if waits.is_empty() {
            return Waits::default();
        }
        waits.sort_by(f64::total_cmp);
        let rank =
            |p: f64| waits[((p * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1];
        Waits {
            count: waits.len(),
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            max: waits[waits.len() - 1],
            mean: waits.iter().sum::<f64>() / waits.len() as f64,
            never_started,
            abandoned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integrals_cover_the_window_only_and_series_the_whole_run() {
        let mut r = Recorder::new(Ms(1_000), Ms(3_000), 2_000, 4);
        let v = |milli| Values {
            allocated_milli: milli,
            ..Values::default()
        };
        r.advance(Ms(2_000), v(1_000));
        r.advance(Ms(3_000), v(2_000));
        // Window [1 s, 3 s]: 1 s at 1,000 milli, 1 s at 2,000: mean 1,500 of 2,000 = 75%.
        assert!((r.means().allocation_pct - 75.0).abs() < 1e-9);
        assert_eq!(r.allocated_all, 1_000.0 * 2_000.0 + 2_000.0 * 1_000.0);
        assert_eq!(r.series.t_s, vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(r.series.allocation_pct, vec![50.0, 50.0, 100.0, 100.0]);
    }

    #[test]
    fn percentiles_by_nearest_rank_and_classes_by_shape() {
        let w = Waits::of((1..=100).map(f64::from).collect(), 3, 2);
        assert_eq!((w.p50, w.p90, w.p99, w.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!((w.never_started, w.abandoned), (3, 2));
        let req = |count, milli| Request {
            gpu_count: count,
            gpu_milli: milli,
            ..Request::default()
        };
        assert_eq!(Class::of(&req(1, 500)), vec![Class::Share]);
        assert_eq!(Class::of(&req(8, 1000)), vec![Class::Eight]);
        assert!(Class::of(&req(0, 0)).is_empty());
        let mut linked = req(4, 1000);
        linked.need.topology = GpuTopology::Nvlink;
        assert_eq!(Class::of(&linked), vec![Class::TwoToFour, Class::Nvlink]);
    }
}
