//! Make-room's and rebalancing's movable units, each as its running jobs, in one flat
//! list: a listing holds thousands of units (most one pod each), and a vector per unit was
//! an allocation each, every round a make-room search ran.

/// Units of running jobs: unit `i` is `jobs[ends[i - 1]..ends[i]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct MovableUnits {
    jobs: Vec<u32>,
    ends: Vec<u32>,
}

impl MovableUnits {
    /// Adds a unit of `jobs` (none: nothing is added).
    pub(super) fn push(&mut self, jobs: &[u32]) {
        if jobs.is_empty() {
            return;
        }
        self.jobs.extend_from_slice(jobs);
        self.ends.push(self.jobs.len() as u32);
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The jobs of unit `i` (none past the end).
    pub(super) fn get(&self, i: usize) -> &[u32] {
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.jobs[start as usize..end as usize]
    }

    /// Each unit's jobs, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Every unit's jobs, one after another (a holder's index in core's movables).
    pub(super) fn all_jobs(&self) -> &[u32] {
        &self.jobs
    }

    /// The units `keep` accepts, in order.
    pub(super) fn keeping(&self, mut keep: impl FnMut(&[u32]) -> bool) -> MovableUnits {
        let mut kept = MovableUnits::default();
        for unit in self.iter().filter(|u| keep(u)) {
            kept.push(unit);
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_keep_their_jobs_and_order() {
        let mut m = MovableUnits::default();
        m.push(&[4]);
        m.push(&[]);
        m.push(&[7, 2]);
        m.push(&[9]);
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(1), &[7, 2]);
        assert!(m.get(3).is_empty());
        assert_eq!(m.all_jobs(), &[4, 7, 2, 9]);
        let units: Vec<&[u32]> = m.iter().collect();
        assert_eq!(units, vec![&[4][..], &[7, 2], &[9]]);
        let m = m.keeping(|u| u.len() == 1);
        assert_eq!(m.all_jobs(), &[4, 9]);
        assert_eq!(m.get(1), &[9]);
        assert!(MovableUnits::default().is_empty());
    }
}
