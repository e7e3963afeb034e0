//! The DRA kubelet plugin's two gRPC endpoints: the registration socket the kubelet's plugin
//! watcher finds (`<registry>/<driver>-reg.sock`, service `pluginregistration.Registration`)
//! and the plugin socket it then calls (`<plugins>/<driver>/dra.sock`, service
//! `v1.DRAPlugin`). A restarted kubelet scans the registry again, so the sockets stay
//! where they are; a socket someone removed is bound again within [`RECHECK`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuplace_kubelet_api::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use gpuplace_kubelet_api::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use gpuplace_kubelet_api::drahealth::dra_resource_health_server::DraResourceHealthServer;
use gpuplace_kubelet_api::pluginregistration::registration_server::{
    Registration, RegistrationServer,
};
use gpuplace_kubelet_api::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use gpuplace_kubelet_api::{DRA_PLUGIN_TYPE, DRA_SERVICE_V1};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::claim::ClaimRef;
use super::prepare::{ClaimSource, Preparer};
use crate::metrics::Metrics;

/// How often the sockets are checked for having been removed.
pub const RECHECK: Duration = Duration::from_secs(5);
/// How long stopping waits for open connections before it drops them.
pub const GRACE: Duration = Duration::from_secs(5);
/// Claims in one kubelet call at most (a pod has at most a few; this bounds a bad caller).
pub const MAX_CLAIMS_PER_CALL: usize = 256;

/// Where the two sockets are.
#[derive(Clone, Debug)]
pub struct Sockets {
    pub registration: PathBuf,
    pub plugin: PathBuf,
}

impl Sockets {
    pub fn new(registry: &Path, plugins: &Path, driver: &str) -> Sockets {
        Sockets {
            registration: registry.join(format!("{driver}-reg.sock")),
            plugin: plugins.join(driver).join("dra.sock"),
        }
    }
}

/// `v1.DRAPlugin` over a [`Preparer`].
pub struct DraService<S> {
    preparer: Arc<Preparer<S>>,
    metrics: Metrics,
}

impl<S> DraService<S> {
    pub fn new(preparer: Arc<Preparer<S>>, metrics: Metrics) -> Self {
        DraService { preparer, metrics }
    }
}

fn claim_ref(c: &Claim) -> Result<ClaimRef, Status> {
    if c.uid.is_empty() || c.name.is_empty() || c.namespace.is_empty() {
        return Err(Status::invalid_argument(format!(
            "claim {:?}/{:?} ({:?}): namespace, name and uid are required",
            c.namespace, c.name, c.uid
        )));
    }
    Ok(ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    })
}

fn bounded(claims: &[Claim]) -> Result<(), Status> {
    if claims.len() > MAX_CLAIMS_PER_CALL {
        return Err(Status::invalid_argument(format!(
            "{} claims in one call; at most {MAX_CLAIMS_PER_CALL}",
            claims.len()
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl<S: ClaimSource> DraPlugin for DraService<S> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        bounded(&claims)?;
        let mut answer = NodePrepareResourcesResponse::default();
        for c in &claims {
            let asked = claim_ref(c)?;
            let one = match self.preparer.prepare(&asked).await {
                Ok(prepared) => {
                    self.metrics.allocations.inc();
                    let cdi = self.preparer.cdi_device_id(&asked.uid);
                    NodePrepareResourceResponse {
                        devices: prepared
                            .devices
                            .iter()
                            .map(|d| Device {
                                request_names: vec![d.request.clone()],
                                pool_name: d.pool.clone(),
                                device_name: d.device.clone(),
                                cdi_device_ids: vec![cdi.clone()],
                                share_id: d.share_id.clone(),
                            })
                            .collect(),
                        error: String::new(),
                    }
                }
                Err(e) => {
                    warn!(claim = %asked, error = %e, "cannot prepare claim");
                    self.metrics
                        .allocation_errors
                        .get_or_create(&crate::metrics::ReasonLabel {
                            reason: "dra_prepare".into(),
                        })
                        .inc();
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            answer.claims.insert(c.uid.clone(), one);
        }
        Ok(Response::new(answer))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        bounded(&claims)?;
        let mut answer = NodeUnprepareResourcesResponse::default();
        for c in &claims {
            let asked = claim_ref(c)?;
            let error = match self.preparer.unprepare(&asked).await {
                Ok(()) => String::new(),
                Err(e) => {
                    warn!(claim = %asked, error = %e, "cannot unprepare claim");
                    e.to_string()
                }
            };
            answer
                .claims
                .insert(c.uid.clone(), NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(answer))
    }
}

/// `pluginregistration.Registration`: tells the kubelet who we are and where to call.
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    metrics: Metrics,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_SERVICE_V1.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            self.metrics.registrations.inc();
            self.metrics.registered.set(1);
            info!(driver = %self.driver, "registered with the kubelet");
        } else {
            self.metrics.registration_failures.inc();
            self.metrics.registered.set(0);
            warn!(driver = %self.driver, error = %status.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds `path` afresh (a stale socket file from an earlier run is removed first).
fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Serves both sockets until `shutdown` turns true, binding again any socket that was
/// removed; removes them on the way out (the kubelet then unregisters the driver).
pub async fn serve<S: ClaimSource>(
    sockets: Sockets,
    driver: String,
    preparer: Arc<Preparer<S>>,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    loop {
        let (stop, stop_rx) = watch::channel(false);
        let plugin = bind(&sockets.plugin)?;
        let registration = bind(&sockets.registration)?;
        let dra = DraPluginServer::new(DraService::new(preparer.clone(), metrics.clone()));
        let health = DraResourceHealthServer::new(super::health::HealthService {
            pool: preparer.pool().to_string(),
            inventory: preparer.inventory(),
        });
        let reg = RegistrationServer::new(RegistrationService {
            driver: driver.clone(),
            endpoint: sockets.plugin.display().to_string(),
            metrics: metrics.clone(),
        });
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let plugin_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dra)
                .add_service(health)
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(plugin),
                    until(stop_rx.clone()),
                ),
        );
        let reg_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(reg)
                .serve_with_incoming_shutdown(
                    // The kubelet sends the socket's path as :authority: rewritten first.
                    UnixListenerStream::new(registration)
                        .map(|conn| conn.map(super::authority::proxied)),
                    until(stop_rx),
                ),
        );
        info!(registration = %sockets.registration.display(), plugin = %sockets.plugin.display(), "DRA plugin serving");
        let ended = loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break true,
                _ = tokio::time::sleep(RECHECK) => {
                    if !(sockets.plugin.exists() && sockets.registration.exists()) {
                        warn!("a DRA plugin socket was removed; binding both again");
                        break false;
                    }
                }
            }
        };
        let _ = stop.send(true);
        // Graceful: calls in flight finish; a client that keeps its connection open past
        // GRACE does not hold the driver up.
        for task in [plugin_task, reg_task] {
            let abort = task.abort_handle();
            if tokio::time::timeout(GRACE, task).await.is_err() {
                abort.abort();
            }
        }
        if ended {
            let _ = std::fs::remove_file(&sockets.registration);
            let _ = std::fs::remove_file(&sockets.plugin);
            metrics.registered.set(0);
            return Ok(());
        }
    }
}
