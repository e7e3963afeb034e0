use super::*;
use gpuplace_model::Gpu;
use gpuplace_model::device_attributes::driver_version;

fn dgx1() -> NodeInventory {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/inventories/dgx1-hybrid-cube-mesh.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the DGX-1 inventory is in deploy/");
    crate::backend::parse_inventory(&text, path, "node-a").expect("the DGX-1 inventory parses")
}

fn input(inventory: &NodeInventory, shares: bool) -> SliceInput<'_> {
    SliceInput {
        inventory,
        driver: DEFAULT_DRIVER,
        node: "node-a",
        generation: 3,
        shares,
    }
}

fn attr<'a>(d: &'a Device, key: &str) -> &'a DeviceAttribute {
    &d.attributes.as_ref().expect("attributes")[key]
}

#[test]
fn one_device_per_gpu_with_its_attributes_and_capacity() {
    let inventory = dgx1();
    let slices = node_slices(input(&inventory, true));
    assert_eq!(slices.len(), 1);
    let s = &slices[0];
    assert_eq!(s.name, "node-a-gpu.gpuplace.io-0");
    assert_eq!(s.spec.driver, "gpu.gpuplace.io");
    assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(s.spec.pool.name, "node-a");
    assert_eq!(s.spec.pool.generation, 3);
    assert_eq!(s.spec.pool.resource_slice_count, 1);
    let devices = s.spec.devices.as_ref().expect("devices");
    assert_eq!(devices.len(), 8);
    let d = &devices[5];
    assert_eq!(d.name, "gpu-5");
    assert_eq!(attr(d, "index").int, Some(5));
    assert_eq!(
        attr(d, "uuid").string.as_deref(),
        Some("GPU-6b1d0001-0005-4001-8005-000000001005")
    );
    assert_eq!(
        attr(d, "model").string.as_deref(),
        Some("Tesla-V100-SXM2-16GB")
    );
    assert_eq!(attr(d, "numaNode").int, Some(1));
    let cap = d.capacity.as_ref().expect("capacity");
    assert_eq!(cap[MILLI_CAPACITY].value.0, "1000");
    assert_eq!(cap[MEMORY_CAPACITY].value.0, "16160Mi");
    let policy = cap[MILLI_CAPACITY].request_policy.as_ref().expect("policy");
    assert_eq!(policy.default.as_ref().map(|q| q.0.as_str()), Some("1000"));
    assert_eq!(d.allow_multiple_allocations, Some(true));
    assert!(d.taints.is_none());
}

#[test]
fn the_dgx1_quads_are_two_cliques_in_one_nvlink_domain() {
    let inventory = dgx1();
    let slices = node_slices(input(&inventory, true));
    let devices = slices[0].spec.devices.as_ref().expect("devices");
    let clique: Vec<i64> = devices
        .iter()
        .map(|d| attr(d, "nvlinkClique").int.expect("int"))
        .collect();
    assert_eq!(clique, [0, 0, 0, 0, 1, 1, 1, 1]);
    assert!(
        devices
            .iter()
            .all(|d| attr(d, "nvlinkDomain").int == Some(0))
    );
    // Pairs behind one PCIe switch: 0-1, 2-3, 4-5, 6-7.
    let switch: Vec<i64> = devices
        .iter()
        .map(|d| attr(d, "pcieSwitch").int.expect("int"))
        .collect();
    assert_eq!(switch, [0, 0, 1, 1, 2, 2, 3, 3]);
}

#[test]
fn an_unhealthy_gpu_is_tainted_and_shares_off_makes_devices_exclusive() {
    let mut inventory = dgx1();
    inventory.gpus[2].healthy = false;
    let slices = node_slices(input(&inventory, false));
    let devices = slices[0].spec.devices.as_ref().expect("devices");
    let taints = devices[2].taints.as_ref().expect("tainted");
    assert_eq!(taints[0].key, UNHEALTHY_TAINT);
    assert_eq!(taints[0].effect, "NoSchedule");
    assert!(devices[1].taints.is_none());
    assert!(
        devices
            .iter()
            .all(|d| d.allow_multiple_allocations.is_none())
    );
    let cap = devices[0].capacity.as_ref().expect("capacity");
    assert!(cap[MILLI_CAPACITY].request_policy.is_none());
}

#[test]
fn many_gpus_split_into_slices_of_one_pool() {
    let gpus = (0..130)
        .map(|i| Gpu {
            id: format!("GPU-{i}"),
            index: i,
            minor: None,
            uuid: format!("GPU-{i}"),
            model: "X".into(),
            memory_mib: 1024,
            numa_node: None,
            healthy: true,
            milli_capacity: 1000,
        })
        .collect();
    let inventory = NodeInventory {
        name: "big".into(),
        gpus,
        ..Default::default()
    };
    let slices = node_slices(input(&inventory, true));
    assert_eq!(slices.len(), 3);
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));
    let total: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(total, 130);
    assert_eq!(slices[2].name, "node-a-gpu.gpuplace.io-2");
}

#[test]
fn names_versions_and_indexes_round_trip() {
    assert_eq!(device_index(&device_name(12)), Some(12));
    assert_eq!(device_index("gpu-"), None);
    assert_eq!(device_index("gpu-1a"), None);
    assert_eq!(device_index("nic-1"), None);
    let long = "n".repeat(300);
    assert_eq!(slice_name(&long, DEFAULT_DRIVER, 0).len(), 253);
    let mut inventory = NodeInventory::default();
    for (raw, want) in [
        ("550.54.15", Some("550.54.15")),
        ("535.104", Some("535.104.0")),
        ("535.04.01", Some("535.4.1")),
        ("r535", None),
        ("1.2.3.4", None),
    ] {
        inventory
            .labels
            .insert(DRIVER_VERSION_LABEL.into(), raw.into());
        assert_eq!(driver_version(&inventory).as_deref(), want, "{raw}");
    }
}
