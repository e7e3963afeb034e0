//! The handshake's Kubernetes adapter: a watch on the pods bound to this node (field
//! selector `spec.nodeName`) feeding [`NodePods`], and [`NodeApi`] writes with kube-rs (a
//! merge patch of the pod's `gpuplace.io/allocated` annotation guarded by its UID, and
//! events.k8s.io/v1 Events through kube-rs's recorder, which names and deduplicates them
//! as the API server expects).

use futures::StreamExt;
use gpuplace_model::ALLOCATED_ANNOTATION;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tracing::warn;

use crate::plan::handshake::{NodeApi, NodeApiError};
use crate::plan::store::{NodePod, NodePods};

/// Keeps `pods` equal to the pods bound to `node` until the stream ends (it retries with
/// backoff; the caller drops the task on shutdown).
pub async fn watch_pods(client: Client, node: String, pods: NodePods) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => pods.begin_relist(),
            Ok(watcher::Event::InitApply(pod)) => pods.relisted(&pod),
            Ok(watcher::Event::InitDone) => pods.relist_done(),
            Ok(watcher::Event::Apply(pod)) => pods.apply(&pod),
            Ok(watcher::Event::Delete(pod)) => pods.delete(
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                pod.metadata.name.as_deref().unwrap_or_default(),
            ),
            Err(e) => warn!(error = %e, %node, "watching this node's pods failed; retrying"),
        }
    }
}

/// [`NodeApi`] over kube-rs.
pub struct KubeNodeApi {
    client: Client,
    recorder: Recorder,
}

impl KubeNodeApi {
    pub fn new(client: Client, node: &str) -> KubeNodeApi {
        let reporter = Reporter {
            controller: "gpuplace-device-plugin".into(),
            instance: Some(format!("gpuplace-device-plugin-{node}")),
        };
        KubeNodeApi {
            recorder: Recorder::new(client.clone(), reporter),
            client,
        }
    }
}

impl NodeApi for KubeNodeApi {
    async fn set_allocated(&self, pod: &NodePod, allocated: &str) -> Result<(), NodeApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        // The UID in the patch makes it fail on a pod re-created under the same name.
        let patch = json!({"metadata": {
            "uid": pod.uid,
            "annotations": {ALLOCATED_ANNOTATION: allocated},
        }});
        api.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| NodeApiError(format!("patch pod {}/{}: {e}", pod.namespace, pod.name)))
    }

    async fn warn(&self, pod: &NodePod, reason: &str, note: String) -> Result<(), NodeApiError> {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: None,
        };
        self.recorder
            .publish(&event, &reference)
            .await
            .map_err(|e| NodeApiError(format!("event on pod {}/{}: {e}", pod.namespace, pod.name)))
    }
}
