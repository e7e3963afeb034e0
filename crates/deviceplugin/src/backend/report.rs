//! `gpuplace device-plugin --discover`: what the plugin would advertise on this node, read
//! once and printed, with what NVML says about each GPU beyond the inventory (driver, MIG
//! mode, XID event support, whether it answers, its device file). An operator's check that a
//! node's GPUs, links and health are seen as they are, before the kubelet is involved.

use std::path::Path;

use gpuplace_model::NodeInventory;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use serde::Serialize;

use super::file::{parse_inventory, read_text};
use super::nvml::discover;
use super::source::{BackendError, device_file_present};

/// One discovery, as printed.
#[derive(Debug, Serialize)]
pub struct DiscoveryReport {
    /// `nvml` or `file`.
    pub backend: &'static str,
    /// The driver, when NVML is the source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverReport>,
    /// What the plugin advertises and publishes (health as the plugin would start with it).
    pub inventory: NodeInventory,
    /// Per GPU facts that are not in the inventory (NVML only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuReport>,
}

/// Versions NVML reports.
#[derive(Debug, Serialize)]
pub struct DriverReport {
    pub driver_version: String,
    pub nvml_version: String,
    /// CUDA driver API version, e.g. 12080 for 12.8.
    pub cuda_driver_version: Option<i32>,
}

/// What NVML says about one GPU beyond the inventory.
#[derive(Debug, Serialize)]
pub struct GpuReport {
    pub uuid: String,
    /// MIG mode now (`enabled`, `disabled`, or `unsupported` on GPUs without MIG).
    pub mig_mode: String,
    /// MIG mode after the next GPU reset, when it differs from `mig_mode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_mode_pending: Option<String>,
    /// MIG devices (GPU instances with a compute instance) on this GPU now.
    pub mig_devices: Vec<MigDeviceReport>,
    /// Whether the GPU reports critical XID events (else health comes from probes only).
    pub xid_events: bool,
    /// Whether a memory query answers (the health probe).
    pub answers: bool,
    /// Whether `<dev-root>/nvidia<minor>` is a character device.
    pub device_file: bool,
}

/// One MIG device.
#[derive(Debug, Serialize)]
pub struct MigDeviceReport {
    pub uuid: String,
    pub memory_mib: u64,
}

fn mig_name(mode: u32) -> String {
    match mode {
        0 => "disabled".into(),
        1 => "enabled".into(),
        other => format!("unknown ({other})"),
    }
}

/// Discovers this node's GPUs through NVML once, with the health the plugin would start
/// with (device file present and answering).
pub fn nvml_report(node_name: &str, dev_root: &Path) -> Result<DiscoveryReport, BackendError> {
    let nvml = Nvml::init().map_err(|e| BackendError::NoDriver(e.to_string()))?;
    let mut inventory = discover(&nvml, node_name)?;
    let driver = DriverReport {
        driver_version: nvml.sys_driver_version().unwrap_or_default(),
        nvml_version: nvml.sys_nvml_version().unwrap_or_default(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
    };
    let mut gpus = Vec::new();
    for gpu in &mut inventory.gpus {
        let report = gpu_report(&nvml, &gpu.uuid, gpu.device_node(), dev_root)?;
        // The health thread's first checks: a GPU that does not answer or whose device
        // file is missing starts unhealthy.
        gpu.healthy = report.answers && report.device_file;
        gpus.push(report);
    }
    Ok(DiscoveryReport {
        backend: "nvml",
        driver: Some(driver),
        inventory,
        gpus,
    })
}

fn gpu_report(
    nvml: &Nvml,
    uuid: &str,
    minor: u32,
    dev_root: &Path,
) -> Result<GpuReport, BackendError> {
    let device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| BackendError::Nvml(format!("device {uuid}: {e}")))?;
    let (mig_mode, mig_mode_pending) = match device.mig_mode() {
        Ok(mode) => (
            mig_name(mode.current),
            (mode.pending != mode.current).then(|| mig_name(mode.pending)),
        ),
        Err(_) => ("unsupported".to_string(), None),
    };
    let mut mig_devices = Vec::new();
    let count = device.mig_device_count().unwrap_or(0);
    for index in 0..count {
        // Slots without a MIG device answer NotFound.
        let Ok(mig) = device.mig_device_by_index(index) else {
            continue;
        };
        mig_devices.push(MigDeviceReport {
            uuid: mig.uuid().unwrap_or_default(),
            memory_mib: mig.memory_info().map(|m| m.total >> 20).unwrap_or(0),
        });
    }
    Ok(GpuReport {
        uuid: uuid.to_string(),
        mig_mode,
        mig_mode_pending,
        mig_devices,
        xid_events: device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR)),
        answers: device.memory_info().is_ok(),
        device_file: device_file_present(dev_root, minor),
    })
}

/// The file backend's discovery: the inventory as the plugin reads it.
pub fn file_report(path: &Path, node_name: &str) -> Result<DiscoveryReport, BackendError> {
    let text = read_text(path)?;
    Ok(DiscoveryReport {
        backend: "file",
        driver: None,
        inventory: parse_inventory(&text, &path.display().to_string(), node_name)?,
        gpus: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_modes_are_named() {
        assert_eq!(mig_name(0), "disabled");
        assert_eq!(mig_name(1), "enabled");
        assert_eq!(mig_name(7), "unknown (7)");
    }

    #[test]
    fn nvml_report_without_a_driver_fails_clearly() {
        // With a driver (the device machine) it reports the real GPUs instead.
        match nvml_report("n", Path::new("/dev")) {
            Ok(report) => {
                assert_eq!(report.gpus.len(), report.inventory.gpus.len());
                println!("{}", serde_json::to_string_pretty(&report).unwrap());
            }
            Err(e) => assert!(e.to_string().starts_with("cannot load NVML"), "{e}"),
        }
    }
}
