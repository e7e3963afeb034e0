//! `GET /ui/api/waiting?namespace=&limit=`: every waiting GPU pod the viewer may see, with
//! the scheduler's structured record from its memory (blocker, gang, true position,
//! queue standing, plan, expected start as a range), oldest first: what `gpuplace status
//! --scheduler` reads, so that nothing of it has to be written to the pods.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::{Ui, json, unavailable, visible};
use crate::access::Viewer;
use crate::api::ClusterApi;
use crate::status::PendingPod;

/// Pods sent unless asked otherwise, and at most.
const DEFAULT_LIMIT: usize = 1_000;
const MAX_LIMIT: usize = 10_000;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct WaitingQuery {
    /// Only this namespace's pods.
    namespace: Option<String>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct WaitingAnswer<'s> {
    /// Waiting pods the viewer may see (of which `pending` are sent).
    total: usize,
    pending: Vec<&'s PendingPod>,
}

pub(super) async fn waiting<A: ClusterApi>(
    State(ui): State<Arc<Ui<A>>>,
    viewer: Option<Extension<Viewer>>,
    Query(query): Query<WaitingQuery>,
) -> Response {
    let status = match ui.status().await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let viewer = viewer.map(|Extension(v)| v);
    let visible = visible(viewer.as_ref(), &status).await;
    let pending: Vec<&PendingPod> = status
        .pending
        .iter()
        .filter(|p| visible.sees(&p.namespace))
        .filter(|p| query.namespace.as_ref().is_none_or(|ns| &p.namespace == ns))
        .collect();
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    json(&WaitingAnswer {
        total: pending.len(),
        pending: pending.into_iter().take(limit).collect(),
    })
}
