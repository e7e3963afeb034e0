use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_model::GpuTopology;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use super::pod::{ClaimLookup, ClaimPlan, PodClaimRef, plans_of, refs_of};
use super::write::{PlacedGpu, undo_patch, writes_for};
use super::*;
use crate::k8s::pod_info::PodKey;

fn claim(value: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(value).unwrap()
}

fn requesting(requests: serde_json::Value, constraints: serde_json::Value) -> ResourceClaim {
    claim(json!({
        "metadata": {"name": "c", "namespace": "ml", "uid": "cu", "resourceVersion": "5"},
        "spec": {"devices": {"requests": requests, "constraints": constraints}}
    }))
}

fn shape(
    requests: serde_json::Value,
    constraints: serde_json::Value,
) -> Result<ClaimShape, String> {
    shape_of(&requesting(requests, constraints), &DraSettings::default())
}

#[test]
fn whole_gpus_and_their_link_are_read() {
    let s = shape(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 4}}]),
        json!([{"requests": ["gpu"], "matchAttribute": "gpu.gpuplace.io/nvlinkClique"}]),
    )
    .unwrap();
    assert_eq!(s.options[0].count(), 4);
    assert_eq!(s.topology, GpuTopology::Nvlink);
    assert_eq!(s.options[0].requests[0].milli, 1000);
    let numa = shape(
        json!([{"name": "a", "exactly": {"deviceClassName": "gpu.gpuplace.io"}},
               {"name": "b", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 1}}]),
        json!([{"matchAttribute": "numaNode"}]),
    )
    .unwrap();
    assert_eq!(
        (numa.options[0].count(), numa.topology),
        (2, GpuTopology::Numa)
    );
}

#[test]
fn all_of_a_nodes_gpus_is_asked_without_a_count() {
    let s = shape(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuplace.io", "allocationMode": "All"}}]),
        json!(null),
    )
    .unwrap();
    let r = &s.options[0].requests[0];
    assert!(r.all);
    assert_eq!((r.count, r.milli), (0, 1000));
}

#[test]
fn a_share_asks_milli_and_memory() {
    let s = shape(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu-share.gpuplace.io",
            "capacity": {"requests": {"milli": "250", "memory": "10Gi"}}}}]),
        json!(null),
    )
    .unwrap();
    assert_eq!(s.options[0].requests[0].milli, 250);
    assert_eq!(s.options[0].requests[0].memory_mib, Some(10240));
}

#[test]
fn what_gpuplace_cannot_allocate_is_said() {
    let cases = [
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "fpga.example.com"}}]),
            json!(null),
            "not one of gpuplace's",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io",
                "selectors": [{"cel": {"expression": "device.attributes["}}]}}]),
            json!(null),
            "does not parse",
        ),
        (
            json!([{"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "fpga.example.com"},
                {"name": "b", "deviceClassName": "gpu.gpuplace.io", "allocationMode": "Some"}]}]),
            json!(null),
            "request \"g/a\" asks DeviceClass \"fpga.example.com\"",
        ),
        (
            json!([{"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.gpuplace.io"}],
                "exactly": {"deviceClassName": "gpu.gpuplace.io"}}]),
            json!(null),
            "both exactly and firstAvailable",
        ),
        (
            json!([{"name": "a", "firstAvailable": subrequests(5)},
                   {"name": "b", "firstAvailable": subrequests(4)}]),
            json!(null),
            "20 combinations",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "allocationMode": "Some"}}]),
            json!(null),
            "allocationMode Some",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu-share.gpuplace.io", "allocationMode": "All",
                "capacity": {"requests": {"milli": "500"}}}}]),
            json!(null),
            "as shares",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "allocationMode": "All"}},
                   {"name": "h", "exactly": {"deviceClassName": "gpu.gpuplace.io"}}]),
            json!(null),
            "its claim's only request",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 0}}]),
            json!(null),
            "count 0",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2,
                "capacity": {"requests": {"milli": "500"}}}}]),
            json!(null),
            "a share",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io",
                "capacity": {"requests": {"cores": "2"}}}}]),
            json!(null),
            "capacity \"cores\"",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2}}]),
            json!([{"distinctAttribute": "gpu.gpuplace.io/numaNode"}]),
            "does not spread",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io"}}]),
            json!([{"distinctAttribute": "gpu.gpuplace.io/rack"}]),
            "meets uuid and index",
        ),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2}}]),
            json!([{"matchAttribute": "other.example.com/rack"}]),
            "not an attribute of driver",
        ),
        (json!([]), json!(null), "no devices"),
        (
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2}}]),
            json!([{"matchAttribute": "gpu.gpuplace.io/nvlinkClique"},
                   {"matchAttribute": "gpu.gpuplace.io/numaNode"}]),
            "at once",
        ),
    ];
    for (requests, constraints, said) in cases {
        let e = shape(requests.clone(), constraints).unwrap_err();
        assert!(e.contains(said), "{requests}: {e}");
    }
}

