//! What arrives when in the timeline replay.
//!
//! The pod list is a mix of arrival units: one pod, or a gang's pods (the `gang` column)
//! that arrive together. Per seed, units arrive in shuffled list order (a fresh shuffle each
//! time the list is used up) with exponential gaps at the rate that makes the offered load
//! `rho` = GPU-seconds asked per second / GPU capacity:
//! `rate = rho * capacity / mean(GPU-seconds of one unit)`.
//!
//! A warm start puts the cluster in the state an infinite cluster would have after running
//! that mix for ever (the stationary M/G/infinity population): a Poisson number
//! `rate * mean(run time)` of units, each picked with chance proportional to its run time
//! and left with a uniform share of it. Without it the long pods of the trace's heavy tail
//! (a few run for months and hold most GPU-seconds) would take months of simulated time to
//! build up, and a run of days would measure an emptier cluster than the load says.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::options::Ms;
use crate::trace::TracePod;

/// One arrival unit of the pod list.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// Indexes into the pod list.
    pub pods: Vec<usize>,
    /// The highest priority of its pods.
    pub priority: i32,
    /// Milli-GPU times milliseconds its pods ask for.
    pub gpu_ms: f64,
    /// Its longest run, milliseconds.
    pub longest_ms: u64,
}

/// The arrival units of a pod list and each pod's run time.
#[derive(Clone, Debug)]
pub struct Mix {
    pub templates: Vec<Template>,
    /// Per pod of the list, its run time in milliseconds.
    pub durations_ms: Vec<u64>,
}

impl Mix {
    /// Groups `pods` into units (gangs by name, in order of first appearance) with run
    /// times from `model`.
    pub fn new(pods: &[TracePod], model: &super::durations::DurationModel) -> Mix {
        let durations_ms: Vec<u64> = pods
            .iter()
            .map(|p| model.millis(&p.name, p.duration_s))
            .collect();
        let mut templates: Vec<Template> = Vec::new();
        let mut gangs: std::collections::HashMap<&str, usize> = Default::default();
        for (i, pod) in pods.iter().enumerate() {
            let t = match pod.gang.as_deref() {
                Some(g) => *gangs.entry(g).or_insert_with(|| {
                    templates.push(Template {
                        pods: Vec::new(),
                        priority: i32::MIN,
                        gpu_ms: 0.0,
                        longest_ms: 0,
                    });
                    templates.len() - 1
                }),
                None => {
                    templates.push(Template {
                        pods: Vec::new(),
                        priority: i32::MIN,
                        gpu_ms: 0.0,
                        longest_ms: 0,
                    });
                    templates.len() - 1
                }
            };
            let template = &mut templates[t];
            template.pods.push(i);
            template.priority = template.priority.max(pod.priority);
            template.gpu_ms += pod.request.total_gpu_milli() as f64 * durations_ms[i] as f64;
            template.longest_ms = template.longest_ms.max(durations_ms[i]);
        }
        Mix {
            templates,
            durations_ms,
        }
    }

    /// Mean milli-GPU-milliseconds one arrival asks for.
    pub fn mean_gpu_ms(&self) -> f64 {
        if self.templates.is_empty() {
            return 0.0;
        }
        self.templates.iter().map(|t| t.gpu_ms).sum::<f64>() / self.templates.len() as f64
    }

    /// Arrivals per millisecond for offered load `rho` on `capacity_milli`.
    /// The mean number of units a warm start holds at `rate` per millisecond.
    pub fn warm_mean(&self, rate: f64) -> f64 {
        if self.templates.is_empty() {
            return 0.0;
        }
        let total: f64 = self.templates.iter().map(|t| t.longest_ms as f64).sum();
        rate * total / self.templates.len() as f64
    }

    pub fn rate_per_ms(&self, capacity_milli: u64, rho: f64) -> f64 {
        let mean = self.mean_gpu_ms();
        if mean <= 0.0 {
            return 0.0;
        }
        rho * capacity_milli as f64 / mean
    }
}

/// A unit already running when the replay starts (the warm start).
#[derive(Clone, Debug, PartialEq)]
pub struct Warm {
    pub template: u32,
    /// The share (0-1) of each pod's run time still to go.
    pub left: f64,
}

/// One arrival after the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub at: Ms,
    pub template: u32,
}

/// Everything that arrives in one seed's replay.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub warm: Vec<Warm>,
    pub arrivals: Vec<Arrival>,
    /// Arrivals per second.
    pub rate_per_s: f64,
}

/// The arrivals of one seed: `count` units after a warm start (if asked).
pub fn schedule(
    mix: &Mix,
    capacity_milli: u64,
    rho: f64,
    count: usize,
    seed: u64,
    warm_start: bool,
) -> Schedule {
    let rate = mix.rate_per_ms(capacity_milli, rho);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = mix.templates.len();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    let mut arrivals = Vec::with_capacity(count);
    let mut clock = 0.0f64;
    while arrivals.len() < count && n > 0 && rate > 0.0 {
        if order.is_empty() {
            order = (0..n as u32).collect();
            for i in (1..n).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            order.reverse();
        }
        let template = order.pop().unwrap_or(0);
        clock += exponential(&mut rng) / rate;
        arrivals.push(Arrival {
            at: Ms(clock.round() as u64),
            template,
        });
    }
    let warm = if warm_start && rate > 0.0 {
        warm_population(mix, rate, seed)
    } else {
        Vec::new()
    };
    Schedule {
        warm,
        arrivals,
        rate_per_s: rate * 1000.0,
    }
}

