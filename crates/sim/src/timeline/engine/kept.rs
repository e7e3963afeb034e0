//! What the timeline's engine keeps between attempts so that a round's failed attempts do
//! not redo the same work: the units marked in a victim search, and make-room's movable
//! units while the running pods and the time are the same. (Apart from the engine's
//! modules that use them, which import the engine.)

use crate::timeline::options::Ms;

/// Units marked in one victim search (a stamp per search: nothing to clear).
#[derive(Debug, Default)]
pub(super) struct UnitMarks {
    stamps: Vec<u32>,
    last: u32,
}

impl UnitMarks {
    /// A new stamp: no unit is marked with it yet.
    pub(super) fn stamp(&mut self) -> u32 {
        self.last = self.last.wrapping_add(1);
        if self.last == 0 {
            self.stamps.fill(0);
            self.last = 1;
        }
        self.last
    }

    pub(super) fn mark(&mut self, unit: u32, stamp: u32) {
        let u = unit as usize;
        if self.stamps.len() <= u {
            self.stamps.resize(u + 1, 0);
        }
        self.stamps[u] = stamp;
    }

    pub(super) fn marked(&self, unit: u32, stamp: u32) -> bool {
        self.stamps.get(unit as usize) == Some(&stamp)
    }
}

/// Make-room's movable units as listed at a generation of the running pods and a time.
#[derive(Debug)]
pub(super) struct MovableKept {
    pub(super) generation: u64,
    pub(super) at: Ms,
    pub(super) groups: std::sync::Arc<super::movable::MovableUnits>,
}

impl MovableKept {
    /// Whether these are the units listed at `generation` and `at`.
    pub(super) fn is(&self, generation: u64, at: Ms) -> bool {
        self.generation == generation && self.at == at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_stamp_forgets_every_mark_even_when_the_stamps_wrap() {
        let mut marks = UnitMarks::default();
        let first = marks.stamp();
        marks.mark(3, first);
        assert!(marks.marked(3, first) && !marks.marked(2, first) && !marks.marked(99, first));
        let second = marks.stamp();
        assert!(!marks.marked(3, second));
        marks.last = u32::MAX;
        let wrapped = marks.stamp();
        marks.mark(5, wrapped);
        assert_eq!(wrapped, 1);
        assert!(marks.marked(5, wrapped) && !marks.marked(3, wrapped));
    }
}
