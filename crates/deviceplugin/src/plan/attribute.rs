//! Allocates the plugin could not attribute when they came, attributed once the kubelet's
//! later containers tell whose they were.
//!
//! When several pods could be the one being admitted, the plugin answers without a plan and
//! cannot tell whose the devices are. The kubelet admits a pod's containers in order, so
//! the candidate whose container still has no devices while a later container of the same
//! pod now has some is the one that was admitted. For app containers and sidecars `List`
//! shows their devices anyway; a regular init container is never listed, so without this
//! its devices would be missing from the pod's record for good. Pure code: no I/O, no
//! clock.

use std::collections::{HashMap, VecDeque};

use crate::plan::identify::{Candidate, ListedPod, PodLookup, Served, has_devices};

/// How many unattributed Allocates are kept (the oldest go first).
const KEPT: usize = 64;

/// One Allocate whose container was not known: its device IDs and who it could be.
#[derive(Clone, Debug)]
struct Entry {
    ids: Vec<String>,
    candidates: Vec<Candidate>,
}

/// Devices found to be a container's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribution {
    pub uid: String,
    pub container: String,
    pub ids: Vec<String>,
}

/// The Allocates still waiting to be attributed, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Unattributed {
    entries: VecDeque<Entry>,
}

/// Where a candidate stands now.
enum Standing {
    /// Its pod is gone or finished, or its container has devices: never the one.
    Closed,
    /// Its container has no devices, and none after it has: not admitted yet.
    Open,
    /// Its container has no devices but a later one has: admitted, so this was it.
    Admitted,
}

fn standing(
    candidate: &Candidate,
    pods: &impl PodLookup,
    listed: &[ListedPod],
    served: &Served,
) -> Standing {
    let wanted = &candidate.pod;
    let Some(pod) = pods
        .lookup(&wanted.namespace, &wanted.name)
        .filter(|p| p.uid == wanted.uid && !p.finished)
    else {
        return Standing::Closed;
    };
    let nobody = ListedPod::default();
    let shown = listed
        .iter()
        .find(|l| l.namespace == pod.namespace && l.name == pod.name)
        .unwrap_or(&nobody);
    let Some(at) = pod
        .containers
        .iter()
        .position(|c| c.name == candidate.container)
    else {
        return Standing::Closed;
    };
    if has_devices(&pod, &candidate.container, shown, served) {
        return Standing::Closed;
    }
    let later = pod.containers[at + 1..]
        .iter()
        .any(|c| has_devices(&pod, &c.name, shown, served));
    if later {
        Standing::Admitted
    } else {
        Standing::Open
    }
}

