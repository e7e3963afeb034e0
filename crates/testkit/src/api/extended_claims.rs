//! The claims a scheduler makes for pods' extended resources (DRAExtendedResource), in the
//! in-memory API as kube-apiserver 1.36 takes them: a claim created from `generateName`
//! (a name of five more characters, a UID, owner references kept), deleted by UID once its
//! finalizers are off, and the pod's `status.extendedResourceClaimStatus` validated as
//! `validatePodExtendedResourceClaimStatus` does (at least one mapping; each names a
//! container of the pod that asks that resource, a request name that is a DNS label, no
//! mapping twice; a claim name that is a valid object name). DeviceClasses are kept for
//! the view (which of gpuplace's classes serves the GPU resource).

use gpuplace_scheduler::ApiError;
use gpuplace_scheduler::PodKey;
use gpuplace_scheduler::api::{ClaimMade, PodState};
use gpuplace_scheduler::k8s::dra::{DELETE_PROTECTION, claim_key};
use k8s_openapi::api::core::v1::{Pod, PodExtendedResourceClaimStatus};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

use gpuplace_model::keys::{is_dns_label, is_dns_subdomain as is_object_name};

use super::{MemoryApi, lock};

/// Whether `container` of `pod` asks `resource` (its requests; limits stand for requests
/// of extended resources, as the server defaults them).
fn asks(pod: &Pod, container: &str, resource: &str) -> Option<bool> {
    let spec = pod.spec.as_ref()?;
    let c = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == container)?;
    let r = c.resources.as_ref();
    Some(
        r.and_then(|r| r.requests.as_ref())
            .is_some_and(|m| m.contains_key(resource))
            || r.and_then(|r| r.limits.as_ref())
                .is_some_and(|m| m.contains_key(resource)),
    )
}

