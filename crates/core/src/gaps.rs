//! How many partly used GPUs the cluster has per free milli: the counts N(h) that the
//! `gpuplace` policy keeps balanced (Csirik et al.'s Sum-of-Squares rule for online bin
//! packing, with a GPU as the bin and milli-GPU as the size).

/// Partly used GPUs per free milli, counting only gaps that a share of the workload could
/// still fill (free milli at or above the workload's share floor, see
/// [`TargetWorkload::share_floor`](crate::TargetWorkload::share_floor)).
#[derive(Clone, Debug, Default)]
pub struct GapCounts {
    /// Gaps below this are dead and not counted (`u32::MAX`: nothing is counted).
    floor: u32,
    counts: Vec<u32>,
}

impl GapCounts {
    /// Empty counts that count gaps of at least `floor` milli (none when `floor` is `None`).
    pub(crate) fn new(floor: Option<u32>) -> Self {
        GapCounts {
            floor: floor.unwrap_or(u32::MAX),
            counts: Vec::new(),
        }
    }

    /// Whether a GPU with `free` of `capacity` milli is a counted gap.
    pub fn counts_as_gap(&self, free: u32, capacity: u32) -> bool {
        free >= self.floor && free < capacity
    }

    /// N(h): counted gaps with exactly `free` milli.
    pub fn count(&self, free: u32) -> u32 {
        self.counts.get(free as usize).copied().unwrap_or(0)
    }

    /// Records a GPU of `capacity` whose free milli went from `before` to `after`.
    pub(crate) fn update(&mut self, capacity: u32, before: u32, after: u32) {
        if self.counts_as_gap(before, capacity)
            && let Some(c) = self.counts.get_mut(before as usize)
        {
            *c = c.saturating_sub(1);
        }
        if self.counts_as_gap(after, capacity) {
            let at = after as usize;
            if self.counts.len() <= at {
                self.counts.resize(at + 1, 0);
            }
            self.counts[at] += 1;
        }
    }

    /// The change of sum over h of N(h)^2 when one GPU of `capacity` goes from `before` to
    /// `after` free milli.
    pub fn square_change(&self, capacity: u32, before: u32, after: u32) -> i64 {
        let gone = self.counts_as_gap(before, capacity);
        let new = self.counts_as_gap(after, capacity);
        if gone && new && before == after {
            return 0;
        }
        let mut change = 0i64;
        if gone {
            change += 1 - 2 * i64::from(self.count(before));
        }
        if new {
            change += 2 * i64::from(self.count(after)) + 1;
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_updates_and_square_changes_are_exact() {
        let mut gaps = GapCounts::new(Some(100));
        gaps.update(1000, 1000, 500);
        gaps.update(1000, 1000, 500);
        gaps.update(1000, 1000, 190);
        // A gap below the floor, a full GPU and a free GPU are not counted.
        gaps.update(1000, 1000, 60);
        gaps.update(1000, 500, 0);
        assert_eq!(gaps.count(500), 1);
        assert_eq!(gaps.count(190), 1);
        assert_eq!(gaps.count(60), 0);
        let sum = |g: &GapCounts| {
            (0..=1000)
                .map(|h| i64::from(g.count(h)).pow(2))
                .sum::<i64>()
        };
        for (before, after) in [(500, 310), (190, 30), (1000, 190), (500, 190), (1000, 940)] {
            let mut next = gaps.clone();
            next.update(1000, before, after);
            assert_eq!(
                gaps.square_change(1000, before, after),
                sum(&next) - sum(&gaps),
                "{before} -> {after}"
            );
        }
        assert_eq!(GapCounts::new(None).square_change(1000, 1000, 500), 0);
    }
}
