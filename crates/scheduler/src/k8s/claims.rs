//! The persistent volume claims a pod mounts, and what the scheduler keeps of claims and
//! volumes (the volume stage, `framework/volumes`, decides with them).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

/// A claim the pod uses: its name and whether a generic ephemeral volume makes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub name: String,
    pub ephemeral: bool,
}

/// The claims `pod` mounts: `persistentVolumeClaim` volumes, and `ephemeral` volumes
/// (whose claim, `<pod>-<volume>`, the ephemeral volume controller creates).
pub fn claims_of(pod: &Pod) -> Vec<ClaimRef> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                Some(ClaimRef {
                    name: pvc.claim_name.clone(),
                    ephemeral: false,
                })
            } else {
                v.ephemeral.as_ref().map(|_| ClaimRef {
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                })
            }
        })
        .collect()
}

/// Drops what the scheduler never reads of a claim.
pub fn strip_claim(claim: &mut PersistentVolumeClaim) {
    claim.metadata.managed_fields = None;
    claim.metadata.annotations = None;
    claim.metadata.labels = None;
    claim.status = None;
}

/// Drops what the scheduler never reads of a volume (its source, status, annotations).
pub fn strip_volume(volume: &mut PersistentVolume) {
    volume.metadata.managed_fields = None;
    volume.metadata.annotations = None;
    volume.metadata.labels = None;
    volume.status = None;
    if let Some(spec) = volume.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::PersistentVolumeSpec {
            node_affinity: spec.node_affinity.take(),
            claim_ref: spec.claim_ref.take(),
            storage_class_name: spec.storage_class_name.take(),
            ..Default::default()
        };
    }
}
