use super::*;
use crate::kubelet::service::{MPS_MEMORY_ENV, MPS_THREADS_ENV, SHARE_MEMORY_ENV, SHARE_MILLI_ENV};
use gpuplace_model::Gpu;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceToleration, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn inventory() -> NodeInventory {
    let gpu = |i: u32, healthy: bool| Gpu {
        id: format!("GPU-{i}"),
        index: i,
        minor: None,
        uuid: format!("GPU-{i}"),
        model: "A100".into(),
        memory_mib: 40_000,
        numa_node: None,
        healthy,
        milli_capacity: 1000,
    };
    NodeInventory {
        name: "node-a".into(),
        gpus: vec![gpu(0, true), gpu(1, true), gpu(2, false)],
        ..Default::default()
    }
}

fn asked() -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: "train-gpu".into(),
        uid: "uid-1".into(),
    }
}

fn result(device: &str, consumed: &[(&str, &str)]) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        driver: "gpu.gpuplace.io".into(),
        pool: "node-a".into(),
        device: device.into(),
        request: "gpu".into(),
        consumed_capacity: (!consumed.is_empty()).then(|| {
            consumed
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        }),
        share_id: (!consumed.is_empty()).then(|| "share-1".to_string()),
        ..Default::default()
    }
}

fn claim(uid: &str, results: Option<Vec<DeviceRequestAllocationResult>>) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.uid = Some(uid.into());
    c.status = results.map(|results| ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

fn node(inventory: &NodeInventory) -> Node<'_> {
    Node {
        driver: "gpu.gpuplace.io",
        pool: "node-a",
        inventory,
    }
}

#[test]
fn whole_gpus_get_the_device_plugins_env() {
    let inv = inventory();
    let mut other = result("nic-0", &[]);
    other.driver = "net.example.com".into();
    let c = claim(
        "uid-1",
        Some(vec![result("gpu-1", &[]), result("gpu-0", &[]), other]),
    );
    let prepared = plan(&asked(), Some(&c), node(&inv)).expect("prepared");
    let uuids: Vec<&str> = prepared.devices.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        ["GPU-1", "GPU-0"],
        "only this driver's devices, in order"
    );
    assert!(prepared.devices.iter().all(|d| !d.share && d.milli == 1000));
    let env = claim_env(&prepared);
    assert_eq!(env[VISIBLE_DEVICES_ENV], "GPU-1,GPU-0");
    assert_eq!(env[DEVICE_IDS_ENV], "GPU-1,GPU-0");
    assert!(!env.contains_key(SHARE_MILLI_ENV));
}

#[test]
fn a_share_gets_its_milli_and_memory_limits() {
    let inv = inventory();
    // The server writes 250 as "250" and 10 GiB as "10Gi".
    let c = claim(
        "uid-1",
        Some(vec![result(
            "gpu-0",
            &[("milli", "250"), ("memory", "10Gi")],
        )]),
    );
    let prepared = plan(&asked(), Some(&c), node(&inv)).expect("prepared");
    let d = &prepared.devices[0];
    assert!(d.share);
    assert_eq!((d.milli, d.memory_mib), (250, 10_240));
    assert_eq!(d.share_id.as_deref(), Some("share-1"));
    let env = claim_env(&prepared);
    assert_eq!(env[SHARE_MILLI_ENV], "250");
    assert_eq!(env[SHARE_MEMORY_ENV], "10240");
    assert_eq!(env[MPS_THREADS_ENV], "25");
    assert_eq!(env[MPS_MEMORY_ENV], "0=10240M");
    assert_eq!(env[DEVICE_IDS_ENV], "GPU-0:250");
    // No memory asked: its milli's part of the GPU's memory; "1k" milli is the whole GPU.
    let c = claim(
        "uid-1",
        Some(vec![result("gpu-1", &[("milli", "500"), ("memory", "0")])]),
    );
    let d = &plan(&asked(), Some(&c), node(&inv))
        .expect("prepared")
        .devices[0];
    assert_eq!((d.milli, d.memory_mib), (500, 20_000));
    let c = claim("uid-1", Some(vec![result("gpu-1", &[("milli", "1k")])]));
    let d = &plan(&asked(), Some(&c), node(&inv))
        .expect("prepared")
        .devices[0];
    assert!(!d.share);
}

#[test]
fn bad_claims_are_refused_with_the_reason() {
    let inv = inventory();
    let a = asked();
    let err = |c: Option<&ResourceClaim>| plan(&a, c, node(&inv)).expect_err("refused").to_string();
    assert!(err(None).contains("not in the API"));
    assert!(err(Some(&claim("uid-2", Some(vec![])))).contains("now has UID uid-2"));
    assert!(err(Some(&claim("uid-1", None))).contains("not allocated"));
    let mut elsewhere = result("gpu-0", &[]);
    elsewhere.pool = "node-b".into();
    assert!(err(Some(&claim("uid-1", Some(vec![elsewhere])))).contains("not on this node"));
    assert!(
        err(Some(&claim("uid-1", Some(vec![result("gpu-9", &[])]))))
            .contains("not one of this node's GPUs")
    );
    assert!(err(Some(&claim("uid-1", Some(vec![result("gpu-2", &[])])))).contains("unhealthy"));
    assert!(
        err(Some(&claim(
            "uid-1",
            Some(vec![result("gpu-0", &[("milli", "2k")])])
        )))
        .contains("not within 1..=1000")
    );
    assert!(
        err(Some(&claim(
            "uid-1",
            Some(vec![result("gpu-0", &[("milli", "lots")])])
        )))
        .contains("not a valid Kubernetes quantity")
    );
    // A claim that tolerates the taint gets the unhealthy GPU (an operator's debug pod).
    let mut tolerant = result("gpu-2", &[]);
    tolerant.tolerations = Some(vec![DeviceToleration {
        key: Some(super::super::slices::UNHEALTHY_TAINT.into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    assert!(plan(&a, Some(&claim("uid-1", Some(vec![tolerant]))), node(&inv)).is_ok());
}

#[test]
fn a_claim_without_this_drivers_devices_prepares_nothing() {
    let inv = inventory();
    let prepared = plan(&asked(), Some(&claim("uid-1", Some(vec![]))), node(&inv)).expect("ok");
    assert!(prepared.devices.is_empty());
    assert_eq!(claim_env(&prepared)[VISIBLE_DEVICES_ENV], "void");
}
