//! The queue's two stores (proptest): a queue keeping its entries by index (the timeline's
//! numbered units) answers every question as one keeping them by hash, under both
//! disciplines, through any sequence of failures, wake-ups, flushes and removals.

use std::ops::Add;
use std::time::Duration;

use gpuplace_core::queue::store::{ByHash, ByIndex};
use gpuplace_core::queue::{Discipline, Entry, Queue, QueueConfig};
use proptest::prelude::*;

/// Milliseconds, as the timeline tells time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ms(u64);

impl Add<Duration> for Ms {
    type Output = Ms;
    fn add(self, d: Duration) -> Ms {
        Ms(self.0 + d.as_millis() as u64)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Unschedulable(u32),
    RetryLater(u32),
    RetryAt(u32, u64),
    Forget(u32),
    Wake(u32),
    WakeAll,
    WakeWhere(u32),
    Flush,
    FlushOne(u32),
    EndBackoff(u32),
    BackoffOver(u32),
    Retain(u32),
    /// The clock moves on by this many ms.
    Pass(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u32..40;
    prop_oneof![
        4 => key.clone().prop_map(Op::Unschedulable),
        2 => key.clone().prop_map(Op::RetryLater),
        1 => (key.clone(), 0u64..20_000).prop_map(|(k, at)| Op::RetryAt(k, at)),
        1 => key.clone().prop_map(Op::Forget),
        1 => key.clone().prop_map(Op::Wake),
        1 => Just(Op::WakeAll),
        1 => (2u32..5).prop_map(Op::WakeWhere),
        1 => Just(Op::Flush),
        2 => key.clone().prop_map(Op::FlushOne),
        1 => key.clone().prop_map(Op::EndBackoff),
        1 => key.clone().prop_map(Op::BackoffOver),
        1 => (2u32..5).prop_map(Op::Retain),
        4 => (0u64..400_000).prop_map(Op::Pass),
    ]
}

fn apply<S: gpuplace_core::queue::store::Store<u32, Entry<Ms>>>(
    q: &mut Queue<u32, Ms, S>,
    op: &Op,
    now: Ms,
) {
    match *op {
        Op::Unschedulable(k) => q.unschedulable(&k, now),
        Op::RetryLater(k) => q.retry_later(&k, now),
        Op::RetryAt(k, at) => q.retry_at(&k, now, Ms(now.0 + at)),
        Op::Forget(k) => q.forget(&k),
        Op::Wake(k) => q.wake(&k, now),
        Op::WakeAll => q.wake_all(now),
        Op::WakeWhere(m) => q.wake_where(now, |k| k % m == 0),
        Op::Flush => q.flush(now),
        Op::FlushOne(k) => q.flush_one(&k, now),
        Op::EndBackoff(k) => q.end_backoff(&k, now),
        Op::BackoffOver(k) => q.backoff_over(&k),
        Op::Retain(m) => q.retain(|k| k % m != 0),
        Op::Pass(_) => {}
    }
}

proptest! {
    #[test]
    fn by_index_answers_as_by_hash(
        kube in any::<bool>(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let discipline = if kube { Discipline::KubeScheduler } else { Discipline::Gpuplace };
        let config = QueueConfig::default();
        let mut hashed: Queue<u32, Ms, ByHash<u32, Entry<Ms>>> = Queue::with_discipline(config, discipline);
        let mut indexed: Queue<u32, Ms, ByIndex<Entry<Ms>>> = Queue::with_discipline(config, discipline);
        let mut now = Ms(0);
        for op in &ops {
            if let Op::Pass(ms) = op {
                now = Ms(now.0 + ms);
            }
            apply(&mut hashed, op, now);
            apply(&mut indexed, op, now);
            prop_assert_eq!(hashed.len(), indexed.len());
            prop_assert_eq!(hashed.is_empty(), indexed.is_empty());
            prop_assert_eq!(hashed.next_due(now), indexed.next_due(now));
            for k in 0..40u32 {
                prop_assert_eq!(hashed.is_due(&k, now), indexed.is_due(&k, now), "key {}", k);
                prop_assert_eq!(hashed.due_at(&k), indexed.due_at(&k));
                prop_assert_eq!(hashed.is_parked(&k), indexed.is_parked(&k));
                prop_assert_eq!(hashed.attempts(&k), indexed.attempts(&k));
            }
        }
    }
}
