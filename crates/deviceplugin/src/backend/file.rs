//! The `file` backend (`--backend file`, formerly `fake`): GPUs from an inventory file,
//! reloaded when it changes. For nodes without NVML, tests and clusters of simulated GPUs.
//!
//! ```yaml
//! gpus:
//!   - uuid: GPU-0b7a5c2e-0000-4000-8000-000000000000
//!     index: 0
//!     model: Tesla-V100-SXM2-16GB
//!     memory_mib: 16160
//!     numa_node: 0
//!     healthy: true
//! links:
//!   - {a: 0, b: 1, nvlinks: 2, pcie: same-cpu}
//! ```
//! Editing the file (or sending SIGHUP) publishes the new inventory within the poll
//! interval; a file that no longer parses is logged and ignored, keeping the last good one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuplace_model::{Gpu, Link, NodeInventory};
use notify::Watcher;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::source::{Backend, BackendError, is_device_node};

/// One GPU of an inventory file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuEntry {
    pub uuid: String,
    pub index: u32,
    /// `/dev/nvidia<minor>` when it differs from the index.
    #[serde(default)]
    pub minor: Option<u32>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub memory_mib: u64,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default = "yes")]
    pub healthy: bool,
    /// The GPU's device file, when this node has one (the file backend expects none
    /// otherwise); a named file that is missing keeps the GPU unhealthy.
    #[serde(default)]
    pub device_file: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

/// The inventory file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryFile {
    pub gpus: Vec<GpuEntry>,
    #[serde(default)]
    pub links: Vec<Link>,
    /// Node CPU and memory, for demos that also feed the scheduler (optional here).
    #[serde(default)]
    pub cpu_milli: u64,
    #[serde(default)]
    pub memory_mib: u64,
}

/// A GPU whose inventory names a device file that is missing is kept unhealthy (logged).
fn device_file_ok(gpu: &GpuEntry) -> bool {
    match &gpu.device_file {
        Some(path) if !is_device_node(path) => {
            warn!(gpu = %gpu.uuid, path = %path.display(), "the GPU's device file is missing: unhealthy, not handed out");
            false
        }
        _ => true,
    }
}

/// Parses and validates inventory YAML; errors name the problem (and the line, for YAML).
pub fn parse_inventory(
    text: &str,
    path: &str,
    node_name: &str,
) -> Result<NodeInventory, BackendError> {
    let bad = |message: String| BackendError::BadInventory {
        path: path.to_string(),
        message,
    };
    let file: InventoryFile = serde_saphyr::from_str(text).map_err(|e| bad(e.to_string()))?;
    if file.gpus.is_empty() {
        return Err(bad("no gpus listed".into()));
    }
    for gpu in &file.gpus {
        if gpu.uuid.is_empty() {
            return Err(bad(format!("gpu {} has an empty uuid", gpu.index)));
        }
        if gpu.uuid.len() + 6 > 63 {
            return Err(bad(format!(
                "gpu uuid {:?} is too long for a device ID (63 characters with a replica or slice suffix)",
                gpu.uuid
            )));
        }
    }
    let inventory = NodeInventory {
        name: node_name.to_string(),
        cpu_milli: file.cpu_milli,
        memory_mib: file.memory_mib,
        gpus: file
            .gpus
            .into_iter()
            .map(|g| Gpu {
                healthy: g.healthy && device_file_ok(&g),
                id: g.uuid.clone(),
                index: g.index,
                minor: g.minor,
                uuid: g.uuid,
                model: g.model,
                memory_mib: g.memory_mib,
                numa_node: g.numa_node,
                milli_capacity: gpuplace_model::MILLI_PER_GPU,
            })
            .collect(),
        links: file.links,
        replicas: 1,
        labels: Default::default(),
    };
    inventory.validate().map_err(|e| bad(e.to_string()))?;
    Ok(inventory)
}

pub(super) fn read_text(path: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(path).map_err(|source| BackendError::ReadInventory {
        path: path.display().to_string(),
        source,
    })
}

/// GPUs from an inventory file.
pub struct FileBackend {
    rx: watch::Receiver<Arc<NodeInventory>>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl FileBackend {
    /// Reads the file (an unreadable or invalid file is an error) and starts watching it.
    /// Must run inside a tokio runtime.
    pub fn start(path: &Path, node_name: &str, poll: Duration) -> Result<Self, BackendError> {
        let path: PathBuf = path.to_path_buf();
        let text = read_text(&path)?;
        let first = parse_inventory(&text, &path.display().to_string(), node_name)?;
        let (tx, rx) = watch::channel(Arc::new(first));
        let (kick_tx, kick_rx) = mpsc::channel::<()>(16);
        let watcher = watch_file(&path, kick_tx.clone());
        let reload = Reload {
            path,
            node_name: node_name.to_string(),
            last_text: text,
        };
        tokio::spawn(reload.run(poll, tx, kick_rx));
        tokio::spawn(async move {
            #[cfg(unix)]
            if let Ok(mut hup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            {
                while hup.recv().await.is_some() {
                    if kick_tx.send(()).await.is_err() {
                        break;
                    }
                }
            }
        });
        Ok(FileBackend {
            rx,
            _watcher: watcher,
        })
    }
}

impl Backend for FileBackend {
    fn watch(&self) -> watch::Receiver<Arc<NodeInventory>> {
        self.rx.clone()
    }
}

/// Watches the file's directory (editors replace files rather than write them in place).
fn watch_file(path: &Path, kick: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let name = path.file_name().map(|n| n.to_os_string());
    let handler = move |event: notify::Result<notify::Event>| {
        // Reading the file (ours included) raises access events: only a change may kick
        // a reload, or every reload would kick the next.
        if let Ok(event) = event
            && !matches!(event.kind, notify::EventKind::Access(_))
            && event
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
        {
            let _ = kick.try_send(());
        }
    };
    match notify::recommended_watcher(handler) {
        Ok(mut watcher) => match watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
            Ok(()) => Some(watcher),
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot watch inventory directory; polling only");
                None
            }
        },
        Err(e) => {
            warn!(error = %e, "cannot create a file watcher; polling only");
            None
        }
    }
}

