//! The kubelet's PodResources API (`List`), read within its rate limit.
//!
//! The kubelet allows about 100 `List` calls a second with a burst of 10, shared with every
//! other node agent. The plugin keeps a token bucket at half that (50/s, burst 10) so that
//! admissions never starve other agents, and hands out the devices of our resource only.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuplace_kubelet_api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use gpuplace_kubelet_api::podresources::{GetPodResourcesRequest, ListPodResourcesRequest};
use gpuplace_kubelet_api::unix_channel;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::plan::identify::ListedPod;

/// Why the kubelet's pod resources could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("PodResources List on {socket}: {status}")]
    List {
        socket: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("PodResources List on {0} did not answer within 2 s")]
    Timeout(PathBuf),
}

type Bucket = gpuplace_core::rate::TokenBucket<Instant>;

/// Reads the kubelet's `List`, rate-limited.
#[derive(Clone)]
pub struct PodResources {
    client: PodResourcesListerClient<Channel>,
    socket: PathBuf,
    resource: String,
    bucket: Arc<Mutex<Bucket>>,
    /// Whether the kubelet serves `Get` (1.34+ by default); cleared on Unimplemented.
    get_served: Arc<std::sync::atomic::AtomicBool>,
}

/// Who is asking: admissions wait for a token; background reconciliation only takes one
/// while half the burst is left, so it never delays an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    Admission,
    Background,
}

impl PodResources {
    /// A client of the kubelet's PodResources socket (connected on first use).
    pub fn new(socket: impl Into<PathBuf>, resource: &str) -> PodResources {
        let socket = socket.into();
        PodResources {
            client: PodResourcesListerClient::new(unix_channel(&socket)),
            socket,
            resource: resource.to_string(),
            bucket: Arc::new(Mutex::new(
                Bucket::new(50.0, 10.0, Instant::now()).expect("a positive rate"),
            )),
            get_served: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Takes a token: `Ok` at once or after waiting (admissions); `Err` when a background
    /// caller should skip this turn.
    async fn token(&self, priority: Priority) -> Result<(), ()> {
        loop {
            let wait = {
                let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
                let reserve = match priority {
                    Priority::Admission => 0.0,
                    Priority::Background => bucket.burst() / 2.0,
                };
                match bucket.take(Instant::now(), reserve) {
                    Ok(()) => return Ok(()),
                    Err(wait) => wait,
                }
            };
            if priority == Priority::Background {
                return Err(());
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether a token is free now without waiting (for the per-admission cache).
    pub fn token_free(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        bucket.available(Instant::now()) >= 1.0
    }

    /// Whether `Get` may be tried (it is, until the kubelet answers Unimplemented).
    pub fn get_served(&self) -> bool {
        self.get_served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One pod through `Get` (an admission's call, within the rate limit): `Ok(Some)` when
    /// the kubelet has it active, `Ok(None)` when it does not; an error when `Get` cannot be
    /// used (then `get_served` turns false for Unimplemented).
    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ListedPod>, PodResourcesError> {
        let _ = self.token(Priority::Admission).await;
        let mut client = self.client.clone();
        let request = GetPodResourcesRequest {
            pod_name: name.to_string(),
            pod_namespace: namespace.to_string(),
        };
        let answer = tokio::time::timeout(Duration::from_secs(2), client.get(request))
            .await
            .map_err(|_| PodResourcesError::Timeout(self.socket.clone()))?;
        match answer {
            Ok(r) => Ok(r.into_inner().pod_resources.map(|p| self.listed(p))),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                self.get_served
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                Err(PodResourcesError::List {
                    socket: self.socket.clone(),
                    status: Box::new(status),
                })
            }
            // The kubelet answers an error for a pod it does not have.
            Err(status) if status.message().contains("not found") => Ok(None),
            Err(status) => Err(PodResourcesError::List {
                socket: self.socket.clone(),
                status: Box::new(status),
            }),
        }
    }

    fn listed(&self, p: gpuplace_kubelet_api::podresources::PodResources) -> ListedPod {
        ListedPod {
            namespace: p.namespace,
            name: p.name,
            containers: p
                .containers
                .into_iter()
                .map(|c| {
                    let ids = c
                        .devices
                        .into_iter()
                        .filter(|d| {
                            d.resource_name == self.resource
                                || d.resource_name == gpuplace_model::SHARE_RESOURCE
                        })
                        .flat_map(|d| d.device_ids)
                        .collect();
                    (c.name, ids)
                })
                .collect(),
        }
    }

    /// The kubelet's active pods with our resource's devices per container. `Ok(None)`
    /// when a background caller must wait for its turn.
    pub async fn list(
        &self,
        priority: Priority,
    ) -> Result<Option<Vec<ListedPod>>, PodResourcesError> {
        if self.token(priority).await.is_err() {
            return Ok(None);
        }
        let mut client = self.client.clone();
        let response = tokio::time::timeout(
            Duration::from_secs(2),
            client.list(ListPodResourcesRequest {}),
        )
        .await
        .map_err(|_| PodResourcesError::Timeout(self.socket.clone()))?
        .map_err(|status| PodResourcesError::List {
            socket: self.socket.clone(),
            status: Box::new(status),
        })?;
        Ok(Some(
            response
                .into_inner()
                .pod_resources
                .into_iter()
                .map(|p| self.listed(p))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut b = Bucket::new(50.0, 10.0, start).unwrap();
        for _ in 0..10 {
            assert!(b.take(start, 0.0).is_ok());
        }
        let wait = b.take(start, 0.0).unwrap_err();
        assert!(wait <= Duration::from_millis(21), "{wait:?}");
        assert!(b.take(start + Duration::from_millis(20), 0.0).is_ok());
        // Background callers keep half the burst for admissions.
        let mut b = Bucket::new(50.0, 10.0, start).unwrap();
        for _ in 0..5 {
            assert!(b.take(start, 5.0).is_ok());
        }
        assert!(b.take(start, 5.0).is_err());
        assert!(b.take(start, 0.0).is_ok());
    }
}
