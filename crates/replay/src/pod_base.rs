//! A cluster's own pod template (`gpuplace replay --pod-template FILE`): what every replay
//! pod carries beside what the trace asks. A real GPU cluster often taints its GPU nodes,
//! pins GPU pods to a pool, pulls images from its own registry or needs a pull secret; a
//! replay pod without these would not land where the cluster's own pods land, or not start.
//!
//! The template is a Pod in YAML or JSON. The replay keeps what it owns: the name and
//! namespace, the scheduler's name, the node, the container's resources (the trace's) and
//! its own labels and annotations; a template that sets any of them is refused, naming the
//! field, rather than silently overridden.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value};

/// A template that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodBaseError {
    #[error("the pod template is not a Pod: {0}")]
    NotAPod(String),
    #[error("the pod template sets {field}, which the replay sets itself ({why})")]
    Owned { field: String, why: &'static str },
    #[error(
        "the pod template has {0} containers: it may have one at most, the container that asks the trace's resources"
    )]
    Containers(usize),
}

/// A checked pod template: a Pod's JSON without anything the replay owns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodBase {
    pod: Map<String, Value>,
}

/// Labels and annotations the replay writes (and reads back) itself.
const OWNED_KEYS: &[&str] = &[
    crate::labels::MANAGED_BY,
    crate::labels::RUN_LABEL,
    crate::labels::PLANNED_LABEL,
    "gpuplace.io/queue",
    gpuplace_model::keys::POD_GROUP_LABEL,
    gpuplace_model::keys::MODEL_ANNOTATION,
];

impl PodBase {
    /// The template in `text` (YAML or JSON), checked.
    pub fn parse(text: &str) -> Result<Self, PodBaseError> {
        let value: Value =
            serde_saphyr::from_str(text).map_err(|e| PodBaseError::NotAPod(e.to_string()))?;
        let Value::Object(pod) = value else {
            return Err(PodBaseError::NotAPod("it is not a mapping".into()));
        };
        if let Some(kind) = pod.get("kind").filter(|k| k.as_str() != Some("Pod")) {
            return Err(PodBaseError::NotAPod(format!("its kind is {kind}")));
        }
        // A template may leave `containers` out (the replay adds its own); a Pod may not.
        let mut whole = pod.clone();
        if let Some(Value::Object(spec)) = whole.get_mut("spec") {
            spec.entry("containers")
                .or_insert_with(|| Value::Array(Vec::new()));
        }
        serde_json::from_value::<Pod>(Value::Object(whole))
            .map_err(|e| PodBaseError::NotAPod(e.to_string()))?;
        let base = PodBase { pod };
        base.check_owned()?;
        Ok(base)
    }

    fn check_owned(&self) -> Result<(), PodBaseError> {
        let owned = |field: &str, why: &'static str| {
            Err(PodBaseError::Owned {
                field: field.to_string(),
                why,
            })
        };
        for (field, why) in [
            ("name", "pods are named after the trace"),
            ("generateName", "pods are named after the trace"),
            ("namespace", "give --namespace"),
        ] {
            if self.meta(field).is_some() {
                return owned(&format!("metadata.{field}"), why);
            }
        }
        for field in ["labels", "annotations"] {
            let keys = self.meta(field).and_then(Value::as_object);
            if let Some(key) =
                keys.and_then(|m| m.keys().find(|k| OWNED_KEYS.contains(&k.as_str())))
            {
                return owned(&format!("metadata.{field}.{key}"), "the replay's own key");
            }
        }
        for (field, why) in [
            ("nodeName", "the scheduler places the pods"),
            ("schedulerName", "give --scheduler-name"),
            ("resourceClaims", "each pod claims what its trace row asks"),
            (
                "priority",
                "admission sets it from priorityClassName, and refuses a pod that sets it",
            ),
        ] {
            if self.spec(field).is_some() {
                return owned(&format!("spec.{field}"), why);
            }
        }
        let containers = self.spec("containers").and_then(Value::as_array);
        let n = containers.map_or(0, Vec::len);
        if n > 1 {
            return Err(PodBaseError::Containers(n));
        }
        if containers
            .and_then(|c| c.first())
            .is_some_and(|c| c.get("resources").is_some())
        {
            return owned(
                "spec.containers[0].resources",
                "each pod asks what its trace row asks",
            );
        }
        let init = self.spec("initContainers").and_then(Value::as_array);
        if let Some(i) = init.and_then(|c| c.iter().position(|c| c.get("resources").is_some())) {
            return owned(
                &format!("spec.initContainers[{i}].resources"),
                "an init container's requests would change what the pod asks",
            );
        }
        Ok(())
    }

    fn meta(&self, field: &str) -> Option<&Value> {
        self.pod.get("metadata").and_then(|m| m.get(field))
    }

    fn spec(&self, field: &str) -> Option<&Value> {
        self.pod.get("spec").and_then(|s| s.get(field))
    }

    /// The template's `spec.priorityClassName`, if it sets one.
    pub fn priority_class(&self) -> Option<&str> {
        self.spec("priorityClassName").and_then(Value::as_str)
    }

    /// A replay pod's JSON: the template with `metadata` (name, namespace, labels and
    /// annotations, added to the template's own) and `spec` (the scheduler's name, the
    /// one container's name, image and resources unless the template names them, and a
    /// `Never` restart policy unless it sets one) filled in by the replay.
    pub fn fill(&self, metadata: Map<String, Value>, spec: Map<String, Value>) -> Value {
        let mut pod = self.pod.clone();
        let mut meta = take_object(&mut pod, "metadata");
        for (key, value) in metadata {
            match (meta.get_mut(&key), value) {
                (Some(Value::Object(mine)), Value::Object(theirs)) => mine.extend(theirs),
                (_, value) => {
                    meta.insert(key, value);
                }
            }
        }
        let mut into = take_object(&mut pod, "spec");
        for (key, value) in spec {
            match key.as_str() {
                "containers" => merge_container(&mut into, value),
                "restartPolicy" if into.contains_key("restartPolicy") => {}
                // The template's tolerations and the replay's own, both.
                "tolerations" => {
                    let mut all = match into.remove("tolerations") {
                        Some(Value::Array(theirs)) => theirs,
                        _ => Vec::new(),
                    };
                    if let Value::Array(mine) = value {
                        all.extend(mine);
                    }
                    into.insert(key, Value::Array(all));
                }
                _ => {
                    into.insert(key, value);
                }
            }
        }
        pod.insert("metadata".into(), Value::Object(meta));
        pod.insert("spec".into(), Value::Object(into));
        Value::Object(pod)
    }
}

