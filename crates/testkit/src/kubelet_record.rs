//! The fake kubelet's record (its checkpoint-like accounting of which pod holds which
//! devices) and its PodResources `List`, served from that record: active pods with their
//! app containers (and sidecars, as 1.28+ kubelets list them), never regular init
//! containers, and no UID.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use gpuplace_kubelet_api::podresources::pod_resources_lister_server::PodResourcesLister;
use gpuplace_kubelet_api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use gpuplace_model::ContainerKind;
use std::time::Duration;

use tonic::{Request, Response, Status};

/// One admission as the kubelet did it.
#[derive(Clone, Debug)]
pub struct Admission {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pod's `gpuplace.io/assignment` when it was admitted.
    pub assignment: Option<String>,
    /// Containers with devices, in admission order.
    pub containers: Vec<(String, ContainerKind, Vec<String>)>,
    pub error: Option<String>,
    /// GetPreferredAllocation calls made for this pod, and their round trips.
    pub preferred_calls: usize,
    pub preferred_latency: Vec<Duration>,
}

pub(crate) struct Entry {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// Container name -> kind, for `List`.
    pub(crate) kinds: Vec<(String, ContainerKind)>,
    pub(crate) devices: HashMap<String, Vec<String>>,
}

#[derive(Default)]
pub(crate) struct NodeState {
    /// The pod manager's active pods, in the order they were added.
    pub(crate) active: BTreeMap<u64, Entry>,
    pub(crate) next: u64,
    pub(crate) log: Vec<Admission>,
    /// Devices found in two pods' records at once (must stay 0).
    pub(crate) double_use: usize,
}

impl NodeState {
    pub(crate) fn in_use(&self) -> HashSet<String> {
        self.active
            .values()
            .flat_map(|e| e.devices.values().flatten().cloned())
            .collect()
    }
}

pub(crate) fn lock(state: &Mutex<NodeState>) -> std::sync::MutexGuard<'_, NodeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct Lister {
    pub(crate) state: Arc<Mutex<NodeState>>,
    pub(crate) resource: String,
    pub(crate) list_sidecars: bool,
    /// Serve `Get` (kubelets 1.34+ by default); `false` answers Unimplemented as 1.26 does.
    pub(crate) serve_get: bool,
}

impl Lister {
    fn pod(&self, e: &Entry) -> PodResources {
        PodResources {
            name: e.name.clone(),
            namespace: e.namespace.clone(),
            containers: e
                .kinds
                .iter()
                .filter(|(_, k)| match k {
                    ContainerKind::App => true,
                    ContainerKind::Sidecar => self.list_sidecars,
                    ContainerKind::Init => false,
                })
                .map(|(name, _)| ContainerResources {
                    name: name.clone(),
                    devices: e
                        .devices
                        .get(name)
                        .map(|ids| {
                            // One entry per resource, as the kubelet lists them.
                            let (slices, whole): (Vec<String>, Vec<String>) =
                                ids.iter().cloned().partition(|id| {
                                    gpuplace_deviceplugin::devices::slice_gpu(id).is_some()
                                });
                            [
                                (self.resource.clone(), whole),
                                (gpuplace_model::SHARE_RESOURCE.to_string(), slices),
                            ]
                            .into_iter()
                            .filter(|(_, ids)| !ids.is_empty())
                            .map(|(resource_name, device_ids)| ContainerDevices {
                                resource_name,
                                device_ids,
                                topology: None,
                            })
                            .collect()
                        })
                        .unwrap_or_default(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let state = lock(&self.state);
        let pod_resources = state.active.values().map(|e| self.pod(e)).collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        if !self.serve_get {
            return Err(Status::unimplemented("unknown method Get"));
        }
        let request = request.into_inner();
        let state = lock(&self.state);
        // Like the kubelet: only pods in its pod manager (active); others are an error.
        match state
            .active
            .values()
            .find(|e| e.name == request.pod_name && e.namespace == request.pod_namespace)
        {
            Some(e) => Ok(Response::new(GetPodResourcesResponse {
                pod_resources: Some(self.pod(e)),
            })),
            None => Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                request.pod_name, request.pod_namespace
            ))),
        }
    }
}
