//! The stack's tests in one binary (scheduler, device plugins, fake kubelets and the
//! in-memory API together): `cargo test -p gpuplace-testkit --test integration replay::`
//! runs one file's tests.

mod api;
mod claims_twin;
mod clock;
mod fuzz;
mod fuzz_properties;
mod handshake;
mod preemption;
mod replay;
mod replay_live;
mod timeline;
