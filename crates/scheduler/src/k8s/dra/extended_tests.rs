use super::*;

fn c(name: &str, kind: ContainerKind, gpus: u32) -> ContainerDemand {
    ContainerDemand {
        name: name.into(),
        kind,
        gpu_count: gpus,
        gpu_milli: 0,
        share: false,
    }
}

fn m(container: &str, request: &str) -> RequestMapping {
    RequestMapping {
        container: container.into(),
        request: request.into(),
    }
}

fn pod() -> PodKey {
    PodKey {
        namespace: "team".into(),
        name: "train".into(),
        uid: "u-1".into(),
    }
}

fn class(name: &str, resource: Option<&str>) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: k8s_openapi::api::resource::v1::DeviceClassSpec {
            extended_resource_name: resource.map(str::to_string),
            ..Default::default()
        },
    }
}

#[test]
fn the_class_is_gpuplaces_own_that_names_the_resource() {
    let settings = DraSettings::default();
    let classes = [
        class("other.example.com", Some("nvidia.com/gpu")),
        class("gpu-share.gpuplace.io", None),
        class("gpu.gpuplace.io", Some("nvidia.com/gpu")),
    ];
    assert_eq!(
        class_for(&classes, &settings, "nvidia.com/gpu").map(|c| c.class.clone()),
        Some("gpu.gpuplace.io".to_string())
    );
    assert_eq!(class_for(&classes, &settings, "example.com/fpga"), None);
    // Another driver's class that names the resource is not gpuplace's to serve.
    assert_eq!(class_for(&classes[..2], &settings, "nvidia.com/gpu"), None);
}

#[test]
fn each_app_container_gets_its_own_request() {
    let ask = ask_of(
        &[c("a", ContainerKind::App, 2), c("b", ContainerKind::App, 1)],
        3,
    )
    .unwrap();
    assert_eq!(
        ask.requests,
        vec![
            ExtendedRequest {
                name: "container-0-gpus".into(),
                count: 2
            },
            ExtendedRequest {
                name: "container-1-gpus".into(),
                count: 1
            },
        ]
    );
    assert_eq!(
        ask.mappings,
        vec![m("a", "container-0-gpus"), m("b", "container-1-gpus")]
    );
}

#[test]
fn init_containers_use_the_later_requests_first_and_share_the_largest_rest() {
    // init-a needs 3: the app's 2 and one more; init-b needs 1: the app's request covers it.
    let containers = [
        c("init-a", ContainerKind::Init, 3),
        c("init-b", ContainerKind::Init, 1),
        c("app", ContainerKind::App, 2),
    ];
    let ask = ask_of(&containers, 3).unwrap();
    assert_eq!(ask.count(), 3);
    assert_eq!(
        ask.requests,
        vec![
            ExtendedRequest {
                name: "container-0-gpus".into(),
                count: 1
            },
            ExtendedRequest {
                name: "container-2-gpus".into(),
                count: 2
            },
        ]
    );
    assert!(ask.mappings.contains(&m("init-a", "container-2-gpus")));
    assert!(ask.mappings.contains(&m("init-a", "container-0-gpus")));
    assert!(ask.mappings.contains(&m("init-b", "container-2-gpus")));
    assert!(!ask.mappings.contains(&m("init-b", "container-0-gpus")));
    // The same pod counted otherwise would hold other GPUs than placed: refused.
    assert_eq!(ask_of(&containers, 4), None);
}

#[test]
fn shares_and_pods_without_gpus_are_not_extended_resources() {
    let mut share = c("a", ContainerKind::App, 1);
    share.share = true;
    share.gpu_milli = 250;
    assert_eq!(ask_of(&[share], 1), None);
    assert_eq!(ask_of(&[], 0), None);
}

#[test]
fn the_write_allocates_the_placed_gpus_in_request_order_and_maps_containers() {
    let ask = ask_of(
        &[c("a", ContainerKind::App, 1), c("b", ContainerKind::App, 2)],
        3,
    )
    .unwrap();
    let gpus: Vec<PlacedGpu> = [5, 6, 7]
        .map(|index| PlacedGpu {
            index,
            memory_mib: 81920,
        })
        .into();
    let class = GpuClass {
        class: "gpu.gpuplace.io".into(),
        driver: "gpu.gpuplace.io".into(),
        resource: "nvidia.com/gpu".into(),
    };
    let w = write_for(&pod(), &ask, &class, "n1", &gpus).unwrap();
    let results = w
        .allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap();
    let got: Vec<(&str, &str, &str)> = results
        .iter()
        .map(|r| (r.request.as_str(), r.pool.as_str(), r.device.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("container-0-gpus", "n1", "gpu-5"),
            ("container-1-gpus", "n1", "gpu-6"),
            ("container-1-gpus", "n1", "gpu-7")
        ]
    );
    assert!(is_extended(&w.claim));
    let meta = &w.claim.metadata;
    assert_eq!(
        meta.generate_name.as_deref(),
        Some("train-extended-resources-")
    );
    assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "u-1");
    assert_eq!(
        meta.finalizers.as_deref(),
        Some(&[DELETE_PROTECTION.to_string()][..])
    );
    let status = w.status("train-extended-resources-x7k2p");
    assert_eq!(status.resource_claim_name, "train-extended-resources-x7k2p");
    assert_eq!(status.request_mappings.len(), 2);
    assert!(
        status
            .request_mappings
            .iter()
            .all(|m| m.resource_name == "nvidia.com/gpu")
    );
    assert_eq!(
        write_for(&pod(), &ask, &class, "n1", &gpus[..2]),
        Err(WriteError::Count { got: 2, want: 3 })
    );
}