/// A GPU's own attribute is distinct among a claim's devices by construction; one several
/// GPUs share leaves only the ways of one GPU (a firstAvailable list falls to them).
#[test]
fn distinct_attributes_are_met_by_different_gpus_or_by_one_gpu() {
    let two = json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2}}]);
    let uuid = json!([{"distinctAttribute": "gpu.gpuplace.io/uuid"}]);
    let numa = json!([{"distinctAttribute": "gpu.gpuplace.io/numaNode"}]);
    assert_eq!(shape(two.clone(), uuid).unwrap().options[0].count(), 2);
    let one = json!([{"name": "g", "exactly": {"deviceClassName": "gpu.gpuplace.io"}}]);
    assert_eq!(shape(one, numa.clone()).unwrap().options[0].count(), 1);
    let counts = |s: ClaimShape| s.options.iter().map(ClaimOption::count).collect::<Vec<_>>();
    // A constraint that names one request of one GPU is met beside a request of two.
    let beside = json!([{"name": "a", "exactly": {"deviceClassName": "gpu.gpuplace.io"}},
        {"name": "b", "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": 2}}]);
    let on_a = json!([{"distinctAttribute": "gpu.gpuplace.io/numaNode", "requests": ["a"]}]);
    assert_eq!(counts(shape(beside.clone(), on_a).unwrap()), [3]);
    let on_b = json!([{"distinctAttribute": "gpu.gpuplace.io/numaNode", "requests": ["b"]}]);
    assert!(shape(beside, on_b).unwrap_err().contains("does not spread"));
    let listed = json!([{"name": "g", "firstAvailable": subrequests(3)}]);
    assert_eq!(counts(shape(listed.clone(), numa).unwrap()), [1]);
    let on_g = json!([{"distinctAttribute": "gpu.gpuplace.io/numaNode", "requests": ["g"]}]);
    assert_eq!(counts(shape(listed.clone(), on_g).unwrap()), [1]);
    assert_eq!(counts(shape(listed, json!(null)).unwrap()), [3, 2, 1]);
}

/// `n` subrequests of whole GPUs, asking n, n-1, ... 1 devices.
fn subrequests(n: u32) -> serde_json::Value {
    (0..n)
        .map(|i| json!({"name": format!("s{i}"), "deviceClassName": "gpu.gpuplace.io", "count": n - i}))
        .collect()
}

#[test]
fn first_available_subrequests_are_the_claims_ways_in_order() {
    let s = shape(
        json!([{"name": "a", "firstAvailable": [
                    {"name": "eight", "deviceClassName": "gpu.gpuplace.io", "count": 8},
                    {"name": "other", "deviceClassName": "fpga.example.com"},
                    {"name": "four", "deviceClassName": "gpu.gpuplace.io", "count": 4}]},
               {"name": "b", "firstAvailable": [
                    {"name": "h100", "deviceClassName": "gpu.gpuplace.io",
                     "selectors": [{"cel": {"expression": "device.attributes[\"gpu.gpuplace.io\"].model == \"H100\""}}]},
                    {"name": "any", "deviceClassName": "gpu.gpuplace.io"}]},
               {"name": "c", "exactly": {"deviceClassName": "gpu.gpuplace.io"}}]),
        json!(null),
    )
    .unwrap();
    let ways: Vec<Vec<(&str, u32)>> = s
        .options
        .iter()
        .map(|o| {
            o.requests
                .iter()
                .map(|r| (r.name.as_str(), r.count))
                .collect()
        })
        .collect();
    assert_eq!(
        ways,
        [
            vec![("a/eight", 8), ("b/h100", 1), ("c", 1)],
            vec![("a/eight", 8), ("b/any", 1), ("c", 1)],
            vec![("a/four", 4), ("b/h100", 1), ("c", 1)],
            vec![("a/four", 4), ("b/any", 1), ("c", 1)],
        ]
    );
    assert!(s.options[0].requests[1].selectors.is_some());
    assert!(s.options[1].requests[1].selectors.is_none());
    // A share is one device in a request alone: the ways that break it are left out.
    let share = shape(
        json!([{"name": "g", "firstAvailable": [
            {"name": "two-halves", "deviceClassName": "gpu-share.gpuplace.io", "count": 2,
             "capacity": {"requests": {"milli": "500"}}},
            {"name": "half", "deviceClassName": "gpu-share.gpuplace.io",
             "capacity": {"requests": {"milli": "500"}}}]}]),
        json!(null),
    )
    .unwrap();
    assert_eq!(share.options.len(), 1);
    assert_eq!(share.options[0].requests[0].name, "g/half");
}

