//! The scheduler's exact choice as recorded on a pod, the node's truth written back, and the
//! kubelet's rules for handing devices to a pod's containers.
//!
//! The kubelet admits a pod container by container: init containers in spec order, then app
//! containers. Devices of a finished regular init container go into a pool that later
//! containers take from first; a restartable init container (sidecar) or an app container
//! takes from the pool too, and what it takes leaves the pool (it keeps running). Only the
//! rest comes fresh from the node. [`plan_containers`] splits a placement's devices the same
//! way, so the plan of every container is what the kubelet can give it; [`fresh_devices`]
//! counts how many distinct devices the pod holds on the node.

use serde::{Deserialize, Serialize};

use crate::request::DeviceShare;

/// Pod annotation with the devices the kubelet really gave each container (JSON
/// [`Allocated`]), written by the node when they differ from the assignment or when there is
/// none. The scheduler counts it instead of the assignment: node truth wins.
pub use crate::keys::ALLOCATED_ANNOTATION;
/// Pod annotation with the scheduler's exact choice (JSON [`Assignment`]).
pub use crate::keys::ASSIGNMENT_ANNOTATION;

/// How the kubelet runs a container, which decides what happens to its devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// A regular init container: runs to completion before the next one starts.
    Init,
    /// A restartable init container (`restartPolicy: Always`): runs beside the app.
    Sidecar,
    /// An app container.
    #[default]
    App,
}

/// Devices given to one container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAssignment {
    pub name: String,
    pub devices: Vec<DeviceShare>,
}

/// The scheduler's decision as recorded on the pod (annotation [`ASSIGNMENT_ANNOTATION`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub node: String,
    pub containers: Vec<ContainerAssignment>,
    pub policy: String,
    /// RFC 3339 time of the decision.
    pub time: String,
}

/// A malformed [`Assignment`] or [`Allocated`] annotation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("annotation {annotation}: {message}")]
pub struct AnnotationError {
    pub annotation: &'static str,
    pub message: String,
}

impl Assignment {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses the annotation; the error names what is wrong.
    pub fn from_json(text: &str) -> Result<Assignment, AnnotationError> {
        serde_json::from_str(text).map_err(|e| AnnotationError {
            annotation: ASSIGNMENT_ANNOTATION,
            message: e.to_string(),
        })
    }

    /// Every (device position, milli) the assignment holds, for accounting.
    pub fn devices(&self) -> impl Iterator<Item = &DeviceShare> {
        self.containers.iter().flat_map(|c| c.devices.iter())
    }

    /// The planned devices of container `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerAssignment> {
        self.containers.iter().find(|c| c.name == name)
    }
}

/// What the kubelet really gave a pod's containers on `node` (annotation
/// [`ALLOCATED_ANNOTATION`]), as the node's device plugin read it from the kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocated {
    pub node: String,
    pub containers: Vec<ContainerAssignment>,
}

impl Allocated {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<Allocated, AnnotationError> {
        serde_json::from_str(text).map_err(|e| AnnotationError {
            annotation: ALLOCATED_ANNOTATION,
            message: e.to_string(),
        })
    }

    /// Every distinct device the pod holds (a device reused by several containers once).
    pub fn devices(&self) -> Vec<&DeviceShare> {
        let mut out: Vec<&DeviceShare> = Vec::new();
        for d in self.containers.iter().flat_map(|c| c.devices.iter()) {
            if !out.iter().any(|o| o.id == d.id) {
                out.push(d);
            }
        }
        out
    }
}

/// A container that uses devices, in the kubelet's admission order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerNeed {
    pub name: String,
    pub kind: ContainerKind,
    /// Devices of the resource it asks for (1 for a share).
    pub count: u32,
    /// Milli-GPU of one GPU it asks for as a share (the resource [`SHARE_RESOURCE`]);
    /// 0 for whole devices.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub milli: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// The extended resource a share of one GPU is asked with, in milli-GPU
/// (`gpuplace.io/gpu-milli: 250`); the device plugin advertises 1000 slices per GPU.
pub use crate::keys::SHARE_RESOURCE;

impl ContainerNeed {
    /// Whether it asks for a share of one GPU rather than whole devices.
    pub fn is_share(&self) -> bool {
        self.milli > 0
    }

    /// How many devices the kubelet allocates it: slices for a share, else whole devices.
    pub fn kubelet_size(&self) -> usize {
        if self.is_share() {
            self.milli as usize
        } else {
            self.count as usize
        }
    }
}

/// How many distinct devices the kubelet gives a pod whose device-using containers are
/// `containers` (kubelet order): each container reuses what earlier regular init containers
/// left in the pool, and only the rest is fresh.
pub fn fresh_devices(containers: &[ContainerNeed]) -> u32 {
    let symbolic: Vec<DeviceShare> = (0..containers.iter().map(|c| c.count).sum::<u32>())
        .map(|i| DeviceShare {
            index: i,
            id: i.to_string(),
            milli: 0,
        })
        .collect();
    let plan = plan_containers(containers, &symbolic);
    let mut used: Vec<&str> = Vec::new();
    for c in &plan {
        for d in &c.devices {
            if !used.contains(&d.id.as_str()) {
                used.push(&d.id);
            }
        }
    }
    used.len() as u32
}

