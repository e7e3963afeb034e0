//! The scheduling queue's attempt state, as kube-scheduler keeps it: a pod is active until
//! an attempt fails; then it backs off (per pod, 1 s doubling to 10 s, kube-scheduler's
//! podInitialBackoffSeconds and podMaxBackoffSeconds). A pod that did not fit is also
//! parked: it is not tried again, whatever its backoff, until an event that could make it
//! fit (a node added or changed, a pod on a node gone or finished, a pod group changed) or
//! until it has been parked for the flush interval. Such an event moves the pod back to the
//! active queue at once, as kube-scheduler's queueing hints do (and its scheduling of
//! backing-off pods when nothing else is active), but not sooner than the initial backoff
//! after its last attempt: a storm of events tries a pod at most once a second. A failed
//! write backs off without parking (the cluster did not refuse the pod; the server did).
//!
//! [`Discipline::KubeScheduler`] keeps kube-scheduler v1.26's own rules instead, for the
//! simulator's model of a stock cluster (`kube-default`): an event moves a parked pod to the
//! backoff queue until its whole backoff has passed, and from there to the active queue only
//! when that queue is next flushed (a one-second loop there: the caller's ticks, through
//! [`Queue::end_backoff`]); a failed write, too, waits in the backoff queue.
//!
//! Pure: the caller says what time it is. The scheduler keys pods by UID and tells time
//! with `Instant`; the simulator's timeline replay keys them by number and tells simulated
//! time, so both retry a pod at exactly the same moments.

pub mod store;

use std::borrow::Borrow;
use std::hash::Hash;
use std::ops::Add;
use std::time::Duration;

use store::{ByHash, Store};

/// A point in time the queue can compare and move forward (`std::time::Instant`, or a
/// simulator's clock).
pub trait QueueTime: Copy + Ord + Add<Duration, Output = Self> {}

impl<T: Copy + Ord + Add<Duration, Output = T>> QueueTime for T {}

/// Backoff and parking settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// A parked pod is tried again after this long even if nothing happened
    /// (kube-scheduler's podMaxInUnschedulablePodsDuration, 5 minutes).
    pub unschedulable_flush: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            unschedulable_flush: Duration::from_secs(300),
        }
    }
}

/// How a parked pod comes back when something happens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Discipline {
    /// gpuplace's scheduler: due one initial backoff after its last attempt (at once, if
    /// that has passed), whatever its backoff had grown to.
    #[default]
    Gpuplace,
    /// kube-scheduler v1.26 (`internal/queue/scheduling_queue.go`): `movePodsToActiveOrBackoffQueue`
    /// puts a pod whose backoff (by attempts, from its last one) has not passed in the
    /// backoff queue, which `flushBackoffQCompleted` empties into the active queue once a
    /// second; `flushUnschedulablePodsLeftover` does the same for pods parked longer than the
    /// flush interval (every 30 s there; the caller's ticks). A failure that does not park
    /// (`retry_later`, `retry_at`) goes to the backoff queue too.
    KubeScheduler,
}

/// One pod's attempt state.
#[derive(Clone, Copy, Debug)]
pub struct Entry<T> {
    attempts: u32,
    /// The last failed attempt.
    tried_at: T,
    not_before: T,
    parked_at: Option<T>,
    /// In kube-scheduler's backoff queue: not due, even past `not_before`, until
    /// [`Queue::end_backoff`] (its flush loop) moves it ([`Discipline::KubeScheduler`] only).
    in_backoff: bool,
}

impl<T: QueueTime> Entry<T> {
    /// An event (or the flush) unparks the pod.
    fn wake(&mut self, discipline: Discipline, soonest: Duration, now: T) {
        if self.parked_at.take().is_none() && discipline == Discipline::KubeScheduler {
            // Only parked pods move: one in the backoff queue stays there.
            return;
        }
        match discipline {
            Discipline::Gpuplace => {
                self.not_before = self.not_before.min(self.tried_at + soonest);
            }
            Discipline::KubeScheduler => self.in_backoff = self.not_before > now,
        }
    }
}

