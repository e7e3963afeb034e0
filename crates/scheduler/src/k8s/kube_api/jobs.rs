//! The Jobs' deadlines, looked up by name in the Job watch's store.

use k8s_openapi::api::batch::v1::Job;

use super::watch::Watched;
use crate::k8s::job::{JobDeadline, JobLookup};

/// The Job watch's store, read by name.
pub(super) struct WatchedJobs(pub(super) Watched<Job>);

impl JobLookup for WatchedJobs {
    fn deadline(&self, namespace: &str, name: &str) -> Option<JobDeadline> {
        JobDeadline::of(&*self.0.get(namespace, name)?)
    }
}