/// Splits a placement's `devices` (as many as [`fresh_devices`] counts) over `containers`
/// by the kubelet's rules: a container first reuses devices from the pool of earlier regular
/// init containers (in pool order), then takes the next fresh devices of the placement.
/// When the pool holds more than a container needs, the kubelet picks among them at random;
/// the plan names the first ones, and the node reports what it really got.
pub fn plan_containers(
    containers: &[ContainerNeed],
    devices: &[DeviceShare],
) -> Vec<ContainerAssignment> {
    let mut pool: Vec<DeviceShare> = Vec::new();
    let mut fresh = devices.iter();
    let mut out = Vec::with_capacity(containers.len());
    for c in containers {
        let need = c.count as usize;
        let mut mine: Vec<DeviceShare> = pool.iter().take(need).cloned().collect();
        while mine.len() < need {
            match fresh.next() {
                Some(d) => mine.push(d.clone()),
                None => break,
            }
        }
        match c.kind {
            ContainerKind::Init => {
                for d in &mine {
                    if !pool.iter().any(|p| p.id == d.id) {
                        pool.push(d.clone());
                    }
                }
            }
            ContainerKind::Sidecar | ContainerKind::App => {
                pool.retain(|p| !mine.iter().any(|m| m.id == p.id));
            }
        }
        if c.is_share() {
            for d in &mut mine {
                d.milli = c.milli;
            }
        }
        out.push(ContainerAssignment {
            name: c.name.clone(),
            devices: mine,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(name: &str, kind: ContainerKind, count: u32) -> ContainerNeed {
        ContainerNeed {
            name: name.into(),
            kind,
            count,
            milli: 0,
        }
    }

    fn shares(n: u32) -> Vec<DeviceShare> {
        (0..n)
            .map(|i| DeviceShare {
                index: i,
                id: format!("g{i}"),
                milli: 1000,
            })
            .collect()
    }

    fn ids(plan: &[ContainerAssignment]) -> Vec<Vec<String>> {
        plan.iter()
            .map(|c| c.devices.iter().map(|d| d.id.clone()).collect())
            .collect()
    }

    use ContainerKind::{App, Init, Sidecar};

    #[test]
    fn init_devices_are_reused_by_later_containers() {
        // init 2, app 1: the pod holds 2; the app reuses the first of the init's.
        let c = [need("i", Init, 2), need("a", App, 1)];
        assert_eq!(fresh_devices(&c), 2);
        assert_eq!(
            ids(&plan_containers(&c, &shares(2))),
            [vec!["g0", "g1"], vec!["g0"]]
        );
        // init 1, app 2: the app reuses the init's device and takes one more.
        let c = [need("i", Init, 1), need("a", App, 2)];
        assert_eq!(fresh_devices(&c), 2);
        assert_eq!(
            ids(&plan_containers(&c, &shares(2))),
            [vec!["g0"], vec!["g0", "g1"]]
        );
    }

    #[test]
    fn app_and_sidecar_devices_leave_the_pool() {
        // init 2, then two apps of 1: each app takes one of the init's.
        let c = [need("i", Init, 2), need("a", App, 1), need("b", App, 1)];
        assert_eq!(fresh_devices(&c), 2);
        assert_eq!(
            ids(&plan_containers(&c, &shares(2))),
            [vec!["g0", "g1"], vec!["g0"], vec!["g1"]]
        );
        // A sidecar before an init container keeps its device: the init needs a fresh one.
        let c = [need("s", Sidecar, 1), need("i", Init, 1), need("a", App, 1)];
        assert_eq!(fresh_devices(&c), 2);
        assert_eq!(
            ids(&plan_containers(&c, &shares(2))),
            [vec!["g0"], vec!["g1"], vec!["g1"]]
        );
        // Two apps without init containers: nothing is shared.
        let c = [need("a", App, 2), need("b", App, 1)];
        assert_eq!(fresh_devices(&c), 3);
        assert_eq!(
            ids(&plan_containers(&c, &shares(3))),
            [vec!["g0", "g1"], vec!["g2"]]
        );
    }

    #[test]
    fn fresh_count_matches_kubernetes_request_formula() {
        // Kubernetes: max(sum(apps) + sum(sidecars), max_i(init_i + sidecars before i)).
        let cases: Vec<Vec<ContainerNeed>> = vec![
            vec![need("i1", Init, 1), need("i2", Init, 3), need("a", App, 2)],
            vec![need("s", Sidecar, 2), need("i", Init, 1), need("a", App, 1)],
            vec![need("i", Init, 2), need("s", Sidecar, 1), need("a", App, 2)],
            vec![need("i", Init, 4), need("a", App, 1), need("b", App, 1)],
        ];
        for c in cases {
            let mut sidecars = 0u32;
            let mut init_max = 0u32;
            let mut apps = 0u32;
            for n in &c {
                match n.kind {
                    Sidecar => {
                        sidecars += n.count;
                        init_max = init_max.max(sidecars);
                    }
                    Init => init_max = init_max.max(n.count + sidecars),
                    App => apps += n.count,
                }
            }
            assert_eq!(fresh_devices(&c), (apps + sidecars).max(init_max), "{c:?}");
        }
    }

    #[test]
    fn annotations_round_trip_and_errors_name_the_annotation() {
        let a = Allocated {
            node: "n".into(),
            containers: vec![ContainerAssignment {
                name: "c".into(),
                devices: shares(2),
            }],
        };
        assert_eq!(Allocated::from_json(&a.to_json()).unwrap(), a);
        assert!(
            Allocated::from_json("[")
                .unwrap_err()
                .to_string()
                .starts_with("annotation gpuplace.io/allocated")
        );
        assert!(
            Assignment::from_json("{\"node\": 1}")
                .unwrap_err()
                .to_string()
                .starts_with("annotation gpuplace.io/assignment")
        );
    }
}
