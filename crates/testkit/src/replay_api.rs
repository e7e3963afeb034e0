//! `gpuplace replay`'s API boundary on the in-memory API, as strict and as slow as the real
//! server where the replay could tell: names and labels validated as the server does, a
//! second create of a name refused (409 AlreadyExists), a delete of nothing a 404, a
//! latency on every request, a watch that is late and starts with a listing, and a switch
//! that takes the server away (every call then fails as a refused connection would).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use gpuplace_replay::kube_api::state_of;
use gpuplace_replay::{ApiError, Kind, MANAGED_BY, MANAGED_BY_VALUE, Object, PodSeen, ReplayApi};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::MemoryApi;

type Labels = BTreeMap<String, String>;

/// Whether `labels` hold `selector`'s one `key=value`.
fn selects(selector: &str, labels: Option<&Labels>) -> bool {
    let Some((key, value)) = selector.split_once('=') else {
        return false;
    };
    labels.and_then(|l| l.get(key)).map(String::as_str) == Some(value)
}

/// The replay's view of a [`MemoryApi`].
#[derive(Clone)]
pub struct MemoryReplayApi {
    pub api: MemoryApi,
    namespace: String,
    latency: Duration,
    watch_delay: Duration,
    down: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    /// Labels of queues, groups and leases by name (the in-memory API keeps their specs,
    /// not their labels).
    labelled: Arc<std::sync::Mutex<BTreeMap<(Kind, String), Labels>>>,
    /// Fake nodes' heartbeats: renewals per node.
    leases: Arc<std::sync::Mutex<BTreeMap<String, u32>>>,
    /// The watch lists again at its next look (as after a dropped watch or a restart).
    relist: Arc<AtomicBool>,
    /// Requests still to be answered 429, and the `Retry-After` they carry.
    throttled: Arc<std::sync::Mutex<(usize, Duration)>>,
    /// The server does not serve `resource.k8s.io` (before 1.34): its lists and writes are
    /// answered 404, as a v1.26 server answers them.
    no_dra: Arc<AtomicBool>,
}

impl MemoryReplayApi {
    /// Pods in `namespace`; every request costs `latency`, watch events come
    /// `watch_delay` late.
    pub fn new(api: MemoryApi, namespace: &str, latency: Duration, watch_delay: Duration) -> Self {
        MemoryReplayApi {
            api,
            namespace: namespace.to_string(),
            latency,
            watch_delay,
            down: Arc::default(),
            requests: Arc::default(),
            labelled: Arc::default(),
            leases: Arc::default(),
            relist: Arc::default(),
            throttled: Arc::default(),
            no_dra: Arc::default(),
        }
    }

    /// Serves no `resource.k8s.io` from now on, as a v1.26 server: a list or write of a
    /// ResourceSlice or ResourceClaimTemplate is answered 404 (`404 page not found`).
    pub fn serve_no_dra(&self) {
        self.no_dra.store(true, Ordering::SeqCst);
    }

    /// 404 for a kind of `resource.k8s.io` when the server serves none.
    fn served(&self, kind: Kind) -> Result<(), ApiError> {
        if self.no_dra.load(Ordering::SeqCst)
            && matches!(kind, Kind::ResourceSlice | Kind::ClaimTemplate)
        {
            return Err(ApiError::NotFound(format!(
                "{} (list) (404 page not found)",
                kind.name()
            )));
        }
        Ok(())
    }

    /// The watch starts over at its next look: a listing of the pods there are then
    /// (without those whose creation is still in flight), as after a dropped watch or an
    /// API server restart.
    pub fn relist(&self) {
        self.relist.store(true, Ordering::SeqCst);
    }

    /// The next `n` requests are answered 429 with `Retry-After: retry_after`, as API
    /// Priority and Fairness answers a busy server's.
    pub fn throttle(&self, n: usize, retry_after: Duration) {
        if let Ok(mut t) = self.throttled.lock() {
            *t = (n, retry_after);
        }
    }

    /// Takes the server away (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Each fake node's heartbeat renewals so far.
    pub fn heartbeats(&self) -> BTreeMap<String, u32> {
        self.leases.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Requests served (or refused) so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    async fn charge(&self) -> Result<(), ApiError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        if self.down.load(Ordering::SeqCst) {
            return Err(ApiError::Unavailable(
                "error trying to connect: tcp connect error: Connection refused (os error 111)"
                    .into(),
            ));
        }
        if let Ok(mut t) = self.throttled.lock()
            && t.0 > 0
        {
            t.0 -= 1;
            return Err(ApiError::Throttled {
                what: "the server is currently unable to handle the request".into(),
                retry_after: Some(t.1),
            });
        }
        Ok(())
    }

