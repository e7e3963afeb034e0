//! The in-memory API with hooks around its calls: one delegating wrapper for the tests that
//! change the world between the view and the writes, or pace and count the writes.

use std::future::Future;

use gpuplace_scheduler::api::{BindRequest, PodState};
use gpuplace_scheduler::{ApiError, ClusterApi, ClusterView, EventRecord, PodKey};
use gpuplace_testkit::MemoryApi;

/// What a test does around the calls; each hook does nothing unless overridden.
pub trait Hooks: Clone + Send + Sync + 'static {
    /// After each view is read.
    fn after_view(&self, _api: &MemoryApi) {}
    /// Before a Binding is sent, and after it is answered.
    fn before_bind(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    fn after_bind(&self) {}
    /// Before an Event is sent, and after it is answered.
    fn before_event(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    fn after_event(&self) {}
    /// After a preemption's eviction (or its dry run) is answered.
    fn after_evict(&self, _dry_run: bool) {}
    /// After a move's eviction (or its dry run) is answered.
    fn after_move(&self, _dry_run: bool) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Whether a `PodScheduled` condition write fails (a 500) instead of being made.
    fn fail_unschedulable(&self) -> bool {
        false
    }
}

/// `inner` with `hooks` around its calls.
#[derive(Clone)]
pub struct Wrapped<H> {
    pub inner: MemoryApi,
    pub hooks: H,
}

impl<H: Hooks> ClusterApi for Wrapped<H> {
    async fn view(&self) -> Result<ClusterView, ApiError> {
        let view = self.inner.view().await;
        self.hooks.after_view(&self.inner);
        view
    }
    async fn view_since(
        &self,
        since: Option<gpuplace_model::Cursor>,
        with_pods: bool,
    ) -> Result<gpuplace_scheduler::api::FedView, ApiError> {
        let view = self.inner.view_since(since, with_pods).await;
        self.hooks.after_view(&self.inner);
        view
    }
    fn generation(&self) -> u64 {
        self.inner.generation()
    }
    async fn changed(&self, since: u64) {
        self.inner.changed(since).await
    }
    async fn bind(&self, request: &BindRequest) -> Result<(), ApiError> {
        self.hooks.before_bind().await;
        let result = self.inner.bind(request).await;
        self.hooks.after_bind();
        result
    }
    async fn write_claim(
        &self,
        write: &gpuplace_scheduler::k8s::dra::write::ClaimWrite,
    ) -> Result<(), ApiError> {
        self.inner.write_claim(write).await
    }
    async fn undo_claim(
        &self,
        write: &gpuplace_scheduler::k8s::dra::write::ClaimWrite,
    ) -> Result<(), ApiError> {
        self.inner.undo_claim(write).await
    }
    async fn create_claim(
        &self,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> Result<gpuplace_scheduler::api::ClaimMade, ApiError> {
        self.inner.create_claim(claim).await
    }
    async fn delete_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        self.inner.delete_claim(namespace, name, uid).await
    }
    fn extended_claims_of(
        &self,
        pod: &PodKey,
    ) -> Vec<std::sync::Arc<gpuplace_scheduler::k8s::dra::ClaimInfo>> {
        self.inner.extended_claims_of(pod)
    }
    async fn extended_status(
        &self,
        pod: &PodKey,
        status: Option<&k8s_openapi::api::core::v1::PodExtendedResourceClaimStatus>,
    ) -> Result<PodState, ApiError> {
        self.inner.extended_status(pod, status).await
    }
    async fn get_pod(&self, pod: &PodKey) -> Result<Option<PodState>, ApiError> {
        self.inner.get_pod(pod).await
    }
    async fn event(&self, event: EventRecord) -> Result<(), ApiError> {
        self.hooks.before_event().await;
        let result = self.inner.event(event).await;
        self.hooks.after_event();
        result
    }
    async fn unschedulable(&self, pod: &PodKey, message: &str) -> Result<(), ApiError> {
        if self.hooks.fail_unschedulable() {
            return Err(ApiError::Other("injected 500".into()));
        }
        self.inner.unschedulable(pod, message).await
    }
    async fn evict(&self, victim: &PodKey, message: &str, dry_run: bool) -> Result<(), ApiError> {
        let result = self.inner.evict(victim, message, dry_run).await;
        self.hooks.after_evict(dry_run);
        result
    }
    async fn evict_to_move(&self, pod: &PodKey, dry_run: bool) -> Result<(), ApiError> {
        let result = self.inner.evict_to_move(pod, dry_run).await;
        self.hooks.after_move(dry_run).await;
        result
    }
    async fn nominate(&self, pod: &PodKey, node: Option<&str>) -> Result<(), ApiError> {
        self.inner.nominate(pod, node).await
    }
    async fn group_status(
        &self,
        ns: &str,
        name: &str,
        s: gpuplace_scheduler::k8s::gang::PodGroupStatus,
    ) -> Result<(), ApiError> {
        self.inner.group_status(ns, name, s).await
    }
    async fn queue_status(
        &self,
        name: &str,
        s: gpuplace_scheduler::k8s::queue::QueueStatus,
    ) -> Result<(), ApiError> {
        self.inner.queue_status(name, s).await
    }
    async fn queue_event(
        &self,
        queue: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        self.inner.queue_event(queue, kind, reason, message).await
    }
}
