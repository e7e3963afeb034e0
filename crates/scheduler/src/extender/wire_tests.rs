use proptest::prelude::*;
use serde_json::json;

use super::*;

const LIMIT: usize = 1 << 20;

fn args_body() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "Pod": {"metadata": {"name": "p", "namespace": "ml", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
        "NodeNames": ["n1", "n2"]
    }))
    .unwrap()
}

#[test]
fn keys_are_read_in_any_case() {
    let args = decode_args(&args_body(), LIMIT).unwrap();
    assert_eq!(args.pod.metadata.name.as_deref(), Some("p"));
    assert_eq!(args.node_names, Some(["n1", "n2"].into_iter().collect()));
    let lower = br#"{"pod": {"metadata": {"name": "q"}}, "nodes": {"items": [{"metadata": {"name": "a"}}]}}"#;
    let mut args = decode_args(lower, LIMIT).unwrap();
    assert!(args.node_names.is_none());
    assert_eq!(args.take_names(), ["a"].into_iter().collect());
    let binding = decode_binding(
        br#"{"podName": "p", "PODNAMESPACE": "ml", "PodUID": "u1", "Node": "n1"}"#,
        LIMIT,
    )
    .unwrap();
    assert_eq!(
        binding,
        BindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ml".into(),
            pod_uid: "u1".into(),
            node: "n1".into()
        }
    );
}

