//! Fuzzing with properties, not only "no panic": a record or object that decodes encodes
//! back to the same meaning; a number out of its range is refused by name; gpuplace's own
//! CRDs (PodGroup, Queue) decode object by object with the same rules the scheduler's
//! watch uses; the device plugin's gRPC requests (Allocate, GetPreferredAllocation,
//! PreStartContainer device IDs) are answered with devices of the request or refused.

use std::sync::Arc;

use gpuplace_deviceplugin::devices::DeviceTable;
use gpuplace_model::{Allocated, Assignment, NodeInventory};
use gpuplace_scheduler::k8s::gang::PodGroup;
use gpuplace_scheduler::k8s::queue::Queue;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Numbers around every edge the decoders care about.
fn edge() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0u64..200).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => prop::sample::select(vec![
            json!(0), json!(-1), json!(4_294_967_295u64), json!(4_294_967_296u64),
            json!(1.5), json!("3"), json!(null), json!(1e300), json!(u64::MAX),
        ]),
    ]
}

/// Short text: names, models, keys.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{0,12}",
        any::<String>().prop_map(|s| s.chars().take(12).collect()),
    ]
}

fn shares() -> impl Strategy<Value = Vec<Value>> {
    prop::collection::vec(
        (word(), 0u32..2000).prop_map(|(id, milli)| json!({"id": id, "milli": milli})),
        0..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Assignment and Allocated records: what decodes re-encodes to itself.
    #[test]
    fn records_that_decode_encode_back_to_the_same(
        node in word(), names in prop::collection::vec(word(), 0..3),
        devices in shares(), extra in any::<bool>(),
    ) {
        let containers: Vec<Value> = names.iter()
            .map(|n| json!({"name": n, "devices": devices.clone()}))
            .collect();
        let mut assignment = json!({"node": node, "containers": containers, "policy": "fgd",
            "time": "2026-12-03T00:00:00Z"});
        if extra {
            assignment["unknown"] = json!(1);
        }
        let text = assignment.to_string();
        if let Ok(a) = Assignment::from_json(&text) {
            prop_assert_eq!(Assignment::from_json(&a.to_json()), Ok(a));
        }
        let allocated = json!({"node": node, "containers": containers}).to_string();
        if let Ok(a) = Allocated::from_json(&allocated) {
            prop_assert_eq!(Allocated::from_json(&a.to_json()), Ok(a));
        }
    }

    /// The inventory annotation: it decodes exactly when it validates, and what decodes
    /// encodes back to the same inventory.
    #[test]
    fn inventories_decode_when_valid_and_encode_back(
        name in word(), cpu in any::<u64>(), memory in any::<u64>(), count in 0u32..12,
        model in word(), replicas in 0u32..80, drop_id in any::<bool>(),
    ) {
        let mut inv = NodeInventory::uniform(&name, cpu, memory, count, &model);
        inv.replicas = replicas;
        if drop_id && let Some(g) = inv.gpus.last_mut() {
            g.id.clear();
        }
        let back = NodeInventory::from_json(&inv.to_json());
        match inv.validate() {
            Ok(()) => prop_assert_eq!(back.ok(), Some(inv)),
            Err(e) => {
                let refused = back.expect_err("an invalid inventory is refused");
                prop_assert_eq!(refused.to_string(), e.to_string());
            }
        }
    }

    /// A PodGroup decodes exactly when its numbers fit their types; what decodes encodes
    /// back to the same object; what does not names the number.
    #[test]
    fn podgroups_decode_when_their_numbers_fit(
        min_member in edge(), timeout in edge(), key in word(),
    ) {
        let object = json!({"apiVersion": "gpuplace.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ml"},
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": timeout, "topologyKey": key}});
        let fits_u32 = min_member.as_u64().is_some_and(|n| n <= u64::from(u32::MAX));
        let fits_u64 = timeout.is_null() || timeout.as_u64().is_some();
        match serde_json::from_value::<PodGroup>(object) {
            Ok(g) => {
                prop_assert!(fits_u32 && fits_u64, "{min_member} / {timeout} accepted");
                let again: PodGroup = serde_json::from_value(serde_json::to_value(&g).unwrap()).unwrap();
                prop_assert_eq!(again.spec, g.spec);
            }
            Err(e) => {
                prop_assert!(!fits_u32 || !fits_u64, "{min_member} / {timeout} refused: {e}");
                let said = e.to_string();
                let bad = if fits_u32 { &timeout } else { &min_member };
                let named = match bad {
                    Value::Number(n) => said.contains(&n.to_string()) || said.contains("invalid type"),
                    _ => said.contains("invalid type"),
                };
                prop_assert!(named, "{said} does not name {bad}");
            }
        }
    }

    /// A Queue decodes or is refused whole (one bad field refuses the object, which the
    /// scheduler's watch then skips alone); what decodes encodes back to the same.
    #[test]
    fn queues_decode_or_are_refused_and_encode_back(
        weight in edge(), amount in edge(), pending in edge(), parent in word(),
    ) {
        let object = json!({"apiVersion": "gpuplace.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "q"},
            "spec": {"weight": weight, "parent": parent,
                "guaranteed": {"nvidia.com/gpu": amount}, "limit": {"nvidia.com/gpu": amount}},
            "status": {"pendingPods": pending}});
        if let Ok(q) = serde_json::from_value::<Queue>(object) {
            let again: Queue = serde_json::from_value(serde_json::to_value(&q).unwrap()).unwrap();
            prop_assert_eq!(again.spec, q.spec);
            prop_assert_eq!(again.status, q.status);
        } else {
            // `pendingPods` has a default when absent, but null is not a count.
            let pending_fits = pending.as_u64().is_some_and(|n| n <= u64::from(u32::MAX));
            let weight_fits = weight.is_null() || weight.is_number();
            prop_assert!(!pending_fits || !weight_fits, "refused with {weight} / {pending}");
        }
    }

    /// The device plugin's requests: Allocate and PreStartContainer resolve exactly the
    /// IDs asked (each a device of the table) or are refused; a preferred allocation is
    /// `size` IDs of the available ones holding every must-include, or refused.
    #[test]
    fn device_requests_are_answered_with_their_own_devices_or_refused(
        replicas in 1u32..4, shares in any::<bool>(),
        picks in prop::collection::vec((0usize..6, 0u32..1200, any::<bool>()), 0..6),
        junk in word(), must in 0usize..3, size in -2i64..8,
    ) {
        let shares = shares && replicas == 1;
        let mut inv = NodeInventory::uniform("n", 8_000, 65_536, 4, "A100");
        for g in &mut inv.gpus {
            g.id = format!("GPU-{}", g.index);
            g.uuid = g.id.clone();
        }
        inv.replicas = replicas;
        let table = DeviceTable::with_shares(Arc::new(inv), replicas, shares);
        let ids: Vec<String> = picks.iter().map(|&(g, m, slice)| match (g, slice) {
            (4, _) => junk.clone(),
            (5, _) => format!("GPU-{g}"),
            (g, true) => format!("GPU-{g}::m{m}"),
            (g, false) if replicas > 1 => format!("GPU-{g}::{}", m % replicas),
            (g, false) => format!("GPU-{g}"),
        }).collect();
        for slices in [false, true] {
            if let Ok(devices) = table.resolve_kind(&ids, true, slices) {
                prop_assert_eq!(devices.len(), ids.len());
                for d in devices {
                    prop_assert!(ids.contains(&d.id), "{} not asked for", d.id);
                    prop_assert_eq!(d.slice, slices);
                }
            }
        }
        let must_include: Vec<String> = ids.iter().take(must).cloned().collect();
        if let Ok((chosen, _)) = table.preferred(&ids, &must_include, size) {
            prop_assert_eq!(chosen.len() as i64, size);
            for id in &chosen {
                prop_assert!(ids.contains(id), "{id} not available");
            }
            for id in &must_include {
                prop_assert!(chosen.contains(id), "{id} must be included");
            }
        }
    }

    /// The device plugin's settings: a number out of its range is refused, naming it.
    #[test]
    fn plugin_settings_out_of_range_are_refused_by_name(
        replicas in any::<u32>(), poll in any::<u64>(),
    ) {
        let settings = gpuplace_deviceplugin::Settings {
            replicas: Some(replicas),
            poll_interval_ms: Some(poll),
            shares: Some(false),
            ..Default::default()
        };
        let ok_replicas = (1..=64).contains(&replicas);
        let ok_poll = (50..=60_000).contains(&poll);
        match settings.resolve() {
            Ok(_) => prop_assert!(ok_replicas && ok_poll),
            Err(e) => {
                let said = e.to_string();
                prop_assert!(!ok_replicas || !ok_poll, "{said}");
                if !ok_replicas {
                    prop_assert!(said.contains("replicas") && said.contains(&replicas.to_string()), "{said}");
                } else {
                    prop_assert!(said.contains(&poll.to_string()), "{said}");
                }
            }
        }
    }
}
