//! Which pod and container the kubelet is admitting, found by state, never by order, size
//! alone or time.
//!
//! The device plugin API names no pod. But the kubelet admits one pod at a time, container
//! by container, and its PodResources `List` shows the pod being admitted as active, with
//! devices for the containers already allocated (app containers and sidecars; regular init
//! containers never appear, so the plugin keeps its own record of what it served). So the
//! pod being admitted is the listed pod with a plan whose next planned container (in the
//! kubelet's order) has no devices yet. Several such pods (leftovers after a plugin
//! restart) are told apart by the request: the container's size, and whether the planned
//! devices are among those the kubelet offers. Pure code: no I/O, no clock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::plan::store::{NodePod, NodePods, PodName};

/// One pod as PodResources `List` shows it: our resource's device IDs per container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListedPod {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<(String, Vec<String>)>,
}

impl ListedPod {
    fn devices(&self, container: &str) -> Option<&[String]> {
        self.containers
            .iter()
            .find(|(n, d)| n == container && !d.is_empty())
            .map(|(_, d)| d.as_slice())
    }
}

/// What the plugin itself served: pod UID -> container -> device IDs (advertised IDs).
#[derive(Clone, Debug, Default)]
pub struct Served {
    pods: HashMap<String, HashMap<String, Vec<String>>>,
}

impl Served {
    pub fn record(&mut self, uid: &str, container: &str, ids: Vec<String>) {
        self.pods
            .entry(uid.to_string())
            .or_default()
            .insert(container.to_string(), ids);
    }

    pub fn get(&self, uid: &str, container: &str) -> Option<&Vec<String>> {
        self.pods.get(uid).and_then(|c| c.get(container))
    }

    /// Every pod's record: UID -> container -> device IDs.
    pub fn pods(&self) -> impl Iterator<Item = (&String, &HashMap<String, Vec<String>>)> {
        self.pods.iter()
    }

    pub fn pod(&self, uid: &str) -> Option<&HashMap<String, Vec<String>>> {
        self.pods.get(uid)
    }

    /// Forgets pods for which `keep` is false (deleted pods).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.pods.retain(|uid, _| keep(uid));
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// What the kubelet asks for one container.
#[derive(Clone, Debug)]
pub struct Ask<'a> {
    /// Physical GPU IDs of the offered devices (replicas folded).
    pub available: &'a HashSet<String>,
    /// Physical GPU IDs the kubelet already chose (reused from init containers).
    pub must_include: &'a HashSet<String>,
    /// Devices the container needs in all (slices for a share).
    pub size: usize,
    /// The kubelet asks for the share resource's slices, not whole devices.
    pub share: bool,
}

impl Ask<'_> {
    /// Whether `need` is what this ask is for: the same resource and size.
    pub fn matches(&self, need: &gpuplace_model::ContainerNeed) -> bool {
        need.is_share() == self.share && need.kubelet_size() == self.size
    }
}

/// The container being admitted and its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitting {
    pub pod: Arc<NodePod>,
    pub container: String,
    /// Planned physical GPU IDs of the container.
    pub planned: Vec<String>,
    /// Every planned device not already chosen is on offer.
    pub offered: bool,
}

/// A container that could be the one being admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub pod: Arc<NodePod>,
    pub container: String,
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}:{}",
            self.pod.namespace, self.pod.name, self.container
        )
    }
}

/// The answer to "whose container is this?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identified {
    /// Exactly one pod with a plan fits.
    Planned(Admitting),
    /// Several pods fit equally: the plugin falls back to a topology-aware choice (and
    /// attributes the devices once the kubelet's later containers tell which it was).
    Ambiguous(Vec<Candidate>),
    /// No pod with a plan is being admitted (a pod placed by another scheduler): the
    /// containers without a plan that fit, if any.
    Unplanned(Vec<Candidate>),
    /// `List` shows pods the node's pod watch has not delivered yet: wait for it.
    NotYetKnown(Vec<PodName>),
}

/// Whether `container` of `pod` has devices: the plugin served them or `List` shows them.
pub fn has_devices(pod: &NodePod, container: &str, listed: &ListedPod, served: &Served) -> bool {
    served.get(&pod.uid, container).is_some() || listed.devices(container).is_some()
}

/// The next container of `pod` that uses our resource and has no devices yet. The kubelet
/// admits a pod's containers in order, so a container with devices means every one before
/// it was admitted, whether or not the plugin knew whose it was (an init container whose
/// Allocate could not be attributed): the next one is the first after the last with
/// devices.
pub fn next_container<'a>(
    pod: &'a NodePod,
    listed: &ListedPod,
    served: &Served,
) -> Option<&'a gpuplace_model::ContainerNeed> {
    let start = pod
        .containers
        .iter()
        .rposition(|c| has_devices(pod, &c.name, listed, served))
        .map_or(0, |last| last + 1);
    pod.containers.get(start)
}