    fn managed(labels: Option<&BTreeMap<String, String>>) -> bool {
        labels.and_then(|l| l.get(MANAGED_BY)).map(String::as_str) == Some(MANAGED_BY_VALUE)
    }

    fn keep_labels(&self, kind: Kind, name: &str, labels: Option<&Labels>) {
        if let Ok(mut l) = self.labelled.lock() {
            l.insert(
                (kind, name.to_string()),
                labels.cloned().unwrap_or_default(),
            );
        }
    }

    fn exists(&self, kind: Kind, name: &str) -> bool {
        match kind {
            Kind::Node => self.api.node(name).is_some(),
            Kind::Pod => self.api.pod(&self.namespace, name).is_some(),
            Kind::Queue => self.api.queue(name).is_some(),
            Kind::PodGroup => self.api.group(&self.namespace, name).is_some(),
            Kind::Lease => self
                .leases
                .lock()
                .map(|l| l.contains_key(name))
                .unwrap_or(false),
            // Kept by their labels alone: nothing in the in-memory API reads them.
            Kind::ResourceSlice | Kind::ClaimTemplate => self
                .labelled
                .lock()
                .map(|l| l.contains_key(&(kind, name.to_string())))
                .unwrap_or(false),
        }
    }
}

/// The server's name rules: a DNS-1123 subdomain (pods, nodes, custom objects).
fn check_name(kind: Kind, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(ApiError::Invalid(format!(
            "{} {name:?} is invalid: metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
            kind.name()
        )))
    }
}

/// The server's label value rules: at most 63 characters of alphanumerics, '-', '_', '.',
/// starting and ending alphanumeric.
fn check_labels(labels: Option<&BTreeMap<String, String>>) -> Result<(), ApiError> {
    for (key, value) in labels.into_iter().flatten() {
        let ok = value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && (value.is_empty()
                || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && value.ends_with(|c: char| c.is_ascii_alphanumeric())));
        if !ok {
            return Err(ApiError::Invalid(format!(
                "metadata.labels: Invalid value: {value:?} (label {key})"
            )));
        }
    }
    Ok(())
}

/// A pod the server would take: containers with names and images.
fn check_pod(pod: &Pod) -> Result<(), ApiError> {
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| ApiError::Invalid("spec: Required value".into()))?;
    if spec.containers.is_empty() {
        return Err(ApiError::Invalid("spec.containers: Required value".into()));
    }
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Err(ApiError::Invalid(
            "the replay must not bind its own pods (spec.nodeName set)".into(),
        ));
    }
    for c in &spec.containers {
        if c.image.as_deref().unwrap_or_default().is_empty() {
            return Err(ApiError::Invalid(format!(
                "spec.containers[{}].image: Required value",
                c.name
            )));
        }
    }
    Ok(())
}

impl ReplayApi for MemoryReplayApi {
    async fn create(&self, object: &Object) -> Result<(), ApiError> {
        self.charge().await?;
        let (kind, name) = (object.kind(), object.name().to_string());
        self.served(kind)?;
        check_name(kind, &name)?;
        if self.exists(kind, &name) {
            return Err(ApiError::AlreadyExists(format!("{} {name}", kind.name())));
        }
        match object {
            Object::Node(node) => {
                check_labels(node.metadata.labels.as_ref())?;
                self.api.put_node(Node::clone(node));
            }
            Object::Pod(pod) => {
                check_labels(pod.metadata.labels.as_ref())?;
                check_pod(pod)?;
                let mut pod = Pod::clone(pod);
                pod.metadata.namespace = Some(self.namespace.clone());
                pod.status = None;
                self.api.put_pod(pod);
            }
            Object::Queue(q) => {
                check_labels(q.metadata.labels.as_ref())?;
                self.api.put_queue(&name, q.spec.clone());
            }
            Object::PodGroup(g) => {
                check_labels(g.metadata.labels.as_ref())?;
                let mut g = g.as_ref().clone();
                g.metadata.namespace = Some(self.namespace.clone());
                self.api.put_group(g);
            }
            Object::ResourceSlice(o) => check_labels(o.metadata.labels.as_ref())?,
            Object::ClaimTemplate(o) => check_labels(o.metadata.labels.as_ref())?,
        }
        match object {
            Object::Queue(o) => self.keep_labels(kind, &name, o.metadata.labels.as_ref()),
            Object::PodGroup(o) => self.keep_labels(kind, &name, o.metadata.labels.as_ref()),
            Object::ResourceSlice(o) => self.keep_labels(kind, &name, o.metadata.labels.as_ref()),
            Object::ClaimTemplate(o) => self.keep_labels(kind, &name, o.metadata.labels.as_ref()),
            _ => {}
        }
        Ok(())
    }

