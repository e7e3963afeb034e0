//! The extender over HTTP (axum): `POST /filter`, `/prioritize`, `/bind` as
//! kube-scheduler calls them (`urlPrefix` + verb). A body that is too large, not JSON or
//! of the wrong shape gets 400 with the reason; nothing in a body can make a handler panic.
//! Each verb is counted by result and timed in `/metrics`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Extender;
use super::wire::{self, BindingResult, FilterResult};
use crate::api::ClusterApi;

/// Request bodies above this are refused unless configured otherwise (a NodeList of
/// 5,000 full Node objects is about 40 MB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResult {
    verb: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verb {
    verb: String,
}

/// The extender's metrics.
#[derive(Clone)]
pub struct ExtenderMetrics {
    requests: Family<VerbResult, Counter>,
    seconds: Family<Verb, Histogram>,
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        ExtenderMetrics {
            requests: Family::default(),
            seconds: Family::new_with_constructor(|| {
                Histogram::new([0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
            }),
        }
    }
}

impl ExtenderMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "gpuplace_extender_requests",
            "Extender calls by verb and result (ok, bad_request, error)",
            self.requests.clone(),
        );
        registry.register(
            "gpuplace_extender_request_seconds",
            "Time to answer an extender call",
            self.seconds.clone(),
        );
    }

    fn observe(&self, verb: &str, result: &str, started: Instant) {
        self.requests
            .get_or_create(&VerbResult {
                verb: verb.into(),
                result: result.into(),
            })
            .inc();
        self.seconds
            .get_or_create(&Verb { verb: verb.into() })
            .observe(started.elapsed().as_secs_f64());
    }
}

struct Shared<A: ClusterApi> {
    extender: Arc<Extender<A>>,
    metrics: ExtenderMetrics,
    limit: usize,
    /// The candidates' lists recently read and answered (see [`wire::RecentLists`]).
    lists: Mutex<wire::RecentLists>,
}

/// A JSON answer already written.
fn json_bytes(bytes: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response()
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn bad_request(error: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response()
}

async fn body_of(request: Request, limit: usize) -> Result<axum::body::Bytes, wire::WireError> {
    axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| wire::WireError::TooLarge(limit))
}

/// The request's body decoded by `decode`, or the 400 answer (counted under `verb`).
async fn decoded<A: ClusterApi, T>(
    s: &Shared<A>,
    request: Request,
    verb: &str,
    started: Instant,
    decode: impl FnOnce(&[u8]) -> Result<T, wire::WireError>,
) -> Result<T, Response> {
    match body_of(request, s.limit).await.and_then(|b| decode(&b)) {
        Ok(args) => Ok(args),
        Err(e) => {
            s.metrics.observe(verb, "bad_request", started);
            Err(bad_request(e))
        }
    }
}

async fn filter<A: ClusterApi>(State(s): State<Arc<Shared<A>>>, request: Request) -> Response {
    let started = Instant::now();
    let decode = |b: &[u8]| wire::decode_args_recalling(b, s.limit, &s.lists, wire::Caller::Filter);
    let args = match decoded(&s, request, "filter", started, decode).await {
        Ok(args) => args,
        Err(answer) => return answer,
    };
    let (result, answer) = match s.extender.filter(args).await {
        Ok(r) => ("ok", r),
        Err(e) => ("error", FilterResult::failed_with(e.to_string())),
    };
    let bytes = answer.into_json(&s.lists);
    s.metrics.observe("filter", result, started);
    json_bytes(bytes)
}

async fn prioritize<A: ClusterApi>(State(s): State<Arc<Shared<A>>>, request: Request) -> Response {
    let started = Instant::now();
    let decode =
        |b: &[u8]| wire::decode_args_recalling(b, s.limit, &s.lists, wire::Caller::Prioritize);
    let args = match decoded(&s, request, "prioritize", started, decode).await {
        Ok(args) => args,
        Err(answer) => return answer,
    };
    match s.extender.prioritize(args).await {
        Ok(list) => {
            let bytes = list.to_json();
            s.metrics.observe("prioritize", "ok", started);
            json_bytes(bytes)
        }
        Err(e) => {
            s.metrics.observe("prioritize", "error", started);
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn bind<A: ClusterApi>(State(s): State<Arc<Shared<A>>>, request: Request) -> Response {
    let started = Instant::now();
    let decode = |b: &[u8]| wire::decode_binding(b, s.limit);
    let args = match decoded(&s, request, "bind", started, decode).await {
        Ok(args) => args,
        Err(answer) => return answer,
    };
    let (result, answer) = match s.extender.bind(args).await {
        Ok(()) => ("ok", BindingResult::default()),
        Err(e) => (
            "error",
            BindingResult {
                error: e.to_string(),
            },
        ),
    };
    s.metrics.observe("bind", result, started);
    json(StatusCode::OK, &answer)
}

/// The extender's routes; merge them with the metrics and health routes.
pub fn router<A: ClusterApi>(
    extender: Arc<Extender<A>>,
    metrics: ExtenderMetrics,
    limit: usize,
) -> Router {
    let shared = Arc::new(Shared {
        extender,
        metrics,
        limit,
        lists: Mutex::default(),
    });
    Router::new()
        .route("/filter", post(filter::<A>))
        .route("/prioritize", post(prioritize::<A>))
        .route("/bind", post(bind::<A>))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(shared)
}
