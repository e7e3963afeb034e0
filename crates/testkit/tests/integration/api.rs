//! The in-memory API's own behaviour: its cache follows the watch and relists only after a
//! gap longer than the history (the lib's one unit test, moved here so the lib is not
//! compiled a second time for it).

use gpuplace_scheduler::{ClusterApi, ClusterView};
use gpuplace_testkit::MemoryApi;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"schedulerName": "gpuplace", "containers": []}
    }))
    .unwrap()
}

fn names(view: &ClusterView) -> Vec<String> {
    view.pods.iter().map(|p| p.key.name.clone()).collect()
}

#[tokio::test]
async fn the_cache_follows_the_watch_and_relists_after_compaction() {
    let api = MemoryApi::new();
    api.put_pod(pod("a"));
    api.put_pod(pod("b"));
    assert_eq!(names(&api.view().await.unwrap()), ["a", "b"]);
    assert_eq!(api.relists(), 1, "the first view lists");

    // Changes arrive as watch events: no relist.
    api.delete_pod("ns", "a");
    api.put_pod(pod("c"));
    let uid = api.pod("ns", "b").unwrap().metadata.uid.unwrap();
    api.set_annotation("ns", "b", &uid, "gpuplace.io/assignment", "{}")
        .unwrap();
    let view = api.view().await.unwrap();
    assert_eq!(names(&view), ["b", "c"]);
    assert_eq!(view.pods[0].assignment.as_deref(), Some("{}"));
    assert_eq!(api.relists(), 1);

    // A gap longer than the history: 410 Gone, so the cache lists again, and a pod
    // deleted during the gap is gone from it.
    api.delete_pod("ns", "c");
    api.compact_history();
    assert_eq!(names(&api.view().await.unwrap()), ["b"]);
    assert_eq!(api.relists(), 2);
}

/// TokenReview and SubjectAccessReview answer as the v1.26 API server did (checked with
/// curl on `../shared/realapi`): 400 for an empty token, RBAC's rules (URL prefixes, a
/// ClusterRole bound in one namespace only, no rights by default), 422 for an invalid
/// review.
#[tokio::test]
async fn reviews_answer_as_the_api_server_does() {
    use gpuplace_scheduler::access::{Access, ReviewError, Reviews};
    let api = MemoryApi::new();
    let binding = |kind: &str, json: serde_json::Value| -> serde_json::Value {
        let mut v = json;
        v["roleRef"] =
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": v["roleRef"]});
        v
    };
    api.put_cluster_role(
        serde_json::from_value(json!({"metadata": {"name": "map"},
            "rules": [{"nonResourceURLs": ["/ui", "/ui/*"], "verbs": ["get"]}]}))
        .unwrap(),
    );
    api.put_cluster_role(
        serde_json::from_value(json!({"metadata": {"name": "pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}))
        .unwrap(),
    );
    api.put_cluster_role_binding(
        serde_json::from_value(binding(
            "ClusterRole",
            json!({"metadata": {"name": "m"}, "roleRef": "map",
            "subjects": [{"kind": "ServiceAccount", "name": "v", "namespace": "a"}]}),
        ))
        .unwrap(),
    );
    api.put_role_binding(
        serde_json::from_value(binding("ClusterRole", json!({"metadata": {"name": "p", "namespace": "a"},
            "roleRef": "pods", "subjects": [{"kind": "ServiceAccount", "name": "v", "namespace": "a"}]})))
        .unwrap(),
    );
    let token = api.service_account_token("a", "v");
    let other = api.service_account_token("b", "w");
    assert!(
        matches!(api.authenticate("").await, Err(ReviewError::Refused(e)) if e.contains("token is required"))
    );
    assert_eq!(api.authenticate("forged").await, Ok(None));
    let v = api.authenticate(&token).await.unwrap().expect("a user");
    assert_eq!(v.name, "system:serviceaccount:a:v");
    assert!(v.groups.contains(&"system:serviceaccounts:a".to_string()));
    let w = api.authenticate(&other).await.unwrap().expect("a user");
    let may = |user, access: Access| {
        let api = api.clone();
        async move { api.authorize(user, &access).await.unwrap().allowed }
    };
    assert!(may(&v, Access::path("/ui", "get")).await);
    assert!(may(&v, Access::path("/ui/api/fleet", "get")).await);
    assert!(
        !may(&v, Access::path("/uix", "get")).await,
        "/ui/* is a prefix with its slash"
    );
    assert!(!may(&v, Access::path("/metrics", "get")).await);
    assert!(!may(&v, Access::path("/ui", "create")).await);
    assert!(may(&v, Access::list_pods("a")).await);
    assert!(!may(&v, Access::list_pods("b")).await, "bound in a only");
    assert!(!may(&v, Access::list_pods("")).await, "not cluster-wide");
    assert!(
        !may(&w, Access::path("/ui", "get")).await,
        "no rights by default"
    );
    let decision = api
        .authorize(&v, &Access::path("/ui", "get"))
        .await
        .unwrap();
    assert_eq!(
        decision.reason,
        "RBAC: allowed by ClusterRoleBinding \"m\" of ClusterRole \"map\" to ServiceAccount \"v/a\""
    );
    let nobody = gpuplace_scheduler::access::User::default();
    let invalid = api.authorize(&nobody, &Access::path("/ui", "get")).await;
    assert!(
        matches!(invalid, Err(ReviewError::Refused(e)) if e.contains("at least one of user or group"))
    );
    revoke_and_check(&api, &token).await;
}

async fn revoke_and_check(api: &MemoryApi, token: &str) {
    use gpuplace_scheduler::access::Reviews;
    api.revoke_token(token);
    assert_eq!(api.authenticate(token).await, Ok(None));
}
