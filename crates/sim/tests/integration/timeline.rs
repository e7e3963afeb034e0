//! The timeline replay as an instrument: what holds by construction (Little's law, GPU time
//! conserved, no pod running outside its life), the same seed giving the same result, and
//! the openb trace (skipped, saying why, when it is absent).

use gpuplace_core::Policy;
use gpuplace_sim::timeline::{DurationModel, Job, Ms, Timeline, TimelineOptions, TimelineRun};
use gpuplace_sim::{Workload, builtin_workload};

fn timeline(workload: Workload, load: f64, arrivals: usize) -> Timeline {
    Timeline::new(
        workload,
        TimelineOptions {
            load,
            arrivals,
            // Runs of at most 4 hours: the queue reaches a steady state within the run.
            durations: DurationModel {
                max_s: Some(14_400.0),
                ..DurationModel::default()
            },
            ..TimelineOptions::default()
        },
    )
    .expect("a valid timeline")
}

/// GPU milli of each pod of the list.
fn milli(t: &Timeline, job: &Job) -> f64 {
    t.workload().pods[job.pod as usize]
        .request
        .total_gpu_milli() as f64
}

fn end_of(run: &TimelineRun) -> Ms {
    Ms((run.simulated_s * 1e3).round() as u64)
}

#[test]
fn littles_law_holds_over_a_long_run() {
    // A loaded small cluster, so that pods queue: L (time-mean pods waiting) = lambda (pods
    // arriving per second) * W (mean wait), over the measurement window. Only pods of at
    // most one GPU: on a cluster this small at this load some multi-GPU shapes starve (their
    // queue only grows, so pods that arrived in the warm-up still wait through the whole
    // window), and Little's law is about a queue in a steady state.
    let mut workload = builtin_workload(16);
    workload.pods.retain(|p| p.request.gpu_count <= 1);
    let t = timeline(workload, 0.97, 20_000);
    for policy in [Policy::Fgd, Policy::DEFAULT] {
        let run = t.run(policy, 11);
        let l = run.little;
        let predicted = l.arrivals_per_s * l.mean_wait_s;
        println!(
            "{policy}: L = {:.3}, lambda * W = {:.4}/s * {:.1}s = {predicted:.3}",
            l.waiting, l.arrivals_per_s, l.mean_wait_s
        );
        assert!(
            l.waiting > 0.5,
            "the run must queue to test anything: {l:?}"
        );
        assert!(
            (l.waiting / predicted - 1.0).abs() < 0.05,
            "L {} vs lambda W {predicted}",
            l.waiting
        );
    }
}

#[test]
fn gpu_time_is_conserved_and_no_pod_runs_outside_its_life() {
    let t = timeline(builtin_workload(16), 1.05, 8_000);
    let (run, jobs) = t.run_with_jobs(Policy::Fgd, 5);
    let end = end_of(&run);
    let mut held = 0.0;
    for job in &jobs {
        let (Some(placed), Some(start), Some(work)) = (job.placed_at, job.start, job.work_from)
        else {
            assert!(job.end.is_none() && job.start.is_none(), "{job:?}");
            continue;
        };
        assert!(placed >= job.arrival, "placed before it arrived: {job:?}");
        assert!(placed <= start && start <= work, "{job:?}");
        assert!(placed <= end, "{job:?}");
        match job.end {
            Some(stop) if job.evicted => assert!(stop.0 < work.0 + job.run_ms, "{job:?}"),
            Some(stop) => assert_eq!(stop.0, work.0 + job.run_ms, "{job:?}"),
            None => assert!(work.0 + job.run_ms >= end.0, "left early: {job:?}"),
        }
        let stop = job.end.unwrap_or(end).min(end);
        held += milli(&t, job) * stop.0.saturating_sub(placed.0) as f64;
    }
    let held_hours = held / 1e3 / 3.6e6;
    assert!(
        (held_hours / run.run_busy_gpu_hours - 1.0).abs() < 1e-9,
        "pods held {held_hours} GPU-hours, the cluster's allocation integrates to {}",
        run.run_busy_gpu_hours
    );
    assert!(run.busy_gpu_hours < run.run_busy_gpu_hours);
}

