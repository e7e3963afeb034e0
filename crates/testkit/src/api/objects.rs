//! Cluster objects other than pods in the in-memory API: nodes (with the publisher's
//! metadata merges), PersistentVolumeClaims and PersistentVolumes, PodGroups. Each write
//! bumps the resourceVersion and the view's generation and wakes the scheduler's watch.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuplace_scheduler::k8s::gang::PodGroup;
use gpuplace_scheduler::k8s::selector::selects;
use gpuplace_scheduler::{ApiError, PodKey};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::{MemoryApi, lock};

impl MemoryApi {
    /// Creates or replaces a node (resourceVersion assigned).
    pub fn put_node(&self, mut node: Node) {
        let mut s = lock(&self.store);
        s.generation += 1;
        node.metadata.resource_version = Some(s.bump());
        let name = node.metadata.name.clone().unwrap_or_default();
        s.nodes.insert(name, Arc::new(node));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    /// Deletes a Node; a Node created again under the name starts with only what its
    /// creator writes (no annotations or labels of other writers survive).
    pub fn delete_node(&self, name: &str) {
        let mut s = lock(&self.store);
        s.generation += 1;
        s.nodes.remove(name);
        s.bump();
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    pub fn node(&self, name: &str) -> Option<Node> {
        lock(&self.store).nodes.get(name).map(|n| (**n).clone())
    }

    /// Every Node.
    pub fn nodes(&self) -> Vec<Node> {
        lock(&self.store)
            .nodes
            .listed()
            .iter()
            .map(|n| (**n).clone())
            .collect()
    }

    /// Merges annotations and labels into a Node (a JSON merge patch of metadata).
    pub fn merge_node_metadata(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> Result<Node, ApiError> {
        self.patch_node_metadata(name, |meta| {
            meta.annotations
                .get_or_insert_with(Default::default)
                .extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
            meta.labels
                .get_or_insert_with(Default::default)
                .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        })
    }

    /// Removes labels from a Node (a merge patch's nulls, as the API server applies them).
    pub fn remove_node_labels(&self, name: &str, labels: &[String]) -> Result<Node, ApiError> {
        self.patch_node_metadata(name, |meta| {
            if let Some(have) = meta.labels.as_mut() {
                for l in labels {
                    have.remove(l);
                }
            }
        })
    }

    /// Changes a Node's metadata as a patch does: a new resourceVersion, its watchers told.
    fn patch_node_metadata(
        &self,
        name: &str,
        change: impl FnOnce(&mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta),
    ) -> Result<Node, ApiError> {
        let mut s = lock(&self.store);
        s.generation += 1;
        let rv = s.bump();
        let node = s
            .nodes
            .get_mut(name)
            .ok_or_else(|| ApiError::NotFound(format!("node {name}")))?;
        change(&mut node.metadata);
        node.metadata.resource_version = Some(rv);
        let out = node.clone();
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
        Ok(out)
    }

    /// Waits until a Node changes after version `since`; returns the version now.
    pub async fn wait_node_change(&self, since: u64) -> u64 {
        let mut rx = self.node_version.subscribe();
        let _ = rx.wait_for(|v| *v > since).await;
        *rx.borrow()
    }

    /// Creates or replaces a PersistentVolumeClaim (seen by the next view, like a node).
    pub fn put_claim(&self, mut claim: PersistentVolumeClaim) {
        let mut s = lock(&self.store);
        s.generation += 1;
        claim.metadata.resource_version = Some(s.bump());
        let ns = claim
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = claim.metadata.name.clone().unwrap_or_default();
        s.claims.insert((ns, name), Arc::new(claim));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    /// Creates or replaces a PersistentVolume.
    pub fn put_volume(&self, mut volume: PersistentVolume) {
        let mut s = lock(&self.store);
        s.generation += 1;
        volume.metadata.resource_version = Some(s.bump());
        let name = volume.metadata.name.clone().unwrap_or_default();
        s.volumes.insert(name, Arc::new(volume));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    pub fn put_group(&self, mut group: PodGroup) {
        let mut s = lock(&self.store);
        s.generation += 1;
        group.metadata.resource_version = Some(s.bump());
        let ns = group
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = group.metadata.name.clone().unwrap_or_default();
        s.groups.insert((ns, name), Arc::new(group));
    }

    /// Creates or replaces a Workload API PodGroup (`scheduling.k8s.io/v1alpha2`), held as the
    /// scheduler's watch hands it over: read as a gang of gpuplace's.
    pub fn put_workload_group(&self, group: k8s_openapi::api::scheduling::v1alpha2::PodGroup) {
        self.put_group(gpuplace_scheduler::k8s::workload::gang_of(&group));
    }

    pub fn delete_group(&self, namespace: &str, name: &str) {
        let mut s = lock(&self.store);
        s.generation += 1;
        s.bump();
        s.groups.remove(&(namespace.to_string(), name.to_string()));
    }

    /// Creates or replaces a PodDisruptionBudget (its status as the disruption controller
    /// would have written it).
    pub fn put_budget(&self, mut budget: PodDisruptionBudget) {
        let mut s = lock(&self.store);
        s.generation += 1;
        budget.metadata.resource_version = Some(s.bump());
        let ns = budget
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = budget.metadata.name.clone().unwrap_or_default();
        s.budgets.insert((ns, name), Arc::new(budget));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    /// The Eviction API's budget check, as the server makes it: the pod must exist with
    /// this UID; every budget of its namespace selecting it must allow a disruption, and
    /// each then allows one fewer and lists the pod as disrupted.
    /// The Eviction API's checks (UID, budgets); the budgets are charged unless `dry_run`.
    pub fn evict_through_budgets(&self, pod: &PodKey, dry_run: bool) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let current = s
            .pods
            .get(&(pod.namespace.clone(), pod.name.clone()))
            .ok_or_else(|| ApiError::NotFound(pod.to_string()))?;
        if current.metadata.uid.as_deref() != Some(pod.uid.as_str()) {
            return Err(ApiError::Conflict(format!(
                "{pod}: Precondition failed: UID in precondition: {}",
                pod.uid
            )));
        }
        let labels = current.metadata.labels.clone().unwrap_or_default();
        let covering: Vec<(String, String)> = s
            .budgets
            .iter()
            .filter(|((ns, _), b)| {
                *ns == pod.namespace
                    && selects(b.spec.as_ref().and_then(|s| s.selector.as_ref()), &labels)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let allowed = |b: &PodDisruptionBudget| {
            b.status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0)
        };
        if covering.iter().any(|k| allowed(&s.budgets[k]) <= 0) {
            return Err(ApiError::Blocked(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ));
        }
        if dry_run {
            return Ok(());
        }
        let version = s.bump();
        for k in covering {
            let mut b = (*s.budgets[&k]).clone();
            if let Some(status) = b.status.as_mut() {
                status.disruptions_allowed = Some(status.disruptions_allowed.unwrap_or(0) - 1);
                status
                    .disrupted_pods
                    .get_or_insert_with(Default::default)
                    .insert(
                        pod.name.clone(),
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            crate::clock::server_time(),
                        ),
                    );
            }
            b.metadata.resource_version = Some(version.clone());
            s.budgets.insert(k, Arc::new(b));
        }
        s.generation += 1;
        Ok(())
    }
}

/// A number in [0, 1) from `seed` and `n` (splitmix64): the same for the same pair.
pub(crate) fn unit_hash(seed: u64, n: u64) -> f64 {
    let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// FNV-1a of `text`.
pub(crate) fn text_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