fn first_plan(
    driver: &str,
    namespace: &str,
    uid: &str,
    refs: &[PodClaimRef],
    claims: &impl ClaimLookup,
) -> Result<ClaimPlan, String> {
    plans_of(driver, namespace, uid, refs, claims).map(|plans| plans.into_iter().next().unwrap())
}

fn choosing(name: &str, counts: &[u32]) -> ResourceClaim {
    let subrequests: Vec<serde_json::Value> = counts
        .iter()
        .map(|c| json!({"name": format!("n{c}"), "deviceClassName": "gpu.gpuplace.io", "count": c}))
        .collect();
    claim(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"), "resourceVersion": "3"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}}
    }))
}

#[test]
fn a_pods_plans_are_its_claims_ways_combined_and_each_writes_its_own() {
    let claims = known(&[
        choosing("x", &[4, 2]),
        choosing("y", &[2, 1]),
        whole("z", 1),
    ]);
    let refs = [named("x", "x"), named("y", "y"), named("z", "z")];
    let plans = plans_of("gpu.gpuplace.io", "ml", "ub", &refs, &claims).unwrap();
    let counts: Vec<(u32, &[usize])> = plans
        .iter()
        .map(|p| (p.count, p.picks.as_slice()))
        .collect();
    assert_eq!(
        counts,
        [
            (7, &[0, 0, 0][..]),
            (6, &[0, 1, 0][..]),
            (5, &[1, 0, 0][..]),
            (4, &[1, 1, 0][..])
        ]
    );
    let pod = PodKey {
        namespace: "ml".into(),
        name: "b".into(),
        uid: "ub".into(),
    };
    let gpus: Vec<PlacedGpu> = (0..4)
        .map(|index| PlacedGpu {
            index,
            memory_mib: 81920,
        })
        .collect();
    let writes = writes_for(&plans[3], &pod, "n1", &gpus).unwrap();
    let asked: Vec<Vec<(String, String)>> = writes
        .iter()
        .map(|w| {
            let results = w.allocation.as_ref().unwrap().devices.as_ref().unwrap();
            results
                .results
                .iter()
                .flatten()
                .map(|r| (r.request.clone(), r.device.clone()))
                .collect()
        })
        .collect();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        asked,
        [
            pairs(&[("gpu/n2", "gpu-0"), ("gpu/n2", "gpu-1")]),
            pairs(&[("gpu/n1", "gpu-2")]),
            pairs(&[("gpu", "gpu-3")])
        ]
    );
    // Past the bound the pod is told so.
    let many = known(&[
        choosing("p", &[1, 2, 3, 4, 5]),
        choosing("q", &[1, 2, 3, 4]),
    ]);
    let e = plans_of(
        "gpu.gpuplace.io",
        "ml",
        "ub",
        &[named("p", "p"), named("q", "q")],
        &many,
    )
    .unwrap_err();
    assert!(e.contains("20 combinations"), "{e}");
    // Many claims of two ways each: counted without overflowing, and refused.
    let names: Vec<String> = (0..70).map(|i| format!("c{i}")).collect();
    let lots = known(
        &names
            .iter()
            .map(|n| choosing(n, &[2, 1]))
            .collect::<Vec<_>>(),
    );
    let refs: Vec<PodClaimRef> = names.iter().map(|n| named(n, n)).collect();
    let e = plans_of("gpu.gpuplace.io", "ml", "ub", &refs, &lots).unwrap_err();
    assert!(e.contains("more than can be counted"), "{e}");
}

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

