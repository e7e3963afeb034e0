//! Keeps this node's ResourceSlices equal to its GPUs: written when the inventory changes
//! (health, a GPU gone) or when someone else changed or removed them (the kubelet wipes a
//! driver's slices after it unregisters), and never otherwise. The slices are owned by the
//! Node, so they go with it.
//!
//! "Equal" is judged on what we asked for, quantities by value (the server stores `1000` as
//! `1k`), and both ways (a healed GPU's taint left in the API is a difference). A server
//! may add defaults, and one whose feature gates drop a field (device taints, consumable
//! capacity) answers with less than was written: what the server made of our last write is
//! remembered and compared against, so neither case rewrites the slices on every event.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpuplace_model::NodeInventory;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::slices::{SliceInput, SliceSpec, node_slices};

/// The slice API this publisher needs.
pub trait SliceApi: Send + Sync {
    /// This node's UID (the slices' owner), `None` when the Node does not exist.
    fn node_uid(&self, node: &str)
    -> impl Future<Output = Result<Option<String>, ApiError>> + Send;
    /// The slices of `driver` on `node`.
    fn list(
        &self,
        node: &str,
        driver: &str,
    ) -> impl Future<Output = Result<Vec<ResourceSlice>, ApiError>> + Send;
    fn create(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, ApiError>> + Send;
    fn replace(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, ApiError>> + Send;
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// A call to the API failed.
#[derive(Debug, thiserror::Error)]
#[error("ResourceSlice API: {0}")]
pub struct ApiError(pub String);

/// What a publisher is for.
#[derive(Clone, Debug)]
pub struct PublishSettings {
    pub driver: String,
    pub node: String,
    pub shares: bool,
}

/// What the server made of the last specs written.
struct Settled {
    asked: Vec<Value>,
    stored: Vec<Value>,
}

/// The slices' specs as compared: JSON without the pool's generation.
fn comparable(spec: &ResourceSliceSpec) -> Value {
    let mut value = serde_json::to_value(spec).unwrap_or(Value::Null);
    if let Some(pool) = value.get_mut("pool").and_then(Value::as_object_mut) {
        pool.remove("generation");
    }
    value
}

/// Whether every field of `want` is in `have` with the same value (`have` may hold more:
/// the server's defaults). Quantities compare by value: the server stores `1000` as `1k`.
fn within(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| v.is_null() || h.get(k).is_some_and(|hv| within(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| within(a, b))
        }
        (Value::String(w), Value::String(h)) => same_string(w, h),
        _ => want == have,
    }
}

/// Whether two specs say the same: [`within`] both ways, so that a field we no longer
/// write (a healed GPU's taint) counts as a difference.
fn same(a: &Value, b: &Value) -> bool {
    within(a, b) && within(b, a)
}

fn same_string(a: &str, b: &str) -> bool {
    a == b
        || matches!(
            (gpuplace_model::quantity_milli(a), gpuplace_model::quantity_milli(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// One publisher: call [`Publisher::reconcile`] on every change; it writes only on a
/// difference.
pub struct Publisher<A> {
    api: A,
    settings: PublishSettings,
    settled: Option<Settled>,
}

impl<A: SliceApi> Publisher<A> {
    pub fn new(api: A, settings: PublishSettings) -> Self {
        Publisher {
            api,
            settings,
            settled: None,
        }
    }

    /// Makes the API's slices match `inventory`; returns how many objects were written.
    pub async fn reconcile(&mut self, inventory: &NodeInventory) -> Result<usize, ApiError> {
        let s = &self.settings;
        let observed = self.api.list(&s.node, &s.driver).await?;
        let generation = observed
            .iter()
            .map(|o| o.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let mut desired = node_slices(SliceInput {
            inventory,
            driver: &s.driver,
            node: &s.node,
            generation,
            shares: s.shares,
        });
        if self.matches(&desired, &observed) {
            return Ok(0);
        }
        let Some(uid) = self.api.node_uid(&s.node).await? else {
            return Err(ApiError(format!(
                "Node {} does not exist; its slices wait for it",
                s.node
            )));
        };
        // A new generation, so that readers drop the slices it replaces.
        for slice in &mut desired {
            slice.spec.pool.generation = generation + 1;
        }
        let mut written = 0;
        let mut stored = Vec::new();
        for want in &desired {
            let old = observed
                .iter()
                .find(|o| o.metadata.name.as_deref() == Some(want.name.as_str()));
            let object = self.object(want, &uid, old);
            let back = match old {
                Some(_) => self.api.replace(&object).await?,
                None => self.api.create(&object).await?,
            };
            written += 1;
            stored.push(comparable(&back.spec));
        }
        for extra in &observed {
            let name = extra.metadata.name.clone().unwrap_or_default();
            if !desired.iter().any(|d| d.name == name) {
                self.api.delete(&name).await?;
                written += 1;
            }
        }
        let asked: Vec<Value> = desired.iter().map(|d| comparable(&d.spec)).collect();
        if !asked.iter().zip(&stored).all(|(a, b)| within(a, b)) {
            warn!(
                node = %s.node,
                "the API server stored the ResourceSlices with fields dropped (a feature gate off: DRADeviceTaints, DRAConsumableCapacity?); unhealthy GPUs or shares may not be honoured by the allocator"
            );
        }
        info!(node = %s.node, slices = desired.len(), generation = generation + 1, "ResourceSlices published");
        self.settled = Some(Settled { asked, stored });
        Ok(written)
    }

    fn matches(&self, desired: &[SliceSpec], observed: &[ResourceSlice]) -> bool {
        if desired.len() != observed.len() {
            return false;
        }
        let asked: Vec<Value> = desired.iter().map(|d| comparable(&d.spec)).collect();
        let expected = match &self.settled {
            Some(settled) if settled.asked == asked => &settled.stored,
            _ => &asked,
        };
        desired.iter().zip(expected).all(|(want, expect)| {
            observed.iter().any(|o| {
                o.metadata.name.as_deref() == Some(want.name.as_str())
                    && o.metadata.deletion_timestamp.is_none()
                    && same(expect, &comparable(&o.spec))
            })
        })
    }

    fn object(
        &self,
        want: &SliceSpec,
        node_uid: &str,
        old: Option<&ResourceSlice>,
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(want.name.clone()),
                resource_version: old.and_then(|o| o.metadata.resource_version.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.settings.node.clone(),
                    uid: node_uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: want.spec.clone(),
        }
    }
}

/// Publishes on every inventory change and every slice event (`changed`), retrying failed
/// writes with backoff, until both senders are gone.
pub async fn keep_published<A: SliceApi>(
    mut publisher: Publisher<A>,
    mut inventory: watch::Receiver<Arc<NodeInventory>>,
    mut changed: mpsc::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let current = inventory.borrow_and_update().clone();
        match publisher.reconcile(&current).await {
            Ok(_) => backoff = Duration::from_millis(500),
            Err(e) => {
                warn!(error = %e, retry_in = ?backoff, "cannot publish the ResourceSlices");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        }
        tokio::select! {
            r = inventory.changed() => if r.is_err() { return },
            r = changed.recv() => if r.is_none() { return },
        }
    }
}
