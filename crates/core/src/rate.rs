//! A token bucket kept as numbers: `burst` tokens, refilled at `rate` a second. The caller
//! says what time it is (any clock whose instants subtract to a `Duration`: std's, tokio's
//! paused one), so the scheduler's client rate limit and the device plugin's PodResources
//! limit share this arithmetic and it is tested without waiting.

use std::ops::Sub;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct TokenBucket<T> {
    tokens: f64,
    burst: f64,
    rate: f64,
    at: T,
}

impl<T: Copy + Ord + Sub<T, Output = Duration>> TokenBucket<T> {
    /// A full bucket at `now`; `None` when `rate` is not a positive number (no limit).
    /// A burst below one token is raised to one.
    pub fn new(rate: f64, burst: f64, now: T) -> Option<TokenBucket<T>> {
        (rate > 0.0 && rate.is_finite()).then(|| {
            let burst = if burst.is_finite() {
                burst.max(1.0)
            } else {
                1.0
            };
            TokenBucket {
                tokens: burst,
                burst,
                rate,
                at: now,
            }
        })
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// Tokens available at `now` (a clock that went back adds none).
    pub fn available(&mut self, now: T) -> f64 {
        if now > self.at {
            let elapsed = (now - self.at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
            self.at = now;
        }
        self.tokens
    }

    /// Takes a token if at least `reserve` tokens would be left; else how long until one
    /// can be taken so.
    pub fn take(&mut self, now: T, reserve: f64) -> Result<(), Duration> {
        let tokens = self.available(now);
        if tokens >= 1.0 + reserve {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 + reserve - tokens) / self.rate,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_burst_then_the_rate_with_a_reserve_kept() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 4.0, t0).unwrap();
        for _ in 0..4 {
            assert_eq!(bucket.take(t0, 0.0), Ok(()));
        }
        let wait = bucket.take(t0, 0.0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        let t1 = t0 + Duration::from_millis(250);
        assert!((bucket.available(t1) - 2.5).abs() < 1e-9);
        // Two tokens must stay: 2.5 is not enough for a background caller.
        assert!(bucket.take(t1, 2.0).is_err());
        assert_eq!(bucket.take(t1, 0.0), Ok(()));
        // Never more than the burst, and a clock that goes back adds nothing.
        assert_eq!(bucket.available(t1 + Duration::from_secs(60)), 4.0);
        assert_eq!(bucket.available(t0), 4.0);
        assert!(TokenBucket::new(0.0, 5.0, t0).is_none());
        assert!(TokenBucket::new(f64::NAN, 5.0, t0).is_none());
        assert_eq!(TokenBucket::new(1.0, 0.0, t0).unwrap().burst(), 1.0);
    }
}
