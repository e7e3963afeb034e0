//! The fake server's clock: wall time that follows the test's tokio clock.
//!
//! The in-memory API stamps what a real server stamps (creation, deletion, conditions,
//! disruptions). From the wall clock, a stress on paused tokio time (hours simulated in a
//! second) stamped every pod within the same real second or two, so pods created hours
//! apart tied on creationTimestamp, and how many ticked over depended on how busy the
//! machine was: the same seed scheduled differently from run to run. These stamps follow
//! tokio's clock instead: real time where the runtime runs in real time, the simulated
//! time where it is paused.

use std::sync::OnceLock;

use gpuplace_scheduler::clock::WallClock;
use k8s_openapi::jiff::Timestamp;

/// Wall time now on the current tokio clock (paused or not): the scheduler's own mapping
/// of an instant to wall time, from one process-wide pairing.
pub fn server_time() -> Timestamp {
    static EPOCH: OnceLock<WallClock> = OnceLock::new();
    EPOCH
        .get_or_init(WallClock::default)
        .timestamp(tokio::time::Instant::now().into_std())
}
