//! The replay's GPUs through DRA (`gpuplace replay --dra`, Kubernetes 1.34+): each fake
//! node's GPUs published as gpuplace's DRA driver publishes them (a ResourceSlice, no
//! `nvidia.com/gpu`), and each pod's GPUs claimed from a ResourceClaimTemplate of its
//! shape (whole GPUs: a count of `gpu.gpuplace.io`; a share: consumable capacity of
//! `gpu-share.gpuplace.io`; allowed models: a CEL selector; GPUs that must be linked: a
//! `matchAttribute` constraint). The controller makes each
//! pod's claim from its template and deletes it with the pod; whoever schedules the pod
//! (gpuplace, or kube-scheduler's own allocator) allocates it. The DeviceClasses are the
//! cluster's (`deploy/base/dra-driver/deviceclasses.yaml`).

use gpuplace_deviceplugin::dra::DEFAULT_DRIVER;
use gpuplace_deviceplugin::dra::slices::{SliceInput, node_slices};
use gpuplace_model::keys::{DRA_DRIVER_LABEL, GPU_RESOURCE, SHARE_RESOURCE};
use gpuplace_model::{GpuTopology, NodeInventory, Request};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use serde_json::json;

use crate::objects::{ObjectError, fake_node, run_labels};

/// The DeviceClass of whole GPUs.
pub const WHOLE_CLASS: &str = "gpu.gpuplace.io";
/// The DeviceClass of GPU shares (consumable capacity).
pub const SHARE_CLASS: &str = "gpu-share.gpuplace.io";
pub use crate::objects::{POD_CLAIM, template_name};

/// A fake node whose GPUs the DRA driver serves: the fake node without the device
/// plugin's resources, labelled with the driver.
pub fn dra_node(run: &str, name: &str, inventory: &NodeInventory) -> Result<Node, ObjectError> {
    let mut node = fake_node(run, name, inventory)?;
    if let Some(status) = node.status.as_mut() {
        for list in [status.capacity.as_mut(), status.allocatable.as_mut()]
            .into_iter()
            .flatten()
        {
            list.remove(GPU_RESOURCE);
            list.remove(SHARE_RESOURCE);
        }
    }
    node.metadata
        .labels
        .get_or_insert_default()
        .insert(DRA_DRIVER_LABEL.into(), DEFAULT_DRIVER.into());
    Ok(node)
}

/// The ResourceSlices of fake node `name`: its GPUs as the driver publishes them, shares
/// allowed, labelled with run `run`. A node without GPUs has none.
pub fn node_slices_of(
    run: &str,
    name: &str,
    inventory: &NodeInventory,
) -> Result<Vec<ResourceSlice>, ObjectError> {
    if inventory.gpus.is_empty() {
        return Ok(Vec::new());
    }
    let mut inventory = inventory.clone();
    inventory.name = name.to_string();
    for (i, g) in inventory.gpus.iter_mut().enumerate() {
        if g.uuid.is_empty() {
            g.uuid = format!("{name}-gpu{i}");
        }
    }
    node_slices(SliceInput {
        inventory: &inventory,
        driver: DEFAULT_DRIVER,
        node: name,
        generation: 1,
        shares: true,
    })
    .into_iter()
    .map(|s| {
        serde_json::from_value(json!({
            "metadata": {"name": s.name, "labels": run_labels(run)},
            "spec": s.spec,
        }))
        .map_err(|e| ObjectError::Build(format!("ResourceSlice of node {name}: {e}")))
    })
    .collect()
}

/// The templates the pods of `requests` claim from, one per shape (GPU-less requests
/// claim nothing).
pub fn claim_templates<'a>(
    run: &str,
    namespace: &str,
    requests: impl IntoIterator<Item = &'a Request>,
) -> Result<Vec<ResourceClaimTemplate>, ObjectError> {
    let mut seen = std::collections::BTreeSet::new();
    requests
        .into_iter()
        .filter(|r| r.gpu_count > 0 && seen.insert(template_name(r)))
        .map(|r| claim_template(run, namespace, r))
        .collect()
}

/// The ResourceClaimTemplate of `request`'s shape, in `namespace`.
pub fn claim_template(
    run: &str,
    namespace: &str,
    request: &Request,
) -> Result<ResourceClaimTemplate, ObjectError> {
    let name = template_name(request);
    let mut exactly = if request.gpu_milli < 1000 {
        json!({"deviceClassName": SHARE_CLASS,
            "capacity": {"requests": {"milli": request.gpu_milli.to_string()}}})
    } else {
        json!({"deviceClassName": WHOLE_CLASS, "count": request.gpu_count})
    };
    if !request.allowed_models.is_empty() {
        let models = serde_json::to_string(&request.allowed_models)
            .map_err(|e| ObjectError::Build(format!("template {name}: {e}")))?;
        exactly["selectors"] = json!([{"cel": {"expression":
            format!("device.attributes[\"{DEFAULT_DRIVER}\"].model in {models}")}}]);
    }
    let mut devices = json!({"requests": [{"name": POD_CLAIM, "exactly": exactly}]});
    if let Some(attribute) = matched_attribute(request.need.topology) {
        devices["constraints"] = json!([{"requests": [POD_CLAIM],
            "matchAttribute": format!("{DEFAULT_DRIVER}/{attribute}")}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": run_labels(run)},
        "spec": {"spec": {"devices": devices}},
    }))
    .map_err(|e| ObjectError::Build(format!("template {name}: {e}")))
}

