//! The replay's driver: pods made at their arrivals and again by their controllers, deleted
//! when their run ends or (without kubelets) when their grace period is over, a scheduling
//! round at each step, and what each pod got read back from the API.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use gpuplace_model::Assignment;
use gpuplace_scheduler::clock::WallClock;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::{mpsc, oneshot};

use super::jobs::{RoundCall, StackJob, StackOutcome, TimelineStackOptions, job_names};
use super::settle::{controller, pod, put_group, settle_admissions, settle_deletions, settle_gone};
use crate::api::MemoryApi;
use crate::cluster::HandshakeCluster;

/// What the driver works on: the API, the kubelets where they run (else the driver writes
/// what they would), and the scheduler's wall clock (start times are stamped on it).
pub(super) struct Side<'a> {
    pub api: &'a MemoryApi,
    pub cluster: Option<&'a HandshakeCluster>,
    pub wall: WallClock,
}

/// Steps to come: (time in ms, job).
type Due = BinaryHeap<Reverse<(u64, usize)>>;

/// The steps of `heap` due by `now`, earliest first.
fn pop_due(heap: &mut Due, now: u64) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    while let Some(&Reverse((t, i))) = heap.peek()
        && t <= now
    {
        heap.pop();
        out.push((t, i));
    }
    out
}

/// The replay's bookkeeping: the pods' names, what each got, the steps to come.
struct Replay<'j> {
    jobs: &'j [StackJob],
    names: Vec<String>,
    out: Vec<StackOutcome>,
    /// Run ends.
    departures: Due,
    /// Evicted pods deleted for good (their grace period over; without kubelets).
    terminations: Due,
    /// Controllers' new pods made.
    recreations: Due,
    waiting: BTreeSet<usize>,
    running: BTreeSet<usize>,
    /// Arrivals (jobs not made by a controller), in arrival order.
    arrivals: Vec<usize>,
}