/// Looks a pod up by namespace and name (the node's pod store, a map in tests).
pub trait PodLookup {
    fn lookup(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>>;
}

impl PodLookup for NodePods {
    fn lookup(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>> {
        self.get_or_deleted(namespace, name)
    }
}

impl PodLookup for HashMap<PodName, Arc<NodePod>> {
    fn lookup(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>> {
        self.get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

/// The store's snapshot.
impl PodLookup for std::collections::BTreeMap<PodName, Arc<NodePod>> {
    fn lookup(&self, namespace: &str, name: &str) -> Option<Arc<NodePod>> {
        self.get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

/// Finds the pod and container the kubelet is admitting. `pods` is the node's pod store,
/// `listed` the kubelet's active pods, `served` the plugin's record.
pub fn identify(
    pods: &impl PodLookup,
    listed: &[ListedPod],
    served: &Served,
    ask: &Ask<'_>,
) -> Identified {
    let mut unknown = Vec::new();
    let mut candidates: Vec<Admitting> = Vec::new();
    let mut unplanned: Vec<Candidate> = Vec::new();
    for l in listed {
        let Some(pod) = pods.lookup(&l.namespace, &l.name) else {
            unknown.push((l.namespace.clone(), l.name.clone()));
            continue;
        };
        if pod.finished {
            continue;
        }
        let Some(next) = next_container(&pod, l, served) else {
            continue;
        };
        if !ask.matches(next) {
            continue;
        }
        let planned = pod.planned(&next.name);
        // A plan that does not cover the container cannot be answered verbatim.
        if pod.assignment().is_none() || planned.len() != next.count as usize {
            unplanned.push(Candidate {
                container: next.name.clone(),
                pod,
            });
            continue;
        }
        let offered = planned
            .iter()
            .all(|id| ask.must_include.contains(id) || ask.available.contains(id));
        let container = next.name.clone();
        candidates.push(Admitting {
            pod,
            container,
            planned,
            offered,
        });
    }
    let offered: Vec<&Admitting> = candidates.iter().filter(|c| c.offered).collect();
    match (offered.len(), candidates.len()) {
        (1, _) => Identified::Planned(offered[0].clone()),
        // One planned pod whose devices are partly busy (held by a terminating pod): still
        // that pod, unless a pod without a plan could be the one.
        (0, 1) if unplanned.is_empty() && unknown.is_empty() => {
            Identified::Planned(candidates[0].clone())
        }
        (0, 0) if !unknown.is_empty() => Identified::NotYetKnown(unknown),
        (0, 0) => Identified::Unplanned(unplanned),
        _ if !unknown.is_empty() => Identified::NotYetKnown(unknown),
        _ => Identified::Ambiguous(
            candidates
                .into_iter()
                .map(|c| Candidate {
                    pod: c.pod,
                    container: c.container,
                })
                .chain(unplanned)
                .collect(),
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpuplace_model::{
        Assignment, ContainerAssignment, ContainerKind, ContainerNeed, DeviceShare,
    };

    pub(crate) fn pod(name: &str, containers: &[(&str, ContainerKind, &[&str])]) -> Arc<NodePod> {
        Arc::new(NodePod {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            containers: containers
                .iter()
                .map(|(n, k, d)| ContainerNeed {
                    name: n.to_string(),
                    kind: *k,
                    count: d.len() as u32,
                    milli: 0,
                })
                .collect(),
            plan: Some(Ok(Assignment {
                node: "n".into(),
                policy: "fgd".into(),
                time: String::new(),
                containers: containers
                    .iter()
                    .map(|(n, _, d)| ContainerAssignment {
                        name: n.to_string(),
                        devices: d
                            .iter()
                            .map(|id| DeviceShare {
                                index: 0,
                                id: id.to_string(),
                                milli: 1000,
                            })
                            .collect(),
                    })
                    .collect(),
            })),
            allocated: None,
            finished: false,
        })
    }

    pub(crate) fn listed(name: &str, containers: &[(&str, &[&str])]) -> ListedPod {
        ListedPod {
            namespace: "ml".into(),
            name: name.into(),
            containers: containers
                .iter()
                .map(|(n, d)| (n.to_string(), d.iter().map(|s| s.to_string()).collect()))
                .collect(),
        }
    }

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn store(pods: &[Arc<NodePod>]) -> HashMap<PodName, Arc<NodePod>> {
        pods.iter().map(|p| (p.key(), p.clone())).collect()
    }

    use ContainerKind::{App, Init};

    #[test]
    fn the_pod_whose_next_container_has_no_devices_is_admitted() {
        let done = pod("done", &[("a", App, &["g0"])]);
        let new = pod("new", &[("a", App, &["g1", "g2"]), ("b", App, &["g3"])]);
        let pods = store(&[done, new]);
        let list = [
            listed("done", &[("a", &["g0"])]),
            listed("new", &[("a", &[]), ("b", &[])]),
        ];
        let available = set(&["g1", "g2", "g3", "g4"]);
        let none = set(&[]);
        let ask = Ask {
            available: &available,
            must_include: &none,
            size: 2,
            share: false,
        };
        match identify(&pods, &list, &Served::default(), &ask) {
            Identified::Planned(a) => {
                assert_eq!((a.pod.name.as_str(), a.container.as_str()), ("new", "a"));
                assert_eq!(a.planned, ["g1", "g2"]);
            }
            other => panic!("{other:?}"),
        }
        // After `a` got its devices, the next container is `b`.
        let list = [listed("new", &[("a", &["g1", "g2"]), ("b", &[])])];
        let ask = Ask { size: 1, ..ask };
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Planned(a) if a.container == "b"
        ));
    }

    #[test]
    fn init_containers_are_known_from_the_plugins_own_record() {
        let p = pod("p", &[("i", Init, &["g0"]), ("a", App, &["g0"])]);
        let pods = store(&[p]);
        // List never shows init containers.
        let list = [listed("p", &[("a", &[])])];
        let available = set(&["g1"]);
        let must = set(&["g0"]);
        let mut served = Served::default();
        let ask = Ask {
            available: &available,
            must_include: &must,
            size: 1,
            share: false,
        };
        // Without the record the init container looks next.
        assert!(matches!(
            identify(&pods, &list, &served, &ask),
            Identified::Planned(a) if a.container == "i"
        ));
        served.record("uid-p", "i", vec!["g0".into()]);
        assert!(matches!(
            identify(&pods, &list, &served, &ask),
            Identified::Planned(a) if a.container == "a" && a.offered
        ));
        // An app container with devices: the init container before it was admitted, even
        // when the plugin could not tell whose its Allocate was; the pod is no candidate.
        let list = [listed("p", &[("a", &["g0"])])];
        assert_eq!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Unplanned(Vec::new())
        );
    }

    #[test]
    fn candidates_are_told_apart_by_the_offered_devices() {
        // After a plugin restart an old pod's init container looks unserved; its planned
        // device is held by its app container, so it is not on offer.
        let old = pod("old", &[("i", Init, &["g0"]), ("a", App, &["g0"])]);
        let new = pod("new", &[("a", App, &["g1"])]);
        let pods = store(&[old, new]);
        let list = [
            listed("old", &[("a", &["g0"])]),
            listed("new", &[("a", &[])]),
        ];
        let available = set(&["g1", "g2"]);
        let none = set(&[]);
        let ask = Ask {
            available: &available,
            must_include: &none,
            size: 1,
            share: false,
        };
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Planned(a) if a.pod.name == "new"
        ));
        // Two equally plausible pods: ambiguous, never a guess.
        let twin = pod("twin", &[("a", App, &["g2"])]);
        let pods = store(&[pods[&("ml".into(), "new".into())].clone(), twin]);
        let list = [listed("new", &[("a", &[])]), listed("twin", &[("a", &[])])];
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Ambiguous(c) if c.len() == 2
        ));
    }

