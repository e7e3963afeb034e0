//! Tests of the cluster state.

use super::*;

fn cluster() -> ClusterState {
    ClusterState::new(vec![NodeInventory::uniform("a", 8000, 1000, 2, "T4")]).unwrap()
}

fn req(cpu: u64, count: u32, milli: u32) -> Request {
    Request {
        cpu_milli: cpu,
        memory_mib: 10,
        gpu_count: count,
        gpu_milli: milli,
        allowed_models: vec![],
        need: Default::default(),
    }
}

#[test]
fn apply_and_release_round_trip() {
    let mut c = cluster();
    let r = req(1000, 1, 300);
    c.apply(0, &r, &[(1, 300)]).unwrap();
    assert_eq!(c.node(0).gpu_free, vec![1000, 700]);
    assert_eq!(c.gpu_allocated_milli(), 300);
    c.release(0, &r, &[(1, 300)]).unwrap();
    assert_eq!(c.node(0).gpu_free, vec![1000, 1000]);
    assert_eq!(c.node(0).cpu_free, 8000);
    assert!(c.node(0).classes.is_empty());
}

#[test]
fn overcommit_is_refused_and_state_kept() {
    let mut c = cluster();
    c.apply(0, &req(0, 1, 800), &[(0, 800)]).unwrap();
    let err = c.apply(0, &req(0, 1, 300), &[(0, 300)]).unwrap_err();
    assert_eq!(err.to_string(), "node a: gpu 0 would be over capacity");
    assert_eq!(c.node(0).gpu_free, vec![200, 1000]);
    assert!(c.apply(0, &req(9000, 0, 0), &[]).is_err());
    assert!(
        c.apply(0, &req(0, 2, 1000), &[(1, 1000), (1, 1000)])
            .is_err()
    );
    assert!(c.release(0, &req(0, 1, 900), &[(0, 900)]).is_err());
    assert_eq!(c.node(0).gpu_free, vec![200, 1000]);
}

#[test]
fn fit_reasons() {
    let c = cluster();
    assert_eq!(c.fit(0, &req(9000, 0, 0)), Err(FitFailure::InsufficientCpu));
    assert_eq!(
        c.fit(0, &req(0, 3, 1000)),
        Err(FitFailure::InsufficientGpus)
    );
    let mut r = req(0, 1, 1000);
    r.allowed_models = vec!["A100".into()];
    assert_eq!(c.fit(0, &r), Err(FitFailure::ModelNotAllowed));
    let cpu_only = ClusterState::new(vec![NodeInventory::uniform("c", 8000, 1000, 0, "")]).unwrap();
    assert_eq!(cpu_only.fit(0, &req(0, 1, 500)), Err(FitFailure::NoGpus));
}

#[test]
fn binding_the_workload_again_keeps_the_total_fragmentation() {
    let mut c = cluster();
    c.apply(0, &req(1000, 1, 300), &[(1, 300)]).unwrap();
    let workload = Arc::new(crate::TargetWorkload::from_requests(
        [req(1000, 1, 1000), req(1000, 2, 1000)].iter(),
        1.0,
    ));
    c.set_workload(Arc::clone(&workload));
    let once = c.total_frag();
    assert!(
        once > 0.0,
        "a partly used GPU fragments for 1- and 2-GPU pods"
    );
    c.set_workload(workload);
    assert_eq!(
        c.total_frag(),
        once,
        "the same workload again: the same total"
    );
}

#[test]
fn the_change_journal_is_bounded_and_a_copy_starts_its_own() {
    let mut c = cluster();
    let r = req(1000, 1, 300);
    let first = c.instance();
    for _ in 0..JOURNAL_MAX / 2 {
        c.apply(0, &r, &[(1, 300)]).unwrap();
        c.release(0, &r, &[(1, 300)]).unwrap();
    }
    assert_eq!((c.journal_len(), c.instance()), (JOURNAL_MAX, first));
    // Full: it starts again under a new id, so an index following it rebuilds.
    c.apply(0, &r, &[(1, 300)]).unwrap();
    assert_eq!(c.journal_len(), 1);
    assert_ne!(c.instance(), first);
    // A copy is another state, with none of the history.
    let copy = c.clone();
    assert_eq!(copy.journal_len(), 0);
    assert_ne!(copy.instance(), c.instance());
    assert_eq!(copy.node(0).gpu_free, c.node(0).gpu_free);
}
