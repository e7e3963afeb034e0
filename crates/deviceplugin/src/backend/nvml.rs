//! The `nvml` backend: GPUs, NUMA, PCIe and NVLink topology and live health from NVML.
//!
//! NVML is loaded at run time (nvml-wrapper uses dlopen), so builds need no driver; without
//! one, [`NvmlBackend::start`] fails with a message saying what to do.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuplace_model::{Gpu, Link, NodeInventory, PcieLevel};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{EventSet, Nvml};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::health::HealthTracker;
use super::source::{Backend, BackendError, device_file_present};

/// Links NVML can report per GPU (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

/// GPUs from NVML with XID-driven health.
pub struct NvmlBackend {
    rx: watch::Receiver<Arc<NodeInventory>>,
}

impl NvmlBackend {
    /// Loads NVML, discovers the GPUs and starts the health thread.
    pub fn start(
        node_name: &str,
        xid_ignore: BTreeSet<u64>,
        recovery: Duration,
        dev_root: std::path::PathBuf,
    ) -> Result<Self, BackendError> {
        let nvml = Nvml::init().map_err(|e| BackendError::NoDriver(e.to_string()))?;
        let inventory = discover(&nvml, node_name)?;
        info!(
            gpus = inventory.gpus.len(),
            links = inventory.links.len(),
            "NVML discovery done"
        );
        let (tx, rx) = watch::channel(Arc::new(inventory));
        let tracker = HealthTracker::new(xid_ignore, recovery);
        std::thread::Builder::new()
            .name("nvml-health".into())
            .spawn(move || health_loop(nvml, tracker, tx, dev_root))
            .map_err(|e| BackendError::Nvml(format!("cannot start the health thread: {e}")))?;
        Ok(NvmlBackend { rx })
    }
}

impl Backend for NvmlBackend {
    fn watch(&self) -> watch::Receiver<Arc<NodeInventory>> {
        self.rx.clone()
    }
}

fn nvml_err(what: &str) -> impl Fn(NvmlError) -> BackendError + '_ {
    move |e| BackendError::Nvml(format!("{what}: {e}"))
}

/// NVML's `00000000:3B:00.0` as sysfs spells it: `0000:3b:00.0`.
pub fn sysfs_bus_id(nvml_bus_id: &str) -> String {
    let trimmed = nvml_bus_id.trim_end_matches('\0');
    let start = trimmed.len().saturating_sub(12);
    trimmed[start..].to_ascii_lowercase()
}

/// The PCIe level of NVML's common-ancestor answer.
pub fn pcie_level(level: &TopologyLevel) -> PcieLevel {
    match level {
        TopologyLevel::Internal => PcieLevel::SameBoard,
        TopologyLevel::Single => PcieLevel::SingleSwitch,
        TopologyLevel::Multiple => PcieLevel::MultiSwitch,
        TopologyLevel::HostBridge => PcieLevel::HostBridge,
        TopologyLevel::Node => PcieLevel::SameCpu,
        TopologyLevel::System => PcieLevel::CrossCpu,
    }
}

/// The NUMA node the GPU is attached to: the kernel's answer for its PCI device (what the
/// kubelet's topology manager uses), else NVML's memory affinity when it names exactly one
/// node (VMs often report -1 in sysfs; `nvidia-smi topo -m` shows the affinity). Not
/// `nvmlDeviceGetNumaNodeId`: that is the GPU's own memory node on coherent systems (Grace
/// Hopper), not the CPU side's; on the H200 check it answered nothing.
fn numa_node(device: &nvml_wrapper::Device<'_>, bus_id: &str) -> Option<u32> {
    let path = format!("/sys/bus/pci/devices/{}/numa_node", sysfs_bus_id(bus_id));
    let sysfs = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    sysfs.or_else(|| {
        // NVML_AFFINITY_SCOPE_NODE; four words cover 256 NUMA nodes.
        let words = device.memory_affinity(4, 0).ok()?;
        single_node(&words)
    })
}

/// The one node set in an NVML node mask, `None` when none or several are.
fn single_node(words: &[std::os::raw::c_ulong]) -> Option<u32> {
    let bits = std::os::raw::c_ulong::BITS;
    let mut found = None;
    for (w, &word) in words.iter().enumerate() {
        if word == 0 {
            continue;
        }
        if found.is_some() || word.count_ones() != 1 {
            return None;
        }
        found = u32::try_from(w)
            .ok()?
            .checked_mul(bits)?
            .checked_add(word.trailing_zeros());
    }
    found
}

