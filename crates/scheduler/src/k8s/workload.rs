//! The Workload API's gangs (`scheduling.k8s.io/v1alpha2` PodGroup, Kubernetes 1.36 with
//! the `GenericWorkload` gate) read as gpuplace's own gangs: a pod names its group in
//! `spec.schedulingGroup.podGroupName`; the group's `schedulingPolicy.gang.minCount` is the
//! members that must fit at once (a `basic` policy: each pod alone), its first topology
//! constraint key the gang's topology key. Both kinds coexist; where a namespace has both
//! under one name, gpuplace's CRD is the one read. What gpuplace says of a gang goes back
//! as the API defines it: the `PodGroupScheduled` condition.

use k8s_openapi::api::scheduling::v1alpha2::PodGroup as UpstreamGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::k8s::gang::{PodGroup, PodGroupSpec, PodGroupStatus};

/// Marks a gang read from the Workload API (its value: the API version).
pub const UPSTREAM_ANNOTATION: &str = "gpuplace.io/workload-api";
/// The condition the Workload API defines for a group's scheduling.
pub const SCHEDULED_CONDITION: &str = "PodGroupScheduled";

/// The group of `pod` in the Workload API, if it names one.
pub fn group_of(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .clone()
        .filter(|n| !n.is_empty())
}

/// `group` as gpuplace's gang: minCount members at once (1 for a basic policy), its first
/// topology key, marked as the Workload API's.
pub fn gang_of(group: &UpstreamGroup) -> PodGroup {
    let spec = &group.spec;
    let min = spec
        .scheduling_policy
        .gang
        .as_ref()
        .map_or(1, |g| g.min_count.clamp(1, 100_000) as u32);
    let topology_key = spec
        .scheduling_constraints
        .as_ref()
        .and_then(|c| c.topology.as_ref())
        .and_then(|t| t.first())
        .map(|t| t.key.clone())
        .filter(|k| !k.is_empty());
    let mut meta = group.metadata.clone();
    meta.managed_fields = None;
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(
            UPSTREAM_ANNOTATION.into(),
            "scheduling.k8s.io/v1alpha2".into(),
        );
    PodGroup {
        metadata: meta,
        spec: PodGroupSpec {
            min_member: min,
            schedule_timeout_seconds: None,
            topology_key,
        },
        status: None,
    }
}

/// Whether `group` was read from the Workload API.
pub fn is_upstream(group: &PodGroup) -> bool {
    group
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(UPSTREAM_ANNOTATION))
}

/// gpuplace's status of a gang as the Workload API's status patch: `PodGroupScheduled`
/// true once scheduled, else false with the reason (`Unschedulable`) and why.
/// `previous` is the condition as the group has it, whose transition time is kept while
/// its status does not change.
pub fn status_patch(status: &PodGroupStatus, previous: Option<&Condition>) -> serde_json::Value {
    let scheduled = status.phase == "Scheduled";
    let (state, reason, message) = if scheduled {
        (
            "True",
            "Scheduled".to_string(),
            format!("{} members bound", status.scheduled),
        )
    } else {
        (
            "False",
            "Unschedulable".to_string(),
            status
                .unschedulable_message()
                .unwrap_or("waiting for enough members to fit at once")
                .to_string(),
        )
    };
    let since = previous
        .filter(|c| c.status == state)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    let condition = Condition {
        type_: SCHEDULED_CONDITION.into(),
        status: state.into(),
        reason,
        message: message.chars().take(32_768).collect(),
        last_transition_time: since,
        observed_generation: None,
    };
    serde_json::json!({"status": {"conditions": [condition]}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn upstream(spec: serde_json::Value) -> UpstreamGroup {
        serde_json::from_value(json!({
            "metadata": {"name": "g", "namespace": "ml"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn a_gang_policy_is_a_gang_and_basic_is_one_pod() {
        let gang = gang_of(&upstream(
            json!({"schedulingPolicy": {"gang": {"minCount": 3}},
            "schedulingConstraints": {"topology": [{"key": "rack"}]}}),
        ));
        assert_eq!(gang.spec.min_member, 3);
        assert_eq!(gang.spec.topology_key.as_deref(), Some("rack"));
        assert!(is_upstream(&gang));
        let basic = gang_of(&upstream(json!({"schedulingPolicy": {"basic": {}}})));
        assert_eq!(basic.spec.min_member, 1);
        let odd = gang_of(&upstream(
            json!({"schedulingPolicy": {"gang": {"minCount": -4}}}),
        ));
        assert_eq!(
            odd.spec.min_member, 1,
            "a count the server let through is clamped"
        );
    }

    #[test]
    fn the_status_is_the_apis_condition() {
        let waiting = PodGroupStatus {
            phase: "Unschedulable".into(),
            scheduled: 0,
            conditions: vec![crate::k8s::gang::PodGroupCondition {
                type_: "Unschedulable".into(),
                status: "True".into(),
                reason: "NotEnoughResources".into(),
                message: "2 of 3 members fit".into(),
                last_transition_time: None,
            }],
        };
        let patch = status_patch(&waiting, None);
        let c = &patch["status"]["conditions"][0];
        assert_eq!(c["type"], "PodGroupScheduled");
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "Unschedulable");
        assert_eq!(c["message"], "2 of 3 members fit");
        let done = PodGroupStatus {
            phase: "Scheduled".into(),
            scheduled: 3,
            conditions: Vec::new(),
        };
        assert_eq!(
            status_patch(&done, None)["status"]["conditions"][0]["status"],
            "True"
        );
    }
}
