//! The binary's tests in one binary: `cargo test -p gpuplace --test integration
//! simulate::` runs one file's tests.

mod deploy;
mod device_plugin;
mod nvml;
mod replay;
mod scheduler;
mod simulate;
mod simulate_dra;
mod simulate_pods;