/// The stationary M/G/infinity population of the mix at `rate` (see the module's text).
fn warm_population(mix: &Mix, rate: f64, seed: u64) -> Vec<Warm> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5851_f42d_4c95_7f2d);
    let mut cumulative = Vec::with_capacity(mix.templates.len());
    let mut total = 0.0f64;
    for t in &mix.templates {
        total += t.longest_ms as f64;
        cumulative.push(total);
    }
    if total <= 0.0 {
        return Vec::new();
    }
    let count = poisson(&mut rng, mix.warm_mean(rate));
    (0..count)
        .map(|_| {
            let point = rng.random::<f64>() * total;
            let template = cumulative
                .partition_point(|c| *c <= point)
                .min(cumulative.len() - 1) as u32;
            Warm {
                template,
                left: rng.random::<f64>(),
            }
        })
        .collect()
}

/// An exponential draw of mean 1.
fn exponential(rng: &mut ChaCha8Rng) -> f64 {
    -(1.0 - rng.random::<f64>()).ln()
}

/// A Poisson draw of mean `mean` (Knuth's method below 30, else the normal approximation).
fn poisson(rng: &mut ChaCha8Rng, mean: f64) -> usize {
    if !(mean.is_finite() && mean > 0.0) {
        return 0;
    }
    if mean < 30.0 {
        let limit = (-mean).exp();
        let mut product = rng.random::<f64>();
        let mut k = 0;
        while product > limit {
            product *= rng.random::<f64>();
            k += 1;
        }
        return k;
    }
    let (u1, u2) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (mean + mean.sqrt() * z).round().max(0.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::Request;

    fn pod(name: &str, gpus: u32, seconds: u64, gang: Option<&str>) -> TracePod {
        TracePod {
            name: name.into(),
            priority: 0,
            request: Request {
                cpu_milli: 1000,
                memory_mib: 100,
                gpu_count: gpus,
                gpu_milli: if gpus > 0 { 1000 } else { 0 },
                allowed_models: vec![],
                need: Default::default(),
            },
            duration_s: Some(seconds),
            gang: gang.map(str::to_string),
        }
    }

    #[test]
    fn gangs_arrive_as_one_unit_and_the_rate_gives_the_load() {
        let pods = vec![
            pod("a", 1, 100, None),
            pod("g0", 2, 100, Some("g")),
            pod("b", 0, 100, None),
            pod("g1", 2, 300, Some("g")),
        ];
        let mix = Mix::new(&pods, &super::super::durations::DurationModel::default());
        assert_eq!(mix.templates.len(), 3);
        assert_eq!(mix.templates[1].pods, vec![1, 3]);
        assert_eq!(mix.templates[1].longest_ms, 300_000);
        // One GPU-second per arrival on average per ... (1*100 + 2*100 + 2*300) / 3 units.
        let mean = (1000.0 * 100_000.0 + 2000.0 * 100_000.0 + 2000.0 * 300_000.0) / 3.0;
        assert!((mix.mean_gpu_ms() - mean).abs() < 1e-6);
        let rate = mix.rate_per_ms(4000, 0.5);
        assert!((rate - 0.5 * 4000.0 / mean).abs() < 1e-12);
    }

    #[test]
    fn arrivals_cycle_through_shuffles_at_the_asked_rate() {
        let pods: Vec<TracePod> = (0..50)
            .map(|i| pod(&format!("p{i}"), 1, 60, None))
            .collect();
        let mix = Mix::new(&pods, &super::super::durations::DurationModel::default());
        let s = schedule(&mix, 10_000, 0.9, 20_000, 7, true);
        assert_eq!(s.arrivals.len(), 20_000);
        // Each block of 50 arrivals is a permutation of the list.
        let mut first: Vec<u32> = s.arrivals[..50].iter().map(|a| a.template).collect();
        first.sort_unstable();
        assert_eq!(first, (0..50).collect::<Vec<u32>>());
        assert!(s.arrivals.windows(2).all(|w| w[0].at <= w[1].at));
        // rate = 0.9 * 10 GPUs / 60 GPU-s = 0.15/s: 20,000 arrivals in about 133,333 s.
        let span = s.arrivals.last().map_or(0, |a| a.at.0) as f64 / 1000.0;
        assert!((span / 133_333.0 - 1.0).abs() < 0.03, "{span}");
        // Warm start: about rate * 60 s = 9 units, all with part of their run left.
        assert!(s.warm.len() < 30);
        assert!(s.warm.iter().all(|w| (0.0..1.0).contains(&w.left)));
        let again = schedule(&mix, 10_000, 0.9, 20_000, 7, true);
        assert_eq!(again.arrivals, s.arrivals);
    }

    #[test]
    fn the_warm_population_is_length_biased() {
        // Two shapes, equally common; one runs 9 times longer: in the stationary
        // population it is 9 times as common.
        let pods = vec![pod("short", 1, 100, None), pod("long", 1, 900, None)];
        let mix = Mix::new(&pods, &super::super::durations::DurationModel::default());
        let warm = warm_population(&mix, 1.0, 3);
        let long = warm.iter().filter(|w| w.template == 1).count() as f64;
        let ratio = long / (warm.len() as f64 - long);
        assert!((ratio - 9.0).abs() < 0.5, "{ratio}");
        // Mean population rate * mean run: 1/ms * 500,000 ms.
        assert!((warm.len() as f64 / 500_000.0 - 1.0).abs() < 0.01);
    }
}
