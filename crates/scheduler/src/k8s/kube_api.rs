//! [`ClusterApi`] over a real API server with kube-rs: watch-fed caches for the view (a
//! [`PodStore`] of compact pods; reflector stores of Nodes, stripped of what the scheduler
//! never reads, and PodGroups); one `binding` subresource write per pod carrying the
//! assignment annotation, with the pod's UID and resourceVersion as preconditions (a stale
//! resourceVersion is a 409; the API server merges the Binding's annotations into the pod
//! in the update that sets `spec.nodeName`); events.k8s.io/v1 Events;
//! the PodGroup status subresource. Only stable APIs are used (core/v1, events.k8s.io/v1,
//! coordination.k8s.io/v1 for the lease, and our CRD), so any cluster from 1.26 on works.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Namespace, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tracing::warn;

use crate::api::{
    ApiError, BindRequest, ClusterApi, ClusterView, EventRecord, FedView, PodKey, PodState,
};
use crate::k8s::pod_store::PodStore;

use crate::k8s::gang::{PodGroup, PodGroupStatus};
use crate::k8s::queue::{DEFAULT_QUEUE_ANNOTATION, Queue, QueueStatus};

mod checked;
mod claims;
mod errors;
mod events;
mod groups;
mod jobs;
use errors::api_error;
mod watch;
pub use watch::{Changes, WatchLog, WatchNote, is_missing_resource};
use watch::{
    Watched, budget_fingerprint, bump, claim_fingerprint, node_fingerprint, run_reflector,
    volume_fingerprint,
};

/// The API server, seen through reflector caches.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    nodes: Watched<Node>,
    pods: Arc<Mutex<PodStore>>,
    groups: groups::Groups,
    claims: Watched<PersistentVolumeClaim>,
    volumes: Watched<PersistentVolume>,
    budgets: Watched<PodDisruptionBudget>,
    queues: Watched<Queue>,
    namespaces: Watched<Namespace>,
    jobs: crate::k8s::job::Jobs,
    /// DeviceClasses (where DRA is served): which of gpuplace's serves the GPU resource.
    device_classes: Option<Watched<k8s_openapi::api::resource::v1::DeviceClass>>,
    gpu_resource: String,
    events: Arc<events::Publisher>,
    /// Counts watch events of all three caches: the view's generation.
    changes: Changes,
    /// The client's own request rate limit (`--kube-api-qps`, `--kube-api-burst`).
    limit: Option<Arc<crate::k8s::rate::TokenBucket>>,
}

/// The API server refuses an Event whose note is longer than 1 KiB.
const MAX_NOTE_BYTES: usize = 1024;
/// The most of a failure message kept in the pod's condition.
const MAX_CONDITION_BYTES: usize = 4096;

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn truncate_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Drops what node filters and inventories never read (images, volumes, managed fields,
/// other tools' annotations): real Node objects carry kilobytes of it.
pub(crate) fn strip_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with(gpuplace_model::keys::ANNOTATION_PREFIX));
    }
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.config = None;
    }
}

/// Keeps of a Namespace only its name and the default-queue annotation.
fn strip_namespace(ns: &mut Namespace) {
    ns.metadata.managed_fields = None;
    ns.metadata.labels = None;
    if let Some(annotations) = ns.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k == DEFAULT_QUEUE_ANNOTATION);
    }
    ns.spec = None;
    ns.status = None;
}

/// A queue matters by its spec: the scheduler's own status writes wake no round.
fn queue_fingerprint(q: &Queue) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    q.metadata.name.hash(&mut h);
    serde_json::to_string(&q.spec)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// A namespace matters only by its default queue: other changes wake nobody.
fn namespace_fingerprint(ns: &Namespace) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ns.metadata.name.hash(&mut h);
    ns.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_QUEUE_ANNOTATION))
        .hash(&mut h);
    h.finish()
}

