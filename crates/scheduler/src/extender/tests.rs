use super::evaluate::unresolvable;
use super::*;

#[test]
fn scores_spread_so_the_best_gets_ten() {
    assert_eq!(spread_scores(&[None, None]), [0, 0]);
    assert_eq!(
        spread_scores(&[Some((0, 5)), None, Some((0, 5))]),
        [10, 0, 10]
    );
    // One preference level: linear in the policy score.
    assert_eq!(
        spread_scores(&[Some((0, 100)), Some((0, 0)), Some((0, 50))]),
        [10, 0, 4]
    );
    // A better preference beats any policy score.
    let s = spread_scores(&[Some((200, 0)), Some((0, 100)), Some((0, 0))]);
    assert_eq!(s[0], 10);
    assert!(s[1] > s[2] && s[1] < 10, "{s:?}");
    // Three levels: the level's place first, then linear in the policy score within it.
    assert_eq!(
        spread_scores(&[
            Some((300, 0)),
            Some((200, 10)),
            Some((100, 5)),
            Some((200, 0)),
            Some((100, 10)),
            None
        ]),
        [10, 6, 1, 3, 3, 0]
    );
}

#[test]
fn filter_modes_parse() {
    assert_eq!("all".parse::<FilterMode>(), Ok(FilterMode::All));
    assert_eq!("best".parse::<FilterMode>(), Ok(FilterMode::Best));
    assert!(
        "most"
            .parse::<FilterMode>()
            .unwrap_err()
            .contains("all or best")
    );
}

#[test]
fn unresolvable_phrases() {
    assert!(unresolvable("node(s) had untolerated taint {gpu: true}"));
    assert!(unresolvable(crate::framework::volumes::NODE_CONFLICT));
    assert!(!unresolvable("Insufficient nvidia.com/gpu"));
    assert!(!unresolvable(
        "node(s) didn't have free ports for the requested pod ports"
    ));
}

/// Name lookups through the remembered list equal a lookup of each name, whatever the
/// list: the full one, subsets, rotated windows, unknown and repeated names.
#[test]
fn remembered_names_find_what_a_lookup_finds() {
    use k8s_openapi::api::core::v1::Node;
    let node = |name: &str| -> Arc<Node> {
        let inventory = serde_json::json!({"name": name, "cpu_milli": 1000, "memory_mib": 1024,
            "gpus": [{"id": format!("{name}-0"), "index": 0, "model": "A100", "healthy": true}]});
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name,
                    "annotations": {"gpuplace.io/inventory": inventory.to_string()}},
                "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}}
            }))
            .unwrap(),
        )
    };
    let all: Vec<String> = (0..40).map(|i| format!("n{i:02}")).collect();
    let nodes: Vec<Arc<Node>> = all.iter().map(|n| node(n)).collect();
    let snapshot = crate::snapshot::build(&nodes, &[], "nvidia.com/gpu");
    let mut index = evaluate::NameIndex::default();
    let lists: Vec<Vec<String>> = vec![
        all.clone(),
        all.iter().step_by(3).cloned().collect(),
        all[25..].iter().chain(&all[..12]).cloned().collect(),
        vec![
            "n05".into(),
            "ghost".into(),
            "n05".into(),
            "n39".into(),
            "n00".into(),
        ],
        all.iter().rev().cloned().collect(),
        all.clone(),
        all[7..30].to_vec(),
        // Lists seen before, whole (filter's candidates, then the ones that passed).
        all.clone(),
        all[7..30].to_vec(),
        all[7..30].to_vec(),
        all.clone(),
        all.iter().step_by(3).cloned().collect(),
    ];
    for names in lists {
        let expected: Vec<Option<usize>> = names.iter().map(|n| snapshot.node_index(n)).collect();
        let names: super::Names = names.iter().map(String::as_str).collect();
        assert_eq!(
            &index.lookup(&snapshot, &names)[..],
            &expected[..],
            "{names:?}"
        );
    }
}
