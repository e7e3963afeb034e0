//! What a pod says about other pods, kept with the pod: host ports, required and preferred
//! pod (anti-)affinity terms, topology spread constraints (see `interpod` for the filters
//! and `preference` for the scores that read them).

use k8s_openapi::api::core::v1::{
    Pod, PodAffinityTerm, TopologySpreadConstraint, WeightedPodAffinityTerm,
};

/// A host port a container binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    pub protocol: String,
    pub ip: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || any(&self.ip) || any(&other.ip))
    }
}

/// A pod's terms about other pods; absent when it has none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodTerms {
    pub host_ports: Vec<HostPort>,
    pub affinity: Vec<PodAffinityTerm>,
    pub anti_affinity: Vec<PodAffinityTerm>,
    /// Only `DoNotSchedule` constraints (`ScheduleAnyway` ones are preferences).
    pub spread: Vec<TopologySpreadConstraint>,
    /// Preferred pod affinity and anti-affinity terms (scored, see `preference`).
    pub preferred_affinity: Vec<WeightedPodAffinityTerm>,
    pub preferred_anti_affinity: Vec<WeightedPodAffinityTerm>,
    /// `ScheduleAnyway` spread constraints (scored).
    pub soft_spread: Vec<TopologySpreadConstraint>,
}

impl PodTerms {
    /// Whether the pod has terms that score nodes for other pods (preferred pod affinity
    /// or anti-affinity: kube-scheduler scores existing pods' terms symmetrically).
    pub fn scores_others(&self) -> bool {
        !self.preferred_affinity.is_empty() || !self.preferred_anti_affinity.is_empty()
    }

    /// Whether the pod has terms that filter nodes (ports, required terms, hard spread).
    pub fn has_requirements(&self) -> bool {
        !self.host_ports.is_empty()
            || !self.affinity.is_empty()
            || !self.anti_affinity.is_empty()
            || !self.spread.is_empty()
    }

    /// Whether the pod has preferences of its own about other pods.
    pub fn has_preferences(&self) -> bool {
        self.scores_others() || !self.soft_spread.is_empty()
    }
}

impl PodTerms {
    pub fn of(pod: &Pod) -> Option<PodTerms> {
        let spec = pod.spec.as_ref()?;
        let host_ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                p.host_port.filter(|hp| *hp > 0).map(|port| HostPort {
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ip: p.host_ip.clone().unwrap_or_default(),
                    port,
                })
            })
            .collect();
        let affinity = spec.affinity.as_ref();
        let required = |terms: Option<&Vec<PodAffinityTerm>>| terms.cloned().unwrap_or_default();
        let preferred =
            |terms: Option<&Vec<WeightedPodAffinityTerm>>| terms.cloned().unwrap_or_default();
        let constraints = |when: &str| -> Vec<TopologySpreadConstraint> {
            spec.topology_spread_constraints
                .iter()
                .flatten()
                .filter(|c| c.when_unsatisfiable == when)
                .cloned()
                .collect()
        };
        let terms = PodTerms {
            host_ports,
            affinity: required(
                affinity
                    .and_then(|a| a.pod_affinity.as_ref())
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    }),
            ),
            anti_affinity: required(
                affinity
                    .and_then(|a| a.pod_anti_affinity.as_ref())
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    }),
            ),
            spread: constraints("DoNotSchedule"),
            preferred_affinity: preferred(affinity.and_then(|a| a.pod_affinity.as_ref()).and_then(
                |a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                },
            )),
            preferred_anti_affinity: preferred(
                affinity
                    .and_then(|a| a.pod_anti_affinity.as_ref())
                    .and_then(|a| {
                        a.preferred_during_scheduling_ignored_during_execution
                            .as_ref()
                    }),
            ),
            soft_spread: constraints("ScheduleAnyway"),
        };
        (terms != PodTerms::default()).then_some(terms)
    }
}
