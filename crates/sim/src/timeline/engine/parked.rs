//! The units that failed since they were last woken, by what could wake them (core's
//! [`gpuplace_core::wake`]): single pods by their shape (request id and priority), in
//! queue order, the first of a shape woken as many as a departure opened slots for it;
//! and the rest (gangs, nominees, queued units, units make-room looks for, units told
//! when to look again), woken at every departure. A departure costs one check per shape
//! waiting and a step per unit woken, not one per unit waiting.
//!
//! Entries may go stale (the unit woke another way, started, or failed again and was
//! listed elsewhere): the caller keeps each unit's [`Slot`] and skips entries that no
//! longer speak for it.

use std::collections::{BTreeSet, HashMap};

use super::units::{OrderKey, Slot};

/// The failed units by [`Slot`].
#[derive(Debug, Default)]
pub(super) struct Parked {
    anywhere: Vec<u32>,
    /// Per shape, in the order shapes first waited (so a wake-up is deterministic).
    shapes: Vec<Shape>,
    index: HashMap<(u32, i32), usize, foldhash::fast::RandomState>,
}

#[derive(Debug)]
struct Shape {
    rid: u32,
    priority: i32,
    /// In queue order.
    units: BTreeSet<(OrderKey, u32)>,
}

impl Parked {
    pub(super) fn push(&mut self, unit: u32, key: OrderKey, slot: Slot) {
        match slot {
            Slot::Anywhere => self.anywhere.push(unit),
            Slot::Shape { rid, priority } => {
                let shapes = &mut self.shapes;
                let at = *self.index.entry((rid, priority)).or_insert_with(|| {
                    shapes.push(Shape {
                        rid,
                        priority,
                        units: BTreeSet::new(),
                    });
                    shapes.len() - 1
                });
                self.shapes[at].units.insert((key, unit));
            }
        }
    }

    /// Every listed unit with the slot it was listed in (an event that may help any).
    pub(super) fn take_all(&mut self) -> Vec<(u32, Slot)> {
        self.take_helped(|_, _| usize::MAX, |_, _| true)
    }

    /// The units woken at every departure, and of each shape the first `slots(rid,
    /// priority)` in queue order that `live(unit, slot)` says are still listed there
    /// (entries that are not are dropped on the way), each with its slot.
    pub(super) fn take_helped(
        &mut self,
        mut slots: impl FnMut(u32, i32) -> usize,
        mut live: impl FnMut(u32, Slot) -> bool,
    ) -> Vec<(u32, Slot)> {
        let mut out: Vec<(u32, Slot)> = self
            .anywhere
            .drain(..)
            .map(|u| (u, Slot::Anywhere))
            .collect();
        for shape in &mut self.shapes {
            if shape.units.is_empty() {
                continue;
            }
            let mut wanted = slots(shape.rid, shape.priority);
            let slot = Slot::Shape {
                rid: shape.rid,
                priority: shape.priority,
            };
            while wanted > 0
                && let Some((_, unit)) = shape.units.pop_first()
            {
                if live(unit, slot) {
                    out.push((unit, slot));
                    wanted -= 1;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sequence: u64) -> OrderKey {
        (std::cmp::Reverse(0), sequence)
    }

    #[test]
    fn a_departure_takes_as_many_of_a_shape_as_it_opened_slots_for_in_queue_order() {
        let mut p = Parked::default();
        let seven = Slot::Shape {
            rid: 7,
            priority: 0,
        };
        p.push(1, key(1), Slot::Anywhere);
        p.push(4, key(4), seven);
        p.push(
            3,
            key(8),
            Slot::Shape {
                rid: 8,
                priority: 0,
            },
        );
        p.push(2, key(2), seven);
        p.push(5, key(5), seven);
        p.push(
            6,
            key(6),
            Slot::Shape {
                rid: 7,
                priority: 9,
            },
        );
        let one_of_seven = |rid, prio| usize::from(rid == 7 && prio == 0);
        assert_eq!(
            p.take_helped(one_of_seven, |_, _| true),
            vec![(1, Slot::Anywhere), (2, seven)]
        );
        // Unit 4 woke another way: its entry is dropped, 5 is next.
        assert_eq!(p.take_helped(one_of_seven, |u, _| u != 4), vec![(5, seven)]);
        assert!(p.take_helped(|_, _| 0, |_, _| true).is_empty());
        let mut rest: Vec<u32> = p.take_all().into_iter().map(|(u, _)| u).collect();
        rest.sort();
        assert_eq!(rest, vec![3, 6]);
        assert!(p.take_all().is_empty());
    }
}