/// Per-pod attempt state, by key, kept in `S` ([`store`]: by hash unless the keys are
/// numbered). Pods without an entry are active.
#[derive(Debug)]
pub struct Queue<K, T, S = ByHash<K, Entry<T>>> {
    config: QueueConfig,
    discipline: Discipline,
    entries: S,
    _keys: std::marker::PhantomData<fn(K) -> T>,
}

impl<K, T, S: Default> Default for Queue<K, T, S> {
    fn default() -> Self {
        Queue {
            config: QueueConfig::default(),
            discipline: Discipline::Gpuplace,
            entries: S::default(),
            _keys: std::marker::PhantomData,
        }
    }
}

impl<K: Hash + Eq, T: QueueTime, S: Store<K, Entry<T>>> Queue<K, T, S> {
    pub fn new(config: QueueConfig) -> Self {
        Self::with_discipline(config, Discipline::Gpuplace)
    }

    pub fn with_discipline(config: QueueConfig, discipline: Discipline) -> Self {
        Queue {
            config,
            discipline,
            entries: S::default(),
            _keys: std::marker::PhantomData,
        }
    }

    pub fn config(&self) -> QueueConfig {
        self.config
    }

    pub fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// The wait after `attempts` failed attempts.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        self.config
            .initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.config.max_backoff)
    }

    /// Whether the pod may be tried at `now`.
    pub fn is_due<Q>(&self, key: &Q, now: T) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.entries
            .get(key)
            .is_none_or(|e| e.parked_at.is_none() && !e.in_backoff && e.not_before <= now)
    }

    fn fail<Q>(&mut self, key: &Q, now: T, park: bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let attempts = self.entries.get(key).map_or(0, |e| e.attempts) + 1;
        let entry = Entry {
            attempts,
            tried_at: now,
            not_before: now + self.backoff(attempts),
            parked_at: park.then_some(now),
            in_backoff: !park && self.discipline == Discipline::KubeScheduler,
        };
        match self.entries.get_mut(key) {
            Some(e) => *e = entry,
            None => {
                self.entries.insert(key.to_owned(), entry);
            }
        }
    }

    /// The pod fits nowhere now: back off and wait for a cluster event.
    pub fn unschedulable<Q>(&mut self, key: &Q, now: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.fail(key, now, true);
    }

    /// The attempt failed for a reason outside the cluster's shape (a write, a gang still
    /// short of members): back off only.
    pub fn retry_later<Q>(&mut self, key: &Q, now: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.fail(key, now, false);
    }

    /// The attempt failed and looking again before `at` would fail the same way (a
    /// make-room search for the pod's shape is remembered until then): the pod is due at
    /// `at` (or after its backoff, if that ends later), without parking; an event that
    /// wakes waiting pods still makes it due sooner.
    pub fn retry_at<Q>(&mut self, key: &Q, now: T, at: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.fail(key, now, false);
        if let Some(e) = self.entries.get_mut(key) {
            e.not_before = e.not_before.max(at);
        }
    }

    /// When the pod's backoff ends (`None`: it has no failed attempt on record).
    pub fn due_at<Q>(&self, key: &Q) -> Option<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.entries.get(key).map(|e| e.not_before)
    }

    /// The pod's backoff is over already (its last attempt long before `now`): a pod that
    /// failed while the clock stood still, as a live replay's warm start does.
    pub fn backoff_over<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(e) = self.entries.get_mut(key) {
            e.not_before = e.tried_at;
        }
    }

    /// The pod is bound or gone.
    pub fn forget<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.entries.remove(key);
    }

    /// Something happened at `now` that could make waiting pods fit: they are unparked
    /// and due the initial backoff after their last attempt (at once, when that has
    /// passed), whatever their backoff had grown to; under
    /// [`Discipline::KubeScheduler`], once their whole backoff has passed and the backoff
    /// queue is flushed.
    pub fn wake_all(&mut self, now: T) {
        let (discipline, soonest) = (self.discipline, self.config.initial_backoff);
        self.entries
            .each_mut(|_, entry| entry.wake(discipline, soonest, now));
    }

    /// Pods left nodes at `now`: as [`Self::wake_all`], except that under
    /// [`Discipline::Gpuplace`] a parked pod stays parked unless `helped` says the
    /// departures could let it start ([`crate::wake`]); pods not parked (backing off after
    /// a failed write, or told when to look again) wake as at any event. kube-scheduler
    /// v1.26 wakes every parked pod.
    pub fn wake_where(&mut self, now: T, mut helped: impl FnMut(&K) -> bool) {
        if self.discipline == Discipline::KubeScheduler {
            return self.wake_all(now);
        }
        let (discipline, soonest) = (self.discipline, self.config.initial_backoff);
        self.entries.each_mut(|key, entry| {
            if entry.parked_at.is_none() || helped(key) {
                entry.wake(discipline, soonest, now);
            }
        });
    }

    /// Whether the pod waits for an event (or the flush) to be tried again.
    pub fn is_parked<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.entries.get(key).is_some_and(|e| e.parked_at.is_some())
    }

    /// [`Self::wake_all`] for one pod: something happened that could make it alone fit
    /// (its gang's PodGroup made or changed).
    pub fn wake<Q>(&mut self, key: &Q, now: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (discipline, soonest) = (self.discipline, self.config.initial_backoff);
        if let Some(entry) = self.entries.get_mut(key) {
            entry.wake(discipline, soonest, now);
        }
    }

    /// Unparks pods parked for longer than the flush interval (under
    /// [`Discipline::KubeScheduler`], into the backoff queue if their backoff has not passed).
    pub fn flush(&mut self, now: T) {
        let (flush, discipline) = (self.config.unschedulable_flush, self.discipline);
        self.entries.each_mut(|_, entry| {
            if entry.parked_at.is_some_and(|at| at + flush <= now) {
                entry.parked_at = None;
                entry.in_backoff =
                    discipline == Discipline::KubeScheduler && entry.not_before > now;
            }
        });
    }

    /// [`Self::flush`] for one pod: a caller that knows whose parking ends when (the
    /// timeline keeps each parked unit's flush time) unparks just those, at the same
    /// moments, instead of looking at every pod.
    pub fn flush_one<Q>(&mut self, key: &Q, now: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (flush, discipline) = (self.config.unschedulable_flush, self.discipline);
        if let Some(entry) = self.entries.get_mut(key)
            && entry.parked_at.is_some_and(|at| at + flush <= now)
        {
            entry.parked_at = None;
            entry.in_backoff = discipline == Discipline::KubeScheduler && entry.not_before > now;
        }
    }

    /// kube-scheduler's backoff queue flushed at `now` for this pod: into the active queue
    /// if its backoff has passed. The caller calls it at its flush loop's ticks only.
    pub fn end_backoff<Q>(&mut self, key: &Q, now: T)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(e) = self.entries.get_mut(key)
            && e.in_backoff
            && e.not_before <= now
        {
            e.in_backoff = false;
        }
    }

    /// Drops the entries of pods no longer waiting.
    pub fn retain(&mut self, mut waiting: impl FnMut(&K) -> bool) {
        self.entries.retain(|key| waiting(key));
    }

    /// The earliest time after `after` at which a pod becomes due (its backoff ends, or its
    /// parking is flushed), for the loop to sleep until.
    pub fn next_due(&self, after: T) -> Option<T> {
        let mut first: Option<T> = None;
        self.entries.each(|e| {
            let due = match e.parked_at {
                Some(at) => (at + self.config.unschedulable_flush).max(e.not_before),
                None => e.not_before,
            };
            if due > after && first.is_none_or(|f| due < f) {
                first = Some(due);
            }
        });
        first
    }

    /// Whether a pod became due in `(since, now]`: a round is needed even if nothing in
    /// the cluster changed.
    pub fn became_due(&self, since: T, now: T) -> bool {
        self.next_due(since).is_some_and(|t| t <= now)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Attempts made so far for the pod.
    pub fn attempts<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.entries.get(key).map_or(0, |e| e.attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn backoff_doubles_to_the_cap_per_pod() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        let waits: Vec<_> = (1..=8).map(|a| q.backoff(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10, 10]);
        q.retry_later("a", t0);
        assert!(!q.is_due("a", t0));
        assert!(q.is_due("a", t0 + secs(1)));
        assert!(q.is_due("b", t0), "other pods are untouched");
        q.retry_later("a", t0 + secs(1));
        assert!(!q.is_due("a", t0 + secs(2)));
        assert!(q.is_due("a", t0 + secs(3)));
        assert_eq!(q.attempts("a"), 2);
    }

    #[test]
    fn a_pod_whose_backoff_is_over_is_due_at_the_first_event_even_under_kube_scheduler() {
        let mut q: Queue<String, Instant> =
            Queue::with_discipline(QueueConfig::default(), Discipline::KubeScheduler);
        let t0 = Instant::now();
        q.unschedulable("a", t0);
        q.unschedulable("b", t0);
        q.backoff_over("a");
        q.backoff_over("c");
        assert_eq!(q.due_at("a"), Some(t0));
        assert!(!q.is_due("a", t0), "still parked until an event");
        q.wake_all(t0);
        assert!(
            q.is_due("a", t0),
            "its backoff is over: straight to the active queue"
        );
        assert!(!q.is_due("b", t0 + secs(5)), "b waits in the backoff queue");
        assert_eq!(q.attempts("a"), 1);
    }

    #[test]
    fn waking_one_pod_leaves_the_others_parked() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        q.unschedulable("a", t0);
        q.unschedulable("b", t0);
        q.wake("a", t0);
        q.wake("c", t0);
        assert!(q.is_due("a", t0 + secs(1)));
        assert!(!q.is_due("b", t0 + secs(100)), "b is still parked");
    }

    #[test]
    fn a_departure_wakes_only_the_parked_pods_it_could_help() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        q.unschedulable("helped", t0);
        q.unschedulable("not", t0);
        q.retry_at("told", t0, t0 + secs(60));
        let t1 = t0 + secs(5);
        q.wake_where(t1, |k| k == "helped");
        assert!(q.is_due("helped", t1));
        assert!(!q.is_due("not", t1), "still parked");
        assert!(q.is_due("told", t1), "not parked: woken as by any event");
        q.wake_all(t1);
        assert!(q.is_due("not", t1));
    }

    #[test]
    fn flushing_one_pod_unparks_it_alone_once_its_time_came() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        q.unschedulable("a", t0);
        q.unschedulable("b", t0);
        q.flush_one("a", t0 + secs(299));
        assert!(!q.is_due("a", t0 + secs(299)), "not yet");
        q.flush_one("a", t0 + secs(300));
        assert!(q.is_due("a", t0 + secs(300)));
        assert!(!q.is_due("b", t0 + secs(300)), "b waits for its own flush");
    }

    #[test]
    fn parked_pods_wait_for_an_event_or_the_flush() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        q.unschedulable("a", t0);
        assert!(!q.is_due("a", t0 + secs(100)), "no event: still parked");
        assert!(!q.became_due(t0, t0 + secs(100)));
        assert_eq!(q.next_due(t0), Some(t0 + secs(300)));
        q.flush(t0 + secs(300));
        assert!(q.is_due("a", t0 + secs(300)));

        q.unschedulable("b", t0);
        q.wake_all(t0);
        assert!(!q.is_due("b", t0), "an event leaves the first second");
        assert!(q.is_due("b", t0 + secs(1)));
        assert!(q.became_due(t0, t0 + secs(1)));
        // A pod backed off 10 s is due 1 s after its last attempt once an event may help.
        for i in 0..6 {
            q.unschedulable("c", t0 + secs(i));
        }
        assert!(!q.is_due("c", t0 + secs(14)), "parked");
        q.wake_all(t0);
        assert!(!q.is_due("c", t0 + secs(5)));
        assert!(
            q.is_due("c", t0 + secs(6)),
            "1 s after its last attempt, not 10"
        );
        q.forget("c");
        // Waking never resets the attempt count.
        q.unschedulable("b", t0 + secs(1));
        assert_eq!(q.attempts("b"), 2);
        q.forget("b");
        assert!(q.is_due("b", t0));
        q.retain(|uid| uid != "a");
        assert!(q.is_empty());
    }

    #[test]
    fn a_pod_told_when_to_look_again_is_due_then_or_at_an_event() {
        let mut q: Queue<String, Instant> = Queue::new(QueueConfig::default());
        let t0 = Instant::now();
        q.retry_at("a", t0, t0 + secs(60));
        assert_eq!(q.due_at("a"), Some(t0 + secs(60)));
        assert!(
            !q.is_due("a", t0 + secs(59)),
            "not parked, but not due before"
        );
        assert!(q.is_due("a", t0 + secs(60)));
        assert_eq!(q.next_due(t0), Some(t0 + secs(60)));
        q.wake_all(t0);
        assert!(q.is_due("a", t0 + secs(1)), "an event may let it fit");
        // A time sooner than its backoff does not shorten the backoff.
        for i in 0..4 {
            q.retry_later("b", t0 + secs(i));
        }
        q.retry_at("b", t0 + secs(4), t0 + secs(5));
        assert_eq!(q.due_at("b"), Some(t0 + secs(14)));
        assert_eq!(q.attempts("b"), 5);
    }

    #[test]
    fn numeric_keys_and_a_simulated_clock_behave_the_same() {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        struct Millis(u64);
        impl Add<Duration> for Millis {
            type Output = Millis;
            fn add(self, d: Duration) -> Millis {
                Millis(self.0 + d.as_millis() as u64)
            }
        }
        let mut q: Queue<u32, Millis> = Queue::new(QueueConfig::default());
        q.unschedulable(&7, Millis(0));
        assert!(!q.is_due(&7, Millis(5_000)));
        assert_eq!(q.next_due(Millis(0)), Some(Millis(300_000)));
        q.wake_all(Millis(0));
        assert!(q.is_due(&7, Millis(1_000)));
        assert_eq!(q.attempts(&7), 1);
    }

    #[test]
    fn kube_scheduler_keeps_the_whole_backoff_and_waits_for_its_flush() {
        let mut q: Queue<String, Instant> =
            Queue::with_discipline(QueueConfig::default(), Discipline::KubeScheduler);
        let t0 = Instant::now();
        // Five failures in a row: the fifth backoff is 10 s, from t0 + 4 s to t0 + 14 s.
        for i in 0..5 {
            q.unschedulable("a", t0 + secs(i));
        }
        q.wake_all(t0 + secs(6));
        assert!(
            !q.is_due("a", t0 + secs(6)),
            "moved to the backoff queue, not due"
        );
        assert!(
            !q.is_due("a", t0 + secs(20)),
            "past its backoff, still in the backoff queue until it is flushed"
        );
        q.end_backoff("a", t0 + secs(13));
        assert!(
            !q.is_due("a", t0 + secs(13)),
            "a flush before the backoff ends"
        );
        q.end_backoff("a", t0 + secs(15));
        assert!(q.is_due("a", t0 + secs(15)));

        // An event after the backoff has passed moves the pod to the active queue at once.
        q.unschedulable("b", t0);
        q.wake_all(t0 + secs(1));
        assert!(q.is_due("b", t0 + secs(1)));
        // A pod in the backoff queue stays there when another event comes.
        q.retry_later("c", t0);
        q.wake_all(t0 + secs(5));
        assert!(!q.is_due("c", t0 + secs(5)));
        q.end_backoff("c", t0 + secs(5));
        assert!(q.is_due("c", t0 + secs(5)));
        // The flush of parked pods: into the active queue once the backoff has passed.
        q.unschedulable("d", t0);
        q.flush(t0 + secs(299));
        assert!(!q.is_due("d", t0 + secs(299)));
        q.flush(t0 + secs(300));
        assert!(q.is_due("d", t0 + secs(300)));
        // gpuplace's own discipline for the same history: due 1 s after the last attempt.
        let mut g: Queue<String, Instant> = Queue::new(QueueConfig::default());
        for i in 0..5 {
            g.unschedulable("a", t0 + secs(i));
        }
        g.wake_all(t0 + secs(6));
        assert!(g.is_due("a", t0 + secs(6)));
    }
}
