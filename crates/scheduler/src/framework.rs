//! The scheduling framework: the stages one pending pod goes through, each in its own module,
//! and the [`Profile`] (built once per configuration) that strings them together for every
//! driver (the loop, gangs, preemption, make-room and the extender), as kube-scheduler's
//! framework does. The order of the stages for one unit is core's one cycle,
//! `gpuplace_core::cycle::schedule`.
//!
//! | stage | where |
//! |---|---|
//! | QueueSort | `gpuplace_core::Queue` (priority, then arrival; backoff and parking) |
//! | PreFilter / Filter | [`filter`] (node verdicts, extended resources) with [`crate::framework::node_filters`], [`crate::framework::volumes`], [`crate::framework::interpod`] |
//! | Score (narrowing) | [`crate::framework::preference`], through [`Profile::prefer`] |
//! | Score (placement) | `gpuplace_core::Placer` (node and exact GPUs), set up by [`placer`]; per member through `gpuplace_core::cycle::place::trial` over `shared/members.rs` |
//! | Reserve | a trial's copy of the state (`shared/members.rs`), then `shared/assume.rs`, kept by `shared/cluster_cache.rs` (assume/written/forget) |
//! | Permit | `gpuplace_core::cycle::place::permit` (a unit's minimum), carried out by `scheduler/gang_permit.rs` |
//! | PostFilter | `gpuplace_core::cycle::post_filter` over `scheduler/chain.rs` (preemption `scheduler/post_filter.rs`, reclaim, make-room; nominations in `shared/nominations.rs`) |
//! | Bind | `shared/bind.rs` (Bindings; Events in `scheduler/events.rs`) |
//!
//! A new filter is one new function in [`filter`] called from [`Profile::filter`]; a new
//! driver calls the profile instead of writing the chain out again.

pub mod claim_selectors;
pub mod filter;
pub mod interpod;
pub mod node_filters;
pub mod preference;
pub mod profile;
pub mod volumes;

pub use profile::{FilterInput, Filtering, Profile};

/// The placement stage for `policy`, or for a weighted sum of `weights` (a refused weight
/// list is logged and the policy scores alone): the scheduler and the extender set up
/// theirs here.
pub fn placer(
    policy: gpuplace_core::Policy,
    weights: &[(gpuplace_core::Policy, i64)],
    seed: u64,
) -> gpuplace_core::Placer {
    gpuplace_core::Placer::new(policy, seed)
        .with_weights(weights)
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, %policy, "weights refused; scoring with the policy alone");
            gpuplace_core::Placer::new(policy, seed)
        })
}
