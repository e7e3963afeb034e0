//! Serving on the plugin socket, registering with the kubelet, and doing both again
//! whenever the kubelet restarts.
//!
//! The kubelet deletes every socket in the plugin directory when it starts and recreates
//! `kubelet.sock`; it dials the plugin back inside `Register`, so the plugin must already be
//! serving. The loop below therefore (1) binds and serves, (2) registers, retrying with
//! backoff while the kubelet is absent, and (3) watches the directory (inotify, with a
//! periodic stat as backstop) until our socket disappears or `kubelet.sock` is replaced,
//! then starts over.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuplace_kubelet_api::v1beta1::device_plugin_server::DevicePluginServer;
use gpuplace_kubelet_api::v1beta1::registration_client::RegistrationClient;
use gpuplace_kubelet_api::v1beta1::{DevicePluginOptions, RegisterRequest};
use gpuplace_kubelet_api::{KUBELET_SOCKET, VERSION, connect_unix};
use notify::Watcher;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::config::{Config, socket_name};
use crate::devices::DeviceTable;
use crate::kubelet::service::DevicePluginService;
use crate::metrics::Metrics;
use crate::plan::handshake::Handshake;

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin directory {0} does not exist")]
    NoPluginDir(PathBuf),
}

/// Identity of a file: device, inode and change time (inodes alone get reused).
fn identity(path: &Path) -> Option<KubeletIdentity> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Exponential backoff between registration attempts.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        now
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// One gRPC server bound to the plugin socket.
struct Instance {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    socket: PathBuf,
    identity: Option<(u64, u64, i64, i64)>,
}

impl Instance {
    fn start(
        socket: &Path,
        tables: watch::Receiver<Arc<DeviceTable>>,
        config: Arc<Config>,
        metrics: Metrics,
        handshake: Option<Arc<Handshake>>,
        share: bool,
    ) -> std::io::Result<Instance> {
        match std::fs::remove_file(socket) {
            Ok(()) => info!(socket = %socket.display(), "removed a stale socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        let identity = identity(socket);
        let (stop, stop_rx) = watch::channel(false);
        let mut service =
            DevicePluginService::new(tables, config, metrics, stop_rx.clone(), handshake);
        if share {
            service = service.for_shares();
        }
        let mut shutdown = stop_rx;
        let task = tokio::spawn(async move {
            let signal = async move {
                let _ = shutdown.wait_for(|stopping| *stopping).await;
            };
            let result = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), signal)
                .await;
            if let Err(e) = result {
                warn!(error = %e, "plugin server stopped with an error");
            }
        });
        Ok(Instance {
            stop,
            task,
            socket: socket.to_path_buf(),
            identity,
        })
    }

    /// Whether our socket file is still the one we bound.
    fn socket_intact(&self) -> bool {
        self.identity.is_some() && identity(&self.socket) == self.identity
    }

    /// Stops serving: ends open streams, removes the socket if it is still ours, and
    /// returns the server task to wait for (connections close at the client's pace).
    fn begin_stop(self) -> JoinHandle<()> {
        let _ = self.stop.send(true);
        if self.socket_intact() {
            let _ = std::fs::remove_file(&self.socket);
        }
        let mut task = self.task;
        tokio::spawn(async move {
            if tokio::time::timeout(Duration::from_secs(3), &mut task)
                .await
                .is_err()
            {
                warn!("plugin server did not stop in 3 s; aborting it");
                task.abort();
            }
        })
    }

    /// Stops serving and waits for the server to finish (shutdown).
    async fn stop(self) {
        let _ = self.begin_stop().await;
    }

    /// Stops serving without waiting, so a new instance can serve at once (restart).
    fn retire(self) {
        drop(self.begin_stop());
    }
}

/// Calls `Register` on the kubelet socket.
async fn register(
    kubelet: &Path,
    config: &Config,
    resource: &str,
    socket_file: &str,
) -> Result<(), String> {
    let channel = connect_unix(kubelet, Duration::from_secs(2))
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", kubelet.display()))?;
    let mut client = RegistrationClient::new(channel);
    let request = RegisterRequest {
        version: VERSION.to_string(),
        endpoint: socket_file.to_string(),
        resource_name: resource.to_string(),
        options: Some(DevicePluginOptions {
            pre_start_required: config.pre_start_required,
            get_preferred_allocation_available: true,
        }),
    };
    // The kubelet dials us back inside Register (10 s timeout on its side).
    match tokio::time::timeout(Duration::from_secs(15), client.register(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(format!(
            "kubelet refused registration: {}",
            status.message()
        )),
        Err(_) => Err("kubelet did not answer Register within 15 s".to_string()),
    }
}

/// Kicks `tx` on any change in `dir`; `None` when inotify is unavailable (polling only).
fn watch_dir(dir: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        // Sockets created, replaced or removed matter; opens and reads do not.
        if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = tx.try_send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "cannot create a directory watcher; polling only");
            return None;
        }
    };
    match watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot watch the plugin directory; polling only");
            None
        }
    }
}

/// Serves and registers until `shutdown` completes, surviving kubelet restarts.
pub async fn run(
    config: Arc<Config>,
    tables: watch::Receiver<Arc<DeviceTable>>,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    run_with_handshake(config, tables, metrics, None, shutdown).await
}

