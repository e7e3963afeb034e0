//! DRA ResourceClaims on the real API server: a watch that feeds the pod store (where each
//! claim pod is resolved against its claims), and the claim writes a Binding needs.
//! Started only where the server serves `resource.k8s.io/v1` (Kubernetes 1.34+).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use super::errors::api_error;
use super::watch::{Changes, bump};
use crate::api::ApiError;
use crate::k8s::dra::write::{ClaimWrite, status_patch, undo_patch};
use crate::k8s::dra::{ClaimInfo, DraSettings, claim_key};
use crate::k8s::pod_store::PodStore;

/// Whether the server serves ResourceClaims (`resource.k8s.io/v1`).
pub async fn served(client: &Client) -> bool {
    let api = Api::<ResourceClaim>::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(e) => {
            warn!(error = %e, "resourceclaims cannot be listed (RBAC?): pods with DRA claims wait");
            true
        }
    }
}

/// Watches every ResourceClaim into `pods` (the store resolves the pods that name each).
/// Ends with the task that owns it.
pub async fn watch_claims(client: Client, pods: Arc<Mutex<PodStore>>, changes: Changes) {
    let api = Api::<ResourceClaim>::all(client);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<HashSet<(String, String)>> = None;
    while let Some(event) = stream.next().await {
        let mut store = pods.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Ok(watcher::Event::Init) => listing = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(claim)) => {
                if let Some(seen) = listing.as_mut() {
                    seen.insert(claim_key(&claim));
                }
                store.apply_claim(&claim);
            }
            Ok(watcher::Event::InitDone) => {
                let seen = listing.take().unwrap_or_default();
                let gone: Vec<(String, String)> = store
                    .claims()
                    .claims()
                    .map(|c| (c.namespace.clone(), c.name.clone()))
                    .filter(|k| !seen.contains(k))
                    .collect();
                for (ns, name) in gone {
                    store.delete_claim(&ns, &name);
                }
                info!(claims = store.claims().len(), "resource claims listed");
                bump(&changes);
            }
            Ok(watcher::Event::Apply(claim)) => {
                store.apply_claim(&claim);
                bump(&changes);
            }
            Ok(watcher::Event::Delete(claim)) => {
                let (ns, name) = claim_key(&claim);
                store.delete_claim(&ns, &name);
                bump(&changes);
            }
            Err(e) => warn!(error = %e, "resourceclaim watch error (retrying with backoff)"),
        }
    }
}

/// Sends `write`: the finalizer first when missing, then the status, each with the
/// resourceVersion it follows as the precondition.
pub async fn write_claim(client: &Client, write: &ClaimWrite) -> Result<(), ApiError> {
    let api = Api::<ResourceClaim>::namespaced(client.clone(), &write.namespace);
    let mut version = write.resource_version.clone();
    if let Some(finalizers) = &write.finalizers {
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": version, "finalizers": finalizers}
        });
        let patched = api
            .patch(&write.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
        version = patched.metadata.resource_version.unwrap_or_default();
    }
    api.patch_status(
        &write.name,
        &PatchParams::default(),
        &Patch::Merge(&status_patch(write, &version)),
    )
    .await
    .map(|_| ())
    .map_err(api_error)
}

/// Undoes `write` on the claim as the server has it now.
pub async fn undo_claim(
    client: &Client,
    write: &ClaimWrite,
    settings: &DraSettings,
) -> Result<(), ApiError> {
    let api = Api::<ResourceClaim>::namespaced(client.clone(), &write.namespace);
    let Some(current) = api.get_opt(&write.name).await.map_err(api_error)? else {
        return Ok(());
    };
    let Some(patch) = undo_patch(write, &ClaimInfo::of(&current, settings)) else {
        return Ok(());
    };
    api.patch_status(&write.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(api_error)
}

/// A DeviceClass matters by its name and what its extended resource is.
pub fn class_fingerprint(class: &k8s_openapi::api::resource::v1::DeviceClass) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    class.metadata.name.hash(&mut h);
    class.metadata.deletion_timestamp.is_some().hash(&mut h);
    class.spec.extended_resource_name.hash(&mut h);
    h.finish()
}

/// Creates `claim`; what the server made of it.
pub async fn create_claim(
    client: &Client,
    claim: &ResourceClaim,
) -> Result<crate::api::ClaimMade, ApiError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
    let api = Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    let made = api
        .create(&kube::api::PostParams::default(), claim)
        .await
        .map_err(api_error)?;
    Ok(crate::api::ClaimMade {
        name: made.metadata.name.unwrap_or_default(),
        uid: made.metadata.uid.unwrap_or_default(),
        resource_version: made.metadata.resource_version.unwrap_or_default(),
    })
}

/// Deletes a claim the scheduler made: its delete protection off (the UID a
/// precondition), then the delete (the same). Gone already is done.
pub async fn delete_claim(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<(), ApiError> {
    let api = Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    let Some(current) = api.get_opt(name).await.map_err(api_error)? else {
        return Ok(());
    };
    if current.metadata.uid.as_deref() != Some(uid) {
        return Ok(());
    }
    let finalizers: Vec<String> = current
        .metadata
        .finalizers
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != crate::k8s::dra::DELETE_PROTECTION)
        .collect();
    let patch = serde_json::json!({
        "metadata": {
            "uid": uid,
            "resourceVersion": current.metadata.resource_version,
            "finalizers": finalizers,
        }
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_error)?;
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(api_error(e)),
    }
}