/// Reads every GPU, the PCIe level of every pair and NVLink counts between peers.
pub(super) fn discover(nvml: &Nvml, node_name: &str) -> Result<NodeInventory, BackendError> {
    let count = nvml.device_count().map_err(nvml_err("device count"))?;
    let mut gpus = Vec::new();
    let mut bus_ids = Vec::new();
    for i in 0..count {
        let device = nvml.device_by_index(i).map_err(nvml_err("device"))?;
        let uuid = device.uuid().map_err(nvml_err("uuid"))?;
        let bus_id = device.pci_info().map_err(nvml_err("pci info"))?.bus_id;
        gpus.push(Gpu {
            id: uuid.clone(),
            index: device.index().unwrap_or(i),
            minor: device.minor_number().ok(),
            uuid,
            model: device.name().unwrap_or_default(),
            memory_mib: device.memory_info().map(|m| m.total >> 20).unwrap_or(0),
            numa_node: numa_node(&device, &bus_id),
            healthy: true,
            milli_capacity: gpuplace_model::MILLI_PER_GPU,
        });
        bus_ids.push(sysfs_bus_id(&bus_id));
    }
    // NVLink: links to a peer GPU count for that pair; links to an NVSwitch connect every
    // pair of switch-attached GPUs.
    let mut peer_links: HashMap<(usize, usize), u32> = HashMap::new();
    let mut switch_links = vec![0u32; gpus.len()];
    for (a, switch) in switch_links.iter_mut().enumerate() {
        let device = nvml.device_by_index(a as u32).map_err(nvml_err("device"))?;
        for link in 0..MAX_NVLINKS {
            let wrapper = device.link_wrapper_for(link);
            if !matches!(wrapper.is_active(), Ok(true)) {
                continue;
            }
            let Ok(remote) = wrapper.remote_pci_info() else {
                continue;
            };
            match bus_ids
                .iter()
                .position(|b| *b == sysfs_bus_id(&remote.bus_id))
            {
                Some(b) if b != a => *peer_links.entry((a.min(b), a.max(b))).or_default() += 1,
                Some(_) => {}
                None => *switch += 1,
            }
        }
    }
    let mut links = Vec::new();
    for a in 0..gpus.len() {
        for b in a + 1..gpus.len() {
            let da = nvml.device_by_index(a as u32).map_err(nvml_err("device"))?;
            let db = nvml.device_by_index(b as u32).map_err(nvml_err("device"))?;
            let pcie = da
                .topology_common_ancestor(db)
                .map(|l| pcie_level(&l))
                .unwrap_or(PcieLevel::CrossCpu);
            // Both ends report each link; count it once.
            let direct = peer_links.get(&(a, b)).copied().unwrap_or(0).div_ceil(2);
            let via_switch = switch_links[a].min(switch_links[b]);
            links.push(Link {
                a: gpus[a].index,
                b: gpus[b].index,
                nvlinks: direct.max(via_switch),
                pcie,
            });
        }
    }
    let inventory = NodeInventory {
        name: node_name.to_string(),
        cpu_milli: 0,
        memory_mib: 0,
        gpus,
        links,
        // The DRA driver publishes it as each device's `driverVersion`.
        labels: nvml
            .sys_driver_version()
            .ok()
            .map(|v| (crate::dra::slices::DRIVER_VERSION_LABEL.to_string(), v))
            .into_iter()
            .collect(),
        replicas: 1,
    };
    inventory
        .validate()
        .map_err(|e| BackendError::Nvml(format!("discovered inventory is inconsistent: {e}")))?;
    Ok(inventory)
}

fn publish(tx: &watch::Sender<Arc<NodeInventory>>, tracker: &HealthTracker) {
    let mut inventory = (**tx.borrow()).clone();
    for gpu in &mut inventory.gpus {
        gpu.healthy = tracker.is_healthy(&gpu.uuid);
    }
    if **tx.borrow() != inventory {
        let _ = tx.send(Arc::new(inventory));
    }
}

/// Waits for critical XID events, probes GPUs, and publishes health changes.
fn health_loop(
    nvml: Nvml,
    mut tracker: HealthTracker,
    tx: watch::Sender<Arc<NodeInventory>>,
    dev_root: std::path::PathBuf,
) {
    let uuids: Vec<String> = tx.borrow().gpus.iter().map(|g| g.uuid.clone()).collect();
    let files = DeviceFiles {
        minors: tx
            .borrow()
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.device_node()))
            .collect(),
        dev_root,
    };
    files.check(&uuids, &mut tracker, Instant::now());
    publish(&tx, &tracker);
    let events = xid_event_set(&nvml, &uuids);
    let probe = |uuid: &str| {
        nvml.device_by_uuid(uuid)
            .and_then(|d| d.memory_info())
            .is_ok()
    };
    let mut last_probe = Instant::now();
    while !tx.is_closed() {
        let now = Instant::now();
        match events.as_ref().map(|set| set.wait(1000)) {
            Some(Ok(event)) => on_xid_event(&event, &uuids, &mut tracker, now),
            Some(Err(NvmlError::Timeout)) => {}
            Some(Err(e)) => {
                warn!(error = %e, "waiting for NVML events failed");
                std::thread::sleep(Duration::from_secs(1));
            }
            None => std::thread::sleep(Duration::from_secs(1)),
        }
        if now.duration_since(last_probe) >= Duration::from_secs(5) {
            last_probe = now;
            for uuid in &uuids {
                if tracker.is_healthy(uuid) && !probe(uuid) && tracker.on_lost(uuid, now) {
                    error!(gpu = %uuid, "GPU does not answer NVML: marked unhealthy");
                }
            }
            files.check(&uuids, &mut tracker, now);
            for uuid in tracker.recover(now, |u| probe(u) && files.present(u)) {
                info!(gpu = %uuid, "GPU healthy again after the recovery period");
            }
        }
        publish(&tx, &tracker);
    }
}

