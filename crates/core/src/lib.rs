//! Pure, deterministic GPU placement.
//!
//! [`ClusterState`] holds what is free on every node; [`Placer`] decides where a
//! [`Request`](gpuplace_model::Request) goes (node and exact GPUs) with one [`Policy`], and
//! explains per node why it could not when nothing fits. No I/O, no async, no clock: the same
//! seed gives the same decisions, so what the simulator measures is what production runs.

mod classes;
pub mod cycle;
pub mod defrag;
mod devices;
pub mod fairshare;
mod fit;
mod frag;
mod gaps;
mod node_state;
mod placer;
mod policy;
pub mod preempt;
pub mod queue;
pub mod rate;
pub mod replicas;
pub mod require;
mod reserve;
pub mod shortage;
mod state;
mod symmetry;
pub mod topology;
pub mod waiting;
pub mod wake;

pub use fit::{Asked, FitFailure, Unschedulable};
pub use frag::{Shape, ShapeCounts, TargetWorkload};
pub use gaps::GapCounts;
pub use placer::{Decision, Placer, TieBreak, WeightError};
pub use policy::{Ideas, Policy, UnknownPolicy};
pub use reserve::ModelReserve;
pub use state::{ClusterState, NodeState, StateError};
