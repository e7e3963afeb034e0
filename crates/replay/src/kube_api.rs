//! [`ReplayApi`] on a real API server through kube-rs.

use futures::stream::{BoxStream, StreamExt};
use gpuplace_scheduler::k8s::gang::PodGroup;
use gpuplace_scheduler::k8s::queue::Queue;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{ApiError, Kind, Object, PodSeen, PodState, ReplayApi};
use crate::labels::RUN_LABEL;

/// The replay's API on `client`, its pods and PodGroups in `namespace`.
#[derive(Clone)]
pub struct KubeReplayApi {
    nodes: Api<Node>,
    pods: Api<Pod>,
    queues: Api<Queue>,
    groups: Api<PodGroup>,
    leases: Api<Lease>,
    slices: Api<ResourceSlice>,
    templates: Api<ResourceClaimTemplate>,
}

/// Where nodes' heartbeats live.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// A fake node's lease duration, seconds (the kubelet's default).
const LEASE_SECONDS: i32 = 40;

impl KubeReplayApi {
    pub fn new(client: Client, namespace: &str) -> Self {
        KubeReplayApi {
            nodes: Api::all(client.clone()),
            pods: Api::namespaced(client.clone(), namespace),
            queues: Api::all(client.clone()),
            groups: Api::namespaced(client.clone(), namespace),
            slices: Api::all(client.clone()),
            templates: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, LEASE_NAMESPACE),
        }
    }

    /// A fake node: the object, its status as a kubelet would write it, and its own taints
    /// only (admission's not-ready taint off). Each step is tried again while the server
    /// is away or throttling, and a node this run already made (an earlier try whose
    /// answer was lost, or whose status patch failed) is finished, not taken as done: it
    /// counts as created only once its status and taints are written.
    async fn create_node(&self, node: &Node) -> Result<(), ApiError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut spec_only = node.clone();
        spec_only.status = None;
        let created = self.nodes.create(&PostParams::default(), &spec_only).await;
        match created.map_err(|e| api_error(e, "Node", &name)) {
            Ok(_) => {}
            Err(ApiError::AlreadyExists(what)) => {
                // Ours only if it carries this run's label: finish it; else refuse.
                let run = node.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL));
                let there = self
                    .nodes
                    .get_opt(&name)
                    .await
                    .map_err(|e| api_error(e, "Node", &name))?;
                let theirs = there
                    .as_ref()
                    .and_then(|n| n.metadata.labels.as_ref())
                    .and_then(|l| l.get(RUN_LABEL));
                if run.is_none() || theirs != run {
                    return Err(ApiError::AlreadyExists(what));
                }
            }
            Err(e) => return Err(e),
        }
        let mut status = json!({"status": node.status});
        // As a kubelet reports it: Ready since now, heard from now.
        let now = json!(k8s_openapi::jiff::Timestamp::now().to_string());
        if let Some(conditions) = status["status"]["conditions"].as_array_mut() {
            for c in conditions {
                c["lastHeartbeatTime"] = now.clone();
                c["lastTransitionTime"] = now.clone();
            }
        }
        let params = PatchParams::default();
        crate::flights::patiently(|| async {
            self.nodes
                .patch_status(&name, &params, &Patch::Merge(&status))
                .await
                .map(|_| ())
                .map_err(|e| api_error(e, "Node", &name))
        })
        .await?;
        // Admission adds node.kubernetes.io/not-ready until a kubelet reports Ready; the
        // node keeps only its own taints (the replay's, that its pods tolerate).
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone());
        let own_taints = json!({"spec": {"taints": taints}});
        crate::flights::patiently(|| async {
            self.nodes
                .patch(&name, &params, &Patch::Merge(&own_taints))
                .await
                .map(|_| ())
                .map_err(|e| api_error(e, "Node", &name))
        })
        .await
    }
}

/// The replay's error for a kube-rs error about `kind` `name`.
fn api_error(e: kube::Error, kind: &str, name: &str) -> ApiError {
    let what = format!("{kind} {name}");
    match e {
        kube::Error::Api(s) => match s.code {
            409 if s.reason == "AlreadyExists" => ApiError::AlreadyExists(what),
            404 => ApiError::NotFound(format!("{what} ({})", s.message)),
            400 | 422 => ApiError::Invalid(format!("{what}: {}", s.message)),
            401 | 403 => ApiError::Forbidden(format!("{what}: {}", s.message)),
            429 => ApiError::Throttled {
                retry_after: s
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|&s| s > 0)
                    .map(|s| std::time::Duration::from_secs(u64::from(s))),
                what: format!("{what}: {}", s.message),
            },
            500..=599 => ApiError::Unavailable(format!("{what}: {}", s.message)),
            _ => ApiError::Other(format!("{what}: {} ({})", s.message, s.code)),
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            ApiError::Unavailable(format!("{what}: {e}"))
        }
        other => ApiError::Other(format!("{what}: {other}")),
    }
}

fn selected(selector: &str) -> ListParams {
    ListParams::default().labels(selector)
}

fn names<K: kube::Resource + Clone>(list: kube::core::ObjectList<K>) -> Vec<String> {
    list.items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect()
}

