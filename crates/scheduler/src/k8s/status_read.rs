//! One read of the cluster for `gpuplace status` (no watches): Nodes, Pods, PodGroups and
//! the `FailedScheduling` Events, listed page by page with stable APIs only.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, ObjectList};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::api::ClusterView;
use crate::k8s::gang::PodGroup;
use crate::k8s::pod_info::PodInfo;

/// Objects per page of a list.
const PAGE: u32 = 500;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot list {what}: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    /// No answer from the server at all (refused, timed out, TLS): said as such rather than
    /// as the first resource that happened to be read.
    #[error(
        "cannot reach the API server (check the kubeconfig and that the server is up): {source}"
    )]
    Unreachable {
        #[source]
        source: kube::Error,
    },
}

impl ReadError {
    fn of(what: &'static str, source: kube::Error) -> ReadError {
        match source {
            kube::Error::Api(_) | kube::Error::SerdeError(_) => ReadError::List { what, source },
            source => ReadError::Unreachable { source },
        }
    }
}

/// What `gpuplace status` shows: the view, and the `FailedScheduling` Events that say why
/// pods wait (`status::reasons::from_events` reads them).
pub struct Read {
    pub view: ClusterView,
    pub failures: Vec<Event>,
}

async fn list_all<K>(
    api: &Api<K>,
    params: ListParams,
    what: &'static str,
) -> Result<Vec<K>, ReadError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    list_map(api, params, what, |k| k).await
}

/// Every object, each made into a `T` as its page arrives (a page of Pods is dropped once
/// read: 20,000 decoded Pods would take ~120 MB).
async fn list_map<K, T>(
    api: &Api<K>,
    params: ListParams,
    what: &'static str,
    f: impl Fn(K) -> T,
) -> Result<Vec<T>, ReadError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page: ObjectList<K> = api
            .list(&params)
            .await
            .map_err(|source| ReadError::of(what, source))?;
        out.extend(page.items.into_iter().map(&f));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

fn missing(e: &ReadError) -> bool {
    matches!(e, ReadError::List { source: kube::Error::Api(s), .. } if s.code == 404)
}

/// Every PodDisruptionBudget (policy/v1), for plans that move pods.
pub async fn read_budgets(
    client: Client,
) -> Result<Vec<Arc<k8s_openapi::api::policy::v1::PodDisruptionBudget>>, ReadError> {
    let api = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::all(client);
    let list = list_all(&api, ListParams::default(), "poddisruptionbudgets").await?;
    Ok(list.into_iter().map(Arc::new).collect())
}

/// Reads the cluster once. Every pod is read (a node's use counts every namespace); Events
/// only of `namespace` when given. A cluster without the PodGroup CRD has no gangs.
pub async fn read(
    client: Client,
    gpu_resource: &str,
    namespace: Option<&str>,
) -> Result<Read, ReadError> {
    let (nodes_api, pods_api) = (
        Api::<Node>::all(client.clone()),
        Api::<Pod>::all(client.clone()),
    );
    let groups_api = Api::<PodGroup>::all(client.clone());
    let nodes = list_map(&nodes_api, ListParams::default(), "nodes", |mut n| {
        crate::k8s::kube_api::strip_node(&mut n);
        Arc::new(n)
    });
    let pods = list_map(&pods_api, ListParams::default(), "pods", |p| {
        Arc::new(PodInfo::from_pod(&p, gpu_resource))
    });
    let groups = list_all(&groups_api, ListParams::default(), "podgroups.gpuplace.io");
    let queues_api = Api::<crate::k8s::queue::Queue>::all(client.clone());
    let queues = list_all(&queues_api, ListParams::default(), "queues.gpuplace.io");
    let events_api: Api<Event> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let failed = ListParams::default().fields("reason=FailedScheduling");
    let events = list_all(&events_api, failed, "events");
    let (nodes, pods, groups, queues, events) = futures::join!(nodes, pods, groups, queues, events);
    // Nodes and pods first: their error says what is wrong with the server, where the
    // optional PodGroups' would blame a CRD.
    let mut nodes: Vec<Arc<Node>> = nodes?;
    let mut pods: Vec<Arc<PodInfo>> = pods?;
    let groups = match groups {
        Err(e) if missing(&e) => Vec::new(),
        other => other?,
    };
    let queues = match queues {
        Err(e) if missing(&e) => Vec::new(),
        other => other?,
    };
    let events = match events {
        Ok(e) => e,
        // A server that cannot select Events by reason: every Event, sorted out here.
        Err(ReadError::List {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 400 => list_all(&events_api, ListParams::default(), "events").await?,
        Err(e) => return Err(e),
    };
    pods.sort_by(|a, b| (&a.key.namespace, &a.key.name).cmp(&(&b.key.namespace, &b.key.name)));
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let view = ClusterView {
        nodes: Arc::new(nodes),
        pods: pods.into(),
        groups: Arc::new(groups.into_iter().map(Arc::new).collect()),
        queues: Arc::new(queues.into_iter().map(Arc::new).collect()),
        ..ClusterView::default()
    };
    Ok(Read {
        view,
        failures: events,
    })
}
