//! How long users let a pod wait before deleting it (`--patience trace`).
//!
//! In `openb_pod_list_default.csv`, 897 of 8,152 pods (11%) were deleted while still pending
//! (`pod_phase` Pending, no `scheduled_time`), `deletion_time - creation_time` after their
//! creation: median 94 s, p90 342 s. A unit arriving in the replay gives up with the
//! probability its class had in the trace, after a delay drawn from that class's deletions;
//! a class with fewer than [`MIN_OWN`] such pods in the trace (2-4 GPUs: 1; 8 GPUs: 0) takes
//! the figures of all pods. The rest wait as long as it takes. The draw depends on the seed
//! and the arrival alone, so every policy meets the same users.

use super::metrics::Class;

/// Classes with fewer deletions while pending than this use the pooled figures.
pub const MIN_OWN: usize = 30;

/// One class's patience in the trace: the share of its pods deleted while pending and the
/// quantiles of how long after creation (fraction, seconds).
struct ClassPatience {
    gives_up: f64,
    quantiles: &'static [(f64, f64)],
}

/// Share pods (a share of one GPU): 505 of 3,078 deleted while pending.
const SHARE: ClassPatience = ClassPatience {
    gives_up: 505.0 / 3_078.0,
    quantiles: &[
        (0.0, 0.0),
        (0.05, 4.0),
        (0.1, 9.0),
        (0.2, 36.0),
        (0.3, 56.0),
        (0.4, 82.0),
        (0.5, 108.0),
        (0.6, 130.0),
        (0.7, 177.0),
        (0.8, 283.0),
        (0.9, 526.0),
        (0.95, 834.0),
        (0.99, 2_267.0),
        (1.0, 11_717.0),
    ],
};

/// One-GPU pods: 355 of 3,911.
const ONE: ClassPatience = ClassPatience {
    gives_up: 355.0 / 3_911.0,
    quantiles: &[
        (0.0, 1.0),
        (0.05, 27.0),
        (0.1, 36.0),
        (0.2, 47.0),
        (0.3, 57.0),
        (0.4, 74.0),
        (0.5, 87.0),
        (0.6, 102.0),
        (0.7, 120.0),
        (0.8, 145.0),
        (0.9, 203.0),
        (0.95, 251.0),
        (0.99, 839.0),
        (1.0, 1_900.0),
    ],
};

/// Every pod of the list: 897 of 8,152.
const POOLED: ClassPatience = ClassPatience {
    gives_up: 897.0 / 8_152.0,
    quantiles: &[
        (0.0, 0.0),
        (0.05, 5.0),
        (0.1, 22.0),
        (0.2, 41.0),
        (0.3, 57.0),
        (0.4, 75.0),
        (0.5, 94.0),
        (0.6, 114.0),
        (0.7, 142.0),
        (0.8, 198.0),
        (0.9, 342.0),
        (0.95, 600.0),
        (0.99, 2_080.0),
        (1.0, 11_717.0),
    ],
};

fn of_class(classes: &[Class]) -> &'static ClassPatience {
    match classes.first() {
        Some(Class::Share) => &SHARE,
        Some(Class::One) => &ONE,
        _ => &POOLED,
    }
}

/// SplitMix64's step (the golden-ratio increment, then its finaliser): every input bit
/// moves every output bit.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from `seed`, `arrival` and `salt` (independent across salts).
fn uniform(seed: u64, arrival: u64, salt: u64) -> f64 {
    let h = mix(seed ^ mix(arrival ^ mix(salt)));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Milliseconds the unit of arrival `arrival` in seed `seed` waits before its user deletes
/// it, for a unit whose first pod is of `classes`; `None`: it waits as long as it takes.
pub fn draw_ms(classes: &[Class], seed: u64, arrival: u64) -> Option<u64> {
    let c = of_class(classes);
    if uniform(seed, arrival, 1) >= c.gives_up {
        return None;
    }
    let u = uniform(seed, arrival, 2);
    let q = c.quantiles;
    let i = q.partition_point(|(f, _)| *f <= u).clamp(1, q.len() - 1);
    let ((f0, s0), (f1, s1)) = (q[i - 1], q[i]);
    let s = s0 + (s1 - s0) * ((u - f0) / (f1 - f0).max(1e-12)).clamp(0.0, 1.0);
    Some((s * 1e3).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn about_the_trace_share_gives_up_at_about_the_trace_delays() {
        let n = 100_000u64;
        let delays: Vec<u64> = (0..n)
            .filter_map(|a| draw_ms(&[Class::One], 7, a))
            .collect();
        let share = delays.len() as f64 / n as f64;
        assert!((share - ONE.gives_up).abs() < 0.005, "{share}");
        let mut sorted = delays.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2] as f64 / 1e3;
        assert!((80.0..95.0).contains(&median), "{median}");
        // The same arrival, the same user; another seed, others.
        assert_eq!(
            draw_ms(&[Class::Eight], 3, 11),
            draw_ms(&[Class::Eight], 3, 11)
        );
        let other: Vec<Option<u64>> = (0..50).map(|a| draw_ms(&[Class::Share], 4, a)).collect();
        let again: Vec<Option<u64>> = (0..50).map(|a| draw_ms(&[Class::Share], 5, a)).collect();
        assert_ne!(other, again);
    }
}
