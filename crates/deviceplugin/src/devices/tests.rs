use super::*;
use gpuplace_model::{Link, PcieLevel};

fn four() -> Arc<NodeInventory> {
    let mut node = NodeInventory::uniform("n", 1, 1, 4, "A100");
    for (i, g) in node.gpus.iter_mut().enumerate() {
        g.id = format!("GPU-{i}");
        g.uuid = g.id.clone();
        g.numa_node = Some(i as u32 / 2);
    }
    for a in 0..4u32 {
        for b in a + 1..4 {
            let pair = a / 2 == b / 2;
            node.links.push(Link {
                a,
                b,
                nvlinks: if pair { 4 } else { 0 },
                pcie: if pair {
                    PcieLevel::SameCpu
                } else {
                    PcieLevel::CrossCpu
                },
            });
        }
    }
    Arc::new(node)
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn replicas_are_advertised_and_map_back() {
    let table = DeviceTable::new(four(), 2);
    let list = table.list();
    assert_eq!(list.len(), 8);
    assert_eq!(list[1].id, "GPU-0::1");
    assert_eq!(list[2].topology.as_ref().unwrap().nodes[0].id, 0);
    let devices = table
        .resolve(&ids(&["GPU-0::1", "GPU-0::0", "GPU-3::0"]), true)
        .unwrap();
    assert_eq!(table.physical(&devices), vec![0, 3]);
}

#[test]
fn bad_ids_are_named() {
    let mut inv = (*four()).clone();
    inv.gpus[2].healthy = false;
    let table = DeviceTable::new(Arc::new(inv), 1);
    assert_eq!(
        table
            .resolve(&ids(&["GPU-9"]), true)
            .unwrap_err()
            .to_string(),
        "unknown device ID \"GPU-9\""
    );
    assert_eq!(
        table.resolve(&ids(&["GPU-0", "GPU-0"]), true).unwrap_err(),
        DeviceIdError::Duplicate("GPU-0".into())
    );
    assert_eq!(
        table.resolve(&ids(&["GPU-2"]), true).unwrap_err(),
        DeviceIdError::Unhealthy("GPU-2".into())
    );
    assert_eq!(table.resolve(&[], true).unwrap_err(), DeviceIdError::Empty);
}

#[test]
fn preferred_keeps_pairs_and_honours_must_include() {
    let table = DeviceTable::new(four(), 1);
    let all = ids(&["GPU-0", "GPU-1", "GPU-2", "GPU-3"]);
    let (set, score) = table.preferred(&all, &[], 2).unwrap();
    assert_eq!(set, ids(&["GPU-0", "GPU-1"]));
    assert_eq!(score, 420);
    let (set, _) = table.preferred(&all, &ids(&["GPU-3"]), 2).unwrap();
    assert_eq!(set, ids(&["GPU-3", "GPU-2"]));
    // One GPU out of 1, 2, 3: take 1, whose partner is gone, not half of 2-3.
    let (set, _) = table
        .preferred(&ids(&["GPU-1", "GPU-2", "GPU-3"]), &[], 1)
        .unwrap();
    assert_eq!(set, ids(&["GPU-1"]));
    assert!(matches!(
        table.preferred(&all, &[], 5),
        Err(PreferenceError::Size { .. })
    ));
    assert!(matches!(
        table.preferred(&all, &[], 0),
        Err(PreferenceError::Size { .. })
    ));
    assert!(matches!(
        table.preferred(&ids(&["GPU-0"]), &ids(&["GPU-1"]), 1),
        Err(PreferenceError::MustNotAvailable(_))
    ));
    assert!(matches!(
        table.preferred(&all, &ids(&["GPU-0", "GPU-1"]), 1),
        Err(PreferenceError::MustExceedsSize { .. })
    ));
}

#[test]
fn shares_are_slices_of_one_gpu_within_1000_milli() {
    let table = DeviceTable::with_shares(four(), 1, true);
    assert!(table.shares());
    assert_eq!(table.list().len(), 4);
    let slices: Vec<String> = table.list_slices().into_iter().map(|d| d.id).collect();
    assert_eq!(slices.len(), 4000);
    assert_eq!(slices[1001], "GPU-1::m1");
    assert_eq!(slice_gpu("GPU-1::m1"), Some("GPU-1"));
    assert_eq!(slice_gpu("GPU-1::1"), None);
    assert_eq!(slice_gpu("GPU-1::m"), None);
    // Each resource takes only its own devices.
    assert_eq!(
        table
            .resolve_kind(&ids(&["GPU-0"]), true, true)
            .unwrap_err(),
        DeviceIdError::WrongResource("GPU-0".into())
    );
    assert!(table.resolve_kind(&ids(&["GPU-0::m5"]), true, true).is_ok());
    // GPU 0 wholly used, GPU 1 holding 700 milli of shares.
    let mut in_use: Vec<String> = vec!["GPU-0".into()];
    in_use.extend((0..700).map(|k| format!("GPU-1::m{k}")));
    let usage = table.usage(in_use.iter().map(String::as_str));
    assert_eq!(usage, vec![1000, 700, 0, 0]);
    let offered: Vec<String> = slices
        .iter()
        .filter(|id| !in_use.contains(id))
        .cloned()
        .collect();
    // The plan is answered with its GPU's slices.
    let (got, fits) = table
        .slices_for(&offered, &[], 250, &usage, Some("GPU-1"))
        .unwrap();
    assert!(fits);
    assert_eq!(got.len(), 250);
    assert!(got.iter().all(|id| slice_gpu(id) == Some("GPU-1")));
    // Without a plan: the fullest GPU with room (GPU 1), never the wholly used GPU 0.
    let (got, _) = table.slices_for(&offered, &[], 300, &usage, None).unwrap();
    assert!(got.iter().all(|id| slice_gpu(id) == Some("GPU-1")));
    let (got, fits) = table.slices_for(&offered, &[], 301, &usage, None).unwrap();
    assert!(fits);
    assert!(
        got.iter().all(|id| slice_gpu(id) == Some("GPU-2")),
        "{:?}",
        &got[..3]
    );
    // Slices reused from an init container fix the GPU.
    let must: Vec<String> = (900..950).map(|k| format!("GPU-3::m{k}")).collect();
    let (got, _) = table
        .slices_for(&offered, &must, 100, &usage, Some("GPU-2"))
        .unwrap();
    assert_eq!(got.len(), 100);
    assert!(got.iter().all(|id| slice_gpu(id) == Some("GPU-3")));
    assert!(matches!(
        table.slices_for(&offered, &[], 0, &usage, None),
        Err(PreferenceError::Size { .. })
    ));
    // A whole GPU is never one with shares in use while another is free.
    let whole = ids(&["GPU-1", "GPU-2", "GPU-3"]);
    let (got, _) = table.preferred_avoiding(&whole, &[], 2, &usage).unwrap();
    assert_eq!(got, ids(&["GPU-2", "GPU-3"]));
    let (got, _) = table.preferred_avoiding(&whole, &[], 3, &usage).unwrap();
    assert_eq!(got.len(), 3);
}

#[test]
fn preferred_spreads_replicas_over_good_gpus() {
    let table = DeviceTable::new(four(), 2);
    let all: Vec<String> = table.list().into_iter().map(|d| d.id).collect();
    let (set, _) = table.preferred(&all, &[], 5).unwrap();
    // One replica on each of the four GPUs before any GPU gets a second.
    assert_eq!(
        set,
        ids(&["GPU-0::0", "GPU-1::0", "GPU-2::0", "GPU-3::0", "GPU-0::1"])
    );
    let (set, _) = table.preferred(&all, &[], 2).unwrap();
    assert_eq!(set, ids(&["GPU-0::0", "GPU-1::0"]));
}
