//! The live GPU map in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs) drives `/ui` served over the in-memory API
//! while the real loop schedules, the way it is served off loopback: over TLS, behind the
//! sign-in form (a ServiceAccount token, reviewed by the in-memory API server). The map shows the GPUs the cluster holds, a pod bound
//! during the test appears on its GPUs within a second, a pending pod shows its reason,
//! and hostile text from annotations stays text. A screenshot is kept in
//! `target/tmp/gpu-map.png`.

mod webdriver;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use gpuplace_model::NodeInventory;
use gpuplace_scheduler::Scheduler;
use gpuplace_scheduler::ui::{self, Ui};
use gpuplace_testkit::MemoryApi;
use serde_json::json;
use webdriver::Browser;

const HOSTILE_MODEL: &str = "<img src=x onerror=\"window.__xss=1\">";
const HOSTILE_VALUE: &str = "<script>window.__xss=2</script>";

fn hostile_node(name: &str) -> k8s_openapi::api::core::v1::Node {
    let mut inv = NodeInventory::uniform(name, 0, 0, 4, HOSTILE_MODEL);
    for g in &mut inv.gpus {
        g.id = format!("GPU-{name}-{}", g.index);
        g.uuid = g.id.clone();
    }
    node(
        name,
        4,
        json!({"metadata": {"annotations": {"gpuplace.io/inventory": inv.to_json()}}}),
    )
}

/// Whether the card of `node` shows exactly `used` GPU positions as held whole.
const CELLS_HELD: &str = "
    const card = document.querySelector('.card[data-node=\"' + arguments[0] + '\"]');
    if (!card) return false;
    const held = [...card.querySelectorAll('.gpu')].filter(c => c.dataset.use === '#').map(c => Number(c.dataset.gpu));
    return JSON.stringify(held.sort()) === JSON.stringify(arguments[1].slice().sort());";

fn whole_gpus(api: &MemoryApi, pod: &str) -> (String, Vec<u32>) {
    let a = assignment(api, pod).expect("bound with an assignment");
    let mut gpus: Vec<u32> = a.devices().map(|d| d.index).collect();
    gpus.sort();
    gpus.dedup();
    (a.node.clone(), gpus)
}

#[test]
fn the_map_shows_the_cluster_in_a_real_browser() {
    let Some((chromium, driver)) = webdriver::browsers() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs chromium and chromium-driver; they are missing"
        );
        eprintln!(
            "skipped: no /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver)"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let api = MemoryApi::new();
    api.put_node(nvlink_node("dgx-a"));
    api.put_node(hostile_node("odd-b"));
    api.put_pod(pod("train-2", 2, json!({})));
    api.put_pod(pod("huge-16", 16, json!({})));
    api.put_pod(pod(
        "hostile",
        1,
        json!({"metadata": {"annotations": {"gpuplace.io/gpu-memory-min": HOSTILE_VALUE}}}),
    ));
    let mut scheduler = Scheduler::new(api.clone(), config());
    let map = Arc::new(Ui::new("nvidia.com/gpu"));
    map.attach(api.clone(), scheduler.reasons());
    let start = Instant::now();
    rt.block_on(scheduler.round(start)).expect("a round");
    let dir = tempfile::tempdir().expect("a dir");
    let (source, _) = crate::access::certificate(dir.path());
    let tokens = crate::access::grant(&api);
    let addr = rt.block_on(crate::access::serve(&api, ui::router(map), &source));

    let browser = Browser::start(&chromium, &driver);
    browser.goto(&format!("https://{addr}/ui"));
    let form = browser.wait_for(
        "return document.querySelector('form[action=\"/ui/login\"]') !== null && document.querySelectorAll('.card').length === 0",
        json!([]),
        Duration::from_secs(20),
    );
    assert!(
        form.is_some(),
        "without a token the map shows its sign-in form only"
    );
    browser.run(
        "document.querySelector('input[name=token]').value = arguments[0]; document.querySelector('form').submit(); return true",
        json!([tokens.admin]),
    );
    let rendered = browser.wait_for(
        "return document.querySelectorAll('.card').length === 2",
        json!([]),
        Duration::from_secs(20),
    );
    assert!(rendered.is_some(), "the map shows both nodes");

    // The GPUs the cluster holds, where its record says.
    let (node, gpus) = whole_gpus(&api, "train-2");
    assert_eq!(
        browser.run(CELLS_HELD, json!([node, gpus])),
        json!(true),
        "train-2's GPUs {gpus:?} on {node}"
    );
    let tip = browser.run(
        "return document.querySelector('.card[data-node=\"' + arguments[0] + '\"] .gpu[data-gpu=\"' + arguments[1] + '\"]').title",
        json!([node, gpus[0]]),
    );
    assert!(
        tip.as_str().unwrap_or_default().contains("ml/train-2"),
        "{tip}"
    );

    // A pending pod shows its reason.
    let reason = browser.run(
        "const row = document.querySelector('#pending tr[data-pod=\"ml/huge-16\"]'); return row ? row.textContent : '';",
        json!([]),
    );
    assert!(
        reason
            .as_str()
            .unwrap_or_default()
            .contains("nodes are available"),
        "{reason}"
    );

    // A pod bound now appears on its GPUs within a second.
    api.put_pod(pod("late-4", 4, json!({})));
    rt.block_on(scheduler.round(start + Duration::from_secs(1)))
        .expect("a round");
    let (late_node, late_gpus) = whole_gpus(&api, "late-4");
    let mut want = late_gpus.clone();
    if late_node == node {
        want.extend(&gpus);
    }
    let took = browser.wait_for(CELLS_HELD, json!([late_node, want]), Duration::from_secs(1));
    assert!(
        took.is_some(),
        "late-4 on {late_node} GPUs {late_gpus:?} within a second"
    );
    eprintln!(
        "late-4 appeared on the map {} ms after its Binding",
        took.unwrap_or_default().as_millis()
    );

    // Hostile text is shown as text: no element or script came of it.
    let injected = browser.run(
        "return [typeof window.__xss, document.querySelectorAll('img').length, document.scripts.length]",
        json!([]),
    );
    assert_eq!(injected, json!(["undefined", 0, 1]));
    let body = browser.run("return document.body.textContent", json!([]));
    let body = body.as_str().unwrap_or_default();
    assert!(body.contains(HOSTILE_MODEL), "the model shown literally");
    assert!(
        body.contains(HOSTILE_VALUE),
        "the annotation shown literally"
    );

    // A node's topology: its NVLink pairs drawn between its GPUs.
    browser.run(
        "document.querySelector('.card[data-node=\"dgx-a\"]').click(); return true",
        json!([]),
    );
    let drawn = browser.wait_for(
        "return document.querySelectorAll('#topology circle').length === 8 && document.querySelectorAll('#topology line.link').length === 4",
        json!([]),
        Duration::from_secs(5),
    );
    assert!(drawn.is_some(), "dgx-a's 8 GPUs and 4 NVLink pairs drawn");

    // Who is signed in, and that every namespace's pods are named to them.
    let viewer = browser.run(
        "return document.getElementById('viewer').textContent",
        json!([]),
    );
    assert!(
        viewer
            .as_str()
            .unwrap_or_default()
            .contains("system:serviceaccount:ops:admin (pods of every namespace)"),
        "{viewer}"
    );

    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu-map.png");
    std::fs::write(&path, png).expect("the screenshot kept");
    eprintln!("screenshot: {}", path.display());
    drop(browser);
}