/// The object under `key`, taken out (an empty one if absent; a checked template's
/// `metadata` and `spec` are objects).
fn take_object(map: &mut Map<String, Value>, key: &str) -> Map<String, Value> {
    match map.remove(key) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// The replay's one container over the template's: the template's fields first (its image,
/// command, security context), then the replay's name and image where it has none, and
/// always the replay's resources.
fn merge_container(spec: &mut Map<String, Value>, replays: Value) {
    let mine = spec
        .get("containers")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let theirs = match replays {
        Value::Array(mut list) if !list.is_empty() => list.swap_remove(0),
        other => other,
    };
    let mut merged = mine;
    if let Value::Object(theirs) = theirs {
        for (key, value) in theirs {
            if key == "resources" || !merged.contains_key(&key) {
                merged.insert(key, value);
            }
        }
    }
    spec.insert(
        "containers".into(),
        Value::Array(vec![Value::Object(merged)]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEMPLATE: &str = "\
apiVersion: v1
kind: Pod
metadata:
  labels: {team: ml}
  annotations: {note: replay}
spec:
  tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  nodeSelector: {pool: gpu}
  imagePullSecrets: [{name: mirror}]
  containers:
  - name: app
    image: mirror.local/pause:3.9
";

    fn filled(base: &PodBase) -> Value {
        base.fill(
            json!({"name": "rp1-1-0", "namespace": "default",
                "labels": {crate::labels::MANAGED_BY: "gpuplace-replay"}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
            json!({"schedulerName": "gpuplace", "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": {"cpu": "1"}}}]})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        )
    }

    #[test]
    fn a_template_adds_what_the_cluster_needs_and_the_replay_keeps_what_it_owns() {
        let base = PodBase::parse(TEMPLATE).expect("template");
        let pod: Pod = serde_json::from_value(filled(&base)).expect("pod");
        let labels = pod.metadata.labels.expect("labels");
        assert_eq!(labels["team"], "ml");
        assert_eq!(labels[crate::labels::MANAGED_BY], "gpuplace-replay");
        assert_eq!(pod.metadata.name.as_deref(), Some("rp1-1-0"));
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.scheduler_name.as_deref(), Some("gpuplace"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.tolerations.map(|t| t.len()), Some(1));
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(c.name, "app");
        assert_eq!(c.image.as_deref(), Some("mirror.local/pause:3.9"));
        let requests = c.resources.as_ref().and_then(|r| r.requests.clone());
        assert_eq!(requests.expect("requests")["cpu"].0, "1");
    }

    #[test]
    fn no_template_gives_the_replays_own_pod() {
        let pod: Pod = serde_json::from_value(filled(&PodBase::default())).expect("pod");
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[0].name, "main");
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
    }

    #[test]
    fn a_template_setting_what_the_replay_owns_is_refused_by_name() {
        let cases = [
            ("metadata: {name: x}", "metadata.name"),
            ("metadata: {namespace: x}", "metadata.namespace"),
            (
                "metadata: {labels: {app.kubernetes.io/managed-by: me}}",
                "metadata.labels.app.kubernetes.io/managed-by",
            ),
            (
                "metadata: {annotations: {gpuplace.io/gpu-model: A100}}",
                "metadata.annotations.gpuplace.io/gpu-model",
            ),
            ("spec: {nodeName: n1, containers: []}", "spec.nodeName"),
            (
                "spec: {schedulerName: s, containers: []}",
                "spec.schedulerName",
            ),
            (
                "spec: {containers: [{name: a, resources: {limits: {nvidia.com/gpu: 1}}}]}",
                "spec.containers[0].resources",
            ),
            (
                "spec: {containers: [], initContainers: [{name: i}, {name: j, resources: {}}]}",
                "spec.initContainers[1].resources",
            ),
        ];
        for (text, field) in cases {
            let err = PodBase::parse(text).expect_err(text);
            assert!(
                matches!(&err, PodBaseError::Owned { field: f, .. } if f == field),
                "{text}: {err}"
            );
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn what_is_not_a_pod_is_refused_with_its_reason() {
        for (text, says) in [
            ("[1, 2]", "not a mapping"),
            ("kind: Deployment", "its kind is \"Deployment\""),
            ("spec: {containers: 3}", "not a Pod"),
            (
                "spec: {tolerations: [{tolerationSeconds: soon}]}",
                "not a Pod",
            ),
            ("spec: [", "not a Pod"),
        ] {
            let err = PodBase::parse(text).expect_err(text).to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
        let two = "spec: {containers: [{name: a}, {name: b}]}";
        assert_eq!(PodBase::parse(two), Err(PodBaseError::Containers(2)));
    }
}