#[test]
fn bad_bodies_are_named() {
    assert!(matches!(
        decode_args(b"{nope", LIMIT),
        Err(WireError::NotJson(_))
    ));
    let not_object = decode_args(b"[1]", LIMIT).unwrap_err().to_string();
    assert!(
        not_object.contains("expected a JSON object"),
        "{not_object}"
    );
    let missing = decode_args(b"{}", LIMIT).unwrap_err().to_string();
    assert!(missing.starts_with("missing field Pod"), "{missing}");
    assert_eq!(
        decode_args(&args_body(), 10).unwrap_err(),
        WireError::TooLarge(10)
    );
    let wrong = decode_args(br#"{"Pod": {}, "NodeNames": "n1"}"#, LIMIT).unwrap_err();
    assert!(wrong.to_string().starts_with("field NodeNames:"), "{wrong}");
    let wrong = decode_args(br#"{"Pod": {"spec": {"containers": 3}}}"#, LIMIT).unwrap_err();
    assert!(wrong.to_string().starts_with("field Pod:"), "{wrong}");
    let missing = decode_binding(
        br#"{"PodName": "p", "PodNamespace": "ml", "PodUID": "u"}"#,
        LIMIT,
    );
    let missing = missing.unwrap_err().to_string();
    assert!(missing.starts_with("missing field Node"), "{missing}");
}

#[test]
fn replies_are_pascal_case() {
    let mut reply = FilterResult::about(["n1", "n2"].into_iter().collect());
    reply.pass([0]);
    reply.fail(1, "Insufficient nvidia.com/gpu".into());
    assert_eq!(reply.node_names(), Some(vec!["n1"]));
    assert_eq!(reply.failed("n2"), Some("Insufficient nvidia.com/gpu"));
    assert_eq!(reply.unresolvable("n2"), None);
    let text: serde_json::Value = serde_json::from_slice(&reply.to_json()).unwrap();
    assert_eq!(
        text,
        json!({"Nodes": null, "NodeNames": ["n1"], "FailedNodes": {"n2": "Insufficient nvidia.com/gpu"},
            "FailedAndUnresolvableNodes": {}, "Error": ""})
    );
    let p = Priorities {
        names: ["n1", "n2"].into_iter().collect(),
        scores: vec![10, 0],
    };
    let p: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
    assert_eq!(
        p,
        json!([{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}])
    );
}

#[test]
fn names_and_reasons_that_need_escapes_are_written_as_json() {
    let names: Names = ["a\"b", "c\\d", "e\nf", "ok"].into_iter().collect();
    let mut reply = FilterResult::about(names.clone());
    reply.pass([0, 3]);
    reply.fail(1, "x\"y".into());
    reply.fail_unresolvable(2, "tab\there".into());
    reply.error = "line\nbreak".into();
    let text: serde_json::Value = serde_json::from_slice(&reply.to_json()).unwrap();
    assert_eq!(
        text,
        json!({"Nodes": null, "NodeNames": ["a\"b", "ok"], "FailedNodes": {"c\\d": "x\"y"},
            "FailedAndUnresolvableNodes": {"e\nf": "tab\there"}, "Error": "line\nbreak"})
    );
    let p = Priorities {
        names,
        scores: vec![10, -3, 0, i64::MAX],
    };
    let p: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
    assert_eq!(
        p,
        json!([{"Host": "a\"b", "Score": 10}, {"Host": "c\\d", "Score": -3},
            {"Host": "e\nf", "Score": 0}, {"Host": "ok", "Score": i64::MAX}])
    );
    let failed = FilterResult::failed_with("boom".into());
    let text: serde_json::Value = serde_json::from_slice(&failed.to_json()).unwrap();
    assert_eq!(
        text,
        json!({"Nodes": null, "NodeNames": null, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": "boom"})
    );
}

proptest! {
    /// Arbitrary bytes: an answer or a named error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_args(&bytes, LIMIT);
        let _ = decode_binding(&bytes, LIMIT);
    }

    /// Valid bodies with bytes overwritten, cut or inserted.
    #[test]
    fn mutated_bodies_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)
    ) {
        let mut body = args_body();
        for (at, byte, kind) in edits {
            if body.is_empty() {
                break;
            }
            let i = at.index(body.len());
            match kind {
                0 => body[i] = byte,
                1 => body.truncate(i),
                _ => body.insert(i, byte),
            }
        }
        match decode_args(&body, LIMIT) {
            Ok(mut args) => { let _ = args.take_names(); }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

/// The quick reader decodes every body as the serde path does, or leaves it to serde:
/// same arguments, same errors.
#[test]
fn the_quick_reader_agrees_with_serde() {
    let pod =
        r#"{"metadata": {"name": "p", "uid": "u1", "annotations": {"NodeNames": "[\"x\"]"}}}"#;
    let bodies = [
        format!(r#"{{"Pod":{pod},"Nodes":null,"NodeNames":["n1","n2"]}}"#),
        format!("{{\n  \"pod\" : {pod} ,\r\n\t\"NODENAMES\" : [ \"n1\" , \"n2\" ]\n}}\n"),
        format!(r#"{{"Pod":{pod},"NodeNames":["a\"b","c\\d","\u00e9"]}}"#),
        format!(r#"{{"Pod":{pod},"NodeNames":null}}"#),
        format!(r#"{{"Pod":{pod},"NodeNames":[]}}"#),
        format!(r#"{{"Pod":{pod},"Nodes":{{"items":[{{"metadata":{{"name":"a"}}}}]}}}}"#),
        format!(
            r#"{{"NodeNames":["a"],"Pod":{pod},"NodeNames":["b"],"Other":[1,2.5,{{"x":null}}],"n":7}}"#
        ),
        format!(r#"{{"P\u006fd":{pod},"NodeNames":["a"]}}"#),
        format!(r#"{{"Pod":{pod},"NodeNames":["a",]}}"#),
        format!(r#"{{"Pod":{pod},"NodeNames":["a"]}} x"#),
        format!(r#"{{"Pod":{pod},"NodeNames":["a"]"#),
        format!(r#"{{"Pod":{pod},"NodeNames":["a",7]}}"#),
        format!("{{\"Pod\":{pod},\"NodeNames\":[\"a\x0cb\"]}}"),
        format!("{{\"Pod\":{pod},\x0c\"NodeNames\":[\"a\"]}}"),
        r#"{"NodeNames":["a"]}"#.to_string(),
        r#"{"Pod":null,"NodeNames":["a"]}"#.to_string(),
        r#"{}"#.to_string(),
        r#"[]"#.to_string(),
        String::new(),
    ];
    for body in &bodies {
        let quick = decode_args(body.as_bytes(), LIMIT).map(|a| format!("{a:?}"));
        let serde = decode::<ExtenderArgs>(body.as_bytes(), LIMIT).map(|a| format!("{a:?}"));
        assert_eq!(quick, serde, "body {body:?}");
    }
    // The first two are read quickly and give the names in order.
    let names = quick::args(bodies[1].as_bytes(), None).and_then(|a| a.node_names);
    assert_eq!(names, Some(["n1", "n2"].into_iter().collect()));
    assert!(quick::args(bodies[2].as_bytes(), None).is_none());
}

/// `{"Pod": .., "NodeNames": <list>}` with the list's JSON as given.
fn body_with_list(list: &str) -> Vec<u8> {
    format!(r#"{{"Pod": {{"metadata": {{"name": "p", "uid": "u1"}}}}, "NodeNames": {list}}}"#)
        .into_bytes()
}

/// Decoded with and without the kept lists: the same arguments every time.
fn same_both_ways(body: &[u8], lists: &Mutex<RecentLists>, caller: Caller) -> Option<Names> {
    let plain = decode_args(body, LIMIT).map(|a| a.node_names);
    let kept = decode_args_recalling(body, LIMIT, lists, caller).map(|a| a.node_names);
    assert_eq!(plain, kept, "{}", String::from_utf8_lossy(body));
    kept.ok().flatten()
}

#[test]
fn kept_lists_give_the_same_names_and_are_found_by_their_bytes() {
    let lists = Mutex::new(RecentLists::default());
    let list = r#"["n1","n2","n3","n4"]"#;
    same_both_ways(&body_with_list(list), &lists, Caller::Filter);
    assert!(recent::lock(&lists).find(list.as_bytes()).is_some());
    // The filter's answer is kept as written; prioritize sends it back.
    let mut answer = FilterResult::about(["n1", "n2", "n3", "n4"].into_iter().collect());
    answer.pass([0, 2, 3]);
    let json = answer.into_json(&lists);
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let passing = serde_json::to_string(&v["NodeNames"]).unwrap();
    assert_eq!(passing, r#"["n1","n3","n4"]"#);
    let names = same_both_ways(&body_with_list(&passing), &lists, Caller::Prioritize).unwrap();
    assert_eq!(names, ["n1", "n3", "n4"].into_iter().collect());
    assert!(recent::lock(&lists).find(passing.as_bytes()).is_some());
    // Prioritize's list does not replace filter's; other lists are read as they are.
    same_both_ways(&body_with_list(r#"["n1"]"#), &lists, Caller::Prioritize);
    assert!(recent::lock(&lists).find(list.as_bytes()).is_some());
    for other in [
        r#"["n1","n2","n3","n4","n5"]"#,
        r#"["n1","n2","n3"]"#,
        r#"["n1","n2","n3","n4"] "#,
        r#"["n1","n3","n4"]"#,
        r#"["n1","n2","n3","n4"],"Pod":null"#,
        "null",
    ] {
        same_both_ways(&body_with_list(other), &lists, Caller::Filter);
        same_both_ways(&body_with_list(list), &lists, Caller::Filter);
    }
}

proptest! {
    /// Filter then prioritize with the answer's names, over lists with escapes and
    /// repeats: the kept lists never change what a body decodes to.
    #[test]
    fn kept_lists_never_change_a_decoding(
        rounds in proptest::collection::vec(
            (proptest::collection::vec("[ab\"\\\\é]{0,3}", 0..6), any::<u64>()), 1..6)
    ) {
        let lists = Mutex::new(RecentLists::default());
        for (names, mask) in rounds {
            let list = serde_json::to_string(&names).unwrap();
            let read = same_both_ways(&body_with_list(&list), &lists, Caller::Filter);
            let mut answer = FilterResult::about(read.unwrap_or_default());
            answer.pass((0..names.len()).filter(|i| mask >> i & 1 == 1));
            let v: serde_json::Value = serde_json::from_slice(&answer.into_json(&lists)).unwrap();
            let passing = serde_json::to_string(&v["NodeNames"]).unwrap();
            let got = same_both_ways(&body_with_list(&passing), &lists, Caller::Prioritize);
            let want: Vec<&String> =
                names.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, n)| n).collect();
            prop_assert_eq!(got.map(|g| g.iter().map(String::from).collect::<Vec<_>>()),
                Some(want.into_iter().cloned().collect::<Vec<_>>()));
        }
    }
}
