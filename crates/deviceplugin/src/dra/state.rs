//! What the driver keeps on disk: the checkpoint of prepared claims (so that a restarted
//! plugin answers the kubelet as before) and one CDI spec per prepared claim (what the
//! runtime injects). Both are written to a temporary name and renamed, so a reader (the
//! runtime's CDI cache, a restarted plugin) never sees half a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::claim::{PreparedClaim, claim_env};

/// The checkpoint's format version.
const CHECKPOINT_VERSION: u32 = 1;
/// The CDI class of the driver's devices (the vendor is the driver name).
pub const CDI_CLASS: &str = "claim";
/// Device files every GPU container needs besides its GPUs.
const CONTROL_DEVICES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {path} is not a gpuplace DRA checkpoint: {message}")]
    Corrupt { path: PathBuf, message: String },
}

/// The prepared claims by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    version: u32,
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// Reads the checkpoint; none yet is an empty one.
    pub fn load(path: &Path) -> Result<Checkpoint, StateError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: CHECKPOINT_VERSION,
                    claims: BTreeMap::new(),
                });
            }
            Err(source) => {
                return Err(StateError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let corrupt = |message: String| StateError::Corrupt {
            path: path.to_path_buf(),
            message,
        };
        let checkpoint: Checkpoint =
            serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if checkpoint.version != CHECKPOINT_VERSION {
            return Err(corrupt(format!(
                "version {} (this plugin reads {CHECKPOINT_VERSION})",
                checkpoint.version
            )));
        }
        Ok(checkpoint)
    }

    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let mut copy = self.clone();
        copy.version = CHECKPOINT_VERSION;
        // Serializing plain strings and numbers cannot fail.
        let text = serde_json::to_string_pretty(&copy).unwrap_or_default();
        write_atomic(path, text.as_bytes())
    }
}

/// Where the driver's CDI specs live and what they may name.
#[derive(Clone, Debug)]
pub struct CdiSettings {
    /// The CDI spec directory the runtime reads (`/var/run/cdi`).
    pub root: PathBuf,
    /// The CDI vendor: the driver name.
    pub vendor: String,
    /// Name the GPUs' device files in the spec (only those present under `dev_root`).
    pub device_nodes: bool,
    pub dev_root: PathBuf,
}

impl CdiSettings {
    /// The fully qualified CDI device name of a prepared claim: `<driver>/claim=<uid>`.
    pub fn device_id(&self, claim_uid: &str) -> String {
        format!("{}/{CDI_CLASS}={claim_uid}", self.vendor)
    }

    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.root
            .join(format!("{}-{CDI_CLASS}_{claim_uid}.json", self.vendor))
    }

    /// Writes the claim's CDI spec: one device, named by the claim's UID, whose edits are
    /// the claim's environment and its GPUs' device files.
    pub fn write(&self, claim: &PreparedClaim) -> Result<(), StateError> {
        let env: Vec<String> = claim_env(claim)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut edits = serde_json::json!({ "env": env });
        if self.device_nodes && !claim.devices.is_empty() {
            let nodes: Vec<serde_json::Value> = claim
                .devices
                .iter()
                .map(|d| format!("nvidia{}", d.minor))
                .chain(CONTROL_DEVICES.iter().map(|c| c.to_string()))
                .filter(|name| crate::backend::is_device_node(&self.dev_root.join(name)))
                .map(|name| {
                    serde_json::json!({
                        "path": format!("/dev/{name}"),
                        "hostPath": self.dev_root.join(&name).display().to_string(),
                    })
                })
                .collect();
            edits["deviceNodes"] = serde_json::Value::Array(nodes);
        }
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": format!("{}/{CDI_CLASS}", self.vendor),
            "devices": [{ "name": claim.claim.uid, "containerEdits": edits }],
        });
        std::fs::create_dir_all(&self.root).map_err(|source| StateError::Write {
            path: self.root.clone(),
            source,
        })?;
        write_atomic(
            &self.spec_path(&claim.claim.uid),
            spec.to_string().as_bytes(),
        )
    }

    /// Removes the claim's CDI spec; an absent one is already removed.
    pub fn remove(&self, claim_uid: &str) -> Result<(), StateError> {
        let path = self.spec_path(claim_uid);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Write { path, source }),
        }
    }
}

/// Writes `bytes` to a hidden temporary name beside `path` (no `.json` ending, so the CDI
/// cache ignores it), then renames it over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let err = |source| StateError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
