//! ResourceClaims in the in-memory API, kept as kube-apiserver 1.36 keeps them: every write
//! bumps the resourceVersion and a stale one in a patch is a 409; a status write is
//! validated as `ValidateResourceClaimStatusUpdate` validates it (an allocation is
//! immutable once set, `reservedFor` needs an allocation and holds at most 256 users, no new
//! user while the claim is being deleted, results name the claim's requests, share IDs
//! are UUIDs in normal form). The resource claim controller's part is played too: a deleted
//! pod leaves `reservedFor`, and a claim whose last user left is deallocated and loses
//! its finalizer.

use gpuplace_scheduler::ApiError;
use gpuplace_scheduler::k8s::dra::write::{ClaimWrite, status_patch, undo_patch};
use gpuplace_scheduler::k8s::dra::{ClaimInfo, DELETE_PROTECTION, MAX_RESERVED_FOR, claim_key};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};

use super::{MemoryApi, Store, lock};

impl Store {
    /// Stores `claim` as a write (a new resourceVersion) and delivers it to the cache.
    pub(super) fn store_claim(&mut self, mut claim: ResourceClaim) {
        let rv = self.bump();
        claim.metadata.resource_version = Some(rv);
        let key = claim_key(&claim);
        self.cache.apply_claim(&claim);
        self.resource_claims.insert(key, claim);
        self.generation += 1;
    }

    /// The resource claim controller's part when the pod `uid` is gone: it leaves its
    /// claims' users, and a claim left without users is deallocated.
    pub(super) fn release_claims_of(&mut self, uid: &str) {
        let held: Vec<ResourceClaim> = self
            .resource_claims
            .values()
            .filter(|c| ClaimInfo::of(c, &Default::default()).reserved_for_pod(uid))
            .cloned()
            .collect();
        for mut claim in held {
            let status = claim.status.get_or_insert_with(Default::default);
            let users = status.reserved_for.get_or_insert_with(Vec::new);
            users.retain(|u| u.uid != uid);
            if users.is_empty() {
                status.reserved_for = None;
                status.allocation = None;
                if let Some(f) = claim.metadata.finalizers.as_mut() {
                    f.retain(|f| f != DELETE_PROTECTION);
                }
            }
            self.store_claim(claim);
        }
    }
}

impl MemoryApi {
    /// Holds the resource claim controller back: a deleted pod's claims keep it as a user
    /// (and stay allocated) until [`release_held_claims`](Self::release_held_claims), as
    /// they do on a real cluster until the controller gets to them.
    pub fn hold_claim_releases(&self) {
        lock(&self.store)
            .claim_releases
            .get_or_insert_with(Vec::new);
    }

    /// The controller catches up: the claims of the pods deleted since
    /// [`hold_claim_releases`](Self::hold_claim_releases) are released, and it works at
    /// once again.
    pub fn release_held_claims(&self) {
        let mut s = lock(&self.store);
        for uid in s.claim_releases.take().unwrap_or_default() {
            s.release_claims_of(&uid);
        }
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }
}

fn conflict(key: &(String, String), sent: &str) -> ApiError {
    ApiError::Conflict(format!(
        "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"{}\" in {}: the object has been modified; please apply your changes to the latest version and try again (precondition {sent})",
        key.1, key.0
    ))
}

/// The status `patch` (a merge patch of `status`) applied to `claim`, validated.
fn patched_status(
    claim: &ResourceClaim,
    patch: &serde_json::Value,
) -> Result<ResourceClaimStatus, ApiError> {
    let mut status = serde_json::to_value(claim.status.clone().unwrap_or_default())
        .map_err(|e| ApiError::Other(e.to_string()))?;
    super::queues::merge_patch(&mut status, patch["status"].clone());
    let next: ResourceClaimStatus =
        serde_json::from_value(status).map_err(|e| ApiError::Invalid(format!("status: {e}")))?;
    validate(claim, &next)?;
    Ok(next)
}

fn validate(claim: &ResourceClaim, next: &ResourceClaimStatus) -> Result<(), ApiError> {
    let old = claim.status.clone().unwrap_or_default();
    if old.allocation.is_some() && next.allocation.is_some() && old.allocation != next.allocation {
        return Err(ApiError::Invalid(
            "status.allocation: Invalid value: field is immutable".into(),
        ));
    }
    let users = next.reserved_for.as_deref().unwrap_or_default();
    if !users.is_empty() && next.allocation.is_none() {
        return Err(ApiError::Invalid(
            "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"
                .into(),
        ));
    }
    if users.len() > MAX_RESERVED_FOR {
        return Err(ApiError::Invalid(format!(
            "status.reservedFor: Too many: {}: must have at most {MAX_RESERVED_FOR} items",
            users.len()
        )));
    }
    let before = old.reserved_for.as_deref().unwrap_or_default();
    let added = users.iter().any(|u| !before.iter().any(|b| b.uid == u.uid));
    if added && claim.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::Invalid(
            "status.reservedFor: Forbidden: new entries may not be added while `deletionTimestamp` is set".into(),
        ));
    }
    let requests: Vec<&k8s_openapi::api::resource::v1::DeviceRequest> = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .collect();
    let results = next
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    for (i, r) in results.into_iter().flatten().enumerate() {
        if !names_a_request(&requests, &r.request) {
            return Err(ApiError::Invalid(format!(
                "status.allocation.devices.results[{i}].request: Invalid value: {:?}: must be the name of a request in the claim or the name of a request and a subrequest separated by '/'",
                r.request
            )));
        }
        if let Some(id) = &r.share_id
            && !is_uuid(id)
        {
            return Err(ApiError::Invalid(format!(
                "status.allocation.devices.results[{i}].shareID: Invalid value: {id:?}: uid must be in RFC 4122 normalized form"
            )));
        }
    }
    Ok(())
}

