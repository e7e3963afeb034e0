//! The units that failed since they were last woken, by what could wake them (core's
//! [`gpuplace_core::wake`]): single pods by their shape (request id and priority), woken
//! together when a departure could help that shape, and the rest (gangs, nominees,
//! queued units, units make-room looks for, units told when to look again), woken at
//! every departure. A departure costs one check per shape waiting, not one per unit.
//!
//! Entries may go stale (the unit woke another way, started, or failed again and was
//! listed elsewhere): the caller keeps each unit's [`Slot`] and skips entries that no
//! longer speak for it.

use std::collections::HashMap;

/// Where a failed unit waits to be woken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// Woken at every departure.
    Anywhere,
    /// Woken when a departure could let a pod of this request id and priority start.
    Shape { rid: u32, priority: i32 },
}

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
    units: Vec<u32>,
}

impl Parked {
    pub(super) fn push(&mut self, unit: u32, slot: Slot) {
        match slot {
            Slot::Anywhere => self.anywhere.push(unit),
            Slot::Shape { rid, priority } => {
                let shapes = &mut self.shapes;
                let at = *self.index.entry((rid, priority)).or_insert_with(|| {
                    shapes.push(Shape {
                        rid,
                        priority,
                        units: Vec::new(),
                    });
                    shapes.len() - 1
                });
                self.shapes[at].units.push(unit);
            }
        }
    }

    /// Every listed unit with the slot it was listed in (an event that may help any).
    pub(super) fn take_all(&mut self) -> Vec<(u32, Slot)> {
        self.take_helped(|_, _| true)
    }

    /// The units woken at every departure, and those of each shape `helped(rid, priority)`
    /// says the departures could help, each with the slot it was listed in.
    pub(super) fn take_helped(
        &mut self,
        mut helped: impl FnMut(u32, i32) -> bool,
    ) -> Vec<(u32, Slot)> {
        let mut out: Vec<(u32, Slot)> = self
            .anywhere
            .drain(..)
            .map(|u| (u, Slot::Anywhere))
            .collect();
        for shape in &mut self.shapes {
            if !shape.units.is_empty() && helped(shape.rid, shape.priority) {
                let slot = Slot::Shape {
                    rid: shape.rid,
                    priority: shape.priority,
                };
                out.extend(shape.units.drain(..).map(|u| (u, slot)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_departure_takes_the_shapes_it_helps_and_everything_anywhere() {
        let mut p = Parked::default();
        p.push(1, Slot::Anywhere);
        p.push(
            2,
            Slot::Shape {
                rid: 7,
                priority: 0,
            },
        );
        p.push(
            3,
            Slot::Shape {
                rid: 8,
                priority: 0,
            },
        );
        p.push(
            4,
            Slot::Shape {
                rid: 7,
                priority: 0,
            },
        );
        p.push(
            5,
            Slot::Shape {
                rid: 7,
                priority: 9,
            },
        );
        let units = |taken: Vec<(u32, Slot)>| -> Vec<u32> {
            let mut u: Vec<u32> = taken.into_iter().map(|(u, _)| u).collect();
            u.sort();
            u
        };
        assert_eq!(
            units(p.take_helped(|rid, prio| rid == 7 && prio == 0)),
            vec![1, 2, 4]
        );
        assert!(p.take_helped(|_, _| false).is_empty());
        assert_eq!(units(p.take_all()), vec![3, 5]);
        assert!(p.take_all().is_empty());
    }
}
