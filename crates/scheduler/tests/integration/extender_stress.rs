//! Seeded stress of the extender's incremental state: it follows the pod store's change
//! feed instead of walking every pod, so this drives it through everything that could make
//! the feed and the state part ways: watch events up to 300 ms late, 3% each of 409s,
//! 500s and time-outs on Bindings, pods finishing (some terminating first) and deleted
//! while pending, and relists (the history compacted, so the watch lists again and the
//! feed answers "read everything"). After every step no GPU is booked twice, and whenever
//! the extender's state reflects the current view it equals a state built afresh from it.
//! Time is tokio's paused clock. `GPUPLACE_STRESS_SEED` picks one seed.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use gpuplace_scheduler::ClusterApi;
use gpuplace_scheduler::extender::http::{ExtenderMetrics, router};
use gpuplace_scheduler::extender::{Extender, ExtenderConfig, FilterMode};
use gpuplace_testkit::MemoryApi;
use gpuplace_testkit::api::{Faults, ServerCosts};
use k8s_openapi::api::core::v1::Pod;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common::*;

async fn call(app: &Router, verb: &str, body: Value) -> Value {
    let body = serde_json::to_vec(&body).unwrap();
    let response = app
        .clone()
        .oneshot(
            Request::post(format!("/{verb}"))
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn shaped(name: &str, rng: &mut ChaCha8Rng) -> Pod {
    let mut pod = match rng.random_range(0..5) {
        0 => pod(name, [2, 4, 8][rng.random_range(0..3)], json!({})),
        1 => pod(name, 1, share(["250", "500"][rng.random_range(0..2)])),
        2 => pod(
            name,
            2,
            json!({"metadata": {"annotations": {"gpuplace.io/topology": "nvlink"}}}),
        ),
        _ => pod(name, 1, json!({})),
    };
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod
}

/// kube-scheduler's side for one pod: filter, prioritize, bind on a random passing node.
/// Whether a Binding was accepted.
async fn try_schedule(app: &Router, pod: &Pod, names: &[String], rng: &mut ChaCha8Rng) -> bool {
    let filtered = call(app, "filter", json!({"Pod": pod, "NodeNames": names})).await;
    let passing: Vec<String> =
        serde_json::from_value(filtered["NodeNames"].clone()).unwrap_or_default();
    if passing.is_empty() {
        return false;
    }
    let scores = call(app, "prioritize", json!({"Pod": pod, "NodeNames": passing})).await;
    assert!(scores.as_array().is_some_and(|s| s.len() == passing.len()));
    let node = &passing[rng.random_range(0..passing.len())];
    let meta = &pod.metadata;
    let bind = json!({"PodName": meta.name, "PodNamespace": meta.namespace,
        "PodUID": meta.uid, "Node": node});
    call(app, "bind", bind).await["Error"] == ""
}

struct Tally {
    bound: usize,
    refused: usize,
    finished: usize,
    relists: usize,
    checks: usize,
    updates: gpuplace_scheduler::extender::StateUpdates,
}

async fn run(seed: u64) -> Tally {
    let api = MemoryApi::new().with_costs(ServerCosts {
        watch_delay: (Duration::ZERO, Duration::from_millis(300)),
        latency: Duration::from_millis(1),
        seed,
        ..ServerCosts::default()
    });
    api.set_faults(Faults {
        conflict: 0.03,
        error: 0.03,
        timeout: 0.03,
    });
    let mut names = Vec::new();
    for i in 0..16 {
        let name = format!("n{i:02}");
        api.put_node(if i % 2 == 0 {
            nvlink_node(&name)
        } else {
            node(&name, 4, json!({}))
        });
        names.push(name);
    }
    let mode = if seed.is_multiple_of(2) {
        FilterMode::All
    } else {
        FilterMode::Best
    };
    let extender = Arc::new(Extender::new(
        api.clone(),
        ExtenderConfig {
            filter_mode: mode,
            ..Default::default()
        },
    ));
    let app = router(Arc::clone(&extender), ExtenderMetrics::default(), 1 << 22);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tally = Tally {
        bound: 0,
        refused: 0,
        finished: 0,
        relists: 0,
        checks: 0,
        updates: Default::default(),
    };
    let mut pending: Vec<Pod> = Vec::new();
    for step in 0..1500 {
        let roll = rng.random_range(0..100);
        if roll < 55 {
            let pod = if !pending.is_empty() && rng.random_bool(0.3) {
                pending.swap_remove(rng.random_range(0..pending.len()))
            } else {
                let pod = shaped(&format!("p{step}"), &mut rng);
                api.put_pod(pod.clone());
                pod
            };
            if try_schedule(&app, &pod, &names, &mut rng).await {
                tally.bound += 1;
            } else {
                tally.refused += 1;
                pending.push(pod);
            }
        } else if roll < 90 {
            let pods = api.pods();
            if !pods.is_empty() {
                let p = &pods[rng.random_range(0..pods.len())];
                let name = p.metadata.name.clone().unwrap_or_default();
                if rng.random_bool(0.3) {
                    api.delete_pod_gracefully("ml", &name);
                } else {
                    api.delete_pod("ml", &name);
                }
                pending.retain(|q| q.metadata.name.as_deref() != Some(name.as_str()));
                tally.finished += 1;
            }
        } else if roll < 92 {
            api.compact_history();
            tally.relists += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
        assert_no_double_booking(&api);
        // Bring the extender up to now (a filter call), then compare with a fresh build.
        let probe = shaped("probe", &mut rng);
        call(&app, "filter", json!({"Pod": probe, "NodeNames": names})).await;
        let view = api.view().await.unwrap();
        match extender.verify_state(&view) {
            Ok(true) => tally.checks += 1,
            Ok(false) => {}
            Err(e) => panic!("seed {seed} step {step}: kept state differs: {e}"),
        }
    }
    tally.updates = extender.state_updates();
    tally
}

#[tokio::test(start_paused = true)]
async fn the_extender_state_follows_the_feed_through_lag_faults_relists_and_churn() {
    let seeds: Vec<u64> = match std::env::var("GPUPLACE_STRESS_SEED") {
        Ok(s) => vec![s.parse().expect("GPUPLACE_STRESS_SEED is a number")],
        Err(_) => vec![1, 2],
    };
    for seed in seeds {
        let tally = run(seed).await;
        println!(
            "seed {seed}: {} Bindings accepted, {} filters or binds refused, {} pods finished, \
             {} relists forced, the kept state equalled a fresh build at {} checks; state \
             {:?}",
            tally.bound, tally.refused, tally.finished, tally.relists, tally.checks, tally.updates
        );
        let u = tally.updates;
        assert!(
            u.updates > 5 * (u.walks + u.builds) && u.walks > 0,
            "seed {seed}: the feed carries most updates, relists are walked: {u:?}"
        );
        assert!(tally.bound > 300, "seed {seed}: only {} bound", tally.bound);
        assert!(
            tally.checks > 300,
            "seed {seed}: only {} checks",
            tally.checks
        );
    }
}