#[test]
fn a_pods_claims_are_named_directly_or_through_its_status() {
    let p = pod(json!({
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [], "resourceClaims": [
            {"name": "shared", "resourceClaimName": "big"},
            {"name": "own", "resourceClaimTemplateName": "t"},
            {"name": "later", "resourceClaimTemplateName": "t"},
            {"name": "none", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [
            {"name": "own", "resourceClaimName": "p-own-x2"}, {"name": "none"}]}
    }));
    let refs = refs_of(&p);
    let named: Vec<(&str, Option<&str>)> = refs
        .iter()
        .map(|r| (r.name.as_str(), r.claim.as_deref()))
        .collect();
    assert_eq!(
        named,
        [
            ("shared", Some("big")),
            ("own", Some("p-own-x2")),
            ("later", None)
        ]
    );
}

struct Claims(HashMap<(String, String), Arc<ClaimInfo>>);

impl ClaimLookup for Claims {
    fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<ClaimInfo>> {
        self.0.get(&(namespace.to_string(), name.to_string()))
    }
}

fn known(claims: &[ResourceClaim]) -> Claims {
    Claims(
        claims
            .iter()
            .map(|c| {
                let info = ClaimInfo::of(c, &DraSettings::default());
                ((info.namespace.clone(), info.name.clone()), Arc::new(info))
            })
            .collect(),
    )
}

fn named(name: &str, claim: &str) -> PodClaimRef {
    PodClaimRef {
        name: name.into(),
        claim: Some(claim.into()),
    }
}

fn whole(name: &str, count: u32) -> ResourceClaim {
    claim(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"), "resourceVersion": "3"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.gpuplace.io", "count": count}}]}}
    }))
}

