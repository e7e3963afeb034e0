//! The device plugin's settings: flags beat environment beat the config file beat defaults.
//!
//! The binary parses flags and environment (clap) into a [`Settings`] of options, reads the
//! optional YAML file into another, and [`Settings::resolve`] merges them over the defaults.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

/// Where GPUs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// NVML from the NVIDIA driver, loaded at run time.
    Nvml,
    /// An inventory file (tests, demos, non-NVIDIA devices); `fake` is its old name.
    #[serde(alias = "fake")]
    File,
}

/// How devices are named to the container runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceIdStrategy {
    Uuid,
    Index,
}

/// How the allocated devices are passed to the container runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES`.
    Envvar,
    /// CDI device names in the Allocate response.
    Cdi,
    /// Both.
    Both,
}

/// How the node agent serves the kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeletApi {
    /// The device plugin API (v1beta1): extended resources; any cluster from 1.26.
    DevicePlugin,
    /// A DRA driver: ResourceSlices and the DRA kubelet plugin (v1); 1.34 and later.
    Dra,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    Text,
    Json,
}

/// A setting value that is not one of the accepted words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{value:?} is not one of: {accepted}")]
pub struct BadChoice {
    value: String,
    accepted: &'static str,
}

macro_rules! parse_choice {
    ($ty:ty, $accepted:literal, $($word:literal => $variant:expr),+) => {
        impl FromStr for $ty {
            type Err = BadChoice;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($word => Ok($variant),)+
                    _ => Err(BadChoice { value: s.to_string(), accepted: $accepted }),
                }
            }
        }
    };
}

// `fake` is the file backend's old name, kept so existing manifests and scripts still work.
parse_choice!(BackendKind, "nvml, file", "nvml" => BackendKind::Nvml, "file" => BackendKind::File,
    "fake" => BackendKind::File);
parse_choice!(DeviceIdStrategy, "uuid, index", "uuid" => DeviceIdStrategy::Uuid, "index" => DeviceIdStrategy::Index);
parse_choice!(DeviceListStrategy, "envvar, cdi, both",
    "envvar" => DeviceListStrategy::Envvar, "cdi" => DeviceListStrategy::Cdi, "both" => DeviceListStrategy::Both);
parse_choice!(KubeletApi, "device-plugin, dra",
    "device-plugin" => KubeletApi::DevicePlugin, "dra" => KubeletApi::Dra);
parse_choice!(LogFormat, "text, json", "text" => LogFormat::Text, "json" => LogFormat::Json);

/// Settings as given: every field optional, so sources can be layered.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    pub plugin_dir: Option<PathBuf>,
    pub resource: Option<String>,
    pub backend: Option<BackendKind>,
    pub inventory: Option<PathBuf>,
    pub node_name: Option<String>,
    pub replicas: Option<u32>,
    /// Also advertise GPU shares (`gpuplace.io/gpu-milli`, 1000 slices per GPU).
    pub shares: Option<bool>,
    pub device_id_strategy: Option<DeviceIdStrategy>,
    pub device_list_strategy: Option<DeviceListStrategy>,
    pub cdi_kind: Option<String>,
    pub dev_root: Option<PathBuf>,
    pub pass_device_specs: Option<bool>,
    pub pre_start_required: Option<bool>,
    /// Publish the inventory annotation and GFD labels on this node's Node object.
    pub publish_inventory: Option<bool>,
    /// Answer the kubelet with the scheduler's exact devices (watches this node's pods).
    pub handshake: Option<bool>,
    /// The kubelet's PodResources socket.
    pub pod_resources_socket: Option<PathBuf>,
    pub metrics_addr: Option<SocketAddr>,
    pub log_format: Option<LogFormat>,
    pub xid_ignore: Option<Vec<u64>>,
    pub health_recovery_seconds: Option<u64>,
    pub poll_interval_ms: Option<u64>,
    pub kubelet_api: Option<KubeletApi>,
    /// The DRA driver's name (DNS subdomain).
    pub dra_driver: Option<String>,
    /// The CDI spec directory the container runtime reads.
    pub cdi_root: Option<PathBuf>,
    /// The kubelet's plugin watcher directory.
    pub plugins_registry: Option<PathBuf>,
    /// Where DRA plugins keep their sockets and state.
    pub dra_plugin_dir: Option<PathBuf>,
}

