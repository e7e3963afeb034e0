//! The warm start's pods that found no place, as the clock starts: how many times the
//! scheduler had tried each ([`crate::timeline::options::WarmAttempts`]), and whether their
//! backoff is over.

use gpuplace_core::queue::Discipline;

use super::Engine;
use crate::timeline::options::Ms;
use crate::timeline::patience::mix;

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
                self.tally_failure(unit);
            }
            // Its parking's flush entry speaks for its last failure (gpuplace's queue
            // flushes each unit at its own time; kube-scheduler's looks at every pod).
            if tried > 1 && self.queue.discipline() == Discipline::Gpuplace {
                let at = now + self.queue.config().unschedulable_flush;
                let fails = self.units[unit as usize].fails;
                self.flushes.push_back(super::quiet::Flush {
                    at,
                    unit,
                    fails,
                    quiet: None,
                });
            }
            if self.warm_pending_due {
                self.queue.backoff_over(&unit);
            }
        }
    }
}

impl Engine<'_> {
    /// One failed attempt of `unit` counted: the run's and the unit's (its wake-ups tell
    /// attempts apart by it; its pods' for `pods.csv` are the unit's). [`Engine::attempted`] and
    /// the warm start's earlier attempts both count through here.
    pub(super) fn tally_failure(&mut self, unit: u32) {
        self.outcome_counts.failed_attempts += 1;
        // Its pods' counts are its own, copied at the end ([`Engine::count_pods_attempts`]):
        // a job is of one unit all its life.
        self.units[unit as usize].fails += 1;
    }

    /// Each pod's failed attempts (`pods.csv`): its unit's.
    pub(super) fn count_pods_attempts(&mut self) {
        self.speak_up_all();
        for job in &mut self.jobs {
            if let Some(u) = self.units.get(job.unit as usize) {
                job.failed_attempts = u.fails;
            }
        }
    }
}

/// A uniform draw for `unit` from `seed`: SplitMix64 ([`mix`]) of the seed with the unit in
/// its high bits; the same pods get the same counts for a seed, another tie-break seed
/// another assignment. (The increment is taken back out so the draws stay those the
/// measured twins of docs/replay.md were made with.)
fn draw(seed: u64, unit: u32) -> u64 {
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    mix((seed ^ (u64::from(unit) << 32) ^ GOLDEN).wrapping_sub(GOLDEN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::options::WarmAttempts;

    #[test]
    fn draws_stay_those_the_documented_twins_were_made_with() {
        for (seed, unit, expected) in [
            (0, 0, 0xe220_a839_7b1d_cdaf),
            (42, 7, 0x468d_e391_73c1_fd54),
            (u64::MAX, u32::MAX, 0xadef_16ce_72f9_3470),
            (0x1234_5678_9abc_def0, 4_183, 0xc1fe_888d_f43b_9dc3),
        ] {
            assert_eq!(draw(seed, unit), expected, "seed {seed} unit {unit}");
        }
    }

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
