//! The fake kubelet's `devicesToAllocate`, GetPreferredAllocation and Allocate for one
//! container and one resource (see the parent module for the rules it follows).

use std::collections::HashSet;

use gpuplace_kubelet_api::HEALTHY;
use gpuplace_kubelet_api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Device,
    PreferredAllocationRequest,
};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::{Admission, Admitter};
use crate::kubelet_record::lock;

impl Admitter {
    /// `devicesToAllocate` and Allocate for one container.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn allocate_container(
        &self,
        seq: u64,
        container: &str,
        resource: &str,
        needed: usize,
        reuse: &[String],
        rng: &mut ChaCha8Rng,
        admission: &mut Admission,
    ) -> Result<Vec<String>, String> {
        let mut allocated: Vec<String> = Vec::new();
        // Sets where the lists are long: a share offers up to 1,000 slices a GPU.
        let take = |allocated: &mut Vec<String>, from: &[String], rng: &mut ChaCha8Rng| {
            let held: HashSet<&String> = allocated.iter().collect();
            let mut pool: Vec<String> =
                from.iter().filter(|d| !held.contains(d)).cloned().collect();
            pool.shuffle(rng);
            for d in pool {
                if allocated.len() >= needed {
                    break;
                }
                allocated.push(d);
            }
            allocated.len() == needed
        };
        let done = take(&mut allocated, reuse, rng);
        if !done {
            if !self.kubelet_shared.serves(resource) {
                return Err(format!(
                    "OutOf{resource}: Node didn't have enough resource: {resource}, Requested: {needed}, Used: 0, Capacity: 0"
                ));
            }
            let devices: Vec<Device> = self.kubelet_shared.devices(resource);
            let in_use = lock(&self.state).in_use();
            let available: Vec<&Device> = devices
                .iter()
                .filter(|d| d.health == HEALTHY && !in_use.contains(&d.id))
                .collect();
            let remaining = needed - allocated.len();
            if available.len() < remaining {
                return Err(format!(
                    "UnexpectedAdmissionError: requested number of devices unavailable for {resource}. Requested: {remaining}, Available: {}",
                    available.len()
                ));
            }
            let ids = |v: &[&Device]| v.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
            let numa = |d: &Device| {
                d.topology
                    .as_ref()
                    .and_then(|t| t.nodes.first())
                    .map(|n| n.id)
            };
            let (aligned, unaligned, no_affinity): (Vec<&Device>, Vec<&Device>, Vec<&Device>) =
                if self.options.numa_alignment {
                    // The narrowest mask: the lowest NUMA node that can hold the rest alone,
                    // else every node.
                    let mut nodes: Vec<i64> = available.iter().filter_map(|d| numa(d)).collect();
                    nodes.sort_unstable();
                    nodes.dedup();
                    let one = nodes.iter().copied().find(|n| {
                        available.iter().filter(|d| numa(d) == Some(*n)).count() >= remaining
                    });
                    let in_mask = |d: &Device| match (one, numa(d)) {
                        (Some(n), Some(m)) => n == m,
                        (None, Some(_)) => true,
                        _ => false,
                    };
                    (
                        available.iter().copied().filter(|d| in_mask(d)).collect(),
                        available
                            .iter()
                            .copied()
                            .filter(|d| numa(d).is_some() && !in_mask(d))
                            .collect(),
                        available
                            .iter()
                            .copied()
                            .filter(|d| numa(d).is_none())
                            .collect(),
                    )
                } else {
                    (Vec::new(), Vec::new(), available.clone())
                };
            let aligned_ids = ids(&aligned);
            let available_ids = ids(&available);
            let aligned_set: HashSet<&String> = aligned_ids.iter().collect();
            let available_set: HashSet<&String> = available_ids.iter().collect();
            let full = if remaining < aligned.len() {
                let preferred = self
                    .preferred(resource, &aligned_ids, &allocated, needed, admission)
                    .await?;
                let offered: Vec<String> = preferred
                    .into_iter()
                    .filter(|d| aligned_set.contains(d))
                    .collect();
                take(&mut allocated, &offered, rng) || take(&mut allocated, &aligned_ids, rng)
            } else if take(&mut allocated, &aligned_ids, rng) {
                true
            } else {
                let preferred = self
                    .preferred(resource, &available_ids, &allocated, needed, admission)
                    .await?;
                let offered: Vec<String> = preferred
                    .into_iter()
                    .filter(|d| available_set.contains(d))
                    .collect();
                take(&mut allocated, &offered, rng)
                    || take(&mut allocated, &ids(&unaligned), rng)
                    || take(&mut allocated, &ids(&no_affinity), rng)
            };
            if !full {
                return Err(format!(
                    "unexpectedly allocated less resources than required. Requested: {needed}, Got: {}",
                    allocated.len()
                ));
            }
        }
        let mut client = self
            .kubelet_shared
            .client(&self.dir, resource)
            .ok_or("no device plugin registered")?;
        let reply = client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: allocated.clone(),
                }],
            })
            .await
            .map_err(|s| format!("UnexpectedAdmissionError: Allocate failed: {}", s.message()))?;
        if reply.into_inner().container_responses.is_empty() {
            return Err("UnexpectedAdmissionError: empty Allocate response".into());
        }
        // The record and the checkpoint: the devices show in List from now on.
        let mut state = lock(&self.state);
        let others = state.in_use();
        if allocated.iter().any(|d| {
            others.contains(d)
                && !state
                    .active
                    .get(&seq)
                    .is_some_and(|e| e.devices.values().flatten().any(|x| x == d))
        }) {
            state.double_use += 1;
        }
        if let Some(e) = state.active.get_mut(&seq) {
            e.devices
                .entry(container.to_string())
                .or_default()
                .extend(allocated.iter().cloned());
        }
        Ok(allocated)
    }

    async fn preferred(
        &self,
        resource: &str,
        available: &[String],
        must: &[String],
        size: usize,
        admission: &mut Admission,
    ) -> Result<Vec<String>, String> {
        let mut client = self
            .kubelet_shared
            .client(&self.dir, resource)
            .ok_or("no device plugin registered")?;
        admission.preferred_calls += 1;
        let mut offered: Vec<String> = available.to_vec();
        let listed: HashSet<&String> = available.iter().collect();
        for m in must {
            if !listed.contains(m) && !offered[available.len()..].contains(m) {
                offered.push(m.clone());
            }
        }
        let started = std::time::Instant::now();
        let reply = client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: offered,
                    must_include_device_i_ds: must.to_vec(),
                    allocation_size: size as i32,
                }],
            })
            .await
            .map_err(|s| {
                format!(
                    "UnexpectedAdmissionError: GetPreferredAllocation failed: {}",
                    s.message()
                )
            })?;
        admission.preferred_latency.push(started.elapsed());
        Ok(reply
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }
}
