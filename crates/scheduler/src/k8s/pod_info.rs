//! What the scheduler keeps of a pod.
//!
//! A decoded `Pod` is about 6 KB even when its spec is small (k8s-openapi's structs hold
//! every optional field inline); 50,000 of them alone would break the scheduler's memory
//! budget. The caches keep a [`PodInfo`] instead: identity, the fields the queue and the
//! filters read, the raw assignment, and the demand, computed once per pod version rather
//! than once per round.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, Pod, PreferredSchedulingTerm, Toleration};
use k8s_openapi::jiff::Timestamp;

use crate::k8s::demand::{
    ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, POD_GROUP_LABEL, PodDemand, pod_demand,
};

/// Identity of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    pub fn of(pod: &Pod) -> PodKey {
        PodKey {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }

    /// The pod as a message read in `namespace` may name it: `namespace/name` there, and
    /// no name at all for a reader of another namespace (who may not list this pod's).
    /// Every text that reaches the API or the map about a pod of another namespace goes
    /// through here (or counts pods), so no message leaks a name across namespaces.
    pub fn shown_to(&self, namespace: &str) -> String {
        if self.namespace == namespace {
            self.to_string()
        } else {
            "a pod of another namespace".to_string()
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pod fields the node filters read; absent when the pod has none of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulingTerms {
    pub node_selector: Option<BTreeMap<String, String>>,
    /// `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub required_node_affinity: Option<NodeSelector>,
    pub tolerations: Option<Vec<Toleration>>,
    /// `affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution` (scored).
    pub preferred_node_affinity: Option<Vec<PreferredSchedulingTerm>>,
}

impl SchedulingTerms {
    /// The terms of `pod`, or `None` when it sets none.
    pub fn of(pod: &Pod) -> Option<SchedulingTerms> {
        let spec = pod.spec.as_ref()?;
        let terms = SchedulingTerms {
            node_selector: spec.node_selector.clone().filter(|s| !s.is_empty()),
            required_node_affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|na| {
                    na.required_during_scheduling_ignored_during_execution
                        .clone()
                }),
            tolerations: spec.tolerations.clone().filter(|t| !t.is_empty()),
            preferred_node_affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|na| {
                    na.preferred_during_scheduling_ignored_during_execution
                        .clone()
                })
                .filter(|p| !p.is_empty()),
        };
        (terms != SchedulingTerms::default()).then_some(terms)
    }

    /// Pods with equal keys get equal node verdicts, so a round computes the verdicts once
    /// per distinct key.
    pub fn key(&self) -> String {
        serde_json::json!([
            self.node_selector,
            self.required_node_affinity,
            self.tolerations
        ])
        .to_string()
    }
}