impl Replay<'_> {
    /// Records the waiting pods bound by the round at `now`, their runs ending `start_ms`
    /// plus their run time later; those bound.
    fn read_bound(&mut self, api: &MemoryApi, now: u64, start_ms: u64) -> Vec<usize> {
        let mut bound = Vec::new();
        for &i in &self.waiting {
            let Some(p) = api.pod("trace", &self.names[i]) else {
                continue;
            };
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let assignment = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(gpuplace_model::ASSIGNMENT_ANNOTATION))
                .and_then(|a| Assignment::from_json(a).ok());
            let mut devices: Vec<String> = assignment
                .map(|a| a.devices().map(|d| d.id.clone()).collect())
                .unwrap_or_default();
            devices.sort();
            devices.dedup();
            self.out[i] = StackOutcome {
                start_ms: Some(now),
                node: Some(node),
                devices,
                ..StackOutcome::default()
            };
            self.departures
                .push(Reverse((now + start_ms + self.jobs[i].run_ms, i)));
            bound.push(i);
        }
        for i in &bound {
            self.waiting.remove(i);
            self.running.insert(*i);
        }
        bound
    }

    /// Running pods the round evicted (terminating or gone), recorded as ended at `now`.
    fn read_evicted(&mut self, api: &MemoryApi, now: u64) -> Vec<usize> {
        let evicted: Vec<usize> = self
            .running
            .iter()
            .copied()
            .filter(|&i| {
                api.pod("trace", &self.names[i])
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            })
            .collect();
        for &i in &evicted {
            self.running.remove(&i);
            self.out[i].end_ms = Some(now);
            self.out[i].evicted = true;
        }
        evicted
    }

    /// The next step's time: an arrival, a run's end, a pod gone, a new pod, or when the
    /// scheduler's queue has a pod due.
    fn next_step(&self, next: usize, due: Option<u64>) -> Option<u64> {
        let peek = |h: &Due| h.peek().map(|d| d.0.0);
        [
            self.arrivals.get(next).map(|&i| self.jobs[i].arrival_ms),
            peek(&self.departures),
            peek(&self.terminations),
            peek(&self.recreations),
            due,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

pub(super) async fn drive(
    side: &Side<'_>,
    jobs: &[StackJob],
    options: &TimelineStackOptions,
    calls: &mpsc::Sender<RoundCall>,
) -> Result<Vec<StackOutcome>, String> {
    let base = Instant::now();
    let wall = Timestamp::now();
    let (api, costs, timeout) = (side.api, options.costs, options.settle_timeout);
    let mut arrivals: Vec<usize> = (0..jobs.len())
        .filter(|&i| jobs[i].replaces.is_none())
        .collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival_ms, i));
    let mut r = Replay {
        jobs,
        names: job_names(jobs),
        out: vec![StackOutcome::default(); jobs.len()],
        departures: BinaryHeap::new(),
        terminations: BinaryHeap::new(),
        recreations: BinaryHeap::new(),
        waiting: BTreeSet::new(),
        running: BTreeSet::new(),
        arrivals,
    };
    let created_at = |ms: u64| {
        wall.checked_add(SignedDuration::from_secs((ms / 1000) as i64))
            .map_err(|e| e.to_string())
    };
    let (mut next, mut due): (usize, Option<u64>) = (0, None);
    while let Some(now) = r.next_step(next, due).filter(|t| *t <= options.end_ms) {
        let mut gone = Vec::new();
        for (t, i) in pop_due(&mut r.departures, now) {
            // An evicted pod's run ended with its eviction.
            if r.running.remove(&i) {
                api.delete_pod("trace", &r.names[i]);
                r.out[i].end_ms = Some(t);
                gone.push(i);
            }
        }
        for (_, i) in pop_due(&mut r.terminations, now) {
            api.delete_pod("trace", &r.names[i]);
        }
        for (_, k) in pop_due(&mut r.recreations, now) {
            put_group(api, &r.names, &jobs[k]);
            api.put_pod(pod(
                &r.names,
                k,
                &jobs[k],
                controller(jobs, k),
                created_at(now)?,
            ));
            r.waiting.insert(k);
        }
        while let Some(&i) = r.arrivals.get(next)
            && jobs[i].arrival_ms <= now
        {
            put_group(api, &r.names, &jobs[i]);
            let made = pod(&r.names, i, &jobs[i], i, created_at(jobs[i].arrival_ms)?);
            api.put_pod(made);
            r.waiting.insert(i);
            next += 1;
        }
        if let Some(cluster) = side.cluster {
            settle_deletions(cluster, &r.names, &gone, timeout).await?;
        }
        due = round(calls, base, now).await?;
        let bound = r.read_bound(api, now, costs.start_ms);
        match side.cluster {
            Some(cluster) => settle_admissions(cluster, &r.names, &bound, timeout).await?,
            None => {
                let started = base + Duration::from_millis(now + costs.start_ms);
                for &i in &bound {
                    api.set_running("trace", &r.names[i], side.wall.timestamp(started));
                }
            }
        }
        let evicted = r.read_evicted(api, now);
        // The simulator stops after its round at the last arrival.
        if next == r.arrivals.len() && now >= options.end_ms {
            break;
        }
        if evicted.is_empty() {
            continue;
        }
        match side.cluster {
            // Victims: gone once their kubelet let them go, and the scheduler looks again
            // at this instant.
            Some(cluster) => {
                settle_gone(api, &r.names, &evicted, timeout).await?;
                settle_deletions(cluster, &r.names, &evicted, timeout).await?;
                due = Some(now);
            }
            None => {
                for &i in &evicted {
                    r.terminations.push(Reverse((now + costs.grace_ms, i)));
                }
            }
        }
        // Their controller makes them again.
        for (k, job) in jobs.iter().enumerate() {
            if job.replaces.is_some_and(|v| evicted.contains(&v)) {
                r.recreations.push(Reverse((now + costs.recreate_ms, k)));
            }
        }
    }
    Ok(r.out)
}

/// A scheduling round at `now` ms; when the queue next has a pod due.
async fn round(
    calls: &mpsc::Sender<RoundCall>,
    base: Instant,
    now: u64,
) -> Result<Option<u64>, String> {
    let (reply, answer) = oneshot::channel();
    calls
        .send((base + Duration::from_millis(now), reply))
        .await
        .map_err(|_| "the scheduler's thread ended".to_string())?;
    Ok(answer
        .await
        .map_err(|_| "the scheduler's thread ended".to_string())?
        .map(|t| t.saturating_duration_since(base).as_millis() as u64))
}
