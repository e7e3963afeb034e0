//! The device plugin's integration tests in one binary: `cargo test -p
//! gpuplace-deviceplugin --test integration kubelet::` runs one file's tests.

mod dra;
mod dra_slices;
mod kubelet;
mod publish;
