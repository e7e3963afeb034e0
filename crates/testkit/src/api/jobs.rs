//! Jobs in the fake server, as the scheduler's Job watch keeps them: by name, with their
//! deadline and start.

use std::sync::Arc;

use gpuplace_scheduler::k8s::job::{JobDeadline, JobLookup, Jobs};
use k8s_openapi::api::batch::v1::Job;

use super::{MemoryApi, MemoryJobs};

impl JobLookup for MemoryJobs {
    fn deadline(&self, namespace: &str, name: &str) -> Option<JobDeadline> {
        let jobs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        JobDeadline::of(jobs.get(&(namespace.to_string(), name.to_string()))?)
    }
}

impl MemoryApi {
    /// Creates or replaces a Job (a server would have defaulted its template; the
    /// scheduler reads its deadline and start only).
    pub fn put_job(&self, job: Job) {
        let key = (
            job.metadata.namespace.clone().unwrap_or_default(),
            job.metadata.name.clone().unwrap_or_default(),
        );
        let mut jobs = self.jobs.0.lock().unwrap_or_else(|p| p.into_inner());
        jobs.insert(key, Arc::new(job));
    }

    /// The Jobs as a view hands them to the scheduler.
    pub(super) fn job_lookup(&self) -> Jobs {
        Jobs::new(Arc::clone(&self.jobs) as Arc<dyn JobLookup>)
    }
}