    async fn delete(&self, kind: Kind, name: &str) -> Result<bool, ApiError> {
        self.charge().await?;
        self.served(kind)?;
        if !self.exists(kind, name) {
            return Ok(false);
        }
        match kind {
            Kind::Node => self.api.delete_node(name),
            Kind::Pod => self.api.delete_pod(&self.namespace, name),
            Kind::Queue => self.api.delete_queue(name),
            Kind::PodGroup => self.api.delete_group(&self.namespace, name),
            Kind::Lease => {
                if let Ok(mut l) = self.leases.lock() {
                    l.remove(name);
                }
            }
            Kind::ResourceSlice | Kind::ClaimTemplate => {}
        }
        if let Ok(mut l) = self.labelled.lock() {
            l.remove(&(kind, name.to_string()));
        }
        Ok(true)
    }

    async fn list_labelled(&self, kind: Kind, selector: &str) -> Result<Vec<String>, ApiError> {
        self.charge().await?;
        self.served(kind)?;
        Ok(match kind {
            Kind::Pod => self
                .api
                .pods()
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(self.namespace.as_str()))
                .filter(|p| selects(selector, p.metadata.labels.as_ref()))
                .filter_map(|p| p.metadata.name.clone())
                .collect(),
            Kind::Node => self
                .api
                .nodes()
                .iter()
                .filter(|n| selects(selector, n.metadata.labels.as_ref()))
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            _ => self
                .labelled
                .lock()
                .map(|l| {
                    l.iter()
                        .filter(|((k, n), labels)| {
                            // Slices and templates are this map (`exists` would lock it again).
                            *k == kind
                                && selects(selector, Some(labels))
                                && (matches!(kind, Kind::ResourceSlice | Kind::ClaimTemplate)
                                    || self.exists(kind, n))
                        })
                        .map(|((_, n), _)| n.clone())
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    async fn heartbeat(&self, run: &str, node: &str) -> Result<(), ApiError> {
        self.charge().await?;
        check_name(Kind::Lease, node)?;
        if let Ok(mut l) = self.leases.lock() {
            *l.entry(node.to_string()).or_default() += 1;
        }
        let labels = gpuplace_replay::objects::run_labels(run);
        self.keep_labels(Kind::Lease, node, Some(&labels));
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>, ApiError> {
        self.charge().await?;
        Ok(self.api.nodes())
    }

    fn watch_pods(&self) -> BoxStream<'static, Result<PodSeen, ApiError>> {
        let this = self.clone();
        let seen: HashMap<String, gpuplace_replay::PodState> = HashMap::new();
        stream::unfold((this, seen, true), |(this, mut seen, first)| async move {
            tokio::time::sleep(this.watch_delay.max(Duration::from_millis(5))).await;
            if this.down.load(Ordering::SeqCst) {
                let e = ApiError::Unavailable("watch: connection refused".into());
                return Some((vec![Err(e)], (this, seen, first)));
            }
            let now: HashMap<String, gpuplace_replay::PodState> = this
                .api
                .pods()
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(this.namespace.as_str()))
                .filter(|p| Self::managed(p.metadata.labels.as_ref()))
                .map(|p| {
                    let s = state_of(p);
                    (s.name.clone(), s)
                })
                .collect();
            let mut events: Vec<Result<PodSeen, ApiError>> = now
                .iter()
                .filter(|(n, s)| seen.get(*n) != Some(*s))
                .map(|(_, s)| Ok(PodSeen::Changed(s.clone())))
                .collect();
            if first || this.relist.swap(false, Ordering::SeqCst) {
                events.push(Ok(PodSeen::Listed(now.keys().cloned().collect())));
            } else {
                events.extend(
                    seen.keys()
                        .filter(|n| !now.contains_key(*n))
                        .map(|n| Ok(PodSeen::Gone(n.clone()))),
                );
            }
            seen = now;
            Some((events, (this, seen, false)))
        })
        .flat_map(stream::iter)
        .boxed()
    }
}
