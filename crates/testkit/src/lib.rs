//! Fakes shared by gpuplace's tests.
//!
//! [`FakeKubelet`] behaves like the kubelet's device manager over real unix sockets in a
//! temporary directory: it serves `Registration` on `kubelet.sock`, and inside `Register` it
//! dials the plugin back, reads its options and opens `ListAndWatch` before answering, as
//! the kubelet does. A restart deletes every socket in the directory and recreates
//! `kubelet.sock`, again as the kubelet does.

pub mod api;
pub mod clock;
pub mod cluster;
pub mod kubelet;
pub mod kubelet_node;
mod kubelet_record;
pub mod node_feed;
pub mod replay;
pub mod replay_api;
pub mod seed;
pub mod timeline;
pub mod workload;

pub use api::MemoryApi;
pub use kubelet::{FakeKubelet, KubeletHandle, Registered, wait_for_devices};
pub use kubelet_node::{Admission, FakeNode, NodeOptions};