fn run_pod_cache(
    api: Api<Pod>,
    gpu_resource: &str,
    dra: crate::k8s::dra::DraSettings,
    changes: Changes,
) -> (Arc<Mutex<PodStore>>, tokio::sync::watch::Receiver<bool>) {
    let cache = Arc::new(Mutex::new(PodStore::new(gpu_resource).with_dra(dra)));
    let (listed, ready) = tokio::sync::watch::channel(false);
    let writer = Arc::clone(&cache);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let mut cache = writer.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(
                event,
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
            ) {
                bump(&changes);
            }
            match event {
                Ok(watcher::Event::Init) => cache.begin_relist(),
                Ok(watcher::Event::InitApply(pod)) => cache.relisted(&pod),
                Ok(watcher::Event::InitDone) => {
                    cache.relist_done();
                    let _ = listed.send(true);
                }
                Ok(watcher::Event::Apply(pod)) => cache.apply(&pod),
                Ok(watcher::Event::Delete(pod)) => cache.delete(&pod),
                Err(e) => warn!(error = %e, "pod watch error (retrying with backoff)"),
            }
        }
    });
    (cache, ready)
}

impl KubeApi {
    /// Starts the watches and waits until nodes and pods are listed.
    pub async fn start(
        client: Client,
        reporting_instance: String,
        gpu_resource: &str,
    ) -> Result<KubeApi, ApiError> {
        Self::start_with(
            client,
            reporting_instance,
            gpu_resource,
            crate::k8s::dra::DraSettings::default(),
        )
        .await
    }

