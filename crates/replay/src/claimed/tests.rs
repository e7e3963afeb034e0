use super::*;
use gpuplace_model::GpuTopology;

fn request(count: u32, milli: u32, models: &[&str]) -> Request {
    Request {
        cpu_milli: 4000,
        memory_mib: 8192,
        gpu_count: count,
        gpu_milli: milli,
        allowed_models: models.iter().map(|m| m.to_string()).collect(),
        ..Request::default()
    }
}

fn linked(count: u32, topology: GpuTopology) -> Request {
    let mut r = request(count, 1000, &[]);
    r.need.topology = topology;
    r
}

fn cluster() -> Vec<NodeInventory> {
    vec![
        NodeInventory::uniform("a", 96_000, 786_432, 8, "V100M16"),
        NodeInventory::uniform("b", 96_000, 786_432, 8, "T4"),
        NodeInventory::uniform("c", 96_000, 786_432, 4, "A100"),
        NodeInventory::uniform("cpu", 96_000, 786_432, 0, ""),
    ]
}

#[test]
fn trace_shapes_read_as_claims_ask_what_the_pods_asked() {
    let requests = [
        request(1, 1000, &[]),
        request(2, 1000, &[]),
        request(8, 1000, &[]),
        request(1, 250, &[]),
        request(1, 500, &["T4"]),
        request(2, 1000, &["V100M16", "T4"]),
        // A model the cluster lacks changes nothing.
        request(4, 1000, &["A100", "P100"]),
        // GPUs that must be linked: a matchAttribute constraint, read back as asked.
        linked(2, GpuTopology::Nvlink),
        linked(4, GpuTopology::PcieSwitch),
        linked(2, GpuTopology::Numa),
        request(0, 0, &[]),
        request(1, 1000, &[]),
    ];
    let found = read_as_claims(&requests, &cluster()).unwrap();
    assert_eq!(
        found,
        Claimed {
            pods: 11,
            shapes: 10
        }
    );
}

#[test]
fn what_a_claim_of_a_shape_cannot_carry_is_refused_by_name() {
    let mut linked = request(4, 1000, &[]);
    linked.need.prefer = GpuTopology::Nvlink;
    let err = read_as_claims([&linked], &cluster()).unwrap_err();
    assert!(matches!(err, ClaimedError::NotAsAsked { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("shape gpus-4") && text.contains("no preferred topology"),
        "{text}"
    );
    let mut pattern = request(1, 1000, &[]);
    pattern.need.models = vec!["v100".into()];
    let err = read_as_claims([&pattern], &cluster()).unwrap_err();
    assert!(matches!(err, ClaimedError::NotAsAsked { .. }), "{err}");
}

#[test]
fn selectors_that_admit_some_nodes_of_a_model_and_not_others_are_refused() {
    // A node of T4s and V100s: a claim for T4s matches only some of its GPUs, so the
    // scheduler's filter refuses the node, where it admits the all-T4 node.
    let mut nodes = cluster();
    let mut mixed = NodeInventory::uniform("m", 96_000, 786_432, 8, "T4");
    for g in &mut mixed.gpus[4..] {
        g.model = "V100M16".into();
    }
    nodes.push(mixed);
    let err = read_as_claims([&request(1, 1000, &["T4"])], &nodes).unwrap_err();
    assert!(
        matches!(&err, ClaimedError::ModelSplit { model, .. } if model == "T4"),
        "{err}"
    );
}

/// Every pod list of the openb trace beside the repository reads as claims that ask what
/// its pods ask (skips, saying why, when the trace is absent).
#[test]
fn every_openb_pod_list_reads_as_claims() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = match gpuplace_sim::trace::shared_openb_dir(manifest) {
        Ok(dir) => dir,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let nodes = gpuplace_sim::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let mut lists = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("openb_pod_list_") && name.ends_with(".csv")) {
            continue;
        }
        let pods = gpuplace_sim::load_pods(&path).unwrap();
        let read = read_as_claims(pods.iter().map(|p| &p.request), &nodes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name}: {} GPU pods, {} shapes", read.pods, read.shapes);
        assert!(read.pods > 0 && read.shapes > 0, "{name}");
        lists += 1;
    }
    assert!(lists >= 1);
}
