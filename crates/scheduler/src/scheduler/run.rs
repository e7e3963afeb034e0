//! The production loop: a round whenever something happened (a watch event, a write's
//! outcome, a backoff that ended; at least once a second to beat the heartbeat), only
//! while the leadership gate is open. Writes overlap the next rounds. On shutdown the
//! Bindings in flight are waited for (bounded), so no decision is left half known.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, warn};

use super::{RoundReport, Scheduler};
use crate::api::ClusterApi;

/// The loop's heartbeat, for `/healthz`: the loop beats at least once a tick; a loop
/// stuck (in a round, or waiting on a write slot) stops beating.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    base: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            base: Instant::now(),
            last_ms: Arc::default(),
        }
    }
}

impl Heartbeat {
    pub fn beat(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(last)
    }
}

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// The longest sleep between two looks at the cluster.
    pub tick: Duration,
    /// How long shutdown waits for Bindings in flight.
    pub drain: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            tick: Duration::from_secs(1),
            drain: Duration::from_secs(10),
        }
    }
}

impl<A: ClusterApi> Scheduler<A> {
    /// Runs rounds until `shutdown` resolves; `observe` sees every round and every
    /// settled write (for metrics).
    pub async fn run(
        mut self,
        config: LoopConfig,
        heartbeat: Heartbeat,
        shutdown: impl Future<Output = ()>,
        mut observe: impl FnMut(&RoundReport, Duration),
    ) {
        tokio::pin!(shutdown);
        let api = self.api.clone();
        loop {
            heartbeat.beat();
            // tokio's clock (std's outside tests), so paused-time tests see one clock.
            let now = tokio::time::Instant::now().into_std();
            // Wake on watch events only after a round that saw the cluster; a standby or a
            // failed round waits for the tick.
            let mut listen = false;
            let mut more = false;
            if self.gate.is_open() {
                match self.schedule(now).await {
                    Ok(report) => {
                        listen = true;
                        more = report.more;
                        observe(&report, now.elapsed());
                    }
                    Err(e) => {
                        error!(error = %e, "scheduling round failed");
                        self.dirty = true;
                    }
                }
            } else if let Err(e) = self.observe_usage(now).await {
                // A standby keeps the queues' usage from its own watch, so that a leader
                // change loses none of it; a failure is made good by the next tick.
                warn!(error = %e, "queue usage not observed");
            }
            let seen = self.seen.generation.unwrap_or(0);
            let wake = self
                .next_due(now)
                .map_or(now + config.tick, |t| t.min(now + config.tick));
            let in_flight = self.in_flight() > 0;
            if more {
                // A round that stopped at its cap: the next goes at once (a shutdown first).
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    () = std::future::ready(()) => continue,
                }
            }
            let outcome = tokio::select! {
                _ = &mut shutdown => break,
                _ = api.changed(seen), if listen => None,
                Some(outcome) = self.binder.next(), if in_flight => Some(outcome),
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => None,
            };
            // Taken outside the select: taking an outcome may write to the API (a gang's
            // status, a nomination to clear), and a branch the select dropped halfway
            // would lose the outcome (a failed Binding's reservation held for ever).
            if let Some(outcome) = outcome {
                let mut report = RoundReport::default();
                self.take_write_outcome(outcome, now, &mut report).await;
                observe(&report, Duration::ZERO);
            }
        }
        let now = tokio::time::Instant::now().into_std();
        match tokio::time::timeout(config.drain, self.drain_writes(now)).await {
            Ok(report) => observe(&report, Duration::ZERO),
            // Bindings go first, then the Events a burst left queued (tens of thousands
            // after 40,000 pods), then the queues' statuses: say which were cut short.
            Err(_) => warn!(
                bindings_in_flight = self.in_flight(),
                events_unsent = self.queued_events(),
                "shutting down before every write was sent: the rest are dropped"
            ),
        }
        let now = tokio::time::Instant::now().into_std();
        if tokio::time::timeout(config.drain, self.leave_usage_record(now))
            .await
            .is_err()
        {
            warn!("shutting down without the queues' last usage record");
        }
    }
}