fn validate_status(pod: &Pod, status: &PodExtendedResourceClaimStatus) -> Result<(), ApiError> {
    let path = "status.extendedResourceClaimStatus";
    if status.request_mappings.is_empty() {
        return Err(ApiError::Invalid(format!(
            "{path}.requestMappings: Required value: at least one request mapping is required"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, m) in status.request_mappings.iter().enumerate() {
        match asks(pod, &m.container_name, &m.resource_name) {
            None => {
                return Err(ApiError::Invalid(format!(
                    "{path}.requestMappings[{i}].containerName: Invalid value: {:?}: must match the name of an entry in spec.initContainers.name or spec.containers.name",
                    m.container_name
                )));
            }
            Some(false) => {
                return Err(ApiError::Invalid(format!(
                    "{path}.requestMappings[{i}].resourceName: Invalid value: {:?}: must match the extended resource name of an entry in spec.initContainers.resources.requests or spec.containers.resources.requests",
                    m.resource_name
                )));
            }
            Some(true) => {}
        }
        if !is_dns_label(&m.request_name) {
            return Err(ApiError::Invalid(format!(
                "{path}.requestName: Invalid value: {:?}: a lowercase RFC 1123 label",
                m.request_name
            )));
        }
        if !seen.insert((&m.container_name, &m.resource_name, &m.request_name)) {
            return Err(ApiError::Invalid(format!(
                "{path}.requestMappings[{i}].containerName: Duplicate value: {:?}",
                m.container_name
            )));
        }
    }
    if !is_object_name(&status.resource_claim_name) {
        return Err(ApiError::Invalid(format!(
            "{path}.resourceClaimName: Invalid value: {:?}",
            status.resource_claim_name
        )));
    }
    Ok(())
}

impl MemoryApi {
    /// Creates or replaces a DeviceClass.
    pub fn put_device_class(&self, class: DeviceClass) {
        let mut s = lock(&self.store);
        s.device_classes
            .retain(|c| c.metadata.name != class.metadata.name);
        s.device_classes.push(class);
        s.generation += 1;
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    pub(super) async fn take_claim_create(
        &self,
        claim: &ResourceClaim,
    ) -> Result<ClaimMade, ApiError> {
        let (_permit, fault) = self.charge().await;
        if matches!(
            fault,
            Some(super::Fault::Error | super::Fault::TimeoutLost | super::Fault::Conflict)
        ) {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        let mut claim = claim.clone();
        let meta = &mut claim.metadata;
        if meta.resource_version.is_some() || meta.uid.is_some() {
            return Err(ApiError::Invalid(
                "metadata.resourceVersion: Invalid value: must be unspecified on create".into(),
            ));
        }
        let version = s.version;
        let name = match (&meta.name, &meta.generate_name) {
            (Some(n), _) => n.clone(),
            (None, Some(prefix)) => {
                // The server's five random characters (here from the store's version).
                let suffix: String = format!("{version:05}")
                    .bytes()
                    .rev()
                    .take(5)
                    .map(|b| char::from(b'b' + (b - b'0')))
                    .collect();
                format!("{}{suffix}", &prefix[..prefix.len().min(58)])
            }
            (None, None) => {
                return Err(ApiError::Invalid(
                    "metadata.name: Required value: name or generateName is required".into(),
                ));
            }
        };
        if !is_object_name(&name) {
            return Err(ApiError::Invalid(format!(
                "metadata.name: Invalid value: {name:?}"
            )));
        }
        let ns = meta
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        if s.resource_claims.contains_key(&(ns.clone(), name.clone())) {
            return Err(ApiError::Conflict(format!(
                "resourceclaims.resource.k8s.io {name:?} already exists"
            )));
        }
        meta.name = Some(name.clone());
        meta.uid = Some(format!("claim-{ns}-{name}-{version}"));
        claim.status = None;
        let uid = meta.uid.clone().unwrap_or_default();
        s.store_claim(claim);
        let resource_version = s.version.to_string();
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        if matches!(fault, Some(super::Fault::TimeoutApplied)) {
            return Err(ApiError::Other("injected time-out (applied)".into()));
        }
        Ok(ClaimMade {
            name,
            uid,
            resource_version,
        })
    }

    pub(super) async fn take_claim_delete(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if matches!(fault, Some(super::Fault::Error | super::Fault::TimeoutLost)) {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        let key = (namespace.to_string(), name.to_string());
        let Some(claim) = s.resource_claims.get(&key) else {
            return Ok(());
        };
        if claim.metadata.uid.as_deref() != Some(uid) {
            return Ok(());
        }
        // The scheduler takes its delete protection off first; any other finalizer keeps
        // the claim (being deleted) as the server would.
        let others = claim
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f != DELETE_PROTECTION);
        if others {
            let mut claim = claim.clone();
            claim.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::clock::server_time()),
            );
            s.store_claim(claim);
        } else {
            let claim = s.resource_claims.remove(&key);
            if let Some(c) = claim {
                let (ns, name) = claim_key(&c);
                s.bump();
                s.cache.delete_claim(&ns, &name);
                s.generation += 1;
            }
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    pub(super) async fn take_extended_status(
        &self,
        pod: &PodKey,
        status: Option<&PodExtendedResourceClaimStatus>,
    ) -> Result<PodState, ApiError> {
        let (_permit, fault) = self.charge().await;
        if matches!(fault, Some(super::Fault::Error | super::Fault::TimeoutLost)) {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        let key = (pod.namespace.clone(), pod.name.clone());
        let current = s
            .pods
            .get(&key)
            .ok_or_else(|| ApiError::NotFound(pod.to_string()))?;
        if current.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
            return Err(ApiError::Conflict(format!(
                "{pod}: Precondition failed: UID in precondition: {}",
                pod.uid
            )));
        }
        if let Some(status) = status {
            validate_status(current, status)?;
        }
        s.write_pod(&key, |p| {
            p.status
                .get_or_insert_with(Default::default)
                .extended_resource_claim_status = status.cloned();
        });
        let state = s.pods.get(&key).map(|p| PodState::of(p));
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        state.ok_or_else(|| ApiError::NotFound(pod.to_string()))
    }

    /// The pod's extended-resource claim status as stored.
    pub fn extended_status_of(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<PodExtendedResourceClaimStatus> {
        let s = lock(&self.store);
        let pod = s.pods.get(&(namespace.to_string(), name.to_string()))?;
        pod.status.as_ref()?.extended_resource_claim_status.clone()
    }
}
