//! Persistent volumes, as far as gpuplace places pods that use them (kube-scheduler's
//! VolumeBinding plugin, without provisioning): a pod's claims must exist and be bound; a
//! bound volume's node affinity (local volumes, zonal disks) limits the nodes. gpuplace does
//! not bind claims: a claim that waits for its first consumer (`WaitForFirstConsumer`) or is
//! not bound yet makes the pod unschedulable with a `FailedScheduling` Event that says so,
//! never a silent placement on a node the volume cannot reach. The pod is tried again when a
//! claim or volume changes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolume, PersistentVolumeClaim};

use crate::k8s::claims::ClaimRef;

/// The phrase for nodes a bound volume cannot reach, as kube-scheduler says it.
pub const NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";

enum Claim {
    Bound(String),
    Unbound,
    Deleting,
}

/// Claims and volumes as one round sees them.
#[derive(Default)]
pub struct VolumeIndex {
    claims: HashMap<(String, String), Claim>,
    /// Volume name -> its required node affinity, if any.
    volumes: HashMap<String, Option<NodeSelector>>,
}

impl VolumeIndex {
    pub fn new(claims: &[Arc<PersistentVolumeClaim>], volumes: &[Arc<PersistentVolume>]) -> Self {
        let claims = claims
            .iter()
            .map(|c| {
                let key = (
                    c.metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    c.metadata.name.clone().unwrap_or_default(),
                );
                let bound = c
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .filter(|v| !v.is_empty());
                let state = match bound {
                    _ if c.metadata.deletion_timestamp.is_some() => Claim::Deleting,
                    Some(v) => Claim::Bound(v),
                    None => Claim::Unbound,
                };
                (key, state)
            })
            .collect();
        let volumes = volumes
            .iter()
            .map(|v| {
                (
                    v.metadata.name.clone().unwrap_or_default(),
                    v.spec
                        .as_ref()
                        .and_then(|s| s.node_affinity.as_ref())
                        .and_then(|a| a.required.clone()),
                )
            })
            .collect();
        VolumeIndex { claims, volumes }
    }

    /// The node selectors every node must match for the volumes of a pod in `namespace`
    /// that mounts `claims` (all of them), or why the pod cannot be placed anywhere now.
    pub fn check(
        &self,
        namespace: &str,
        claims: &[ClaimRef],
    ) -> Result<Vec<&NodeSelector>, String> {
        let mut selectors = Vec::new();
        for claim in claims {
            let key = (namespace.to_string(), claim.name.clone());
            let volume = match self.claims.get(&key) {
                None if claim.ephemeral => {
                    return Err(format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{}\"",
                        claim.name
                    ));
                }
                None => {
                    return Err(format!(
                        "persistentvolumeclaim \"{}\" not found",
                        claim.name
                    ));
                }
                Some(Claim::Deleting) => {
                    return Err(format!(
                        "persistentvolumeclaim \"{}\" is being deleted",
                        claim.name
                    ));
                }
                Some(Claim::Unbound) => {
                    return Err(format!(
                        "persistentvolumeclaim \"{}\" is not bound: gpuplace places pods only on bound claims and does not provision WaitForFirstConsumer volumes (bind the claim, or use a StorageClass with volumeBindingMode: Immediate)",
                        claim.name
                    ));
                }
                Some(Claim::Bound(volume)) => volume,
            };
            match self.volumes.get(volume) {
                None => {
                    return Err(format!(
                        "persistentvolume \"{volume}\" bound to persistentvolumeclaim \"{}\" not found",
                        claim.name
                    ));
                }
                Some(Some(selector)) => selectors.push(selector),
                Some(None) => {}
            }
        }
        Ok(selectors)
    }
}

/// A digest of what volume checks read (claims' binding and volumes' node affinity): when
/// it changes, pods parked for their volumes are tried again.
pub fn digest(claims: &[Arc<PersistentVolumeClaim>], volumes: &[Arc<PersistentVolume>]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in claims {
        (
            &c.metadata.namespace,
            &c.metadata.name,
            c.spec.as_ref().map(|s| &s.volume_name),
            c.metadata.deletion_timestamp.is_some(),
        )
            .hash(&mut h);
    }
    for v in volumes {
        (&v.metadata.name, &v.metadata.resource_version).hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::claims::claims_of;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(volumes: serde_json::Value) -> Vec<ClaimRef> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u"},
            "spec": {"containers": [], "volumes": volumes}
        }))
        .unwrap();
        claims_of(&pod)
    }

    fn claim(name: &str, volume: Option<&str>) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
                "spec": {"volumeName": volume}}))
            .unwrap(),
        )
    }

    fn volume(name: &str, node: Option<&str>) -> Arc<PersistentVolume> {
        let affinity = node.map(|n| {
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [n]}]}]}})
        });
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"nodeAffinity": affinity}}))
            .unwrap(),
        )
    }

    #[test]
    fn claims_must_exist_and_be_bound() {
        let p = pod(
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            {"name": "shm", "emptyDir": {}}]),
        );
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].name, "train-scratch");
        let none = VolumeIndex::new(&[], &[]);
        assert_eq!(
            none.check("ml", &p).unwrap_err(),
            "persistentvolumeclaim \"data\" not found"
        );
        let unbound = VolumeIndex::new(&[claim("data", None)], &[]);
        assert!(
            unbound
                .check("ml", &p)
                .unwrap_err()
                .contains("does not provision WaitForFirstConsumer")
        );
        let no_ephemeral = VolumeIndex::new(&[claim("data", Some("pv1"))], &[volume("pv1", None)]);
        assert!(
            no_ephemeral
                .check("ml", &p)
                .unwrap_err()
                .starts_with("waiting for ephemeral volume controller")
        );
        let lost = VolumeIndex::new(
            &[
                claim("data", Some("pv1")),
                claim("train-scratch", Some("pv2")),
            ],
            &[volume("pv2", None)],
        );
        assert!(lost.check("ml", &p).unwrap_err().contains("\"pv1\""));
        let ready = VolumeIndex::new(
            &[
                claim("data", Some("pv1")),
                claim("train-scratch", Some("pv2")),
            ],
            &[volume("pv1", Some("n3")), volume("pv2", None)],
        );
        let selectors = ready.check("ml", &p).unwrap();
        assert_eq!(selectors.len(), 1);
        let plain = pod(json!([]));
        assert!(plain.is_empty() && none.check("ml", &plain).unwrap().is_empty());
    }

    #[test]
    fn the_digest_changes_when_a_claim_binds() {
        let before = digest(&[claim("data", None)], &[]);
        let after = digest(&[claim("data", Some("pv1"))], &[]);
        assert_ne!(before, after);
        assert_eq!(after, digest(&[claim("data", Some("pv1"))], &[]));
    }
}
