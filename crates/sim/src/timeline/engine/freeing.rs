//! Leaving pods as room that frees itself. The scheduler's victim search counts a pod of
//! lower priority that is already terminating, and promised to no waiting nominee, as room
//! at no cost (core's [`Candidates::freeing`]): a preemptor may be nominated to wait for it
//! instead of evicting another pod. Here the same over [`Leaving`]'s places: those whose
//! nominee started elsewhere (or was never one: rebalancing's moves) are offered to every
//! later search until one counts on them (then they are promised to it), tallied beside
//! the running pods ([`super::evictable::ByPriority`]) so that the room check and the plans
//! kept node by node see them come and go (a departure's wake-up does not count them, as
//! the scheduler's does not count a terminating pod).

use gpuplace_core::preempt::Holder;

use super::Engine;
use super::evictable::Room;
use super::leaving::{Leaving, Owner, Remains};
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// The offered places a search that may evict what `take` accepts (by pod index) may
    /// count on, on the nodes of `room`: their slots in [`Leaving`].
    pub(super) fn offered_slots(&self, take: &dyn Fn(u32) -> bool, room: &Room) -> Vec<u32> {
        self.leaving
            .offered()
            .filter(|(_, r, job)| room.on(r.node) && take(self.jobs[*job as usize].pod))
            .map(|(slot, _, _)| slot)
            .collect()
    }

    /// Tallies slot `slot`'s place as offered (`on`) or no longer.
    fn tally(&mut self, slot: u32, on: bool) {
        let Some((remains, _, Some(owner))) = self.leaving.slot(slot) else {
            return;
        };
        let priority = self.pods[self.jobs[owner.job as usize].pod as usize].priority;
        let (node, amounts) = (remains.node, remains.amounts());
        self.by_priority.freeing(node, priority, amounts, on);
    }

    /// Holds what a plan left of an evicted job's place until `at`, promised to the nominee
    /// `promised` (offered at once without one).
    pub(super) fn hold_leaving(&mut self, job: u32, at: Ms, promised: Option<u32>) {
        let j = &self.jobs[job as usize];
        let place = Remains::new(
            j.node as usize,
            self.pods[j.pod as usize].request.clone(),
            j.gpus.clone(),
        );
        let owner = Owner { job, promised };
        let slot = self.leaving.hold(&mut self.state, &place, at, Some(owner));
        if promised.is_none() {
            self.tally(slot, true);
        }
    }

    /// Holds a nominee's owed `part` (taken in the state) until `at`, of job `owner`
    /// (never offered without one), promised to `promised` (offered at once without).
    pub(super) fn hold_owed(
        &mut self,
        part: Remains,
        at: Ms,
        owner: Option<u32>,
        promised: Option<u32>,
    ) {
        let owner = owner.map(|job| Owner { job, promised });
        let slot = self.leaving.hold_taken(part, at, owner);
        if owner.is_some_and(|o| o.offered()) {
            self.tally(slot, true);
        }
    }

    /// `unit`'s nomination ended: the places it was promised are offered from now on.
    pub(super) fn nomination_ended(&mut self, unit: u32) {
        for slot in self.leaving.release_promises(unit) {
            self.tally(slot, true);
        }
    }

    /// Offered places gone by `now` are no longer tallied; the nodes they were on.
    pub(super) fn leaving_gone(&mut self, now: Ms) -> Vec<u32> {
        let gone = self.leaving.gone_due(&mut self.state, now);
        let mut nodes = Vec::with_capacity(gone.len());
        for (remains, owner) in gone {
            if let Some(owner) = owner.filter(Owner::offered) {
                let priority = self.pods[self.jobs[owner.job as usize].pod as usize].priority;
                (self.by_priority).freeing(remains.node, priority, remains.amounts(), false);
            }
            nodes.push(remains.node as u32);
        }
        nodes
    }

    /// Gives back the offered places `slots` a plan counted on, for its places to be
    /// taken ([`Self::keep_freeing`] after).
    pub(super) fn lend_freeing(&mut self, slots: &[u32]) {
        for &slot in slots {
            self.tally(slot, false);
            self.leaving.lend(&mut self.state, slot);
        }
    }

    /// What the plan left of the lent `slots` stays theirs until they are gone, promised
    /// to the nominee `promised` (as the scheduler's nomination names the terminating pods
    /// it counts on with its victims, so that no other preemptor counts on them too).
    pub(super) fn keep_freeing(&mut self, slots: &[u32], promised: Option<u32>) {
        for &slot in slots {
            self.leaving.keep(&mut self.state, slot);
            match promised {
                Some(unit) => self.leaving.promise(slot, unit),
                None => self.tally(slot, true),
            }
        }
    }

    /// Of the offered `slots`, those on `nodes`' (what a plan on them counted on).
    pub(super) fn slots_on(&self, slots: &[u32], nodes: &[usize]) -> Vec<u32> {
        slots
            .iter()
            .copied()
            .filter(|&s| (self.leaving.slot(s)).is_some_and(|(r, _, _)| nodes.contains(&r.node)))
            .collect()
    }
}

/// The victim search's terminating pods: the places of `slots`.
pub(super) fn holders_of<'s>(leaving: &'s Leaving, slots: &[u32]) -> Vec<Holder<'s>> {
    slots
        .iter()
        .filter_map(|&s| leaving.slot(s))
        .map(|(r, _, _)| Holder {
            node: r.node,
            request: &r.request,
            gpus: &r.gpus,
            budgets: Vec::new(),
        })
        .collect()
}
