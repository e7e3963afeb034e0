//! A replay's records: each pod's job, the units the queue serves, a pod's work and
//! place, how a unit's attempt ended, and what an eviction leaves.

use std::cmp::Reverse;

use crate::timeline::options::Ms;

/// One pod's life in the replay.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Index into the pod list.
    pub pod: u32,
    pub unit: u32,
    pub arrival: Ms,
    /// How long it runs once started.
    pub run_ms: u64,
    /// Its pod's whole run; `full_ms - run_ms` was done before this job (a warm-start pod's
    /// age at t=0, a checkpointed pod's progress before it was evicted).
    pub full_ms: u64,
    /// Arrived inside the measurement window.
    pub measured: bool,
    /// When it was decided: its GPUs are held from here.
    pub placed_at: Option<Ms>,
    /// The round that decided it (the run's round count then): a later round at the same
    /// instant sees its Binding landed, as the scheduler's next round does.
    pub placed_round: u64,
    /// When its Binding was written (its wait ends here).
    pub start: Option<Ms>,
    /// When its container runs (its work starts; its GPUs were held from the decision).
    pub work_from: Option<Ms>,
    /// When it left (finished or evicted).
    pub end: Option<Ms>,
    pub evicted: bool,
    /// Made by its controller for a pod evicted or moved (not an arrival).
    pub by_controller: bool,
    /// Its user deleted it while it waited (`--patience`).
    pub abandoned: bool,
    pub node: u32,
    pub gpus: Vec<(usize, u32)>,
    /// The scheduler's attempts that left it waiting (its unit's, filled in when the
    /// replay ends).
    pub failed_attempts: u32,
    /// The job whose pod was evicted or moved for this one to be made (its controller's
    /// new pod): what that one did, this one may run again.
    pub replaces: Option<u32>,
}

impl Job {
    /// A job of `unit` waiting from `arrival` to run `work`.
    pub(super) fn waiting(
        unit: u32,
        arrival: Ms,
        work: Work,
        measured: bool,
        by_controller: bool,
    ) -> Job {
        Job {
            pod: work.pod,
            unit,
            arrival,
            run_ms: work.full_ms.saturating_sub(work.done_ms).max(1),
            full_ms: work.full_ms,
            measured,
            placed_at: None,
            placed_round: 0,
            start: None,
            work_from: None,
            end: None,
            evicted: false,
            by_controller,
            abandoned: false,
            node: 0,
            gpus: Vec::new(),
            failed_attempts: 0,
            replaces: work.replaces,
        }
    }

    /// Milli-GPU it holds (none while it waits).
    pub fn milli(&self) -> u64 {
        self.gpus.iter().map(|&(_, m)| u64::from(m)).sum()
    }

    /// When its wait ended, as the window ending at `end` saw it: its Binding, else its
    /// user giving up, else the end (a lower bound).
    pub fn waited_until(&self, end: Ms) -> Ms {
        self.start
            .filter(|s| *s <= end)
            .or(self.end.filter(|_| self.abandoned))
            .unwrap_or(end)
    }
}

/// A pod's work as it joins the queue: its whole run and what of it is done.
#[derive(Clone, Copy, Debug)]
pub(super) struct Work {
    pub(super) pod: u32,
    pub(super) full_ms: u64,
    pub(super) done_ms: u64,
    /// The job it is the work of again (evicted or moved), if any.
    pub(super) replaces: Option<u32>,
}

/// Where a pod was placed: the node and its GPUs (position, milli).
#[derive(Clone)]
pub(super) struct Placed {
    pub(super) node: usize,
    pub(super) gpus: Vec<(usize, u32)>,
}

/// Queue order: higher priority first, then arrival sequence.
pub(super) type OrderKey = (Reverse<i32>, u64);

pub(super) struct Unit {
    pub(super) jobs: Vec<u32>,
    /// A unit of one pod: that pod, kept here so that an attempt (most are flushes of
    /// pods that wait long) reads one record, not the jobs list, the job and the request
    /// ids, a cache miss each on a long backlog.
    pub(super) single: Option<Single>,
    pub(super) key: OrderKey,
    /// Still in the queue.
    pub(super) waiting: bool,
    /// Failed attempts so far (tells a wake-up entry for an earlier failure from the
    /// current one).
    pub(super) fails: u32,
    /// In [`Engine::ready`].
    pub(super) ready: bool,
    /// When its last attempt failed.
    pub(super) failed_at: Ms,
    /// Where it is listed in [`Engine::parked`] (`None`: woken since it last failed).
    pub(super) parked: Option<Slot>,
    /// Nominated by PostFilter: the places held for its members (taken in the state) while
    /// it waits ([`super::nominee`]); of them, what the pods leaving still hold, each
    /// part until it is gone, the last at `held_until`.
    pub(super) held: Vec<(u32, Placed)>,
    pub(super) owed: Vec<super::leaving::Owed>,
    pub(super) held_until: Ms,
}

/// A unit's one pod: its pod in the pod list, its request id and priority.
#[derive(Clone, Copy, Debug)]
pub(super) struct Single {
    pub(super) pod: u32,
    pub(super) rid: u32,
    pub(super) priority: i32,
}

/// Where a failed unit waits to be woken ([`super::parked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// Woken at every departure.
    Anywhere,
    /// Woken when a departure could let a pod of this request id and priority start.
    Shape { rid: u32, priority: i32 },
}

/// How a unit's attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tried {
    Started,
    /// It fits nowhere: parked until a pod leaves (or the flush), as the scheduler's queue.
    Parked,
    /// Make-room searched for its shape lately and found nothing: it looks again at this
    /// time (sooner if a pod leaves), as the scheduler does.
    Later(Ms),
    /// A flush's attempt known to fail, counted and not made ([`super::quiet`]), at the
    /// unit's failure count and with what its next turn reads.
    Quiet(u32, Turn),
}

/// What a quiet turn ([`super::quiet`]) reads instead of the unit: its queue order and
/// its one pod's request id and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Turn {
    pub key: OrderKey,
    pub rid: u32,
    pub priority: i32,
}

/// What an eviction left: the replacement's work, the milli-GPU freed and the work thrown
/// away (milli-GPU times milliseconds).
pub(super) struct Evicted {
    pub(super) work: Work,
    pub(super) milli: u64,
    pub(super) lost_milli_ms: u128,
}

/// Pods a controller makes again after an eviction.
pub(super) struct Recreation {
    pub(super) pods: Vec<Work>,
    pub(super) priority: i32,
}
