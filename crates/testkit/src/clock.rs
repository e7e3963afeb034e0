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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn stamps_follow_paused_time() {
        let before = server_time();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let after = server_time();
        let apart = after.as_second() - before.as_second();
        assert!((3599..=3601).contains(&apart), "{apart}");
    }

    #[test]
    fn outside_a_runtime_it_is_the_wall_clock() {
        let apart = (server_time().as_millisecond() - Timestamp::now().as_millisecond()).abs();
        assert!(apart < 1_000, "{apart}");
    }
}