/// The attribute of gpuplace's driver a `matchAttribute` constraint names for GPUs that
/// must be linked by `topology` (one NVLink clique, one PCIe switch, one NUMA node).
fn matched_attribute(topology: GpuTopology) -> Option<&'static str> {
    match topology {
        GpuTopology::Any => None,
        GpuTopology::Nvlink => Some("nvlinkClique"),
        GpuTopology::PcieSwitch => Some("pcieSwitch"),
        GpuTopology::Numa => Some("numaNode"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(count: u32, milli: u32, models: &[&str]) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 1024,
            gpu_count: count,
            gpu_milli: milli,
            allowed_models: models.iter().map(|m| m.to_string()).collect(),
            ..Request::default()
        }
    }

    /// The template's one request.
    fn only_request(t: &ResourceClaimTemplate) -> &k8s_openapi::api::resource::v1::DeviceRequest {
        &t.spec
            .spec
            .devices
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()[0]
    }

    #[test]
    fn templates_ask_whole_gpus_a_share_or_allowed_models() {
        let whole = claim_template("r1", "ns", &request(4, 1000, &[])).unwrap();
        assert_eq!(whole.metadata.name.as_deref(), Some("gpus-4"));
        let r = only_request(&whole);
        let exactly = r.exactly.as_ref().unwrap();
        assert_eq!(
            (exactly.device_class_name.as_str(), exactly.count),
            (WHOLE_CLASS, Some(4))
        );
        let share = claim_template("r1", "ns", &request(1, 250, &[])).unwrap();
        assert_eq!(share.metadata.name.as_deref(), Some("share-250"));
        let r = only_request(&share);
        let exactly = r.exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, SHARE_CLASS);
        let asked = exactly
            .capacity
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(asked["milli"].0, "250");
        let models = claim_template("r1", "ns", &request(2, 1000, &["V100M16", "T4"])).unwrap();
        let name = models.metadata.name.clone().unwrap();
        assert!(
            name.starts_with("gpus-2-m") && name.len() == "gpus-2-m".len() + 8,
            "{name}"
        );
        let r = only_request(&models);
        let cel = &r.exactly.as_ref().unwrap().selectors.as_ref().unwrap()[0];
        assert_eq!(
            cel.cel.as_ref().unwrap().expression,
            r#"device.attributes["gpu.gpuplace.io"].model in ["V100M16","T4"]"#
        );
        assert_ne!(template_name(&request(2, 1000, &["T4"])), name);
        let mut linked = request(4, 1000, &[]);
        linked.need.topology = GpuTopology::Nvlink;
        let linked = claim_template("r1", "ns", &linked).unwrap();
        assert_eq!(linked.metadata.name.as_deref(), Some("gpus-4-nvlink"));
        let constraints = linked.spec.spec.devices.unwrap().constraints.unwrap();
        assert_eq!(
            constraints[0].match_attribute.as_deref(),
            Some("gpu.gpuplace.io/nvlinkClique")
        );
        assert_eq!(constraints[0].requests, Some(vec![POD_CLAIM.to_string()]));
    }

    #[test]
    fn a_dra_pod_claims_from_its_shapes_template_and_asks_no_device_plugin_resource() {
        let template = crate::objects::PodTemplate {
            run: "r1".into(),
            namespace: "ns".into(),
            scheduler_name: "gpuplace".into(),
            priority_classes: None,
            base: crate::pod_base::PodBase::default(),
            dra: true,
        };
        let planned = crate::plan::PlannedPod {
            name: "p".into(),
            pod: 0,
            unit: 0,
            arrival_ms: 0,
            run_ms: 10,
            full_ms: 10,
            measured: true,
            warm: false,
            queue: None,
            gang: None,
            priority: 0,
        };
        let asked = request(2, 1000, &["T4"]);
        let pod = crate::objects::pod(&template, &planned, "p-0", &asked).unwrap();
        assert!(pod.metadata.annotations.unwrap_or_default().is_empty());
        let spec = pod.spec.unwrap();
        let claims = spec.resource_claims.unwrap();
        assert_eq!(claims[0].name, POD_CLAIM);
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some(template_name(&asked).as_str())
        );
        let resources = spec.containers[0].resources.clone().unwrap();
        assert_eq!(resources.claims.unwrap()[0].name, POD_CLAIM);
        assert!(resources.limits.unwrap_or_default().is_empty());
        // A pod without GPUs claims nothing.
        let cpu = crate::objects::pod(&template, &planned, "c-0", &request(0, 0, &[])).unwrap();
        assert!(cpu.spec.unwrap().resource_claims.is_none());
    }

    #[test]
    fn dra_nodes_carry_the_driver_label_and_slices_but_no_device_plugin_resources() {
        let inventory = NodeInventory::uniform("n", 96_000, 786_432, 8, "A100");
        let node = dra_node("r1", "n-1", &inventory).unwrap();
        let status = node.status.unwrap();
        for list in [status.capacity.unwrap(), status.allocatable.unwrap()] {
            assert!(!list.contains_key(GPU_RESOURCE) && !list.contains_key(SHARE_RESOURCE));
            assert!(list.contains_key("cpu"));
        }
        assert_eq!(
            node.metadata.labels.unwrap()[DRA_DRIVER_LABEL],
            DEFAULT_DRIVER
        );
        let slices = node_slices_of("r1", "n-1", &inventory).unwrap();
        assert_eq!(slices.len(), 1);
        let spec = &slices[0].spec;
        assert_eq!(spec.node_name.as_deref(), Some("n-1"));
        assert_eq!(spec.devices.as_ref().unwrap().len(), 8);
        assert_eq!(
            slices[0].metadata.labels.as_ref().unwrap()[crate::RUN_LABEL],
            "r1"
        );
        let none = NodeInventory::uniform("c", 96_000, 786_432, 0, "A100");
        assert!(node_slices_of("r1", "c", &none).unwrap().is_empty());
    }
}