    /// As [`KubeApi::start`], with `dra` saying which DRA claims are gpuplace's.
    pub async fn start_with(
        client: Client,
        reporting_instance: String,
        gpu_resource: &str,
        dra: crate::k8s::dra::DraSettings,
    ) -> Result<KubeApi, ApiError> {
        let changes: Changes = Arc::new(tokio::sync::watch::channel(0).0);
        let nodes = run_reflector(
            Api::<Node>::all(client.clone()),
            strip_node,
            "nodes cannot be listed (RBAC?)",
            changes.clone(),
            Some(node_fingerprint),
        );
        let dra_served = claims::served(&client).await;
        let (pods, mut pods_listed) = run_pod_cache(
            Api::<Pod>::all(client.clone()),
            gpu_resource,
            dra.clone(),
            changes.clone(),
        );
        let device_classes = dra_served.then(|| {
            tokio::spawn(claims::watch_claims(
                client.clone(),
                Arc::clone(&pods),
                changes.clone(),
            ));
            run_reflector(
                Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(client.clone()),
                |c| c.metadata.managed_fields = None,
                "deviceclasses cannot be listed (RBAC?): the GPU resource is not served through DRA",
                changes.clone(),
                Some(claims::class_fingerprint),
            )
        });
        let events = Arc::new(events::Publisher::new(
            client.clone(),
            "gpuplace.io/scheduler",
            &reporting_instance,
        ));
        // The CRD may be absent; gangs then stay unresolved until it is installed. Read
        // object by object: one bad PodGroup is skipped, not every gang with it.
        let groups = checked::run_checked(
            client.clone(),
            Arc::clone(&events),
            |g: &mut PodGroup| g.metadata.managed_fields = None,
            "gangs disabled until the PodGroup CRD is installed: `gpuplace crd | kubectl apply -f -`",
            changes.clone(),
            None,
        );
        // The Workload API's gangs (1.36 with GenericWorkload), read like the CRD's.
        let upstream_groups = checked::run_checked(
            client.clone(),
            Arc::clone(&events),
            |g: &mut k8s_openapi::api::scheduling::v1alpha2::PodGroup| {
                g.metadata.managed_fields = None
            },
            "Workload API gangs off: the server does not serve scheduling.k8s.io/v1alpha2 PodGroups (Kubernetes 1.36 with the GenericWorkload gate)",
            changes.clone(),
            None,
        );
        let groups = groups::Groups::new(groups, upstream_groups);
        let claims = run_reflector(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            crate::k8s::claims::strip_claim,
            "persistentvolumeclaims cannot be listed (RBAC?)",
            changes.clone(),
            Some(claim_fingerprint),
        );
        let volumes = run_reflector(
            Api::<PersistentVolume>::all(client.clone()),
            crate::k8s::claims::strip_volume,
            "persistentvolumes cannot be listed (RBAC?)",
            changes.clone(),
            Some(volume_fingerprint),
        );
        let budgets = run_reflector(
            Api::<PodDisruptionBudget>::all(client.clone()),
            |b| b.metadata.managed_fields = None,
            "poddisruptionbudgets cannot be listed (RBAC?): preemption counts no budget",
            changes.clone(),
            Some(budget_fingerprint),
        );
        let queues = checked::run_checked(
            client.clone(),
            Arc::clone(&events),
            |q: &mut Queue| q.metadata.managed_fields = None,
            "queues disabled until the Queue CRD is installed: `gpuplace crd | kubectl apply -f -`",
            changes.clone(),
            Some(queue_fingerprint),
        );
        let namespaces = run_reflector(
            Api::<Namespace>::all(client.clone()),
            strip_namespace,
            "namespaces cannot be listed (RBAC?): their default queues are not known",
            changes.clone(),
            Some(namespace_fingerprint),
        );
        // Jobs for their deadlines only: a Job's status updates wake nobody.
        let jobs = run_reflector(
            Api::<k8s_openapi::api::batch::v1::Job>::all(client.clone()),
            crate::k8s::job::strip_job,
            "jobs cannot be listed (RBAC?): a Job's activeDeadlineSeconds is not known",
            changes.clone(),
            Some(crate::k8s::job::job_fingerprint),
        );
        let jobs = crate::k8s::job::Jobs::new(Arc::new(jobs::WatchedJobs(jobs)));
        nodes
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("node watch: {e}")))?;
        // Without them, a pod's claims would look missing.
        claims
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("claim watch: {e}")))?;
        volumes
            .wait_until_ready()
            .await
            .map_err(|e| ApiError::Other(format!("volume watch: {e}")))?;
        pods_listed
            .wait_for(|listed| *listed)
            .await
            .map_err(|e| ApiError::Other(format!("pod watch: {e}")))?;
        Ok(KubeApi {
            events,
            client,
            nodes,
            pods,
            groups,
            claims,
            volumes,
            budgets,
            queues,
            namespaces,
            jobs,
            device_classes,
            gpu_resource: gpu_resource.to_string(),
            changes,
            limit: None,
        })
    }

    /// Limits the scheduler's writes and reads to `qps` a second after a burst of `burst`
    /// (no limit when `qps` is 0).
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> KubeApi {
        self.limit = crate::k8s::rate::TokenBucket::new(qps, burst).map(Arc::new);
        self
    }

    async fn throttle(&self) {
        if let Some(limit) = &self.limit {
            limit.acquire().await;
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl ClusterApi for KubeApi {
    async fn view(&self) -> Result<ClusterView, ApiError> {
        // Every pod, from no cursor: the same lists as a feed's view.
        self.view_since(None, true).await.map(|fed| fed.view)
    }

    async fn view_since(
        &self,
        since: Option<gpuplace_model::Cursor>,
        with_pods: bool,
    ) -> Result<FedView, ApiError> {
        // The generation is read first: a change landing while the view is copied makes
        // the next generation differ, so it is never missed.
        let generation = *self.changes.borrow();
        let (feed, pods, claim_holds, gpu_class) = {
            let mut store = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            let feed = store.feed(since);
            let pods = if with_pods || feed.changes.is_none() {
                store.view()
            } else {
                Default::default()
            };
            let gpu_class = self.device_classes.as_ref().and_then(|classes| {
                crate::k8s::dra::extended::class_for(
                    classes.listed().iter().map(|c| &**c),
                    &store.claims().settings,
                    &self.gpu_resource,
                )
            });
            (feed, pods, store.claim_holds(), gpu_class)
        };
        Ok(FedView {
            view: ClusterView {
                nodes: self.nodes.listed(),
                pods,
                groups: self.groups.listed(),
                claims: self.claims.listed(),
                volumes: self.volumes.listed(),
                budgets: self.budgets.listed(),
                queues: self.queues.listed(),
                namespaces: self.namespaces.listed(),
                jobs: self.jobs.clone(),
                claim_holds,
                gpu_class,
                generation,
            },
            feed,
        })
    }

    fn generation(&self) -> u64 {
        *self.changes.borrow()
    }

    async fn changed(&self, since: u64) {
        let mut rx = self.changes.subscribe();
        let _ = rx.wait_for(|g| *g > since).await;
    }

    async fn bind(&self, request: &BindRequest) -> Result<(), ApiError> {
        self.throttle().await;
        let pod = &request.pod;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                resource_version: Some(request.resource_version.clone())
                    .filter(|rv| !rv.is_empty()),
                annotations: Some(request.annotations.clone()).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(request.node.clone()),
                ..Default::default()
            },
        };
        api.create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }

    async fn write_claim(
        &self,
        write: &crate::k8s::dra::write::ClaimWrite,
    ) -> Result<(), ApiError> {
        self.throttle().await;
        let taken = {
            let store = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            store.claims().taken(write)
        };
        if let Some(why) = taken {
            return Err(ApiError::Conflict(format!(
                "ResourceClaim {}/{}: {why}",
                write.namespace, write.name
            )));
        }
        claims::write_claim(&self.client, write).await
    }

    async fn undo_claim(&self, write: &crate::k8s::dra::write::ClaimWrite) -> Result<(), ApiError> {
        self.throttle().await;
        let settings = {
            let store = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            store.claims().settings.clone()
        };
        claims::undo_claim(&self.client, write, &settings).await
    }

    async fn create_claim(
        &self,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> Result<crate::api::ClaimMade, ApiError> {
        self.throttle().await;
        claims::create_claim(&self.client, claim).await
    }

    async fn delete_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        self.throttle().await;
        claims::delete_claim(&self.client, namespace, name, uid).await
    }

    fn extended_claims_of(&self, pod: &PodKey) -> Vec<std::sync::Arc<crate::k8s::dra::ClaimInfo>> {
        let store = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        store.claims().extended_of(&pod.uid)
    }

    async fn extended_status(
        &self,
        pod: &PodKey,
        status: Option<&k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus>,
    ) -> Result<PodState, ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let patch = serde_json::json!({
            "metadata": {"uid": pod.uid},
            "status": {"extendedResourceClaimStatus": status},
        });
        api.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|p| PodState::of(&p))
            .map_err(api_error)
    }

    async fn get_pod(&self, pod: &PodKey) -> Result<Option<PodState>, ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let found = api.get_opt(&pod.name).await.map_err(api_error)?;
        Ok(found.as_ref().map(PodState::of))
    }

    async fn event(&self, event: EventRecord) -> Result<(), ApiError> {
        self.throttle().await;
        // Named `<pod>.<hex time>` (a `generateName` of `<pod>.` is refused by the API
        // server); a repeat with the same note is folded into the Event's series.
        let action = match event.reason.as_str() {
            "Scheduled" => "Binding",
            "Preempted" => "Preempting",
            _ => "Scheduling",
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(event.pod.name.clone()),
            namespace: Some(event.pod.namespace.clone()),
            uid: Some(event.pod.uid.clone()),
            ..Default::default()
        };
        self.events
            .publish(events::Record {
                type_: &event.kind,
                reason: &event.reason,
                action,
                note: truncate_bytes(&event.message, MAX_NOTE_BYTES),
                regarding: &reference,
                at: event.at,
            })
            .await
            .map_err(api_error)
    }

    async fn evict(&self, victim: &PodKey, message: &str, dry_run: bool) -> Result<(), ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &victim.namespace);
        let preconditions = Some(Preconditions {
            uid: Some(victim.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: None,
        });
        if dry_run {
            let params = DeleteParams {
                dry_run: true,
                preconditions,
                ..DeleteParams::default()
            };
            return api
                .delete(&victim.name, &params)
                .await
                .map(|_| ())
                .map_err(api_error);
        }
        // As kube-scheduler does: say why first (the DisruptionTarget condition), then
        // delete. The condition is best effort; the delete is what frees the devices.
        let condition = json!({"status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": truncate_bytes(message, MAX_NOTE_BYTES),
            "lastTransitionTime": crate::clock::rfc3339(std::time::SystemTime::now()),
        }]}});
        if let Err(e) = api
            .patch_status(
                &victim.name,
                &PatchParams::default(),
                &Patch::Strategic(condition),
            )
            .await
        {
            let e = api_error(e);
            if matches!(e, ApiError::NotFound(_)) {
                return Err(e);
            }
            tracing::debug!(pod = %victim, error = %e, "DisruptionTarget condition not written");
        }
        self.throttle().await;
        let params = DeleteParams {
            preconditions,
            ..DeleteParams::default()
        };
        api.delete(&victim.name, &params)
            .await
            .map(|_| ())
            .map_err(api_error)
    }

    async fn evict_to_move(&self, pod: &PodKey, dry_run: bool) -> Result<(), ApiError> {
        self.throttle().await;
        // The body as policy/v1 defines it (kube's own helper sends `delete_options`, which
        // the server does not read, so the UID precondition would be lost).
        let mut options = json!({"preconditions": {"uid": pod.uid}});
        if dry_run {
            options["dryRun"] = json!(["All"]);
        }
        let body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": options,
        });
        let url = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        );
        let bytes = serde_json::to_vec(&body).map_err(|e| ApiError::Invalid(e.to_string()))?;
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .map_err(|e| ApiError::Invalid(e.to_string()))?;
        self.client
            .request::<serde_json::Value>(request)
            .await
            .map(|_| ())
            .map_err(api_error)
    }

    async fn unschedulable(&self, pod: &PodKey, message: &str) -> Result<(), ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        // A strategic merge patch merges conditions by type, leaving the kubelet's alone.
        let condition = json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": truncate_bytes(message, MAX_CONDITION_BYTES),
            "lastTransitionTime": crate::clock::rfc3339(std::time::SystemTime::now()),
        }]}});
        api.patch_status(
            &pod.name,
            &PatchParams::default(),
            &Patch::Strategic(condition),
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }

    async fn nominate(&self, pod: &PodKey, node: Option<&str>) -> Result<(), ApiError> {
        self.throttle().await;
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        api.patch_status(
            &pod.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nominatedNodeName": node}})),
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }

    async fn queue_status(&self, name: &str, status: QueueStatus) -> Result<(), ApiError> {
        self.throttle().await;
        let api = Api::<Queue>::all(self.client.clone());
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .map(|_| ())
        .map_err(api_error)
    }

    async fn queue_event(
        &self,
        queue: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        self.throttle().await;
        let reference = ObjectReference {
            api_version: Some("gpuplace.io/v1alpha1".into()),
            kind: Some("Queue".into()),
            name: Some(queue.to_string()),
            ..Default::default()
        };
        self.events
            .publish(events::Record {
                type_: kind,
                reason,
                action: "Validating",
                note: truncate_bytes(message, MAX_NOTE_BYTES),
                regarding: &reference,
                at: k8s_openapi::jiff::Timestamp::now(),
            })
            .await
            .map_err(api_error)
    }

    async fn group_status(
        &self,
        namespace: &str,
        name: &str,
        status: PodGroupStatus,
    ) -> Result<(), ApiError> {
        self.throttle().await;
        self.groups
            .write_status(&self.client, namespace, name, status)
            .await
    }
}