impl ReplayApi for KubeReplayApi {
    async fn create(&self, object: &Object) -> Result<(), ApiError> {
        let name = object.name().to_string();
        let kind = object.kind().name();
        let params = PostParams::default();
        let done = match object {
            Object::Node(node) => return self.create_node(node).await,
            Object::Pod(pod) => self.pods.create(&params, pod).await.map(|_| ()),
            Object::Queue(q) => self.queues.create(&params, q).await.map(|_| ()),
            Object::PodGroup(g) => self.groups.create(&params, g).await.map(|_| ()),
            Object::ResourceSlice(o) => self.slices.create(&params, o).await.map(|_| ()),
            Object::ClaimTemplate(o) => self.templates.create(&params, o).await.map(|_| ()),
        };
        done.map_err(|e| api_error(e, kind, &name))
    }

    async fn delete(&self, kind: Kind, name: &str) -> Result<bool, ApiError> {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let done = match kind {
            Kind::Node => self.nodes.delete(name, &now).await.map(|_| ()),
            Kind::Pod => self.pods.delete(name, &now).await.map(|_| ()),
            Kind::Queue => self.queues.delete(name, &now).await.map(|_| ()),
            Kind::PodGroup => self.groups.delete(name, &now).await.map(|_| ()),
            Kind::Lease => self.leases.delete(name, &now).await.map(|_| ()),
            Kind::ResourceSlice => self.slices.delete(name, &now).await.map(|_| ()),
            Kind::ClaimTemplate => self.templates.delete(name, &now).await.map(|_| ()),
        };
        match done {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(api_error(e, kind.name(), name)),
        }
    }

    async fn list_labelled(&self, kind: Kind, selector: &str) -> Result<Vec<String>, ApiError> {
        let managed = || selected(selector);
        let listed = match kind {
            Kind::Node => self.nodes.list(&managed()).await.map(names),
            Kind::Pod => self.pods.list(&managed()).await.map(names),
            Kind::Queue => self.queues.list(&managed()).await.map(names),
            Kind::PodGroup => self.groups.list(&managed()).await.map(names),
            Kind::Lease => self.leases.list(&managed()).await.map(names),
            Kind::ResourceSlice => self.slices.list(&managed()).await.map(names),
            Kind::ClaimTemplate => self.templates.list(&managed()).await.map(names),
        };
        listed.map_err(|e| api_error(e, kind.name(), "(list)"))
    }

    async fn heartbeat(&self, run: &str, node: &str) -> Result<(), ApiError> {
        let now = serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now()))
            .unwrap_or_default();
        let lease = json!({
            "metadata": {"name": node, "namespace": LEASE_NAMESPACE,
                "labels": crate::objects::run_labels(run)},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now}
        });
        let renewed = self
            .leases
            .patch(node, &PatchParams::default(), &Patch::Merge(&lease))
            .await;
        match renewed {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let made: Lease = serde_json::from_value(lease)
                    .map_err(|e| ApiError::Other(format!("Lease {node}: {e}")))?;
                self.leases
                    .create(&PostParams::default(), &made)
                    .await
                    .map(|_| ())
                    .map_err(|e| api_error(e, "Lease", node))
            }
            Err(e) => Err(api_error(e, "Lease", node)),
        }
    }

    async fn nodes(&self) -> Result<Vec<Node>, ApiError> {
        self.nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| api_error(e, "Node", "(list)"))
    }

    fn watch_pods(&self) -> BoxStream<'static, Result<PodSeen, ApiError>> {
        let config = watcher::Config::default().labels(crate::labels::MANAGED_SELECTOR);
        let mut listing: Vec<String> = Vec::new();
        // A failing watch retries with kube's backoff (800 ms growing to 30 s), not at once.
        watcher(self.pods.clone(), config)
            .default_backoff()
            .filter_map(move |event| {
                let seen = match event {
                    Ok(watcher::Event::Apply(pod)) => Some(Ok(PodSeen::Changed(state_of(&pod)))),
                    Ok(watcher::Event::Delete(pod)) => {
                        Some(Ok(PodSeen::Gone(pod.metadata.name.unwrap_or_default())))
                    }
                    Ok(watcher::Event::Init) => {
                        listing.clear();
                        None
                    }
                    Ok(watcher::Event::InitApply(pod)) => {
                        listing.push(pod.metadata.name.clone().unwrap_or_default());
                        Some(Ok(PodSeen::Changed(state_of(&pod))))
                    }
                    Ok(watcher::Event::InitDone) => {
                        Some(Ok(PodSeen::Listed(std::mem::take(&mut listing))))
                    }
                    Err(e) => Some(Err(ApiError::Unavailable(format!("the pod watch: {e}")))),
                };
                std::future::ready(seen)
            })
            .boxed()
    }
}

/// What the replay reads of one of its pods (its node and gpuplace's record as the
/// scheduler reads them, [`gpuplace_scheduler::api::PodState::of`]).
pub fn state_of(pod: &Pod) -> PodState {
    let read = gpuplace_scheduler::api::PodState::of(pod);
    PodState {
        name: pod.metadata.name.clone().unwrap_or_default(),
        node: read.node_name,
        assignment: read.assignment,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

#[cfg(test)]
#[path = "kube_api_tests.rs"]
mod tests;