    #[test]
    fn busy_planned_devices_unknown_pods_and_unplanned_pods() {
        let p = pod("p", &[("a", App, &["g0", "g1"])]);
        let pods = store(&[p]);
        let available = set(&["g1", "g2", "g3"]);
        let none = set(&[]);
        let ask = Ask {
            available: &available,
            must_include: &none,
            size: 2,
            share: false,
        };
        // g0 is still held by a terminating pod: still this pod, flagged as not offered.
        let list = [listed("p", &[("a", &[])])];
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Planned(a) if !a.offered
        ));
        // A listed pod the watch has not delivered: wait for it.
        let list = [listed("p", &[("a", &[])]), listed("late", &[("a", &[])])];
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::NotYetKnown(k) if k == [("ml".to_string(), "late".to_string())]
        ));
        // A pod without a plan of the same size: the busy-device candidate is not trusted.
        let mut foreign = (*pod("foreign", &[("a", App, &["x", "y"])])).clone();
        foreign.plan = None;
        let pods = store(&[pods[&("ml".into(), "p".into())].clone(), Arc::new(foreign)]);
        let list = [listed("p", &[("a", &[])]), listed("foreign", &[("a", &[])])];
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Ambiguous(_)
        ));
        // Only the pod without a plan: unplanned.
        let list = [listed("foreign", &[("a", &[])])];
        assert!(matches!(
            identify(&pods, &list, &Served::default(), &ask),
            Identified::Unplanned(c) if c.len() == 1 && c[0].pod.name == "foreign"
        ));
    }
}
