//! The gate every decision and every write passes: open only while this replica holds the
//! lease and renewed it within the renew deadline, measured on the local monotonic clock
//! from the moment the renewing request was sent (so it closes before any other replica,
//! which waits a whole lease duration after it last saw the record change, can take over).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::{Duration, Instant};

#[derive(Debug)]
struct State {
    base: Instant,
    /// Milliseconds after `base` until which the gate is open; 0: closed.
    open_until_ms: AtomicU64,
}

/// Shared by the election (which opens and extends it) and the scheduler (which checks it).
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// `None`: no election; always open.
    state: Option<Arc<State>>,
}

impl Gate {
    /// A gate for a scheduler without leader election.
    pub fn always_open() -> Gate {
        Gate { state: None }
    }

    /// A gate the election controls, closed until the lease is first held.
    pub fn closed() -> Gate {
        Gate {
            state: Some(Arc::new(State {
                base: Instant::now(),
                open_until_ms: AtomicU64::new(0),
            })),
        }
    }

    /// Whether deciding and writing are allowed now.
    pub fn is_open(&self) -> bool {
        match &self.state {
            None => true,
            Some(s) => {
                let now = Instant::now().saturating_duration_since(s.base).as_millis() as u64;
                now < s.open_until_ms.load(Ordering::Acquire)
            }
        }
    }

    /// Opens the gate until `deadline` after `sent` (the time the successful renewal was
    /// sent). Never moves the end earlier.
    pub fn extend(&self, sent: Instant, deadline: Duration) {
        if let Some(s) = &self.state {
            let until = (sent + deadline)
                .saturating_duration_since(s.base)
                .as_millis() as u64;
            s.open_until_ms.fetch_max(until, Ordering::AcqRel);
        }
    }

    /// Closes the gate at once (leadership lost or released).
    pub fn close(&self) {
        if let Some(s) = &self.state {
            s.open_until_ms.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_gate_closes_at_the_deadline_without_renewal() {
        let gate = Gate::closed();
        assert!(!gate.is_open());
        gate.extend(Instant::now(), Duration::from_secs(10));
        assert!(gate.is_open());
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(gate.is_open());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!gate.is_open(), "closed exactly at the renew deadline");
        gate.extend(Instant::now(), Duration::from_secs(10));
        gate.close();
        assert!(!gate.is_open());
        assert!(Gate::always_open().is_open());
    }
}
