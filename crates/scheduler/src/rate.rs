//! A token bucket for the scheduler's own requests to the API server (client-go's
//! `--kube-api-qps` / `--kube-api-burst`): up to `burst` requests at once, then `qps` a
//! second on average.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// `None` when `qps` is not positive (no limit).
    pub fn new(qps: f64, burst: u32) -> Option<TokenBucket> {
        (qps > 0.0 && qps.is_finite()).then(|| {
            let burst = f64::from(burst.max(1));
            TokenBucket {
                qps,
                burst,
                state: Mutex::new((burst, Instant::now())),
            }
        })
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        loop {
            let wait = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let now = Instant::now();
                let (tokens, last) = *state;
                let tokens =
                    (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
                if tokens >= 1.0 {
                    *state = (tokens - 1.0, now);
                    return;
                }
                *state = (tokens, now);
                Duration::from_secs_f64((1.0 - tokens) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let bucket = TokenBucket::new(10.0, 5).unwrap();
        let start = Instant::now();
        for _ in 0..5 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..10 {
            bucket.acquire().await;
        }
        let took = start.elapsed().as_secs_f64();
        assert!((0.95..1.1).contains(&took), "{took}");
        assert!(TokenBucket::new(0.0, 5).is_none());
    }
}
