//! The kubelet's DRA health API (`v1alpha1.DRAResourceHealth`, Kubernetes 1.36): a stream of
//! every GPU's health, all of them at first and again whenever the inventory changes, so
//! that the kubelet can show in a pod's status that a device it holds failed. (The
//! allocator keeps new claims off an unhealthy GPU through its slice taint.)

use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::Stream;
use gpuplace_kubelet_api::drahealth::dra_resource_health_server::DraResourceHealth;
use gpuplace_kubelet_api::drahealth::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};
use gpuplace_model::NodeInventory;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::slices::device_name;

/// `v1alpha1.DRAResourceHealth` over the inventory.
pub struct HealthService {
    pub pool: String,
    pub inventory: watch::Receiver<Arc<NodeInventory>>,
}

/// One report of every GPU of the pool.
pub fn report(inventory: &NodeInventory, pool: &str, now_unix: i64) -> NodeWatchResourcesResponse {
    NodeWatchResourcesResponse {
        devices: inventory
            .gpus
            .iter()
            .map(|g| DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.to_string(),
                    device_name: device_name(g.index),
                }),
                health: if g.healthy {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now_unix,
                health_check_timeout_seconds: 0,
                message: if g.healthy {
                    String::new()
                } else {
                    format!(
                        "GPU {} ({}) is unhealthy (NVML XID or the inventory file)",
                        g.index, g.uuid
                    )
                },
            })
            .collect(),
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

type Reports = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Reports;

    async fn node_watch_resources(
        &self,
        _: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Reports>, Status> {
        let pool = self.pool.clone();
        let start = (self.inventory.clone(), true);
        // Ends when the inventory's sender is gone; tonic drops it when the kubelet leaves.
        let reports = futures::stream::unfold(start, move |(mut rx, first)| {
            let pool = pool.clone();
            async move {
                if !first {
                    rx.changed().await.ok()?;
                }
                let inventory = rx.borrow_and_update().clone();
                Some((Ok(report(&inventory, &pool, now_unix())), (rx, false)))
            }
        });
        Ok(Response::new(Box::pin(reports)))
    }
}