#[test]
fn the_same_seed_gives_the_same_replay() {
    let t = timeline(builtin_workload(32), 0.9, 3_000);
    let (a, jobs_a) = t.run_with_jobs(Policy::DEFAULT, 3);
    let (b, jobs_b) = t.run_with_jobs(Policy::DEFAULT, 3);
    assert_eq!(jobs_a, jobs_b);
    assert_eq!(a.means, b.means);
    let (_, jobs_c) = t.run_with_jobs(Policy::DEFAULT, 4);
    assert_ne!(jobs_a, jobs_c);
}

#[test]
fn bad_options_are_refused_with_the_flag_named() {
    let refused = |options: TimelineOptions| {
        Timeline::new(builtin_workload(32), options)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let base = TimelineOptions::default();
    assert!(
        refused(TimelineOptions {
            load: 0.0,
            ..base.clone()
        })
        .contains("--load")
    );
    assert!(
        refused(TimelineOptions {
            arrivals: 3,
            ..base.clone()
        })
        .contains("--arrivals")
    );
    assert!(
        refused(TimelineOptions {
            warmup: 1.0,
            ..base.clone()
        })
        .contains("--warmup")
    );
    let mut cpu_only = builtin_workload(32);
    cpu_only.pods.retain(|p| p.request.gpu_count == 0);
    let err = Timeline::new(cpu_only, base).err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("no pod in the pod list asks for a GPU")));
}