/// Why settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("resource name {0:?} is not an extended resource name (vendor.domain/name)")]
    BadResource(String),
    #[error("replicas must be between 1 and 64, got {0}")]
    BadReplicas(u32),
    #[error(
        "shares (gpuplace.io/gpu-milli) and time-slicing replicas ({0}) cannot be combined: the kubelet would count one GPU three ways; choose one"
    )]
    SharesWithReplicas(u32),
    #[error("the file backend needs an inventory file (--inventory)")]
    MissingInventory,
    #[error("poll interval must be between 50 and 60000 ms, got {0}")]
    BadPollInterval(u64),
    #[error("cdi kind {0:?} is not vendor.domain/class")]
    BadCdiKind(String),
    #[error(
        "DRA driver name {0:?} is not a DNS subdomain of at most 63 characters with a dot (e.g. gpu.gpuplace.io)"
    )]
    BadDriver(String),
    #[error(
        "time-slicing replicas ({0}) are a device plugin feature; a DRA driver shares GPUs through consumable capacity (claims ask `milli`)"
    )]
    ReplicasWithDra(u32),
}

/// Settings resolved over the defaults and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub plugin_dir: PathBuf,
    pub resource: String,
    pub backend: BackendKind,
    pub inventory: Option<PathBuf>,
    /// This node's name; empty when not given (then nothing is published or watched).
    pub node_name: String,
    pub replicas: u32,
    /// Shares are advertised as a second resource, [`gpuplace_model::SHARE_RESOURCE`].
    pub shares: bool,
    pub device_id_strategy: DeviceIdStrategy,
    pub device_list_strategy: DeviceListStrategy,
    pub cdi_kind: String,
    pub dev_root: PathBuf,
    pub pass_device_specs: bool,
    pub pre_start_required: bool,
    /// Publish the inventory on the Node (needs API access; skipped with a warning without).
    pub publish_inventory: bool,
    /// Honour the scheduler's exact devices (needs API access and the node name).
    pub handshake: bool,
    pub pod_resources_socket: PathBuf,
    pub metrics_addr: Option<SocketAddr>,
    pub log_format: LogFormat,
    pub xid_ignore: BTreeSet<u64>,
    /// How long a GPU must stay free of critical errors to become healthy again; zero
    /// keeps it unhealthy until restart (NVIDIA's behaviour).
    pub health_recovery: Duration,
    /// Backstop stat of the plugin directory (inotify is the primary signal).
    pub poll_interval: Duration,
    pub kubelet_api: KubeletApi,
    pub dra: DraConfig,
}

/// The DRA driver's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DraConfig {
    pub driver: String,
    pub cdi_root: PathBuf,
    pub plugins_registry: PathBuf,
    pub plugin_dir: PathBuf,
}

/// XIDs NVIDIA's plugin also treats as application errors, not GPU faults.
pub const DEFAULT_XID_IGNORE: [u64; 6] = [13, 31, 43, 45, 68, 109];

impl Settings {
    /// Reads a YAML config file (keys as the flags, e.g. `device-list-strategy: both`).
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if text.trim().is_empty() {
            return Ok(Settings::default());
        }
        serde_saphyr::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Fills every unset field of `self` from `lower` (self wins).
    pub fn over(self, lower: Settings) -> Settings {
        Settings {
            plugin_dir: self.plugin_dir.or(lower.plugin_dir),
            resource: self.resource.or(lower.resource),
            backend: self.backend.or(lower.backend),
            inventory: self.inventory.or(lower.inventory),
            node_name: self.node_name.or(lower.node_name),
            replicas: self.replicas.or(lower.replicas),
            shares: self.shares.or(lower.shares),
            device_id_strategy: self.device_id_strategy.or(lower.device_id_strategy),
            device_list_strategy: self.device_list_strategy.or(lower.device_list_strategy),
            cdi_kind: self.cdi_kind.or(lower.cdi_kind),
            dev_root: self.dev_root.or(lower.dev_root),
            pass_device_specs: self.pass_device_specs.or(lower.pass_device_specs),
            pre_start_required: self.pre_start_required.or(lower.pre_start_required),
            publish_inventory: self.publish_inventory.or(lower.publish_inventory),
            handshake: self.handshake.or(lower.handshake),
            pod_resources_socket: self.pod_resources_socket.or(lower.pod_resources_socket),
            metrics_addr: self.metrics_addr.or(lower.metrics_addr),
            log_format: self.log_format.or(lower.log_format),
            xid_ignore: self.xid_ignore.or(lower.xid_ignore),
            health_recovery_seconds: self
                .health_recovery_seconds
                .or(lower.health_recovery_seconds),
            poll_interval_ms: self.poll_interval_ms.or(lower.poll_interval_ms),
            kubelet_api: self.kubelet_api.or(lower.kubelet_api),
            dra_driver: self.dra_driver.or(lower.dra_driver),
            cdi_root: self.cdi_root.or(lower.cdi_root),
            plugins_registry: self.plugins_registry.or(lower.plugins_registry),
            dra_plugin_dir: self.dra_plugin_dir.or(lower.dra_plugin_dir),
        }
    }

