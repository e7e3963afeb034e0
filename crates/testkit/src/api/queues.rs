//! Queues and Namespaces in the in-memory API. A Queue's status is written through its
//! status subresource (the spec is untouched, as the server keeps it); Events about a
//! queue are checked as the server checks Events (a note of at most 1 KiB, a reason).
//! Spec changes wake the scheduler's watch; status writes, like the real watch's
//! fingerprinted cache, do not.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuplace_scheduler::ApiError;
use gpuplace_scheduler::k8s::queue::{DEFAULT_QUEUE_ANNOTATION, Queue, QueueSpec, QueueStatus};
use k8s_openapi::api::core::v1::Namespace;

use super::{MemoryApi, lock};

impl MemoryApi {
    /// Creates or replaces the queue `name` with `spec` (its status kept).
    pub fn put_queue(&self, name: &str, spec: QueueSpec) {
        let mut s = lock(&self.store);
        s.generation += 1;
        let rv = s.bump();
        let status = s.queues.get(name).and_then(|q| q.status.clone());
        let mut q = Queue::new(name, spec);
        q.status = status;
        q.metadata.resource_version = Some(rv);
        s.queues.insert(name.to_string(), Arc::new(q));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    pub fn delete_queue(&self, name: &str) {
        let mut s = lock(&self.store);
        s.generation += 1;
        s.bump();
        s.queues.remove(name);
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    pub fn queue(&self, name: &str) -> Option<Queue> {
        lock(&self.store).queues.get(name).map(|q| (**q).clone())
    }

    /// Creates or replaces a namespace whose pods go to `default_queue` when they name none.
    pub fn put_namespace(&self, name: &str, default_queue: Option<&str>) {
        let mut s = lock(&self.store);
        s.generation += 1;
        let rv = s.bump();
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.to_string());
        ns.metadata.resource_version = Some(rv);
        if let Some(q) = default_queue {
            ns.metadata.annotations = Some(BTreeMap::from([(
                DEFAULT_QUEUE_ANNOTATION.to_string(),
                q.to_string(),
            )]));
        }
        s.namespaces.insert(name.to_string(), Arc::new(ns));
        let v = s.version;
        drop(s);
        self.node_version.send_replace(v);
    }

    /// Events about queues: (queue, type, reason, note).
    pub fn queue_events(&self) -> Vec<(String, String, String, String)> {
        lock(&self.store).queue_events.clone()
    }

    pub(super) fn write_queue_status(
        &self,
        name: &str,
        status: QueueStatus,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.store);
        let rv = s.bump();
        let q = s.queues.get_mut(name).ok_or_else(|| {
            ApiError::NotFound(format!("queues.gpuplace.io \"{name}\" not found"))
        })?;
        // A JSON merge patch of the status, as the scheduler sends it and the server applies
        // it: fields left out keep their value, nulls remove theirs.
        let mut merged = serde_json::to_value(&q.status).unwrap_or_default();
        merge_patch(
            &mut merged,
            serde_json::to_value(&status).unwrap_or_default(),
        );
        q.status = serde_json::from_value(merged).map_err(|e| ApiError::Invalid(e.to_string()))?;
        q.metadata.resource_version = Some(rv);
        s.status_writes += 1;
        Ok(())
    }

    pub(super) fn record_queue_event(
        &self,
        queue: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), ApiError> {
        if message.len() > 1024 {
            return Err(ApiError::Invalid(
                "note: Too long: may not be longer than 1024".into(),
            ));
        }
        if reason.is_empty() || !matches!(kind, "Normal" | "Warning") {
            return Err(ApiError::Invalid("reason and type are required".into()));
        }
        lock(&self.store).queue_events.push((
            queue.to_string(),
            kind.to_string(),
            reason.to_string(),
            message.to_string(),
        ));
        Ok(())
    }
}

/// RFC 7386: `patch` merged into `target`.
pub(super) fn merge_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(Default::default());
    }
    if let serde_json::Value::Object(t) = target {
        for (k, v) in fields {
            if v.is_null() {
                t.remove(&k);
            } else {
                merge_patch(t.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
    }
}
