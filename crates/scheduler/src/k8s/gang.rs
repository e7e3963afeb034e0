//! Gangs: the `podgroups.gpuplace.io` CRD. No member binds until `minMember` members fit
//! at once; a group that cannot fit holds nothing.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A gang of pods (label `gpuplace.io/pod-group: <name>`) placed all together or not at all.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpuplace.io",
    version = "v1alpha1",
    kind = "PodGroup",
    namespaced,
    status = "PodGroupStatus",
    shortname = "pg",
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.minMember"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Scheduled","type":"integer","jsonPath":".status.scheduled"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Members that must fit at once before any binds (1 to 100000).
    // The schema states the range so that the API server refuses what the scheduler could
    // not read (`format: uint32` alone is not enforced); its watch skips such an object.
    #[schemars(range(min = 1, max = 100000))]
    pub min_member: u32,
    /// After this long without fitting, members get a FailedScheduling event and back off.
    #[serde(default)]
    pub schedule_timeout_seconds: Option<u64>,
    /// A node label (e.g. a rack or NVSwitch-domain label): every member lands on nodes
    /// sharing one value of it, or none binds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
}

/// Where a gang stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// `Pending`, `Scheduled` or `Unschedulable`.
    pub phase: String,
    /// Members bound so far.
    pub scheduled: u32,
    /// `Unschedulable` (status `True`) while the gang cannot fit, with why; none once
    /// it is scheduled (written empty then, so a merge patch clears it).
    #[serde(default)]
    pub conditions: Vec<PodGroupCondition>,
}

/// A condition of a PodGroup, as Kubernetes conditions are written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupCondition {
    /// `Unschedulable`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// `NotEnoughResources`, `MembersMissing`, `Invalid` or `Timeout`.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// When the condition last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

impl PodGroupStatus {
    /// Why the gang waits, when its `Unschedulable` condition says so.
    pub fn unschedulable_message(&self) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| c.type_ == "Unschedulable" && c.status == "True")
            .map(|c| c.message.as_str())
    }
}

/// The CRD manifest as YAML-compatible JSON (`gpuplace crd` prints it).
pub fn crd_json() -> serde_json::Value {
    use kube::CustomResourceExt;
    serde_json::to_value(PodGroup::crd()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_names_the_group_and_fields() {
        let crd = crd_json();
        assert_eq!(crd["metadata"]["name"], "podgroups.gpuplace.io");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let min_member = &schema["properties"]["spec"]["properties"]["minMember"];
        assert_eq!(min_member["minimum"].as_f64(), Some(1.0), "{min_member}");
        assert_eq!(
            min_member["maximum"].as_f64(),
            Some(100000.0),
            "the server refuses what we cannot read"
        );
        assert!(schema["properties"]["status"]["properties"]["scheduled"].is_object());
    }
}
