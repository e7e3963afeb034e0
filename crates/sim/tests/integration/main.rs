//! The simulator's integration tests in one binary: `cargo test -p gpuplace-sim --test
//! integration openb::` runs one file's tests.

mod openb;
mod timeline;
