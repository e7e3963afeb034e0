//! What the scheduler reads of Jobs: a Job's `activeDeadlineSeconds`, counted from the
//! Job's start, bounds how long its pods run (the Job controller ends them at the deadline
//! and does not copy it onto them), so a Job pod that declares nothing itself is expected
//! to end by then. Read through a lookup by name (the watch's store), never as a list: a
//! cluster may hold many Jobs and only the projection of the line asks, for the pods it
//! projects.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::{Job, JobSpec, JobStatus};
use k8s_openapi::jiff::Timestamp;

use crate::k8s::pod_info::PodInfo;

/// A Job's deadline: `activeDeadlineSeconds` from its `status.startTime`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDeadline {
    pub uid: String,
    /// When the Job started (`None`: not yet; the deadline then counts from now).
    pub started: Option<Timestamp>,
    pub seconds: u64,
}

impl JobDeadline {
    /// The deadline of `job`, when it has one.
    pub fn of(job: &Job) -> Option<JobDeadline> {
        let seconds = job
            .spec
            .as_ref()?
            .active_deadline_seconds
            .filter(|s| *s > 0)?;
        Some(JobDeadline {
            uid: job.metadata.uid.clone().unwrap_or_default(),
            started: job
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref().map(|t| t.0)),
            seconds: seconds as u64,
        })
    }

    /// When the Job's pods are ended, in ms since the epoch, `now_ms` standing in for a
    /// start not yet recorded.
    pub fn end_ms(&self, now_ms: i64) -> i64 {
        let start = self.started.map_or(now_ms, |t| t.as_millisecond());
        start.saturating_add((self.seconds as i64).saturating_mul(1000))
    }
}

/// Finds a Job's deadline by namespace and name.
pub trait JobLookup: Send + Sync {
    fn deadline(&self, namespace: &str, name: &str) -> Option<JobDeadline>;
}

/// The Jobs the scheduler can look up (none in a view without a Job watch).
#[derive(Clone, Default)]
pub struct Jobs(Option<Arc<dyn JobLookup>>);

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Jobs" } else { "NoJobs" })
    }
}

impl Jobs {
    pub fn new(lookup: Arc<dyn JobLookup>) -> Jobs {
        Jobs(Some(lookup))
    }

    /// The deadline of the Job that owns `pod` (the same Job: its uid matches the pod's
    /// owner reference).
    pub fn deadline_of(&self, pod: &PodInfo) -> Option<JobDeadline> {
        let owner = pod.controller.as_deref().filter(|c| c.kind == "Job")?;
        let found = self.0.as_ref()?.deadline(&pod.key.namespace, &owner.name)?;
        (found.uid.is_empty() || found.uid == owner.uid).then_some(found)
    }

    /// How long `pod` is declared to run from `from_ms` (its start, or now for a pod not
    /// started), in ms: `gpuplace.io/expected-duration` when it has one, else the earlier of
    /// its own `activeDeadlineSeconds` and its Job's deadline.
    pub fn declared_run(&self, pod: &PodInfo, from_ms: i64) -> Option<u64> {
        if let Some(declared) = pod.declared_ms.as_ref().ok().copied().flatten() {
            return Some(declared);
        }
        let by_job = self
            .deadline_of(pod)
            .map(|d| d.end_ms(from_ms).saturating_sub(from_ms).max(0) as u64);
        match (pod.deadline_ms, by_job) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A Job as the scheduler keeps it: its identity, deadline and start; the rest (its pod
/// template, counts, conditions) dropped.
pub fn strip_job(job: &mut Job) {
    let meta = &mut job.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    job.spec = job.spec.take().map(|s| JobSpec {
        active_deadline_seconds: s.active_deadline_seconds,
        ..JobSpec::default()
    });
    job.status = job.status.take().map(|s| JobStatus {
        start_time: s.start_time,
        ..JobStatus::default()
    });
}

/// What of a Job the scheduler reads, hashed: a status update of its counts is no change.
pub fn job_fingerprint(job: &Job) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let d = JobDeadline::of(job);
    (
        d.as_ref().map(|d| d.seconds),
        d.and_then(|d| d.started).map(|t| t.as_millisecond()),
    )
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct One(JobDeadline);

    impl JobLookup for One {
        fn deadline(&self, namespace: &str, name: &str) -> Option<JobDeadline> {
            (namespace == "ml" && name == "train").then(|| self.0.clone())
        }
    }

    fn pod(annotations: serde_json::Value, deadline: Option<i64>) -> PodInfo {
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "train-x", "namespace": "ml", "uid": "p1",
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                    "uid": "j1", "controller": true}]},
            "spec": {"activeDeadlineSeconds": deadline, "containers": [{"name": "c"}]}
        }))
        .unwrap();
        PodInfo::from_pod(&p, "nvidia.com/gpu")
    }

    fn jobs(uid: &str) -> Jobs {
        Jobs::new(Arc::new(One(JobDeadline {
            uid: uid.into(),
            started: Some("2026-12-04T10:00:00Z".parse().unwrap()),
            seconds: 3600,
        })))
    }

    #[test]
    fn a_job_pod_runs_until_its_jobs_deadline() {
        let from = "2026-12-04T10:20:00Z".parse::<Timestamp>().unwrap();
        let run = jobs("j1").declared_run(&pod(json!({}), None), from.as_millisecond());
        assert_eq!(
            run,
            Some(40 * 60_000),
            "the Job's hour, 20 minutes of it gone"
        );
        // Its own shorter deadline wins; its annotation wins outright.
        let run = jobs("j1").declared_run(&pod(json!({}), Some(600)), from.as_millisecond());
        assert_eq!(run, Some(600_000));
        let declared = pod(json!({"gpuplace.io/expected-duration": "2h"}), None);
        let run = jobs("j1").declared_run(&declared, from.as_millisecond());
        assert_eq!(run, Some(2 * 3_600_000));
    }

    #[test]
    fn another_job_of_the_same_name_or_none_declares_nothing() {
        let from = 0;
        assert_eq!(jobs("j2").declared_run(&pod(json!({}), None), from), None);
        assert_eq!(
            Jobs::default().declared_run(&pod(json!({}), None), from),
            None
        );
    }

    #[test]
    fn only_the_deadline_and_start_are_kept() {
        let mut job: Job = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "j1", "labels": {"a": "b"}},
            "spec": {"activeDeadlineSeconds": 60, "parallelism": 4,
                "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
            "status": {"startTime": "2026-12-04T10:00:00Z", "active": 4}
        }))
        .unwrap();
        let before = job_fingerprint(&job);
        strip_job(&mut job);
        assert_eq!(job_fingerprint(&job), before);
        let spec = job.spec.as_ref().unwrap();
        assert!(spec.template.spec.is_none() && spec.parallelism.is_none());
        assert_eq!(job.status.as_ref().unwrap().active, None);
        assert_eq!(JobDeadline::of(&job).unwrap().seconds, 60);
    }
}
