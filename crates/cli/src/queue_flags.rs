//! The scheduling queue's timers as flags (kube-scheduler's `podInitialBackoffSeconds`,
//! `podMaxBackoffSeconds` and `podMaxInUnschedulablePodsDuration`), for the scheduler and
//! the timeline alike: a trace replayed live at `--speed K` stretches a scheduler's timers
//! K times in simulated time, and either side can say so.

use std::time::Duration;

use gpuplace_core::queue::QueueConfig;

/// The longest backoff or flush, seconds (a day).
const MOST_S: f64 = 86_400.0;

/// The queue's timers from seconds, each refused with its flag's name when out of bounds.
pub(crate) fn queue_config(
    initial_s: f64,
    max_s: f64,
    flush_s: f64,
) -> anyhow::Result<QueueConfig> {
    let check = |flag: &str, s: f64| {
        anyhow::ensure!(
            s.is_finite() && s > 0.0 && s <= MOST_S,
            "--{flag} must be above 0 and at most {MOST_S} seconds, got {s}"
        );
        Ok(Duration::from_secs_f64(s))
    };
    let initial = check("pod-initial-backoff", initial_s)?;
    let max = check("pod-max-backoff", max_s)?;
    let flush = check("unschedulable-flush", flush_s)?;
    anyhow::ensure!(
        max >= initial,
        "--pod-max-backoff ({max_s} s) must be at least --pod-initial-backoff ({initial_s} s)"
    );
    Ok(QueueConfig {
        initial_backoff: initial,
        max_backoff: max,
        unschedulable_flush: flush,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_are_checked_and_named() {
        assert_eq!(
            queue_config(1.0, 10.0, 300.0).unwrap(),
            QueueConfig::default()
        );
        let q = queue_config(0.1, 1.0, 30.0).unwrap();
        assert_eq!(q.initial_backoff, Duration::from_millis(100));
        for (a, b, c, says) in [
            (0.0, 10.0, 300.0, "--pod-initial-backoff"),
            (1.0, f64::NAN, 300.0, "--pod-max-backoff"),
            (1.0, 10.0, -1.0, "--unschedulable-flush"),
            (5.0, 2.0, 300.0, "must be at least"),
        ] {
            let e = queue_config(a, b, c).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
