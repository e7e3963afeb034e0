//! The DRA driver's ResourceSlice publisher against an in-memory slice API as strict as the
//! real server on what it stores (quantities in canonical form; optionally taints dropped,
//! as a server with DRADeviceTaints off does): written on change only, a healed GPU's taint
//! removed, slices wiped by the kubelet re-created, a restarted publisher over leftovers.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpuplace_deviceplugin::dra::publish::{ApiError, PublishSettings, Publisher, SliceApi};
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::dra::{DRIVER, inventory};

/// A slice API in memory, as strict as the server on what it keeps: it may drop the
/// devices' taints (a server with DRADeviceTaints off).
#[derive(Default)]
struct Slices {
    stored: Mutex<BTreeMap<String, ResourceSlice>>,
    writes: Mutex<usize>,
    drop_taints: bool,
}

impl SliceApi for &Slices {
    async fn node_uid(&self, _: &str) -> Result<Option<String>, ApiError> {
        Ok(Some("node-uid".into()))
    }
    async fn list(&self, node: &str, driver: &str) -> Result<Vec<ResourceSlice>, ApiError> {
        Ok(self
            .stored
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.spec.node_name.as_deref() == Some(node) && s.spec.driver == driver)
            .cloned()
            .collect())
    }
    async fn create(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        if self.stored.lock().unwrap().contains_key(&name) {
            return Err(ApiError(format!("{name} already exists")));
        }
        self.store(slice)
    }
    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        self.store(slice)
    }
    async fn delete(&self, name: &str) -> Result<(), ApiError> {
        self.stored.lock().unwrap().remove(name);
        Ok(())
    }
}

impl Slices {
    fn store(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let mut kept = slice.clone();
        // As the real server does: quantities in canonical form ("1000" is stored as "1k").
        for d in kept.spec.devices.iter_mut().flatten() {
            for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                c.value.0 = canonical(&c.value.0);
                if let Some(p) = c.request_policy.as_mut() {
                    for q in p.default.iter_mut() {
                        q.0 = canonical(&q.0);
                    }
                    if let Some(r) = p.valid_range.as_mut() {
                        r.min.0 = canonical(&r.min.0);
                        for q in r.max.iter_mut().chain(r.step.iter_mut()) {
                            q.0 = canonical(&q.0);
                        }
                    }
                }
            }
        }
        if self.drop_taints {
            for d in kept.spec.devices.iter_mut().flatten() {
                d.taints = None;
            }
        }
        *self.writes.lock().unwrap() += 1;
        let name = kept.metadata.name.clone().unwrap_or_default();
        self.stored.lock().unwrap().insert(name, kept.clone());
        Ok(kept)
    }
}

/// A plain decimal quantity as the API server writes it back (`1000` -> `1k`).
fn canonical(q: &str) -> String {
    let Ok(mut n) = q.parse::<u64>() else {
        return q.to_string();
    };
    let mut suffix = "";
    for next in ["k", "M", "G", "T"] {
        if n == 0 || n % 1000 != 0 {
            break;
        }
        n /= 1000;
        suffix = next;
    }
    format!("{n}{suffix}")
}

fn publish_settings() -> PublishSettings {
    PublishSettings {
        driver: DRIVER.into(),
        node: "node-a".into(),
        shares: true,
    }
}

#[tokio::test]
async fn slices_are_written_on_change_only() {
    for drop_taints in [false, true] {
        let api = Slices {
            drop_taints,
            ..Default::default()
        };
        let mut publisher = Publisher::new(&api, publish_settings());
        let mut inv = inventory();
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 1, "first publish");
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 0, "unchanged");
        inv.gpus[2].healthy = false;
        assert_eq!(
            publisher.reconcile(&inv).await.unwrap(),
            1,
            "a GPU went unhealthy"
        );
        // With taints dropped by the server, what it stored is what we compare against:
        // no write on every event.
        assert_eq!(
            publisher.reconcile(&inv).await.unwrap(),
            0,
            "settled ({drop_taints})"
        );
        let generation = api
            .stored
            .lock()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .spec
            .pool
            .generation;
        assert_eq!(generation, 2);
        // The kubelet wiped the slices: published again, at a generation readers accept.
        api.stored.lock().unwrap().clear();
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 1, "re-created");
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 0);
        assert_eq!(*api.writes.lock().unwrap(), 3);
        let slice = api.stored.lock().unwrap().values().next().unwrap().clone();
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        // The GPU heals: its taint goes (where the server kept it), written once.
        inv.gpus[2].healthy = true;
        let healed = publisher.reconcile(&inv).await.unwrap();
        assert_eq!(healed, usize::from(!drop_taints), "healed ({drop_taints})");
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 0);
        // A restarted driver finds a taint left from before and a healthy GPU: it writes.
        inv.gpus[3].healthy = false;
        assert_eq!(publisher.reconcile(&inv).await.unwrap(), 1);
        inv.gpus[3].healthy = true;
        let mut restarted = Publisher::new(&api, publish_settings());
        let left = restarted.reconcile(&inv).await.unwrap();
        assert_eq!(left, usize::from(!drop_taints), "restarted ({drop_taints})");
        assert_eq!(restarted.reconcile(&inv).await.unwrap(), 0);
        assert!(
            api.stored
                .lock()
                .unwrap()
                .values()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .all(|d| d.taints.is_none()),
            "no taint left"
        );
    }
}