#[test]
fn openb_default_trace_over_time() {
    let dir = match gpuplace_sim::trace::shared_openb_dir(std::path::Path::new(env!(
        "CARGO_MANIFEST_DIR"
    ))) {
        Ok(dir) => dir,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let workload = gpuplace_sim::load_workload(
        &dir.join("openb_node_list_gpu_node.csv"),
        &dir.join("openb_pod_list_default.csv"),
    )
    .expect("trace");
    assert!(workload.pods.iter().all(|p| p.duration_s.is_some()));
    let t = timeline(workload, 0.95, 10_000);
    let run = t.run(Policy::Fgd, 42);
    println!(
        "openb default, fgd, load 0.95, 10,000 arrivals: allocation {:.2}%, fragmentation {:.2}%, 8-GPU p50 {:?}",
        run.means.allocation_pct,
        run.means.fragmentation_pct,
        run.waits
            .get(&gpuplace_sim::timeline::Class::Eight)
            .map(|w| w.p50)
    );
    // At 95% offered load the cluster is busy but not over: most GPUs are allocated, and
    // one-GPU pods rarely wait.
    assert!(
        (85.0..99.0).contains(&run.means.allocation_pct),
        "{:?}",
        run.means
    );
    let one = run.waits[&gpuplace_sim::timeline::Class::One];
    assert!(one.p50 < 1.0, "{one:?}");
    assert!(run.arrived > 7_000);
}

/// A live replay's lives as the simulator's own jobs would show them.
fn lives_of(jobs: &[Job]) -> Vec<gpuplace_sim::timeline::observed::Life> {
    jobs.iter()
        .map(|j| gpuplace_sim::timeline::observed::Life {
            pod: j.pod,
            unit: j.unit,
            arrival: j.arrival,
            run_ms: j.run_ms,
            full_ms: j.full_ms,
            measured: j.measured,
            bound: j.start,
            end: j.end,
            evicted: j.evicted,
            by_controller: j.by_controller,
            node: j.start.map(|_| j.node as usize),
            gpus: j.start.map(|_| j.gpus.clone()),
            replaces: j.replaces,
        })
        .collect()
}

#[test]
fn lives_measured_as_a_live_replay_give_the_simulators_figures() {
    // One measurement for both: the simulator's jobs, read back as a live replay reads its
    // pods (created, bound, gone), give the run's own allocation, fragmentation and waits.
    let t = Timeline::new(
        builtin_workload(16),
        TimelineOptions {
            load: 0.9,
            arrivals: 3_000,
            costs: gpuplace_sim::timeline::options::Costs::FREE,
            durations: DurationModel {
                max_s: Some(14_400.0),
                ..DurationModel::default()
            },
            record_pods: true,
            ..TimelineOptions::default()
        },
    )
    .expect("a valid timeline");
    for policy in [Policy::GPUPLACE, Policy::KubeDefault] {
        let (run, jobs) = t.run_with_jobs(policy, 5);
        let live = t.measure_lives(
            policy,
            5,
            &lives_of(&jobs),
            Default::default(),
            std::time::Duration::ZERO,
        );
        println!(
            "{policy}: allocation {:.3} / {:.3}, fragmentation {:.3} / {:.3}",
            run.means.allocation_pct,
            live.means.allocation_pct,
            run.means.fragmentation_pct,
            live.means.fragmentation_pct
        );
        assert!((run.means.allocation_pct - live.means.allocation_pct).abs() < 1e-6);
        assert!((run.means.fragmentation_pct - live.means.fragmentation_pct).abs() < 1e-6);
        assert!(
            (run.means.waiting - live.means.waiting).abs() < 1e-6,
            "{} / {}",
            run.means.waiting,
            live.means.waiting
        );
        assert_eq!(run.waits, live.waits);
        assert_eq!(run.arrived, live.arrived);
        assert_eq!(run.never_started, live.never_started);
        // Pod by pod too: `pods.csv` of the live measurement is the simulation's.
        // (but for the attempts, which only the scheduler knows).
        assert_eq!(run.pods.len(), jobs.len());
        assert!(run.pods.iter().all(|p| p.failed_attempts.is_some()));
        assert!(live.pods.iter().all(|p| p.failed_attempts.is_none()));
        let unknown: Vec<_> = run
            .pods
            .iter()
            .map(|p| gpuplace_sim::timeline::pods::PodRecord {
                failed_attempts: None,
                ..p.clone()
            })
            .collect();
        assert_eq!(unknown, live.pods);
        let failed: u64 = run
            .pods
            .iter()
            .map(|p| u64::from(p.failed_attempts.unwrap_or(0)))
            .sum();
        assert!(
            failed > 0 && Some(failed) >= run.failed_attempts,
            "{failed}"
        );
    }
    // Unless asked (a report that writes them), a run keeps no pod records: they grow with
    // the arrivals, policies and seeds.
    let plain = Timeline::new(
        builtin_workload(16),
        TimelineOptions {
            arrivals: 300,
            ..TimelineOptions::default()
        },
    )
    .expect("a valid timeline");
    assert!(plain.run(Policy::GPUPLACE, 5).pods.is_empty());
}

#[test]
fn the_warm_starts_leftovers_start_the_clock_with_their_attempts() {
    // `--warm-attempts 3:1`: every warm-start pod that found no place was tried three times
    // before t=0 (the warm round's attempt and two more), as a live replay's log can show.
    let options = |weights: Vec<(u32, u32)>| TimelineOptions {
        load: 1.2,
        arrivals: 300,
        record_pods: true,
        warm_attempts: gpuplace_sim::timeline::options::WarmAttempts { weights },
        ..TimelineOptions::default()
    };
    let run = |weights| {
        Timeline::new(builtin_workload(16), options(weights))
            .expect("a valid timeline")
            .run(Policy::KubeDefault, 3)
    };
    let (once, thrice) = (run(vec![]), run(vec![(3, 1)]));
    // The warm start's pods and their failed attempts: 0 for those it placed.
    let warm = |r: &TimelineRun| -> Vec<u32> {
        r.pods
            .iter()
            .filter(|p| !p.measured && !p.by_controller && p.arrival_s == 0.0)
            .map(|p| p.failed_attempts.unwrap_or(0))
            .collect()
    };
    let (a, b) = (warm(&once), warm(&thrice));
    let left = |v: &[u32], at_least: u32| v.iter().filter(|n| **n >= at_least).count();
    assert!(
        left(&a, 1) > 0,
        "the warm start must leave pods waiting at load 1.2"
    );
    // The same pods were left (the warm round is the same), each now tried 3 times or more.
    assert_eq!(left(&a, 1), left(&b, 3), "{a:?} / {b:?}");
    assert!(b.iter().all(|n| *n == 0 || *n >= 3), "{b:?}");
    assert!(a.iter().any(|n| (1..3).contains(n)), "{a:?}");
}