/// A digest of what scheduling reads of `pod`: its labels, annotations and spec, not its
/// status nor its resourceVersion. The scheduler's own writes to a pending pod (its
/// PodScheduled condition, its nominated node) are status writes and leave it as it was; a
/// change by anyone else to what the pod asks or allows changes it. Deterministic within
/// one process (`DefaultHasher::new` has fixed keys).
pub fn scheduling_inputs(pod: &Pod) -> u64 {
    use std::hash::Hasher;
    struct Hashing(std::hash::DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Hashing(std::hash::DefaultHasher::new());
    let meta = &pod.metadata;
    // Serialising maps and structs into a hasher cannot fail; a failure would only make
    // two reads differ, and a Binding then wait for the pod's next round.
    let _ = serde_json::to_writer(&mut out, &(&meta.labels, &meta.annotations, &pod.spec));
    out.0.finish()
}

/// A pod's grace period where its spec sets none (the API server's default).
pub const DEFAULT_GRACE_S: i64 = 30;

/// A pod as the scheduler's caches hold it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub key: PodKey,
    pub resource_version: String,
    /// [`scheduling_inputs`] of this version: a Binding refused for a newer resourceVersion
    /// is sent again when the newer version's inputs are these.
    pub inputs: u64,
    pub scheduler_name: Option<String>,
    /// The node it is bound to, if any.
    pub node_name: Option<String>,
    pub phase: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.deletionTimestamp`: for a pod, when its grace period ends (the kubelet
    /// kills it then).
    pub deleted_by: Option<Timestamp>,
    /// `spec.terminationGracePeriodSeconds` (30 where unset): how long it takes at most to
    /// stop once deleted.
    pub grace_s: i64,
    /// `spec.schedulingGates` is not empty: not to be scheduled until they are removed.
    pub gated: bool,
    pub priority: i32,
    /// `spec.preemptionPolicy: Never`: the pod waits instead of evicting others.
    pub never_preempts: bool,
    /// `status.nominatedNodeName`: a node where it preempted and waits for room.
    pub nominated: Option<String>,
    pub created: Option<Timestamp>,
    /// The `gpuplace.io/pod-group` label.
    pub group: Option<String>,
    /// The `gpuplace.io/topology-key` annotation (the gang's topology key when its
    /// PodGroup names none).
    pub topology_key: Option<String>,
    /// The raw `gpuplace.io/assignment` annotation.
    pub assignment: Option<String>,
    /// The raw `gpuplace.io/allocated` annotation (the node's truth).
    pub allocated: Option<String>,
    /// What it asks for, or why its requests are malformed.
    pub demand: Result<PodDemand, String>,
    /// Shared by the pods whose terms are equal (the pod store interns them: the API
    /// server's default tolerations alone give every pod terms).
    pub terms: Option<Arc<SchedulingTerms>>,
    /// [`SchedulingTerms::key`], empty for a pod without terms.
    pub filter_key: Arc<str>,
    /// The pod's labels (other pods' affinity and spread constraints select on them).
    pub labels: BTreeMap<String, String>,
    /// Host ports, pod (anti-)affinity and spread constraints, if any.
    pub placement: Option<Box<crate::k8s::pod_terms::PodTerms>>,
    /// The PersistentVolumeClaims it mounts (see the volume stage).
    pub claims: Vec<crate::k8s::claims::ClaimRef>,
    /// Its controller, when one that makes pods again owns it (ReplicaSet, StatefulSet,
    /// Job): what defragmentation may move.
    pub controller: Option<Box<Controller>>,
    /// How long it declares it runs, in ms, from its start (else creation): the annotation
    /// `gpuplace.io/expected-duration`; an annotation that is not a duration is why not
    /// (shown as a warning, the pod otherwise unaffected). See [`crate::k8s::job::Jobs::declared_run`].
    pub declared_ms: Result<Option<u64>, String>,
    /// Its own `activeDeadlineSeconds`, in ms.
    pub deadline_ms: Option<u64>,
    /// `gpuplace.io/movable: "true"` as a label or an annotation.
    pub movable: bool,
    /// `status.startTime`: when the kubelet took it.
    pub started: Option<Timestamp>,
    /// Its DRA claims (`spec.resourceClaims`), when it has any; the pod store resolves
    /// them against the claims it knows ([`crate::k8s::dra`]).
    pub dra: Option<Arc<PodDra>>,
    /// The GPUs (index, milli) a bound pod holds through its claims, counted on it.
    pub claim_gpus: Option<Arc<[(u32, u32)]>>,
}

/// A claim pod's claims, its own demand before them, and what a pending one still needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PodDra {
    pub refs: Vec<crate::k8s::dra::pod::PodClaimRef>,
    /// The pod's demand without its claims (CPU, memory, other resources).
    pub base: Result<PodDemand, String>,
    /// The pod's node terms without the node its allocated claims bind it to.
    pub base_terms: Option<Arc<SchedulingTerms>>,
    /// For a pending pod: the claims to allocate and join, met the first way their
    /// `firstAvailable` subrequests allow.
    pub plan: Option<Arc<crate::k8s::dra::pod::ClaimPlan>>,
    /// The other ways, in order of preference (`dra::store::alternatives`).
    pub alternatives: Vec<Arc<crate::k8s::dra::pod::ClaimPlan>>,
}

/// A pod's controlling owner that re-creates its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Controller {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// Kinds whose controller makes a deleted pod again.
const RECREATING_KINDS: [&str; 3] = ["ReplicaSet", "StatefulSet", "Job"];

fn controller_of(pod: &Pod) -> Option<Box<Controller>> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    RECREATING_KINDS.contains(&owner.kind.as_str()).then(|| {
        Box::new(Controller {
            kind: owner.kind.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        })
    })
}

fn movable_of(pod: &Pod) -> bool {
    let key = gpuplace_model::keys::MOVABLE_KEY;
    let meta = &pod.metadata;
    let yes = |m: Option<&BTreeMap<String, String>>| {
        m.and_then(|m| m.get(key))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    };
    yes(meta.labels.as_ref()) || yes(meta.annotations.as_ref())
}

impl PodInfo {
    /// Keeps what scheduling needs of `pod`; `gpu_resource` is e.g. `nvidia.com/gpu`.
    pub fn from_pod(pod: &Pod, gpu_resource: &str) -> PodInfo {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let terms = SchedulingTerms::of(pod);
        PodInfo {
            key: PodKey::of(pod),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            inputs: scheduling_inputs(pod),
            scheduler_name: spec.and_then(|s| s.scheduler_name.clone()),
            node_name: spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            deleting: meta.deletion_timestamp.is_some(),
            deleted_by: meta.deletion_timestamp.as_ref().map(|t| t.0),
            grace_s: spec
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(DEFAULT_GRACE_S)
                .max(0),
            gated: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| !g.is_empty()),
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            never_preempts: spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never"),
            nominated: pod
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.clone())
                .filter(|n| !n.is_empty()),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            group: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(POD_GROUP_LABEL))
                .cloned()
                .or_else(|| crate::k8s::workload::group_of(pod)),
            topology_key: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(gpuplace_model::keys::TOPOLOGY_KEY_ANNOTATION))
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty()),
            assignment: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
                .cloned(),
            allocated: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ALLOCATED_ANNOTATION))
                .cloned(),
            demand: pod_demand(pod, gpu_resource).map_err(|e| e.to_string()),
            filter_key: terms
                .as_ref()
                .map_or_else(|| Arc::from(""), |t| Arc::from(t.key())),
            labels: meta.labels.clone().unwrap_or_default(),
            placement: crate::k8s::pod_terms::PodTerms::of(pod).map(Box::new),
            claims: crate::k8s::claims::claims_of(pod),
            terms: terms.map(Arc::new),
            controller: controller_of(pod),
            declared_ms: declared_run(pod),
            deadline_ms: deadline_of(pod),
            movable: movable_of(pod),
            started: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0),
            dra: None,
            claim_gpus: None,
        }
        .with_claims(pod)
    }

    /// A pod with claims keeps them and its own demand; the GPUs come from the claims.
    fn with_claims(mut self, pod: &Pod) -> PodInfo {
        let mut refs = crate::k8s::dra::pod::refs_of(pod);
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        // A bound pod whose GPU resource was served through DRA holds the claim the
        // scheduler made for it (a pending one is placed afresh).
        let extended = self
            .node_name
            .as_ref()
            .and_then(|_| pod.status.as_ref()?.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone());
        if !has_claims && extended.is_none() {
            return self;
        }
        let base = match &self.demand {
            Ok(d) if has_claims && d.request.gpu_count > 0 => Err(
                "the pod asks GPUs through both the device plugin's resources and DRA claims; a pod asks one way"
                    .to_string(),
            ),
            other => other.clone(),
        };
        refs.extend(extended.map(|claim| crate::k8s::dra::pod::PodClaimRef {
            name: crate::k8s::dra::EXTENDED_REF.to_string(),
            claim: Some(claim),
        }));
        self.dra = Some(Arc::new(PodDra {
            refs,
            base,
            base_terms: self.terms.clone(),
            plan: None,
            alternatives: Vec::new(),
        }));
        self
    }

    /// Holds resources on a node: bound and not finished. A pod being deleted still holds
    /// them until it is gone: the kubelet keeps its devices while it terminates, and a new
    /// pod planned onto them would get other devices or be refused at admission.
    pub fn is_active_bound(&self) -> bool {
        self.node_name.is_some() && !self.is_finished()
    }

    /// Its containers are done (phase Succeeded or Failed).
    pub fn is_finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// Waits for `scheduler_name`: not bound, not being deleted, not gated, still Pending.
    pub fn is_pending_for(&self, scheduler_name: &str) -> bool {
        // The cheap test first: a round asks this of every pod, most of them bound.
        self.node_name.is_none()
            && self.scheduler_name.as_deref() == Some(scheduler_name)
            && !self.deleting
            && !self.gated
            && self.phase.as_deref().is_none_or(|p| p == "Pending")
    }
}

/// The annotation a running pod declares its expected run time with (a duration: `2h`,
/// `45m`), from its start: what a waiting pod's expected start is reckoned from.
pub const EXPECTED_DURATION_ANNOTATION: &str = "gpuplace.io/expected-duration";

/// How long `pod` declares it runs (see [`PodInfo::declared_ms`]).
fn declared_run(pod: &Pod) -> Result<Option<u64>, String> {
    let declared = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPECTED_DURATION_ANNOTATION));
    declared
        .map(|text| {
            gpuplace_core::fairshare::parse_half_life(text)
                .map_err(|e| format!("{EXPECTED_DURATION_ANNOTATION}: {e}"))
        })
        .transpose()
}

/// `pod`'s own `activeDeadlineSeconds`, in ms.
fn deadline_of(pod: &Pod) -> Option<u64> {
    pod.spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .filter(|s| *s > 0)
        .map(|s| s as u64 * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn keeps_identity_queue_fields_and_demand() {
        let p = pod(json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                "labels": {"gpuplace.io/pod-group": "g"},
                "annotations": {"gpuplace.io/assignment": "{}", "other": "x"},
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": "gpuplace", "priority": 5, "nodeName": "",
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": "Pending"}
        }));
        let info = PodInfo::from_pod(&p, "nvidia.com/gpu");
        assert_eq!(info.key.to_string(), "ml/a");
        assert_eq!(info.resource_version, "7");
        assert_eq!(info.group.as_deref(), Some("g"));
        assert_eq!(info.assignment.as_deref(), Some("{}"));
        assert_eq!(info.priority, 5);
        assert!(info.node_name.is_none(), "an empty nodeName is unbound");
        assert!(info.is_pending_for("gpuplace"));
        assert!(!info.is_pending_for("default-scheduler"));
        assert_eq!(info.demand.as_ref().unwrap().request.gpu_count, 2);
        assert!(info.terms.is_none());
        assert_eq!(&*info.filter_key, "");
    }

    #[test]
    fn malformed_requests_are_kept_as_an_error() {
        let p = pod(json!({
            "metadata": {"name": "b"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}
        }));
        let info = PodInfo::from_pod(&p, "nvidia.com/gpu");
        assert!(info.demand.unwrap_err().contains("lots"));
    }

    #[test]
    fn terms_and_their_key() {
        let p = pod(json!({
            "metadata": {"name": "c"},
            "spec": {"containers": [], "nodeSelector": {"zone": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}]}
        }));
        let info = PodInfo::from_pod(&p, "nvidia.com/gpu");
        let terms = info.terms.as_deref().unwrap();
        assert_eq!(terms.node_selector.as_ref().unwrap()["zone"], "a");
        assert!(info.filter_key.contains("zone"));
        let bound = pod(json!({"metadata": {"name": "d"},
            "spec": {"containers": [], "nodeName": "n1"}, "status": {"phase": "Succeeded"}}));
        let info = PodInfo::from_pod(&bound, "nvidia.com/gpu");
        assert!(!info.is_active_bound());
        let terminating = pod(json!({"metadata": {"name": "e",
                "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [], "nodeName": "n1"}, "status": {"phase": "Running"}}));
        assert!(
            PodInfo::from_pod(&terminating, "nvidia.com/gpu").is_active_bound(),
            "a terminating pod holds its resources until it is gone"
        );
    }
}