/// What the reload loop needs: the file, and the text the current inventory came from.
struct Reload {
    path: PathBuf,
    node_name: String,
    last_text: String,
}

impl Reload {
    async fn run(
        mut self,
        poll: Duration,
        tx: watch::Sender<Arc<NodeInventory>>,
        mut kick: mpsc::Receiver<()>,
    ) {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                k = kick.recv() => if k.is_none() { return },
            }
            if tx.is_closed() {
                return;
            }
            let Ok(text) = std::fs::read_to_string(&self.path) else {
                continue;
            };
            if text == self.last_text {
                continue;
            }
            let shown = self.path.display().to_string();
            match parse_inventory(&text, &shown, &self.node_name) {
                Ok(inventory) => {
                    if **tx.borrow() != inventory {
                        info!(path = %shown, "inventory changed");
                        let _ = tx.send(Arc::new(inventory));
                    }
                }
                Err(e) => {
                    warn!(error = %e, "ignoring invalid inventory; keeping the last good one")
                }
            }
            self.last_text = text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "gpus:\n  - {uuid: GPU-a, index: 0, model: T4, numa_node: 0}\n  - {uuid: GPU-b, index: 1, model: T4, healthy: false}\nlinks:\n  - {a: 0, b: 1, nvlinks: 0, pcie: same-cpu}\n";

    #[test]
    fn parses_an_inventory() {
        let inv = parse_inventory(TWO, "x.yaml", "node-1").unwrap();
        assert_eq!(inv.name, "node-1");
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!(inv.gpus[0].numa_node, Some(0));
        assert!(!inv.gpus[1].healthy);
        assert_eq!(inv.links[0].score(), 20);
    }

    #[test]
    fn a_named_device_file_that_is_missing_keeps_the_gpu_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        let present = dir.path().join("nvidia0");
        // A character device standing in for a GPU's device node.
        std::os::unix::fs::symlink("/dev/null", &present).unwrap();
        let missing = dir.path().join("nvidia1");
        let text = format!(
            "gpus:\n  - {{uuid: GPU-a, index: 0, device_file: {}}}\n  - {{uuid: GPU-b, index: 1, device_file: {}}}\n  - {{uuid: GPU-c, index: 2}}\n",
            present.display(),
            missing.display()
        );
        let inv = parse_inventory(&text, "x.yaml", "n").unwrap();
        let health: Vec<bool> = inv.gpus.iter().map(|g| g.healthy).collect();
        assert_eq!(health, [true, false, true], "no file named: none expected");
        assert!(super::super::source::device_file_present(dir.path(), 0));
        assert!(!super::super::source::device_file_present(dir.path(), 1));
    }

    #[test]
    fn bad_inventories_name_the_problem() {
        let err = |t: &str| parse_inventory(t, "inv.yaml", "n").unwrap_err().to_string();
        assert!(err("gpus: []\n").contains("no gpus listed"));
        assert!(
            err("gpus:\n  - {uuid: a, index: 0}\n  - {uuid: b, index: 0}\n")
                .contains("gpu index 0 appears more than once")
        );
        assert!(err("gpus:\n  - {uuid: a, index: 0, colour: red}\n").contains("colour"));
        assert!(
            err("gpus:\n  - {uuid: a, index: 0}\nlinks:\n  - {a: 0, b: 5, pcie: same-cpu}\n")
                .contains("not in the inventory")
        );
        assert!(
            err("gpus:\n  - {uuid: a, index: 0}\nlinks:\n  - {a: 0, b: 0, pcie: warp}\n")
                .starts_with("inventory inv.yaml:")
        );
        assert!(err(": : :").starts_with("inventory inv.yaml:"));
    }

    #[tokio::test]
    async fn edits_are_published_and_bad_edits_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(&path, TWO).unwrap();
        let backend = FileBackend::start(&path, "n", Duration::from_millis(50)).unwrap();
        let mut rx = backend.watch();
        assert!(!rx.borrow().gpus[1].healthy);
        std::fs::write(&path, TWO.replace("healthy: false", "healthy: true")).unwrap();
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(rx.borrow_and_update().gpus[1].healthy);
        std::fs::write(&path, "gpus: [").unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!rx.has_changed().unwrap());
        assert_eq!(rx.borrow().gpus.len(), 2);
    }
}
