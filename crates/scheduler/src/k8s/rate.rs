//! A token bucket for the scheduler's own requests to the API server (client-go's
//! `--kube-api-qps` / `--kube-api-burst`): up to `burst` requests at once, then `qps` a
//! second on average.

use std::sync::Mutex;

use tokio::time::Instant;

/// Client-go's rate limit: core's bucket on tokio's clock, shared by the scheduler's tasks.
#[derive(Debug)]
pub struct TokenBucket {
    bucket: Mutex<gpuplace_core::rate::TokenBucket<Instant>>,
}

impl TokenBucket {
    /// `None` when `qps` is not positive (no limit).
    pub fn new(qps: f64, burst: u32) -> Option<TokenBucket> {
        let bucket = gpuplace_core::rate::TokenBucket::new(qps, f64::from(burst), Instant::now())?;
        Some(TokenBucket {
            bucket: Mutex::new(bucket),
        })
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        loop {
            let taken = {
                let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
                bucket.take(Instant::now(), 0.0)
            };
            match taken {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Duration;

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
