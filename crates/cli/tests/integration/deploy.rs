//! Every kustomize overlay under deploy/overlays renders (`kubectl kustomize`) and each
//! object parses as its typed Kubernetes object with no unknown or misspelt field (decoded
//! with k8s-openapi, encoded again, and compared with the YAML); the examples too; and the
//! extender's KubeSchedulerConfiguration has the fields kube-scheduler reads.
//!
//! Without kubectl the overlay check skips with a reason, unless GPUPLACE_REQUIRE_KUBECTL
//! is set (CI installs kubectl and sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Paths in `original` that the typed round trip lost or changed (unknown fields, wrong
/// types).
fn lost(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => lost(v, w, &format!("{path}.{k}"), out),
                    None if v.is_null() => {}
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        _ => out.push(format!("{path} (value {original} became {typed})")),
    }
}

fn check_as<T: DeserializeOwned + serde::Serialize>(object: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    lost(object, &back, "", &mut out);
    if out.is_empty() {
        Ok(())
    } else {
        Err(format!("unknown or mistyped fields: {}", out.join(", ")))
    }
}

/// Parses `object` as the typed object its apiVersion and kind name.
fn check(object: &Value) -> Result<(), String> {
    let api = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    match (api, kind) {
        ("v1", "ServiceAccount") => check_as::<ServiceAccount>(object),
        ("v1", "ConfigMap") => check_as::<ConfigMap>(object),
        ("v1", "Service") => check_as::<Service>(object),
        ("v1", "Pod") => check_as::<Pod>(object),
        ("apps/v1", "Deployment") => check_as::<Deployment>(object),
        ("apps/v1", "DaemonSet") => check_as::<DaemonSet>(object),
        ("policy/v1", "PodDisruptionBudget") => check_as::<PodDisruptionBudget>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => check_as::<ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            check_as::<ClusterRoleBinding>(object)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => check_as::<Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => check_as::<RoleBinding>(object),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            check_as::<CustomResourceDefinition>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            check_as::<ValidatingAdmissionPolicy>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            check_as::<ValidatingAdmissionPolicyBinding>(object)
        }
        ("resource.k8s.io/v1", "DeviceClass") => check_as::<DeviceClass>(object),
        ("resource.k8s.io/v1", "ResourceClaim") => check_as::<ResourceClaim>(object),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            check_as::<ResourceClaimTemplate>(object)
        }
        ("gpuplace.io/v1alpha1", "PodGroup") => {
            check_as::<gpuplace_scheduler::k8s::gang::PodGroup>(object)
        }
        _ => Err(format!("no typed check for {api} {kind}")),
    }
}

fn objects(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .expect("valid YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn name(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[test]
fn every_overlay_renders_into_typed_objects() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("GPUPLACE_REQUIRE_KUBECTL").is_none(),
            "GPUPLACE_REQUIRE_KUBECTL is set but kubectl is not installed"
        );
        println!(
            "skipped: kubectl is not installed (apt-get install kubectl), so the overlays cannot be rendered"
        );
        return;
    }
    let overlays = deploy().join("overlays");
    let mut rendered = 0;
    for entry in std::fs::read_dir(&overlays).expect("deploy/overlays") {
        let dir = entry.expect("entry").path();
        let output = Command::new("kubectl")
            .arg("kustomize")
            .arg(&dir)
            .output()
            .expect("kubectl runs");
        assert!(
            output.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).expect("UTF-8");
        let objects = objects(&text);
        assert!(
            objects.len() >= 10,
            "{}: {} objects",
            dir.display(),
            objects.len()
        );
        for object in &objects {
            if let Err(e) = check(object) {
                panic!("{}: {}: {e}", dir.display(), name(object));
            }
        }
        let kinds: Vec<String> = objects.iter().map(name).collect();
        assert!(
            kinds
                .iter()
                .any(|k| k == "CustomResourceDefinition podgroups.gpuplace.io"),
            "{}: no PodGroup CRD",
            dir.display()
        );
        // A node agent: the device plugin, or (1.34+) the DRA driver with its classes.
        let agent = kinds
            .iter()
            .any(|k| k == "DaemonSet gpuplace-device-plugin")
            || (kinds.iter().any(|k| k == "DaemonSet gpuplace-dra-driver")
                && kinds.iter().any(|k| k == "DeviceClass gpu.gpuplace.io"));
        assert!(agent, "{}: no node agent", dir.display());
        rendered += 1;
    }
    assert!(
        rendered >= 4,
        "standalone, extender, standalone-1.30 and standalone-1.36 at least"
    );
}