/// The GPUs' device files (`/dev/nvidiaN`): a GPU whose file is gone is unhealthy.
struct DeviceFiles {
    minors: HashMap<String, u32>,
    dev_root: std::path::PathBuf,
}

impl DeviceFiles {
    fn present(&self, uuid: &str) -> bool {
        self.minors
            .get(uuid)
            .is_none_or(|&m| device_file_present(&self.dev_root, m))
    }

    /// Marks healthy GPUs whose device file is missing as lost.
    fn check(&self, uuids: &[String], tracker: &mut HealthTracker, now: Instant) {
        for uuid in uuids {
            if tracker.is_healthy(uuid) && !self.present(uuid) && tracker.on_lost(uuid, now) {
                error!(gpu = %uuid, dev_root = %self.dev_root.display(), "the GPU's device file is missing: marked unhealthy, not handed out");
            }
        }
    }
}

/// An event set with critical XID events registered for every GPU that reports them;
/// `None` when NVML gives none (health then comes from probes only).
fn xid_event_set<'nvml>(nvml: &'nvml Nvml, uuids: &[String]) -> Option<EventSet<'nvml>> {
    let mut events = match nvml.create_event_set() {
        Ok(set) => Some(set),
        Err(e) => {
            warn!(error = %e, "cannot create an NVML event set; health comes from probes only");
            None
        }
    };
    for uuid in uuids {
        let Some(set) = events.take() else { break };
        let Ok(device) = nvml.device_by_uuid(uuid.as_str()) else {
            events = Some(set);
            continue;
        };
        let supported = device
            .supported_event_types()
            .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
            .unwrap_or(false);
        if !supported {
            warn!(gpu = %uuid, "GPU does not report XID events; health comes from probes");
            events = Some(set);
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(set) => events = Some(set),
            Err(e) => {
                warn!(gpu = %uuid, error = %e.error, "cannot register XID events; recreating the set");
                events = nvml.create_event_set().ok();
            }
        }
    }
    events
}

/// One XID event: the GPUs it names (every GPU when NVML cannot say which) are marked
/// unhealthy if the XID is critical.
fn on_xid_event(
    event: &EventData<'_>,
    uuids: &[String],
    tracker: &mut HealthTracker,
    now: Instant,
) {
    let uuid = event.device.uuid().unwrap_or_default();
    let xid = match event.event_data {
        Some(XidError::Value(v)) => Some(v),
        _ => None,
    };
    let targets = super::health::xid_targets(&uuid, uuids);
    if targets.len() != 1 || targets[0] != uuid {
        error!(reported = %uuid, xid = ?xid, "XID event for a device NVML cannot identify: every GPU is affected");
    }
    for gpu in targets {
        if tracker.on_xid(gpu, xid, now) {
            error!(gpu = %gpu, xid = ?xid, "critical XID: GPU marked unhealthy");
        } else if tracker.is_healthy(gpu) {
            info!(gpu = %gpu, xid = ?xid, "XID ignored (application error)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_match_sysfs() {
        assert_eq!(sysfs_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(sysfs_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn topology_levels_map_nearest_last() {
        assert_eq!(pcie_level(&TopologyLevel::Internal), PcieLevel::SameBoard);
        assert_eq!(pcie_level(&TopologyLevel::System), PcieLevel::CrossCpu);
        assert!(pcie_level(&TopologyLevel::Single) > pcie_level(&TopologyLevel::HostBridge));
    }

    #[test]
    fn a_numa_mask_names_one_node_or_none() {
        assert_eq!(single_node(&[0b1, 0]), Some(0));
        assert_eq!(single_node(&[0, 0b100]), Some(64 + 2));
        assert_eq!(single_node(&[0b11]), None, "two nodes: no single answer");
        assert_eq!(single_node(&[1, 1]), None);
        assert_eq!(single_node(&[0, 0]), None);
    }

    #[test]
    fn without_a_driver_start_fails_clearly() {
        // On machines with the driver this discovers real GPUs instead; both are fine.
        match NvmlBackend::start("n", BTreeSet::new(), Duration::from_secs(1), "/dev".into()) {
            Ok(backend) => assert!(!backend.watch().borrow().gpus.is_empty()),
            Err(e) => assert!(e.to_string().starts_with("cannot load NVML"), "{e}"),
        }
    }
}