    /// Applies the defaults and checks the result.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let resource = self
            .resource
            .unwrap_or_else(|| gpuplace_model::keys::GPU_RESOURCE.to_string());
        if !is_extended_resource(&resource) {
            return Err(ConfigError::BadResource(resource));
        }
        let replicas = self.replicas.unwrap_or(1);
        if !(1..=64).contains(&replicas) {
            return Err(ConfigError::BadReplicas(replicas));
        }
        // Shares are on by default, but not beside time-slicing replicas.
        let shares = match self.shares {
            Some(true) if replicas > 1 => return Err(ConfigError::SharesWithReplicas(replicas)),
            Some(on) => on,
            None => replicas == 1,
        };
        if shares && resource == gpuplace_model::SHARE_RESOURCE {
            return Err(ConfigError::BadResource(resource));
        }
        let backend = self.backend.unwrap_or(BackendKind::Nvml);
        if backend == BackendKind::File && self.inventory.is_none() {
            return Err(ConfigError::MissingInventory);
        }
        let poll = self.poll_interval_ms.unwrap_or(500);
        if !(50..=60_000).contains(&poll) {
            return Err(ConfigError::BadPollInterval(poll));
        }
        let cdi_kind = self
            .cdi_kind
            .unwrap_or_else(|| gpuplace_model::keys::GPU_RESOURCE.to_string());
        if !is_extended_resource(&cdi_kind) {
            return Err(ConfigError::BadCdiKind(cdi_kind));
        }
        let kubelet_api = self.kubelet_api.unwrap_or(KubeletApi::DevicePlugin);
        if kubelet_api == KubeletApi::Dra && replicas > 1 {
            return Err(ConfigError::ReplicasWithDra(replicas));
        }
        let driver = self
            .dra_driver
            .unwrap_or_else(|| crate::dra::DEFAULT_DRIVER.to_string());
        if !is_driver_name(&driver) {
            return Err(ConfigError::BadDriver(driver));
        }
        let dra = DraConfig {
            driver,
            cdi_root: self
                .cdi_root
                .unwrap_or_else(|| PathBuf::from("/var/run/cdi")),
            plugins_registry: self
                .plugins_registry
                .unwrap_or_else(|| PathBuf::from(gpuplace_kubelet_api::DEFAULT_PLUGINS_REGISTRY)),
            plugin_dir: self
                .dra_plugin_dir
                .unwrap_or_else(|| PathBuf::from(gpuplace_kubelet_api::DEFAULT_PLUGINS_DIR)),
        };
        Ok(Config {
            kubelet_api,
            dra,
            plugin_dir: self
                .plugin_dir
                .unwrap_or_else(|| PathBuf::from(gpuplace_kubelet_api::DEFAULT_PLUGIN_DIR)),
            resource,
            backend,
            inventory: self.inventory,
            node_name: self
                .node_name
                .or_else(|| std::env::var("NODE_NAME").ok())
                .unwrap_or_default(),
            replicas,
            shares,
            device_id_strategy: self.device_id_strategy.unwrap_or(DeviceIdStrategy::Uuid),
            device_list_strategy: self
                .device_list_strategy
                .unwrap_or(DeviceListStrategy::Envvar),
            cdi_kind,
            dev_root: self.dev_root.unwrap_or_else(|| PathBuf::from("/dev")),
            pass_device_specs: self.pass_device_specs.unwrap_or(true),
            pre_start_required: self.pre_start_required.unwrap_or(false),
            publish_inventory: self.publish_inventory.unwrap_or(true),
            handshake: self.handshake.unwrap_or(true),
            pod_resources_socket: self.pod_resources_socket.unwrap_or_else(|| {
                PathBuf::from(gpuplace_kubelet_api::DEFAULT_POD_RESOURCES_SOCKET)
            }),
            metrics_addr: self.metrics_addr,
            log_format: self.log_format.unwrap_or(LogFormat::Text),
            xid_ignore: self
                .xid_ignore
                .unwrap_or_else(|| DEFAULT_XID_IGNORE.to_vec())
                .into_iter()
                .collect(),
            health_recovery: Duration::from_secs(self.health_recovery_seconds.unwrap_or(300)),
            poll_interval: Duration::from_millis(poll),
        })
    }
}

/// A DRA driver name: a lowercase DNS subdomain with a dot, at most 63 characters.
pub fn is_driver_name(name: &str) -> bool {
    name.len() <= 63
        && name.contains('.')
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `vendor.domain/name`: a DNS-like prefix with a dot, a slash, and a non-empty name.
pub fn is_extended_resource(name: &str) -> bool {
    let Some((prefix, rest)) = name.split_once('/') else {
        return false;
    };
    let label_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    };
    prefix.contains('.')
        && !prefix.starts_with("kubernetes.io")
        && label_ok(prefix)
        && label_ok(rest)
        && !rest.contains('/')
}

