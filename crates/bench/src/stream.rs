//! `gpuplace-bench scheduler --stream-rate R`: pods created at R per second while the
//! scheduler's production loop (`Scheduler::run`: a round on every watch change and every
//! settled write) runs, as `scripts/realapi-binder-pairs.sh` with `STREAM=1` does on a real
//! API server. What it measures is the loop's CPU per pod when pods come one by one into a
//! cluster that fills up: a round's fixed cost is paid per change, not per burst.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use gpuplace_scheduler::scheduler::run::{Heartbeat, LoopConfig};
use gpuplace_scheduler::{RoundTimings, Scheduler, SchedulerConfig};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::Pod;

/// How often the driver adds the pods now due (and looks at the Bindings).
const STEP: Duration = Duration::from_millis(5);
/// After the last pod is created, the run ends once no Binding was written for this long
/// (pods that fit nowhere stay pending).
const SETTLE: Duration = Duration::from_secs(3);

/// What a streamed run measured.
pub struct Streamed {
    pub created: usize,
    pub bound: usize,
    /// From the first pod created to the last.
    pub creating: Duration,
    /// From the last pod created to the last Binding (zero when the last Binding came
    /// before the last pod).
    pub bound_after: Duration,
    /// Rounds that looked at the cluster (not idle), and all rounds.
    pub busy_rounds: usize,
    pub rounds: usize,
    pub timings: RoundTimings,
    /// The process's CPU seconds over the run (the scheduler and the in-memory API, which
    /// share the process and its thread).
    pub cpu: Duration,
}

/// The process's user + system CPU time so far (Linux; zero where /proc is not).
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start at its closing ')'.
    let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields of the line, the 12th and 13th here.
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    // The kernel's USER_HZ, 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}

/// Runs the scheduler's loop over `api` while `pods` are created at `rate` per second.
pub async fn run(
    api: MemoryApi,
    config: SchedulerConfig,
    pods: Vec<Pod>,
    rate: f64,
) -> anyhow::Result<Streamed> {
    anyhow::ensure!(
        rate.is_finite() && rate > 0.0,
        "--stream-rate must be a positive number of pods per second, not {rate}"
    );
    let scheduler = Scheduler::new(api.clone(), config);
    let tally = RefCell::new((0usize, 0usize, RoundTimings::default()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let run = scheduler.run(
        LoopConfig::default(),
        Heartbeat::default(),
        async {
            let _ = stopped.await;
        },
        |report, _| {
            let mut t = tally.borrow_mut();
            t.1 += 1;
            if !report.idle {
                t.0 += 1;
            }
            t.2.add(&report.timings);
        },
    );
    let total = pods.len();
    let drive = async {
        let mut pods = pods.into_iter();
        let mut created = 0usize;
        let mut created_at = started;
        let (mut last_count, mut last_bound_at) = (0usize, started);
        loop {
            tokio::time::sleep(STEP).await;
            let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(total);
            for pod in pods.by_ref().take(due.saturating_sub(created)) {
                api.put_pod(pod);
                created += 1;
                created_at = Instant::now();
            }
            let count = api.binding_count();
            if count != last_count {
                (last_count, last_bound_at) = (count, Instant::now());
            }
            let settled = last_bound_at.max(created_at).elapsed() >= SETTLE;
            if created == total && (count >= total || settled) {
                let _ = stop.send(());
                return (created, count, created_at, last_bound_at);
            }
        }
    };
    let ((), (created, bound, created_at, last_bound_at)) = tokio::join!(run, drive);
    let cpu = process_cpu().saturating_sub(cpu_before);
    let (busy_rounds, rounds, timings) = tally.into_inner();
    Ok(Streamed {
        created,
        bound,
        creating: created_at.duration_since(started),
        bound_after: last_bound_at.saturating_duration_since(created_at),
        busy_rounds,
        rounds,
        timings,
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let spent = process_cpu().saturating_sub(before);
        assert!(spent >= Duration::from_millis(20), "spent {spent:?}");
    }
}