#[test]
fn examples_are_typed_objects() {
    for entry in std::fs::read_dir(deploy().join("examples")).expect("deploy/examples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("readable");
        for object in objects(&text) {
            if let Err(e) = check(&object) {
                panic!("{}: {}: {e}", path.display(), name(&object));
            }
        }
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let object: Value = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"}, "spec": {"ports": [{"port": 80, "targetPrt": 8080}]}});
    let err = check(&object).unwrap_err();
    assert!(err.contains(".spec.ports[0].targetPrt"), "{err}");
}

/// The fields of kube-scheduler's v1 configuration that gpuplace's example sets; any other
/// key is refused, so a typo cannot pass unnoticed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SchedulerConfiguration {
    api_version: String,
    kind: String,
    leader_election: LeaderElection,
    profiles: Vec<Profile>,
    extenders: Vec<ExtenderConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaderElection {
    leader_elect: bool,
    resource_name: String,
    resource_namespace: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Profile {
    scheduler_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExtenderConfig {
    url_prefix: String,
    filter_verb: String,
    prioritize_verb: String,
    bind_verb: String,
    weight: i64,
    #[serde(rename = "enableHTTPS")]
    enable_https: bool,
    node_cache_capable: bool,
    http_timeout: String,
    ignorable: bool,
    managed_resources: Vec<ManagedResource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ManagedResource {
    name: String,
    ignored_by_scheduler: bool,
}

#[test]
fn the_kube_scheduler_configuration_calls_the_extender() {
    let path = deploy().join("base/extender/kube-scheduler-config.yaml");
    let text = std::fs::read_to_string(&path).expect("readable");
    let config: SchedulerConfiguration = serde_saphyr::from_str(&text).expect("parses");
    assert_eq!(config.api_version, "kubescheduler.config.k8s.io/v1");
    assert_eq!(config.kind, "KubeSchedulerConfiguration");
    assert!(config.leader_election.leader_elect);
    assert_eq!(
        config.leader_election.resource_name,
        "gpuplace-kube-scheduler"
    );
    assert_eq!(config.leader_election.resource_namespace, "kube-system");
    assert_eq!(config.profiles[0].scheduler_name, "gpuplace");
    let ext = &config.extenders[0];
    assert_eq!(ext.url_prefix, "http://127.0.0.1:8888");
    assert_eq!(
        (
            ext.filter_verb.as_str(),
            ext.prioritize_verb.as_str(),
            ext.bind_verb.as_str()
        ),
        ("filter", "prioritize", "bind")
    );
    assert!(ext.node_cache_capable && !ext.enable_https && !ext.ignorable);
    assert!((1..=100).contains(&ext.weight), "{}", ext.weight);
    assert_eq!(ext.http_timeout, "5s");
    assert_eq!(ext.managed_resources[0].name, "nvidia.com/gpu");
    assert!(!ext.managed_resources[0].ignored_by_scheduler);
}

#[test]
fn the_schedulers_config_map_says_the_defaults_as_strings() {
    let path = deploy().join("base/scheduler/config.yaml");
    let text = std::fs::read_to_string(&path).expect("readable");
    let map: ConfigMap = serde_saphyr::from_str(&text).expect("a ConfigMap");
    let inner = map
        .data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .expect("config.yaml in the ConfigMap");
    let config: Value = serde_saphyr::from_str(inner).expect("config.yaml parses");
    // `off` unquoted would read as a boolean to YAML 1.1 tools; the scheduler wants the
    // word, and its default (core's defrag::Settings) is off.
    assert_eq!(config["defrag"], Value::String("off".into()));
    assert_eq!(config["policy"], Value::String("gpuplace".into()));
}
