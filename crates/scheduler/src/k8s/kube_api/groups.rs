//! The gangs the scheduler reads: gpuplace's PodGroup CRD and, where the server serves it,
//! the Workload API's PodGroups (`scheduling.k8s.io/v1alpha2`), handed out as one list
//! (made again only when either kind changed), and each gang's status written to the kind
//! it came from.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::scheduling::v1alpha2::PodGroup as UpstreamGroup;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::errors::api_error;
use super::watch::Watched;
use crate::api::{ApiError, Listed};
use crate::k8s::gang::{PodGroup, PodGroupStatus};
use crate::k8s::workload;

/// Both kinds of gangs.
#[derive(Clone)]
pub(super) struct Groups {
    pub(super) crd: Watched<PodGroup>,
    pub(super) upstream: Watched<UpstreamGroup>,
    /// The merged list and the two lists it was made from.
    merged: Arc<Mutex<Option<Merged>>>,
}

struct Merged {
    crd: Listed<PodGroup>,
    upstream: Listed<UpstreamGroup>,
    list: Listed<PodGroup>,
}

impl Groups {
    pub(super) fn new(crd: Watched<PodGroup>, upstream: Watched<UpstreamGroup>) -> Self {
        Groups {
            crd,
            upstream,
            merged: Arc::default(),
        }
    }

    /// Every gang: the CRD's, then the Workload API's whose name no CRD gang of their
    /// namespace has.
    pub(super) fn listed(&self) -> Listed<PodGroup> {
        let crd = self.crd.listed();
        let upstream = self.upstream.listed();
        if upstream.is_empty() {
            return crd;
        }
        let mut merged = self.merged.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = &*merged
            && Arc::ptr_eq(&m.crd, &crd)
            && Arc::ptr_eq(&m.upstream, &upstream)
        {
            return Arc::clone(&m.list);
        }
        let mut list: Vec<Arc<PodGroup>> = crd.iter().cloned().collect();
        let key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (m.namespace.clone(), m.name.clone())
        };
        let taken: std::collections::HashSet<_> = crd.iter().map(|g| key(&g.metadata)).collect();
        list.extend(
            upstream
                .iter()
                .filter(|g| !taken.contains(&key(&g.metadata)))
                .map(|g| Arc::new(workload::gang_of(g))),
        );
        let list: Listed<PodGroup> = Arc::new(list);
        *merged = Some(Merged {
            crd,
            upstream,
            list: Arc::clone(&list),
        });
        list
    }

    /// Writes `status` to the gang `namespace/name`, in the kind it came from.
    pub(super) async fn write_status(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        status: PodGroupStatus,
    ) -> Result<(), ApiError> {
        let is_crd = self.crd.listed().iter().any(|g| {
            g.metadata.namespace.as_deref() == Some(namespace)
                && g.metadata.name.as_deref() == Some(name)
        });
        let upstream = (!is_crd)
            .then(|| {
                self.upstream
                    .listed()
                    .iter()
                    .find(|g| {
                        g.metadata.namespace.as_deref() == Some(namespace)
                            && g.metadata.name.as_deref() == Some(name)
                    })
                    .cloned()
            })
            .flatten();
        let Some(group) = upstream else {
            let api = Api::<PodGroup>::namespaced(client.clone(), namespace);
            return api
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .map(|_| ())
                .map_err(api_error);
        };
        let previous = group
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == workload::SCHEDULED_CONDITION));
        let patch = workload::status_patch(&status, previous);
        if previous.is_some_and(|p| {
            p.status == patch["status"]["conditions"][0]["status"]
                && p.message == patch["status"]["conditions"][0]["message"]
        }) {
            // Written on change only.
            return Ok(());
        }
        let api = Api::<UpstreamGroup>::namespaced(client.clone(), namespace);
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error)
    }
}
