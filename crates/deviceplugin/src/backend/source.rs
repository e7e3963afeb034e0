//! The one trait every GPU source implements, its errors, and device-file checks.

use std::sync::Arc;

use gpuplace_model::NodeInventory;
use tokio::sync::watch;

/// Why a backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot read inventory {path}: {source}")]
    ReadInventory {
        path: String,
        source: std::io::Error,
    },
    #[error("inventory {path}: {message}")]
    BadInventory { path: String, message: String },
    #[error(
        "cannot load NVML ({0}); is the NVIDIA driver installed and the container started with the NVIDIA runtime? Use --backend file --inventory FILE to run without a GPU"
    )]
    NoDriver(String),
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("cannot watch {path}: {message}")]
    Watch { path: String, message: String },
}

/// A source of the node's GPUs, their links and their live health.
pub trait Backend: Send + Sync + 'static {
    /// The current inventory; every change (health, reload) is published here.
    fn watch(&self) -> watch::Receiver<Arc<NodeInventory>>;
}

/// Whether the device file of a GPU exists on the host (`<dev_root>/nvidia<minor>`) as a
/// character device. A GPU whose file is missing (a driver being reinstalled, a device
/// gone) is kept unhealthy: handing it out would fail the container (`lstat /dev/nvidia0`).
pub fn device_file_present(dev_root: &std::path::Path, minor: u32) -> bool {
    is_device_node(&dev_root.join(format!("nvidia{minor}")))
}

/// Whether `path` is a character device (following symlinks): what a container runtime
/// accepts as a device spec's host path.
pub fn is_device_node(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}
