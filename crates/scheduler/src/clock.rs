//! Times as the API server writes them, and the scheduler's wall clock.

use std::time::{Instant, SystemTime};

/// Wall time that follows the rounds' clock (`schedule`'s `now`), not the machine's: one
/// pairing of an instant with the wall time then, taken at start. The run loop's clock is
/// the real one, so in production this is the wall clock; a test that drives rounds on a
/// simulated clock gets wall times (pod ages, expected starts, status stamps) on the same
/// clock as its server's timestamps.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    base: Instant,
    wall: SystemTime,
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock {
            base: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

impl WallClock {
    /// The wall time at round-clock instant `now`.
    pub fn at(&self, now: Instant) -> SystemTime {
        match now.checked_duration_since(self.base) {
            Some(ahead) => self.wall + ahead,
            None => self.wall - self.base.duration_since(now),
        }
    }

    /// The same in milliseconds since the epoch.
    pub fn ms(&self, now: Instant) -> i64 {
        self.at(now)
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }

    /// The same as a timestamp.
    pub fn timestamp(&self, now: Instant) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::try_from(self.at(now))
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }
}

/// RFC 3339 UTC time of `t` (seconds precision).
pub fn rfc3339(t: SystemTime) -> String {
    let nanos = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    k8s_openapi::jiff::Timestamp::from_second(nanos)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn the_wall_clock_follows_the_round_clock() {
        let clock = WallClock::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(3600);
        assert_eq!(clock.ms(later) - clock.ms(now), 3_600_000);
        let apart = (clock.ms(now) - clock.ms(Instant::now())).abs();
        assert!(apart < 1_000, "the wall clock now: {apart} ms off");
        let wall_now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        assert!((clock.ms(Instant::now()) - wall_now).abs() < 1_000);
        assert_eq!(clock.timestamp(later).as_millisecond(), clock.ms(later));
    }
}
