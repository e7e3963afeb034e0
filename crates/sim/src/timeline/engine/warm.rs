//! The warm start's pods that found no place, as the clock starts: how many times the
//! scheduler had tried each ([`crate::timeline::options::WarmAttempts`]), and whether their
//! backoff is over.

use super::Engine;
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// After the warm round at `now` (t=0): each waiting unit's attempts before the clock
    /// (one is the warm round's own), then, under `warm_pending_due`, its backoff over.
    pub(super) fn warm_leftovers(&mut self, now: Ms) {
        let seed = self.placer.seed();
        for unit in 0..self.units.len() as u32 {
            if !self.units[unit as usize].waiting {
                continue;
            }
            let tried = self.warm_attempts.pick(draw(seed, unit));
            for _ in 1..tried {
                self.queue.unschedulable(&unit, now);
                self.outcome_counts.failed_attempts += 1;
                let u = &mut self.units[unit as usize];
                u.fails += 1;
                for &job in &u.jobs {
                    if let Some(job) = self.jobs.get_mut(job as usize) {
                        job.failed_attempts += 1;
                    }
                }
            }
            if self.warm_pending_due {
                self.queue.backoff_over(&unit);
            }
        }
    }
}

/// A uniform draw for `unit` from `seed` (splitmix64's finaliser): the same pods get the
/// same counts for a seed, another tie-break seed another assignment.
fn draw(seed: u64, unit: u32) -> u64 {
    let mut z = seed ^ (u64::from(unit) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::options::WarmAttempts;

    #[test]
    fn counts_follow_the_weights_and_none_means_once() {
        assert_eq!(WarmAttempts::default().pick(12345), 1);
        let w = WarmAttempts {
            weights: vec![(1, 60), (2, 30), (5, 10)],
        };
        let mut seen = [0u32; 6];
        for unit in 0..10_000 {
            seen[w.pick(draw(42, unit)) as usize] += 1;
        }
        // 60/30/10 % of 10,000 within 3 points each.
        assert!((5_700..=6_300).contains(&seen[1]), "{seen:?}");
        assert!((2_700..=3_300).contains(&seen[2]), "{seen:?}");
        assert!((700..=1_300).contains(&seen[5]), "{seen:?}");
        assert_eq!(seen[0] + seen[3] + seen[4], 0);
    }
}