fn allocated(name: &str, node: &str, devices: &[&str], users: &[(&str, &str)]) -> ResourceClaim {
    let mut c = whole(name, devices.len() as u32);
    c.metadata.finalizers = Some(vec![DELETE_PROTECTION.into()]);
    c.status = Some(
        serde_json::from_value(json!({
            "allocation": {
                "devices": {"results": devices.iter().map(|d| json!({
                    "request": "gpu", "driver": "gpu.gpuplace.io", "pool": node, "device": d}))
                    .collect::<Vec<_>>()},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": users.iter().map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u}))
                .collect::<Vec<_>>()
        }))
        .unwrap(),
    );
    c
}

#[test]
fn a_pending_pod_allocates_its_new_claims_and_joins_allocated_ones() {
    let claims = known(&[
        whole("mine", 2),
        allocated("shared", "n3", &["gpu-1"], &[("a", "ua")]),
    ]);
    let plan = first_plan(
        "gpu.gpuplace.io",
        "ml",
        "ub",
        &[named("x", "mine"), named("y", "shared")],
        &claims,
    )
    .unwrap();
    assert_eq!(plan.count, 2);
    assert_eq!(plan.allocate.len(), 1);
    assert_eq!(plan.join.len(), 1);
    assert_eq!(plan.node.as_deref(), Some("n3"));
    let waiting = first_plan(
        "gpu.gpuplace.io",
        "ml",
        "ub",
        &[named("x", "gone")],
        &claims,
    );
    assert_eq!(waiting.unwrap_err(), "waiting for ResourceClaim ml/gone");
    let template = PodClaimRef {
        name: "t".into(),
        claim: None,
    };
    assert!(
        first_plan("gpu.gpuplace.io", "ml", "ub", &[template], &claims)
            .unwrap_err()
            .contains("made from its template")
    );
    let split = known(&[
        allocated("a", "n1", &["gpu-0"], &[]),
        allocated("b", "n2", &["gpu-0"], &[]),
    ]);
    assert!(
        first_plan(
            "gpu.gpuplace.io",
            "ml",
            "u",
            &[named("a", "a"), named("b", "b")],
            &split
        )
        .unwrap_err()
        .contains("two nodes")
    );
}

#[test]
fn the_writes_give_each_request_its_devices_and_the_undo_takes_them_back() {
    let claims = known(&[
        whole("mine", 2),
        allocated("shared", "n3", &["gpu-1"], &[("a", "ua")]),
    ]);
    let plan = first_plan(
        "gpu.gpuplace.io",
        "ml",
        "ub",
        &[named("x", "mine"), named("y", "shared")],
        &claims,
    )
    .unwrap();
    let pod = PodKey {
        namespace: "ml".into(),
        name: "b".into(),
        uid: "ub".into(),
    };
    let gpus = [4, 5].map(|index| PlacedGpu {
        index,
        memory_mib: 81920,
    });
    let writes = writes_for(&plan, &pod, "n3", &gpus).unwrap();
    assert_eq!(writes.len(), 2);
    let first = &writes[0];
    assert_eq!(
        first.finalizers.as_deref(),
        Some(&[DELETE_PROTECTION.to_string()][..])
    );
    let allocation = first.allocation.as_ref().unwrap();
    let results = allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap();
    let devices: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(devices, ["gpu-4", "gpu-5"]);
    assert!(results.iter().all(|r| r.pool == "n3" && r.request == "gpu"));
    let id = results[0].share_id.as_deref().unwrap();
    assert_eq!(id.len(), 36);
    assert_eq!(id, id.to_lowercase());
    assert_eq!(first.reserved_for.len(), 1);
    let joined = &writes[1];
    assert!(joined.allocation.is_none() && joined.finalizers.is_none());
    let users: Vec<&str> = joined.reserved_for.iter().map(|u| u.uid.as_str()).collect();
    assert_eq!(users, ["ua", "ub"]);
    assert!(writes_for(&plan, &pod, "n3", &gpus[..1]).is_err());

    // Undo: out of reservedFor; the allocation cleared only where the write made it and
    // no user is left.
    let now_mine = ClaimInfo::of(
        &allocated("mine", "n3", &["gpu-4", "gpu-5"], &[("b", "ub")]),
        &DraSettings::default(),
    );
    let undo = undo_patch(first, &now_mine).unwrap();
    assert_eq!(undo["status"]["allocation"], serde_json::Value::Null);
    assert!(
        undo["status"]
            .as_object()
            .unwrap()
            .contains_key("allocation")
    );
    let now_shared = ClaimInfo::of(
        &allocated("shared", "n3", &["gpu-1"], &[("a", "ua"), ("b", "ub")]),
        &DraSettings::default(),
    );
    let undo = undo_patch(joined, &now_shared).unwrap();
    assert!(
        !undo["status"]
            .as_object()
            .unwrap()
            .contains_key("allocation")
    );
    assert_eq!(undo["status"]["reservedFor"].as_array().unwrap().len(), 1);
    let untouched = ClaimInfo::of(&whole("mine", 2), &DraSettings::default());
    assert!(undo_patch(first, &untouched).is_none());
}

#[test]
fn the_index_knows_which_devices_claims_hold_as_they_change() {
    use super::store::ClaimIndex;
    let mut index = ClaimIndex::default();
    let pod = PodKey {
        namespace: "ml".into(),
        name: "b".into(),
        uid: "ub".into(),
    };
    let plan = first_plan(
        "gpu.gpuplace.io",
        "ml",
        "ub",
        &[named("x", "mine")],
        &known(&[whole("mine", 1)]),
    )
    .unwrap();
    let gpu = [PlacedGpu {
        index: 3,
        memory_mib: 81920,
    }];
    let write = &writes_for(&plan, &pod, "n1", &gpu).unwrap()[0];
    assert_eq!(index.taken(write), None);
    let other = |devices: &[&str]| {
        ClaimInfo::of(
            &allocated("other", "n1", devices, &[]),
            &DraSettings::default(),
        )
    };
    index.apply(other(&["gpu-3"]));
    assert!(index.taken(write).unwrap().contains("gpu-3"));
    // Reallocated elsewhere (a new version of the claim), then deleted: free again.
    index.apply(other(&["gpu-4"]));
    assert_eq!(index.taken(write), None);
    index.apply(other(&["gpu-3"]));
    index.remove("ml", "other");
    assert_eq!(index.taken(write), None);
    // The claim's own allocation never counts against it.
    index.apply(ClaimInfo::of(
        &allocated("mine", "n1", &["gpu-3"], &[("b", "ub")]),
        &DraSettings::default(),
    ));
    let mut mine = write.clone();
    mine.uid = "u-mine".into();
    assert_eq!(index.taken(&mine), None);
}
