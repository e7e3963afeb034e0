//! The fake kubelet's device manager side: `Registration`, the plugin dialled back,
//! `ListAndWatch` followed, restarts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuplace_kubelet_api::v1beta1::device_plugin_client::DevicePluginClient;
use gpuplace_kubelet_api::v1beta1::registration_server::{Registration, RegistrationServer};
use gpuplace_kubelet_api::v1beta1::{Device, DevicePluginOptions, Empty, RegisterRequest};
use gpuplace_kubelet_api::{KUBELET_SOCKET, UNHEALTHY, VERSION, connect_unix, unix_channel};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// One accepted registration.
#[derive(Clone, Debug)]
pub struct Registered {
    pub request: RegisterRequest,
    pub options: DevicePluginOptions,
    pub at: Instant,
    /// Device lists received on ListAndWatch, newest last.
    pub devices: watch::Receiver<Vec<Device>>,
}

#[derive(Default)]
struct Shared {
    registrations: Vec<Registered>,
}

struct RegistrationService {
    dir: PathBuf,
    shared: Arc<Mutex<Shared>>,
    notify: watch::Sender<usize>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported version {:?}",
                request.version
            )));
        }
        let Some((prefix, name)) = request.resource_name.split_once('/') else {
            return Err(Status::invalid_argument(
                "resource name is not an extended resource",
            ));
        };
        if !prefix.contains('.') || name.is_empty() {
            return Err(Status::invalid_argument(
                "resource name is not an extended resource",
            ));
        }
        if request.endpoint.contains('/') {
            return Err(Status::invalid_argument(
                "endpoint must be a file name in the plugin dir",
            ));
        }
        let channel = connect_unix(self.dir.join(&request.endpoint), Duration::from_secs(10))
            .await
            .map_err(|e| Status::unavailable(format!("cannot dial plugin: {e}")))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(Empty {})
            .await
            .map_err(|e| Status::unavailable(format!("GetDevicePluginOptions: {e}")))?
            .into_inner();
        let mut stream = client
            .list_and_watch(Empty {})
            .await
            .map_err(|e| Status::unavailable(format!("ListAndWatch: {e}")))?
            .into_inner();
        let (tx, rx) = watch::channel(Vec::new());
        tokio::spawn(async move {
            loop {
                match stream.message().await {
                    Ok(Some(list)) => {
                        let _ = tx.send(list.devices);
                    }
                    // Stream ended: the kubelet marks every device unhealthy.
                    _ => {
                        tx.send_modify(|devices| {
                            for d in devices.iter_mut() {
                                d.health = UNHEALTHY.to_string();
                            }
                        });
                        break;
                    }
                }
            }
        });
        let count = {
            let mut shared = lock(&self.shared);
            shared.registrations.push(Registered {
                request,
                options,
                at: Instant::now(),
                devices: rx,
            });
            shared.registrations.len()
        };
        // send_replace stores the count even when nobody is waiting yet.
        self.notify.send_replace(count);
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet's device manager, as far as device plugins can tell.
pub struct FakeKubelet {
    dir: PathBuf,
    shared: Arc<Mutex<Shared>>,
    notify: watch::Sender<usize>,
    server: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl FakeKubelet {
    /// Serves `Registration` on `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> FakeKubelet {
        let (notify, _) = watch::channel(0);
        let mut kubelet = FakeKubelet {
            dir: dir.to_path_buf(),
            shared: Arc::default(),
            notify,
            server: None,
        };
        kubelet.serve();
        kubelet
    }

