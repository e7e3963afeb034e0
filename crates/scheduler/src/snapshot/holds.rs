//! The devices of allocated claims no pod holds ([`ClaimHold`]), taken in the state.

use std::collections::BTreeMap;

use gpuplace_model::Request;

use super::{Held, Snapshot, Warning};
use crate::k8s::dra::store::ClaimHold;

impl Snapshot {
    /// Takes the devices of allocated claims no pod holds (`holds`), each under its key
    /// (never placed, so never a victim); one the state cannot take is skipped with a
    /// warning. Gives back the earlier holds of `before` first (both sorted by key).
    /// The view's DRA part: the claims no pod holds (those of `before`, the holds the
    /// state already counts, given back where they changed) and the DeviceClass that
    /// serves the GPU resource on DRA nodes.
    pub fn follow_claims(&mut self, before: &[ClaimHold], view: &crate::api::ClusterView) {
        self.hold_claims(before, &view.claim_holds);
        self.scalars.gpu_class = view.gpu_class.clone();
    }

    pub fn hold_claims(&mut self, before: &[ClaimHold], holds: &[ClaimHold]) {
        for old in before.iter().filter(|h| !h.is_in(holds)) {
            self.release(&old.key);
        }
        for hold in holds.iter().filter(|h| !h.is_in(before)) {
            let Some(n) = self.node_index(&hold.node) else {
                continue;
            };
            let inventory = self.state.inventory(n);
            let gpus: Vec<(usize, u32)> = hold
                .gpus
                .iter()
                .filter_map(|&(index, milli)| {
                    let pos = inventory.gpus.iter().position(|g| g.index == index)?;
                    Some((pos, milli.clamp(1, gpuplace_model::MILLI_PER_GPU)))
                })
                .collect();
            let milli = match gpus.first() {
                Some(&(_, m)) if gpus.iter().all(|&(_, x)| x == m) => m,
                _ => gpuplace_model::MILLI_PER_GPU,
            };
            let request = Request {
                gpu_count: gpus.len() as u32,
                gpu_milli: milli,
                ..Request::default()
            };
            match self.state.apply(n, &request, &gpus) {
                Ok(()) => {
                    self.held.insert(
                        hold.key.to_string(),
                        Held {
                            node: n,
                            request,
                            gpus,
                            extended: BTreeMap::new(),
                        },
                    );
                }
                // A claim written for a pod whose Binding is in flight: the pod's
                // reservation holds these devices until the watch shows it bound.
                Err(_)
                    if hold
                        .reserved_for
                        .iter()
                        .any(|uid| self.held.contains_key(uid)) => {}
                Err(e) => self.warnings.push(Warning::node(format!(
                    "{}: its devices on {} cannot be counted: {e}",
                    hold.key, hold.node
                ))),
            }
        }
    }
}
