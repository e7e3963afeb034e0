//! A moved pod's replacement whose planned place was not all free when its pod moved: the
//! scheduler tries it on that place when its controller has made it, and again whenever
//! something there leaves, and binds it the first time the place is free, the pods still
//! leaving counted as holding theirs (its cache holds a terminating pod's devices). The
//! replay binds it at the latest once the pods its place was taken from are gone; before
//! that, at any instant after its re-create where the node has room for the part still
//! owed to the leaving pods, it is bound then, and that part is taken from the node for
//! them until they are gone, as the scheduler's cache counts it.

use std::cmp::Reverse;

use super::Engine;
use super::defrag_state::SteerWait;
use super::leaving::Owed;
use crate::timeline::options::Ms;

impl Engine<'_> {
    /// The next instant a waiting replacement is first tried (its re-create).
    pub(super) fn next_steer_check(&self) -> Option<Ms> {
        (self.defrag.steering.iter())
            .filter(|w| w.unchecked)
            .map(|w| w.made)
            .min()
    }

    /// Binds at `now` each waiting replacement whose place is free (the part owed to the
    /// leaving pods has room on its node), before the round: its leaving pods keep that
    /// part until they are gone. A replacement whose planned Binding has come is dropped.
    pub(super) fn bind_freed_replacements(&mut self, now: Ms) {
        if self.defrag.steering.is_empty() {
            return;
        }
        let mut waits = std::mem::take(&mut self.defrag.steering);
        waits.retain_mut(|w| {
            if now >= w.decided_by {
                return false;
            }
            if now < w.made {
                return true;
            }
            w.unchecked = false;
            !self.take_owed_for(w, now)
        });
        self.defrag.steering = waits;
    }

    /// Takes `w`'s owed parts still held by leaving pods for them and binds its job at
    /// `now`; false (nothing taken) when the node has no room for them.
    fn take_owed_for(&mut self, w: &SteerWait, now: Ms) -> bool {
        let owed: Vec<&Owed> = w.owed.iter().filter(|o| o.until > now).collect();
        let mut taken = 0;
        for o in &owed {
            let p = &o.part;
            if self.state.apply(p.node, &p.request, &p.gpus).is_err() {
                break;
            }
            taken += 1;
        }
        if taken < owed.len() {
            for o in owed[..taken].iter().rev() {
                let p = &o.part;
                let given = self.state.release(p.node, &p.request, &p.gpus);
                debug_assert!(given.is_ok(), "an owed part just taken: {given:?}");
            }
            return false;
        }
        for o in owed {
            self.hold_owed(o.part.clone(), o.until, o.owner, None);
        }
        self.bind_again(w.job, now);
        true
    }

    /// `job`, started with its Binding planned later, is bound at `now` instead.
    fn bind_again(&mut self, job: u32, now: Ms) {
        let bound = now + self.costs.bind_latency;
        let work_from = bound + self.costs.start;
        let made = self.made(job);
        let j = &mut self.jobs[job as usize];
        let planned = j.start.replace(bound);
        j.work_from = Some(work_from);
        let ends = Ms(work_from.0 + j.run_ms);
        // Its planned departure, later, finds it gone and is passed over.
        self.departures.push(Reverse((ends, job)));
        self.running.work_from(&made, work_from);
        if let Some(at) = (self.defrag.in_flight.iter_mut()).find(|b| Some(**b) == planned) {
            *at = bound;
        }
    }

    /// Keeps `job`'s replacement waiting for its place until `decided_by`, owing `owed`.
    pub(super) fn wait_for_place(&mut self, job: u32, made: Ms, decided_by: Ms, owed: Vec<Owed>) {
        self.defrag.steering.push(SteerWait {
            job,
            made,
            decided_by,
            owed,
            unchecked: true,
        });
    }
}