    fn serve(&mut self) {
        let socket = self.dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind kubelet.sock");
        let service = RegistrationService {
            dir: self.dir.clone(),
            shared: self.shared.clone(),
            notify: self.notify.clone(),
        };
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                })
                .await;
        });
        self.server = Some((stop, task));
    }

    /// Stops serving and removes `kubelet.sock` (the kubelet is down).
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let _ = std::fs::remove_file(self.dir.join(KUBELET_SOCKET));
    }

    /// What a kubelet restart does: stop, delete every socket in the plugin directory
    /// (keeping other files, like the checkpoint), then serve a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.delete_sockets();
        self.serve();
    }

    /// Deletes every socket in the plugin directory.
    pub fn delete_sockets(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                use std::os::unix::fs::FileTypeExt;
                if entry.file_type().map(|t| t.is_socket()).unwrap_or(false) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }

    /// Starts serving again after [`stop`](Self::stop) (a kubelet coming back).
    pub fn start_again(&mut self) {
        self.serve();
    }

    /// Every registration so far.
    pub fn registrations(&self) -> Vec<Registered> {
        lock(&self.shared).registrations.clone()
    }

    /// Waits until at least `n` registrations were accepted; returns the newest.
    pub async fn wait_for_registrations(&self, n: usize, timeout: Duration) -> Option<Registered> {
        let mut rx = self.notify.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|count| *count >= n))
            .await
            .ok()?
            .ok()?;
        lock(&self.shared).registrations.last().cloned()
    }

    /// A client to the socket of the newest registered plugin of whole devices (not the
    /// share resource's).
    pub fn plugin_client(&self) -> Option<DevicePluginClient<Channel>> {
        let endpoint = lock(&self.shared)
            .registrations
            .iter()
            .rev()
            .find(|r| r.request.resource_name != gpuplace_model::SHARE_RESOURCE)?
            .request
            .endpoint
            .clone();
        Some(DevicePluginClient::new(unix_channel(
            self.dir.join(endpoint),
        )))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A handle for the kubelet's own calls to the registered plugin.
    pub fn handle(&self) -> KubeletHandle {
        KubeletHandle {
            shared: self.shared.clone(),
            client: Arc::default(),
        }
    }
}

/// What the kubelet's device manager holds of the newest registration: its device list
/// and one connection to the plugin, as the kubelet keeps one per endpoint.
#[derive(Clone)]
pub struct KubeletHandle {
    shared: Arc<Mutex<Shared>>,
    client: Arc<Mutex<std::collections::HashMap<String, CachedClient>>>,
}

/// A client and the registration it was made for (its position).
type CachedClient = (usize, DevicePluginClient<Channel>);

impl KubeletHandle {
    /// The newest registration for `resource` and its position.
    fn newest(&self, resource: &str) -> Option<(usize, Registered)> {
        let shared = lock(&self.shared);
        shared
            .registrations
            .iter()
            .enumerate()
            .rev()
            .find(|(_, r)| r.request.resource_name == resource)
            .map(|(i, r)| (i, r.clone()))
    }

    /// The newest device list from ListAndWatch of the plugin for `resource`.
    pub fn devices(&self, resource: &str) -> Vec<Device> {
        self.newest(resource)
            .map(|(_, r)| r.devices.borrow().clone())
            .unwrap_or_default()
    }

    /// Whether a plugin for `resource` registered.
    pub fn serves(&self, resource: &str) -> bool {
        self.newest(resource).is_some()
    }

    /// The connection to the newest plugin registered for `resource` (made again after a
    /// re-registration).
    pub fn client(&self, dir: &Path, resource: &str) -> Option<DevicePluginClient<Channel>> {
        let (position, r) = self.newest(resource)?;
        let mut cached = self.client.lock().unwrap_or_else(|p| p.into_inner());
        match cached.get(resource) {
            Some((n, c)) if *n == position => Some(c.clone()),
            _ => {
                let c = DevicePluginClient::new(unix_channel(dir.join(&r.request.endpoint)));
                cached.insert(resource.to_string(), (position, c.clone()));
                Some(c)
            }
        }
    }
}

/// Waits until `rx` holds a device list satisfying `check`.
pub async fn wait_for_devices(
    rx: &mut watch::Receiver<Vec<Device>>,
    timeout: Duration,
    check: impl FnMut(&Vec<Device>) -> bool,
) -> Option<Vec<Device>> {
    let found = tokio::time::timeout(timeout, rx.wait_for(check))
        .await
        .ok()?
        .ok()?;
    Some(found.clone())
}
