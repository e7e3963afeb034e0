//! Where the GPUs come from: one small trait ([`Backend`]), two implementations (NVML, and a
//! file-backed inventory for machines without a GPU), and the health tracking they share.

mod file;
mod health;
mod nvml;
mod report;
mod source;

pub use file::{FileBackend, InventoryFile, parse_inventory};
pub use health::HealthTracker;
pub use nvml::NvmlBackend;
pub use report::{DiscoveryReport, file_report, nvml_report};
pub use source::{Backend, BackendError, device_file_present, is_device_node};
