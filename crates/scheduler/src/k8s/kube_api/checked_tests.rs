use super::*;
use crate::k8s::gang::PodGroup;
use crate::k8s::queue::Queue;

fn decoder<K>() -> (Decoder<K>, mpsc::Receiver<Bad>)
where
    K: kube::Resource<DynamicType = ()>,
{
    let (bad, told) = mpsc::channel(8);
    let decoder = Decoder {
        strip: |_| {},
        resource: ApiResource::erase::<K>(&()),
        good: HashMap::new(),
        relisted: HashSet::new(),
        told: HashMap::new(),
        bad,
    };
    (decoder, told)
}

fn group(name: &str, min_member: serde_json::Value, version: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuplace.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "resourceVersion": version, "uid": name},
        "spec": {"minMember": min_member},
    }))
    .unwrap()
}

fn names<K: kube::Resource>(
    events: &[Option<Result<watcher::Event<K>, watcher::Error>>],
) -> Vec<String> {
    use watcher::Event;
    events
        .iter()
        .map(|e| match e {
            None => "skipped".to_string(),
            Some(Ok(Event::Init)) => "init".into(),
            Some(Ok(Event::InitApply(k))) => {
                format!("list {}", k.meta().name.clone().unwrap_or_default())
            }
            Some(Ok(Event::InitDone)) => "done".into(),
            Some(Ok(Event::Apply(k))) => {
                format!("apply {}", k.meta().name.clone().unwrap_or_default())
            }
            Some(Ok(Event::Delete(k))) => {
                format!("delete {}", k.meta().name.clone().unwrap_or_default())
            }
            Some(Err(_)) => "error".into(),
        })
        .collect()
}

#[test]
fn one_bad_podgroup_is_skipped_and_the_others_listed() {
    use watcher::Event;
    let (mut d, mut told) = decoder::<PodGroup>();
    let events: Vec<_> = [
        Event::Init,
        Event::InitApply(group("a", 2.into(), "1")),
        // The CRD says uint32; the server does not enforce it.
        Event::InitApply(group("huge", 4_294_967_296u64.into(), "2")),
        Event::InitApply(group("b", 3.into(), "3")),
        Event::InitDone,
    ]
    .into_iter()
    .map(|e| d.decode(Ok(e)))
    .collect();
    assert_eq!(
        names(&events),
        ["init", "list a", "skipped", "list b", "done"]
    );
    let bad = told.try_recv().expect("an Event for the bad object");
    assert_eq!(bad.regarding.name.as_deref(), Some("huge"));
    assert_eq!(bad.regarding.kind.as_deref(), Some("PodGroup"));
    assert!(bad.note.contains("4294967296"), "{}", bad.note);
    assert!(told.try_recv().is_err(), "one Event");
}

#[test]
fn a_good_object_turned_bad_is_dropped_and_told_once_per_version() {
    use watcher::Event;
    let (mut d, mut told) = decoder::<PodGroup>();
    let events: Vec<_> = [
        Event::Apply(group("a", 2.into(), "1")),
        Event::Apply(group("a", (-1).into(), "2")),
        // The same bad version again (a relist): not told again.
        Event::Apply(group("a", (-1).into(), "2")),
        Event::Apply(group("a", "x".into(), "3")),
        Event::Apply(group("a", 4.into(), "4")),
        Event::Delete(group("a", "x".into(), "5")),
    ]
    .into_iter()
    .map(|e| d.decode(Ok(e)))
    .collect();
    assert_eq!(
        names(&events),
        [
            "apply a", "delete a", "skipped", "skipped", "apply a", "delete a"
        ]
    );
    assert!(told.try_recv().is_ok());
    assert!(told.try_recv().is_ok(), "version 3 is new");
    assert!(told.try_recv().is_err());
}

#[test]
fn a_queue_with_an_out_of_range_weight_is_skipped() {
    use watcher::Event;
    let (mut d, _told) = decoder::<Queue>();
    let queue = |name: &str, weight: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuplace.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"weight": weight},
            "status": {"pendingPods": 4_294_967_296u64},
        }))
        .unwrap()
    };
    let events = vec![
        d.decode(Ok(Event::InitApply(queue("bad", 1.into())))),
        d.decode(Ok(Event::InitApply(queue("worse", "heavy".into())))),
    ];
    assert_eq!(names(&events), ["skipped", "skipped"]);
}