impl Unattributed {
    /// Remembers an Allocate of `ids` that could be any of `candidates` (none: nothing to
    /// wait for, so it is not kept).
    pub fn push(&mut self, ids: Vec<String>, candidates: Vec<Candidate>) {
        if candidates.is_empty() {
            return;
        }
        if self.entries.len() == KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back(Entry { ids, candidates });
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The Allocates whose container is now known: exactly one candidate admitted past
    /// it (a later container of its pod has devices), named by no other kept Allocate.
    /// Sound because that pod's containers were all admitted after this Allocate: had it
    /// been another candidate's, this one's container would have had an Allocate of its
    /// own, attributed (so it has devices) or kept (so it is named twice). Candidates not
    /// admitted yet do not block it. Entries whose candidates are all closed are dropped;
    /// the rest wait.
    pub fn attribute(
        &mut self,
        pods: &impl PodLookup,
        listed: &[ListedPod],
        served: &Served,
    ) -> Vec<Attribution> {
        let mut live = Vec::with_capacity(self.entries.len());
        let mut admitted_in: HashMap<(&str, &str), usize> = HashMap::new();
        for entry in &self.entries {
            let mut admitted = Vec::new();
            let mut open = false;
            for c in &entry.candidates {
                match standing(c, pods, listed, served) {
                    Standing::Closed => {}
                    Standing::Open => open = true,
                    Standing::Admitted => {
                        *admitted_in
                            .entry((c.pod.uid.as_str(), c.container.as_str()))
                            .or_default() += 1;
                        admitted.push(c);
                    }
                }
            }
            live.push((admitted, open));
        }
        let mut found = Vec::new();
        let mut keep = Vec::with_capacity(live.len());
        for (entry, (admitted, open)) in self.entries.iter().zip(&live) {
            let unique = match admitted.as_slice() {
                [one] if admitted_in[&(one.pod.uid.as_str(), one.container.as_str())] == 1 => {
                    Some(*one)
                }
                _ => None,
            };
            if let Some(one) = unique {
                found.push(Attribution {
                    uid: one.pod.uid.clone(),
                    container: one.container.clone(),
                    ids: entry.ids.clone(),
                });
            }
            keep.push(unique.is_none() && (*open || !admitted.is_empty()));
        }
        let mut keep = keep.into_iter();
        self.entries.retain(|_| keep.next().unwrap_or(false));
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // Planned devices do not matter here: attribution goes by the kubelet's order alone.
    use crate::plan::identify::tests::{listed, pod};
    use crate::plan::store::{NodePod, PodName};
    use gpuplace_model::ContainerKind;
    use std::sync::Arc;

    fn candidate(pod: &Arc<NodePod>, container: &str) -> Candidate {
        Candidate {
            pod: pod.clone(),
            container: container.into(),
        }
    }

    use ContainerKind::{App, Init};

    #[test]
    fn an_init_container_is_attributed_once_its_pods_app_containers_have_devices() {
        let split = pod(
            "split",
            &[
                ("init", Init, &["g3", "g0"]),
                ("a", App, &["g3"]),
                ("b", App, &["g0"]),
            ],
        );
        let other = pod("other", &[("main", App, &["g1", "g2"])]);
        let pods: HashMap<PodName, Arc<NodePod>> = [split.clone(), other.clone()]
            .into_iter()
            .map(|p| (p.key(), p))
            .collect();
        let mut kept = Unattributed::default();
        kept.push(
            vec!["g3".into(), "g0".into()],
            vec![candidate(&split, "init"), candidate(&other, "main")],
        );
        let served = Served::default();
        // Nothing admitted past either candidate yet: it waits.
        let list = [
            listed("split", &[("a", &[]), ("b", &[])]),
            listed("other", &[("main", &[])]),
        ];
        assert!(kept.attribute(&pods, &list, &served).is_empty());
        assert_eq!(kept.len(), 1);
        // The kubelet went on with split's app containers: the init container was split's.
        let list = [
            listed("split", &[("a", &["g3"]), ("b", &[])]),
            listed("other", &[("main", &[])]),
        ];
        assert_eq!(
            kept.attribute(&pods, &list, &served),
            [Attribution {
                uid: "uid-split".into(),
                container: "init".into(),
                ids: vec!["g3".into(), "g0".into()],
            }]
        );
        assert!(kept.is_empty());
    }

    #[test]
    fn two_admitted_candidates_or_one_named_twice_are_no_answer() {
        let one = pod("one", &[("init", Init, &["g0"]), ("a", App, &["g0"])]);
        let two = pod("two", &[("init", Init, &["g0"]), ("a", App, &["g0"])]);
        let three = pod("three", &[("init", Init, &["g0"]), ("a", App, &["g0"])]);
        let pods: HashMap<PodName, Arc<NodePod>> = [one.clone(), two.clone(), three.clone()]
            .into_iter()
            .map(|p| (p.key(), p))
            .collect();
        let mut kept = Unattributed::default();
        kept.push(
            vec!["g0".into()],
            vec![candidate(&one, "init"), candidate(&two, "init")],
        );
        kept.push(
            vec!["g5".into()],
            vec![candidate(&one, "init"), candidate(&three, "init")],
        );
        // `one` admitted and named by both kept Allocates: one of them was its own init
        // container's, the other someone else's; no telling which.
        let list = [
            listed("one", &[("a", &["g1"])]),
            listed("two", &[("a", &[])]),
            listed("three", &[("a", &[])]),
        ];
        assert!(kept.attribute(&pods, &list, &Served::default()).is_empty());
        assert_eq!(kept.len(), 2);
        // Both admitted: no telling which; kept, never guessed.
        let list = [
            listed("one", &[("a", &["g1"])]),
            listed("two", &[("a", &["g2"])]),
        ];
        assert!(kept.attribute(&pods, &list, &Served::default()).is_empty());
        // Every candidate gone: dropped.
        let empty: HashMap<PodName, Arc<NodePod>> = HashMap::new();
        assert!(kept.attribute(&empty, &[], &Served::default()).is_empty());
        assert!(kept.is_empty());
    }
}
