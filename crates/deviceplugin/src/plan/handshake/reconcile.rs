//! The reconciler: writes the node's truth (what the kubelet's record holds) back on each
//! pod as `gpuplace.io/allocated`, and reports containers whose devices differ from the plan.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpuplace_model::{Allocated, ContainerAssignment, ContainerKind, DeviceShare};
use tracing::{info, warn};

use super::{Difference, Handshake, NodeApi, physical_ids, same_set};
use crate::devices::DeviceTable;
use crate::kubelet::podresources::Priority;
use crate::plan::identify::ListedPod;
use crate::plan::store::NodePod;

impl Handshake {
    /// Keeps every pod's record true until `shutdown`: reads `List` (in the background
    /// share of the rate limit) after each admission, on pod changes and every `resync`.
    pub async fn reconcile_loop<A: NodeApi>(
        self: Arc<Self>,
        api: A,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut changes = self.pods.subscribe();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.dirty.notified() => {}
                _ = changes.changed() => {}
                _ = tokio::time::sleep(self.config.resync) => {}
            }
            // Let an admission's remaining containers go first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            loop {
                match self.podres.list(Priority::Background).await {
                    Ok(Some(list)) => {
                        self.reconcile(&api, &list).await;
                        break;
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                    Err(e) => {
                        warn!(error = %e, "reconcile: cannot read the kubelet's pod resources");
                        break;
                    }
                }
            }
        }
    }

    /// One reconciliation pass over `list`; returns how many pods were written.
    pub async fn reconcile<A: NodeApi>(&self, api: &A, list: &[ListedPod]) -> usize {
        let table = self.tables.borrow().clone();
        let pods = self.pods.snapshot();
        {
            let mut state = self.state();
            let live: HashSet<&str> = pods.values().map(|p| p.uid.as_str()).collect();
            state.served.retain(|uid| live.contains(uid));
            state.written.retain(|uid, _| live.contains(uid.as_str()));
            state
                .reported
                .retain(|(uid, _)| live.contains(uid.as_str()));
            let state = &mut *state;
            for found in state.unattributed.attribute(&pods, list, &state.served) {
                info!(uid = %found.uid, container = %found.container, ids = ?found.ids, "attributed an earlier Allocate: the kubelet went on with this pod's later containers");
                self.metrics.handshake("allocate_attributed_later");
                state.served.record(&found.uid, &found.container, found.ids);
            }
        }
        let mut writes = 0;
        for l in list {
            let Some(pod) = pods.get(&(l.namespace.clone(), l.name.clone())) else {
                continue;
            };
            if pod.containers.is_empty() || pod.finished {
                continue;
            }
            let Some((real, differs)) = self.truth(&table, pod, l) else {
                continue;
            };
            for (container, planned, got) in &differs {
                let first = self
                    .state()
                    .reported
                    .insert((pod.uid.clone(), container.clone()));
                if first {
                    self.metrics.mismatches.inc();
                    let note = format!(
                        "container {container}: the kubelet allocated {got:?} instead of the scheduler's {planned:?}; the pod keeps them and gpuplace.io/allocated records them"
                    );
                    if let Err(e) = api.warn(pod, "GPUAllocationDiffers", note).await {
                        warn!(error = %e, "cannot record an Event");
                    }
                }
            }
            let desired =
                if pod.assignment().is_some() && differs.is_empty() && pod.allocated.is_none() {
                    continue;
                } else {
                    Allocated {
                        node: self.config.node.clone(),
                        containers: real,
                    }
                    .to_json()
                };
            let already = pod.allocated.as_deref() == Some(desired.as_str())
                || self.state().written.get(&pod.uid) == Some(&desired);
            if already {
                continue;
            }
            match api.set_allocated(pod, &desired).await {
                Ok(()) => {
                    writes += 1;
                    self.metrics.handshake("allocated_written");
                    self.state().written.insert(pod.uid.clone(), desired);
                    info!(pod = %format!("{}/{}", pod.namespace, pod.name), "recorded the kubelet's devices on the pod");
                }
                Err(e) => warn!(error = %e, "cannot record the kubelet's devices on the pod"),
            }
        }
        writes
    }

    /// What each container of `pod` really holds, and the containers that differ from the
    /// plan; `None` while a container that `List` shows has no devices yet.
    fn truth(
        &self,
        table: &DeviceTable,
        pod: &NodePod,
        listed: &ListedPod,
    ) -> Option<(Vec<ContainerAssignment>, Vec<Difference>)> {
        let served = self
            .state()
            .served
            .pod(&pod.uid)
            .cloned()
            .unwrap_or_default();
        let mut real = Vec::new();
        let mut differs = Vec::new();
        for c in &pod.containers {
            let listed_ids = listed
                .containers
                .iter()
                .find(|(n, d)| *n == c.name && !d.is_empty())
                .map(|(_, d)| d.clone());
            let ids = match (listed_ids, served.get(&c.name)) {
                (Some(ids), _) => ids,
                (None, Some(ids)) => ids.clone(),
                // A regular init container from before a plugin restart: never listed.
                (None, None) if c.kind == ContainerKind::Init => continue,
                (None, None) => return None,
            };
            let got = physical_ids(table, &ids);
            let planned = pod.planned(&c.name);
            if pod.assignment().is_some() && !same_set(&got, &planned) {
                differs.push((c.name.clone(), planned.clone(), got.clone()));
            }
            // A share holds as many milli as it has slices of the GPU.
            let milli = |id: &str| {
                let slices = ids
                    .iter()
                    .filter(|d| crate::devices::slice_gpu(d) == Some(id))
                    .count() as u32;
                if slices > 0 {
                    return slices;
                }
                pod.assignment()
                    .and_then(|a| a.devices().find(|d| d.id == id).map(|d| d.milli))
                    .unwrap_or(gpuplace_model::MILLI_PER_GPU)
            };
            real.push(ContainerAssignment {
                name: c.name.clone(),
                devices: got
                    .iter()
                    .map(|id| DeviceShare {
                        index: table
                            .inventory()
                            .gpus
                            .iter()
                            .find(|g| g.id == *id)
                            .map(|g| g.index)
                            .unwrap_or_default(),
                        id: id.clone(),
                        milli: milli(id),
                    })
                    .collect(),
            });
        }
        Some((real, differs))
    }
}