/// Whether `name` is a request of the claim, or `<request>/<subrequest>` of one of its
/// `firstAvailable` lists (the API server's `requestNames.Has`).
fn names_a_request(
    requests: &[&k8s_openapi::api::resource::v1::DeviceRequest],
    name: &str,
) -> bool {
    let mut segments = name.split('/');
    let (Some(main), sub, None) = (segments.next(), segments.next(), segments.next()) else {
        return false;
    };
    let Some(request) = requests.iter().find(|r| r.name == main) else {
        return false;
    };
    sub.is_none_or(|sub| {
        request
            .first_available
            .iter()
            .flatten()
            .any(|s| s.name == sub)
    })
}

fn is_uuid(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    parts.len() == 5
        && parts.iter().zip(lens).all(|(p, n)| {
            p.len() == n
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

impl MemoryApi {
    /// Creates or replaces a ResourceClaim; a missing namespace or UID is filled in.
    pub fn put_resource_claim(&self, mut claim: ResourceClaim) {
        let mut s = lock(&self.store);
        let ns = claim
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let version = s.version;
        claim
            .metadata
            .uid
            .get_or_insert_with(|| format!("claim-{ns}-{name}-{version}"));
        s.store_claim(claim);
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
    }

    /// The claim `namespace/name` as stored.
    pub fn resource_claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        lock(&self.store)
            .resource_claims
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every stored claim.
    pub fn resource_claims(&self) -> Vec<ResourceClaim> {
        lock(&self.store)
            .resource_claims
            .values()
            .cloned()
            .collect()
    }

    /// The scheduler's claim write, as the real server takes it.
    pub(super) async fn take_claim_write(&self, write: &ClaimWrite) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        match fault {
            Some(super::Fault::Conflict) => {
                return Err(conflict(
                    &(write.namespace.clone(), write.name.clone()),
                    "injected",
                ));
            }
            Some(super::Fault::Error) => return Err(ApiError::Other("injected 500".into())),
            Some(super::Fault::TimeoutLost) => {
                return Err(ApiError::Other("injected time-out".into()));
            }
            _ => {}
        }
        let applied = self.apply_claim_write(write);
        match (applied, fault) {
            (Ok(()), Some(super::Fault::TimeoutApplied)) => {
                Err(ApiError::Other("injected time-out (applied)".into()))
            }
            (result, _) => result,
        }
    }

    fn apply_claim_write(&self, write: &ClaimWrite) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let key = (write.namespace.clone(), write.name.clone());
        // The scheduler's own check against the claims it has seen (the server has none).
        if let Some(why) = s.cache.claims().taken(write) {
            return Err(ApiError::Conflict(format!(
                "ResourceClaim {}/{}: {why}",
                key.0, key.1
            )));
        }
        let mut claim = s
            .resource_claims
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("resourceclaims {:?}", key.1)))?;
        if claim.metadata.resource_version.as_deref() != Some(write.resource_version.as_str()) {
            return Err(conflict(&key, &write.resource_version));
        }
        if let Some(finalizers) = &write.finalizers {
            claim.metadata.finalizers = Some(finalizers.clone());
            s.store_claim(claim.clone());
            claim = s.resource_claims.get(&key).cloned().unwrap_or(claim);
        }
        let version = claim.metadata.resource_version.clone().unwrap_or_default();
        let status = patched_status(&claim, &status_patch(write, &version))?;
        claim.status = Some(status);
        s.store_claim(claim);
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }

    /// The scheduler's undo of a claim write.
    pub(super) async fn take_claim_undo(&self, write: &ClaimWrite) -> Result<(), ApiError> {
        let (_permit, fault) = self.charge().await;
        if matches!(fault, Some(super::Fault::Error | super::Fault::TimeoutLost)) {
            return Err(ApiError::Other("injected 500".into()));
        }
        let mut s = lock(&self.store);
        let key = (write.namespace.clone(), write.name.clone());
        let Some(mut claim) = s.resource_claims.get(&key).cloned() else {
            return Ok(());
        };
        let current = ClaimInfo::of(&claim, &Default::default());
        let Some(patch) = undo_patch(write, &current) else {
            return Ok(());
        };
        claim.status = Some(patched_status(&claim, &patch)?);
        s.store_claim(claim);
        let v = s.version;
        drop(s);
        self.pod_version.send_replace(v);
        Ok(())
    }
}
