//! The kubelet's gRPC contracts that gpuplace speaks, generated at build time from `.proto`
//! files written from the wire contract (no protoc needs to be installed), plus a helper to
//! open gRPC channels over unix sockets.

use std::path::{Path, PathBuf};

/// Device plugin API v1beta1 (`/v1beta1.DevicePlugin/...`, `/v1beta1.Registration/Register`).
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// PodResources API v1 (`/v1.PodResourcesLister/...`).
pub mod podresources {
    tonic::include_proto!("v1");
}

/// DRA kubelet plugin API v1 (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// DRA device health v1alpha1 (`/v1alpha1.DRAResourceHealth/NodeWatchResources`).
pub mod drahealth {
    tonic::include_proto!("v1alpha1");
}

/// The plugin watcher's registration API (`/pluginregistration.Registration/...`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The gRPC service a DRA plugin lists in `PluginInfo.supported_versions`.
pub const DRA_SERVICE_V1: &str = "v1.DRAPlugin";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// Where the kubelet's plugin watcher looks for registration sockets.
pub const DEFAULT_PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";
/// Where plugins keep their own sockets and state.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// API version string sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// Device health values.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// Default directory of device plugin sockets.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket name inside the plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Default PodResources socket.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Opens a gRPC channel to a unix socket (lazily: the first call connects). The URI's
/// authority is `localhost`, as kubelets from 1.26 on send it.
pub fn unix_channel(path: impl AsRef<Path>) -> tonic::transport::Channel {
    let path: PathBuf = path.as_ref().to_path_buf();
    // The URI is a fixed, valid literal: parsing it cannot fail.
    let endpoint = tonic::transport::Endpoint::from_static("http://localhost");
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    }))
}

/// Like [`unix_channel`] but connects now, failing within `timeout` if nobody listens.
pub async fn connect_unix(
    path: impl AsRef<Path>,
    timeout: std::time::Duration,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path: PathBuf = path.as_ref().to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}
