//! The core's integration tests in one binary: `cargo test -p gpuplace-core --test
//! integration preempt::` runs one file's tests.

mod common;
mod defrag;
mod fairshare;
mod invariants;
mod multi_gpu;
mod preempt;
mod queue_store;
mod replicas;
mod requirements;
mod small_node;
mod symmetric_classes;
mod wake;