/// [`run`], answering the kubelet with the scheduler's plans through `handshake`. With
/// shares on, a second endpoint serves the share resource (`gpuplace.io/gpu-milli`) from
/// the same table and handshake, so one record covers both.
pub async fn run_with_handshake(
    config: Arc<Config>,
    tables: watch::Receiver<Arc<DeviceTable>>,
    metrics: Metrics,
    handshake: Option<Arc<Handshake>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let dir = config.plugin_dir.clone();
    if !dir.is_dir() {
        return Err(PluginError::NoPluginDir(dir));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let whole = run_resource(
        config.clone(),
        config.resource.clone(),
        false,
        tables.clone(),
        metrics.clone(),
        handshake.clone(),
        stopped(stop_rx.clone()),
    );
    let shares = async {
        if config.shares {
            run_resource(
                config.clone(),
                gpuplace_model::SHARE_RESOURCE.to_string(),
                true,
                tables,
                metrics,
                handshake,
                stopped(stop_rx.clone()),
            )
            .await
        } else {
            Ok(())
        }
    };
    let signal = async {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let (a, b, ()) = tokio::join!(whole, shares, signal);
    a.and(b)
}

/// The kubelet socket's identity (device, inode, change time): a new kubelet makes a new one.
type KubeletIdentity = (u64, u64, i64, i64);

/// How a phase of the registration loop ended.
enum Next<T> {
    Go(T),
    /// The plugin socket went: serve and register again.
    StartOver,
    /// Shutdown was asked.
    Stop,
}

/// Serves and registers one resource until `shutdown` completes.
async fn run_resource(
    config: Arc<Config>,
    resource: String,
    share: bool,
    tables: watch::Receiver<Arc<DeviceTable>>,
    metrics: Metrics,
    handshake: Option<Arc<Handshake>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    let dir = config.plugin_dir.clone();
    let socket_file = socket_name(&resource);
    let socket = dir.join(&socket_file);
    let (kick_tx, kick) = mpsc::channel::<()>(64);
    // The loop keeps a sender: without a watcher (no inotify) the channel must stay open,
    // or every `recv` would return at once and the loop would spin.
    let _watcher = watch_dir(&dir, kick_tx.clone());
    let mut registrar = Registrar {
        kubelet: dir.join(KUBELET_SOCKET),
        config: config.clone(),
        resource,
        socket_file,
        kick,
        metrics: metrics.clone(),
        backoff: Backoff::new(),
    };
    tokio::pin!(shutdown);
    loop {
        let instance = match Instance::start(
            &socket,
            tables.clone(),
            config.clone(),
            metrics.clone(),
            handshake.clone(),
            share,
        ) {
            Ok(instance) => instance,
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "cannot serve on the plugin socket");
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(registrar.backoff.step()) => continue,
                }
            }
        };
        info!(socket = %socket.display(), "serving");
        let identity = match registrar.register(&instance, shutdown.as_mut()).await {
            Next::Go(identity) => identity,
            Next::StartOver => {
                instance.retire();
                continue;
            }
            Next::Stop => {
                instance.stop().await;
                return Ok(());
            }
        };
        info!(resource = %registrar.resource, "registered with the kubelet");
        if let Next::Stop = registrar
            .stay_registered(&instance, identity, shutdown.as_mut())
            .await
        {
            info!("shutting down");
            instance.stop().await;
            return Ok(());
        }
        metrics.registered.set(0);
        instance.retire();
    }
}

/// One resource's registration with the kubelet.
struct Registrar {
    config: Arc<Config>,
    resource: String,
    socket_file: String,
    /// The kubelet's registration socket.
    kubelet: PathBuf,
    /// Changes in the plugin directory (a kubelet restart removes our socket).
    kick: mpsc::Receiver<()>,
    metrics: Metrics,
    backoff: Backoff,
}

impl Registrar {
    /// Registers, retrying while the kubelet is away; starts over if our socket goes.
    async fn register(
        &mut self,
        instance: &Instance,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Next<KubeletIdentity> {
        loop {
            if !instance.socket_intact() {
                return Next::StartOver;
            }
            while self.kick.try_recv().is_ok() {}
            let before = identity(&self.kubelet);
            let result = register(
                &self.kubelet,
                &self.config,
                &self.resource,
                &self.socket_file,
            );
            let Err(e) = result.await else {
                self.metrics.registrations.inc();
                self.metrics.registered.set(1);
                self.backoff.reset();
                return match identity(&self.kubelet) {
                    Some(identity) => Next::Go(identity),
                    // Registered, and the kubelet's socket is gone already: start over.
                    None => Next::StartOver,
                };
            };
            self.metrics.registration_failures.inc();
            // A kubelet.sock that exists belongs to a kubelet that is starting: retry
            // soon rather than backing off far.
            let mut wait = self.backoff.step();
            if before.is_some() {
                wait = wait.min(Duration::from_millis(400));
            }
            warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "registration failed");
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    _ = shutdown.as_mut() => return Next::Stop,
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = self.kick.recv() => break,
                    _ = tokio::time::sleep(self.config.poll_interval) => {
                        if identity(&self.kubelet) != before {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Waits while registered; returns when our socket is removed or the kubelet's is
    /// replaced (a kubelet restart: register again), or on shutdown.
    async fn stay_registered(
        &mut self,
        instance: &Instance,
        registered_with: KubeletIdentity,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Next<()> {
        loop {
            tokio::select! {
                _ = shutdown.as_mut() => return Next::Stop,
                _ = self.kick.recv() => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
            if !instance.socket_intact() {
                info!("plugin socket removed (kubelet restart?): serving and registering again");
                return Next::StartOver;
            }
            if identity(&self.kubelet) != Some(registered_with) {
                info!("kubelet.sock replaced: registering again");
                return Next::StartOver;
            }
        }
    }
}