/// The plugin's socket file name for `resource`: `gpuplace-nvidia.com_gpu.sock`.
pub fn socket_name(resource: &str) -> String {
    let safe: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("gpuplace-{safe}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let flags = Settings {
            replicas: Some(4),
            ..Default::default()
        };
        let env = Settings {
            replicas: Some(2),
            resource: Some("example.com/gpu".into()),
            ..Default::default()
        };
        let file = Settings {
            resource: Some("other.com/gpu".into()),
            device_list_strategy: Some(DeviceListStrategy::Both),
            ..Default::default()
        };
        let config = flags.over(env).over(file).resolve().unwrap();
        assert_eq!(config.replicas, 4);
        assert_eq!(config.resource, "example.com/gpu");
        assert_eq!(config.device_list_strategy, DeviceListStrategy::Both);
        assert_eq!(config.device_id_strategy, DeviceIdStrategy::Uuid);
        assert_eq!(config.xid_ignore.len(), 6);
    }

    #[test]
    fn file_settings_parse_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "resource: example.com/gpu\nreplicas: 3\ndevice-list-strategy: cdi\nxid-ignore: [13]\n",
        )
        .unwrap();
        let s = Settings::from_file(&path).unwrap();
        assert_eq!(s.replicas, Some(3));
        assert_eq!(s.device_list_strategy, Some(DeviceListStrategy::Cdi));
        assert_eq!(s.xid_ignore, Some(vec![13]));
        std::fs::write(&path, "replicas: 3\ncolour: blue\n").unwrap();
        let err = Settings::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("colour"), "{err}");
        std::fs::write(&path, "replicas: many\n").unwrap();
        assert!(Settings::from_file(&path).is_err());
        // The file backend answers to its old name too, in the file and as a flag.
        for word in ["file", "fake"] {
            std::fs::write(&path, format!("backend: {word}\n")).unwrap();
            let s = Settings::from_file(&path).unwrap();
            assert_eq!(s.backend, Some(BackendKind::File));
            assert_eq!(word.parse::<BackendKind>().ok(), Some(BackendKind::File));
        }
    }

    #[test]
    fn bad_values_are_refused_with_reasons() {
        let bad = |s: Settings| s.resolve().unwrap_err().to_string();
        assert!(
            bad(Settings {
                resource: Some("gpu".into()),
                ..Default::default()
            })
            .contains("not an extended resource name")
        );
        assert!(
            bad(Settings {
                replicas: Some(0),
                ..Default::default()
            })
            .contains("replicas")
        );
        assert!(
            bad(Settings {
                backend: Some(BackendKind::File),
                ..Default::default()
            })
            .contains("inventory")
        );
        assert_eq!(
            "cdx".parse::<DeviceListStrategy>().unwrap_err().to_string(),
            "\"cdx\" is not one of: envvar, cdi, both"
        );
        assert!(
            bad(Settings {
                kubelet_api: Some(KubeletApi::Dra),
                replicas: Some(2),
                shares: Some(false),
                ..Default::default()
            })
            .contains("consumable capacity")
        );
        for name in ["gpu", "GPU.example.com", "-a.example.com", &"a.".repeat(40)] {
            assert!(
                bad(Settings {
                    dra_driver: Some(name.to_string()),
                    ..Default::default()
                })
                .contains("DNS subdomain"),
                "{name}"
            );
        }
        assert_eq!(
            "csi".parse::<KubeletApi>().unwrap_err().to_string(),
            "\"csi\" is not one of: device-plugin, dra"
        );
    }

    #[test]
    fn the_dra_driver_is_chosen_by_a_flag_or_the_file() {
        let file: Settings = serde_saphyr::from_str(
            "kubelet-api: dra\ndra-driver: gpu.example.com\ncdi-root: /etc/cdi\n",
        )
        .expect("parses");
        let config = Settings::default().over(file).resolve().expect("resolves");
        assert_eq!(config.kubelet_api, KubeletApi::Dra);
        assert_eq!(config.dra.driver, "gpu.example.com");
        assert_eq!(config.dra.cdi_root, PathBuf::from("/etc/cdi"));
        assert_eq!(
            config.dra.plugins_registry,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        let plain = Settings::default().resolve().expect("defaults");
        assert_eq!(plain.kubelet_api, KubeletApi::DevicePlugin);
        assert_eq!(plain.dra.driver, "gpu.gpuplace.io");
    }

    #[test]
    fn socket_names_are_safe() {
        assert_eq!(
            socket_name("nvidia.com/gpu"),
            "gpuplace-nvidia.com_gpu.sock"
        );
        assert!(is_extended_resource("nvidia.com/gpu"));
        assert!(!is_extended_resource("nvidia.com/"));
        assert!(!is_extended_resource("kubernetes.io/gpu"));
    }
}
