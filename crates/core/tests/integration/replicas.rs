//! Time-sliced nodes (NVIDIA's `replicas`): one whole-GPU pod takes one replica, a share of
//! ⌊1000 / replicas⌋ milli, and gpuplace packs the replicas; bigger pods take whole GPUs.

use gpuplace_core::{ClusterState, Placer, Policy};
use gpuplace_model::NodeInventory;

use crate::common::gpus;

fn sliced(name: &str, gpus: u32, replicas: u32) -> NodeInventory {
    let mut node = NodeInventory::uniform(name, 64_000, 1 << 18, gpus, "A100");
    node.replicas = replicas;
    node
}

#[test]
fn one_gpu_pods_share_time_sliced_gpus_replica_by_replica() {
    for policy in [Policy::Fgd, Policy::BestFit, Policy::Random, Policy::Spread] {
        let mut state = ClusterState::new(vec![sliced("ts", 2, 4)]).unwrap();
        let mut placer = Placer::new(policy, 7);
        for i in 0..8 {
            let d = placer
                .place(&mut state, &gpus(1, 1000))
                .unwrap_or_else(|e| panic!("{policy:?}: pod {i}: {e:?}"));
            assert_eq!(d.gpus.len(), 1);
            assert_eq!(d.gpus[0].1, 250, "{policy:?}: a replica is a quarter");
        }
        assert!(
            placer.place(&mut state, &gpus(1, 1000)).is_err(),
            "{policy:?}"
        );
        assert_eq!(state.gpu_idle_milli(), 0);
    }
}

#[test]
fn multi_gpu_pods_take_whole_gpus_of_a_time_sliced_node() {
    let mut state = ClusterState::new(vec![sliced("ts", 4, 2)]).unwrap();
    let mut placer = Placer::new(Policy::Fgd, 1);
    let d = placer.place(&mut state, &gpus(2, 1000)).unwrap();
    assert!(d.gpus.iter().all(|&(_, m)| m == 1000));
    // Two GPUs left: four one-GPU pods (replicas), then nothing.
    for _ in 0..4 {
        assert_eq!(
            placer.place(&mut state, &gpus(1, 1000)).unwrap().gpus[0].1,
            500
        );
    }
    assert!(placer.place(&mut state, &gpus(2, 1000)).is_err());
    assert!(placer.place(&mut state, &gpus(1, 1000)).is_err());
}

#[test]
fn plain_nodes_are_unchanged_and_bad_replicas_are_refused() {
    let mut state = ClusterState::new(vec![sliced("plain", 2, 1)]).unwrap();
    let mut placer = Placer::new(Policy::Fgd, 1);
    for _ in 0..2 {
        assert_eq!(
            placer.place(&mut state, &gpus(1, 1000)).unwrap().gpus[0].1,
            1000
        );
    }
    assert!(placer.place(&mut state, &gpus(1, 1000)).is_err());
    let bad = sliced("bad", 2, 0);
    assert!(ClusterState::new(vec![bad]).is_err());
}
