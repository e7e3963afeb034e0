//! The live GPU map (`/ui`), served by the scheduler on its metrics port: a page, its
//! script and style (embedded in the binary, no external assets) and the JSON it polls.
//! Read-only. The page writes every name and message as text (never as markup) and the
//! responses carry a Content-Security-Policy that allows only the page's own script.
//!
//! - `GET /ui`: the page; `/ui/app.js`, `/ui/app.css`;
//! - `GET /ui/api/fleet?q=&sort=&limit=`: totals, models, the matching nodes' GPU cells
//!   (at most `limit`, so 5,000 nodes stay light), pending pods and gangs, the last hour;
//! - `GET /ui/api/node?name=`: one node's GPUs, holders and NVLink topology;
//! - `GET /ui/api/waiting?namespace=&limit=`: every waiting GPU pod the viewer may see,
//!   with the scheduler's structured record from its memory (blocker, gang, true position,
//!   queue standing, plan, expected start as a range): nothing of it written to the pods.
//!
//! Off a loopback address the map is served behind [`crate::access::guard`]: then a
//! viewer sees cluster-wide totals and every GPU, but names, reasons and gangs only of the
//! pods of namespaces they may `list pods` in (another namespace's holder is shown as
//! such, without its name; search does not match it).

pub mod history;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::access::{Viewer, Visible};
use crate::api::ClusterApi;
use crate::status::text::cell;
use crate::status::{self, FleetStatus, GroupStatus, NodeStatus, PendingPod, PendingReasons};
pub use history::{History, Sample};

const PAGE: &str = include_str!("ui/page.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");
const SIGN_IN: &str = include_str!("ui/sign-in.html");
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'self'; frame-ancestors 'none'";

/// Nodes sent at most per answer unless asked otherwise (and never more than 2,000).
const DEFAULT_LIMIT: usize = 300;
const MAX_LIMIT: usize = 2_000;
/// Pending pods sent at most per answer.
const MAX_PENDING: usize = 200;

/// What the map reads: the scheduler's view and reasons (attached once the watches are
/// synced; until then it answers 503) and the last hour's history.
pub struct Ui<A> {
    source: OnceLock<Source<A>>,
    gpu_resource: String,
    history: History,
    /// The status last built.
    cached: Mutex<Option<Built>>,
}

/// A status built from the view of `generation` and the reasons of `version`, at `at`,
/// in `took`.
struct Built {
    generation: u64,
    version: u64,
    at: Instant,
    took: Duration,
    status: Arc<FleetStatus>,
}

struct Source<A> {
    api: A,
    reasons: PendingReasons,
}

impl<A: ClusterApi> Ui<A> {
    pub fn new(gpu_resource: &str) -> Self {
        Ui {
            source: OnceLock::new(),
            gpu_resource: gpu_resource.to_string(),
            history: History::default(),
            cached: Mutex::new(None),
        }
    }

    /// The map reads `api`'s view and the scheduler's `reasons` from now on (the first
    /// attach holds).
    pub fn attach(&self, api: A, reasons: PendingReasons) {
        let _ = self.source.set(Source { api, reasons });
    }

    /// Where the loop records each round for the charts.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The fleet now: built again when the view or the reasons changed, but not sooner
    /// than twice its last build time after it (at 5,000 nodes a build takes ~0.35 s here:
    /// polls arriving one at a time cost at most a third of a core; polls racing one build
    /// may each build once).
    async fn status(&self) -> Result<Arc<FleetStatus>, String> {
        let Some(source) = self.source.get() else {
            return Err("the scheduler's caches are not synced yet".into());
        };
        let generation = source.api.generation();
        let version = source.reasons.version();
        if let Ok(cached) = self.cached.lock()
            && let Some(built) = cached.as_ref()
            && ((built.generation == generation && built.version == version)
                || built.at.elapsed() < built.took * 2)
        {
            return Ok(Arc::clone(&built.status));
        }
        let start = Instant::now();
        let view = source.api.view().await.map_err(|e| e.to_string())?;
        let reasons = source.reasons.snapshot();
        let status = Arc::new(status::fleet(
            &view,
            &self.gpu_resource,
            &reasons,
            &status::Filter::default(),
        ));
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some(Built {
                generation: view.generation,
                version,
                at: Instant::now(),
                took: start.elapsed(),
                status: Arc::clone(&status),
            });
        }
        Ok(status)
    }
}

/// The map's routes, to merge into the metrics server's.
pub fn router<A: ClusterApi>(ui: Arc<Ui<A>>) -> Router {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset(PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/",
            get(|| async { asset(PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route("/ui/api/fleet", get(fleet::<A>))
        .route("/ui/api/node", get(node::<A>))
        .route("/ui/api/waiting", get(waiting::<A>))
        .with_state(ui)
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    secured(([(header::CONTENT_TYPE, kind)], body).into_response())
}

fn json<T: Serialize>(value: &T) -> Response {
    secured(axum::Json(value).into_response())
}

fn unavailable(e: String) -> Response {
    let body = format!("cluster view unavailable: {e}");
    secured((StatusCode::SERVICE_UNAVAILABLE, body).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FleetQuery {
    /// Part of a node's name or of a pod's `namespace/name`, any case.
    q: String,
    /// `name` (default), `free`, `used` or `frag`.
    sort: String,
    limit: Option<usize>,
}

/// One node as a card: a character per GPU (as `gpuplace status` prints it) and each
/// GPU's holders as text.
#[derive(Debug, Serialize)]
struct NodeCard {
    name: String,
    model: String,
    cells: String,
    free: usize,
    frag: f64,
    tips: Vec<String>,
}

/// Nodes, GPUs and use per GPU model.
#[derive(Debug, Default, Serialize)]
struct ModelTotals {
    model: String,
    nodes: usize,
    gpus: usize,
    free: usize,
    allocated_milli: u64,
    capacity_milli: u64,
}

#[derive(Debug, Serialize)]
struct FleetAnswer<'s> {
    totals: &'s status::Totals,
    models: Vec<ModelTotals>,
    /// Nodes matching the search (of which `nodes` are sent).
    matched: usize,
    nodes: Vec<NodeCard>,
    pending_total: usize,
    pending: Vec<&'s PendingPod>,
    groups: Vec<&'s GroupStatus>,
    history: Vec<history::Point>,
    warnings: Vec<&'s crate::snapshot::Warning>,
    /// Absent when the map is served without sign-in (loopback).
    #[serde(skip_serializing_if = "Option::is_none")]
    viewer: Option<ViewerAnswer>,
}

/// Who asks (when the map is guarded) and what they may see.
#[derive(Debug, Serialize)]
struct ViewerAnswer {
    user: String,
    /// The namespaces whose pods are named; `null` for all of them.
    namespaces: Option<Vec<String>>,
}

/// The namespaces a status names pods of.
fn namespaces(status: &FleetStatus) -> std::collections::BTreeSet<&str> {
    let holders = status
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().flat_map(|g| g.holders.iter()))
        .map(|h| h.namespace.as_str());
    let pending = status.pending.iter().map(|p| p.namespace.as_str());
    let groups = status.groups.iter().map(|g| g.namespace.as_str());
    let warnings = status
        .warnings
        .iter()
        .filter_map(|w| w.namespace.as_deref());
    holders
        .chain(pending)
        .chain(groups)
        .chain(warnings)
        .collect()
}

/// What `viewer` may see of `status` (all of it when the map is not guarded).
async fn visible(viewer: Option<&Viewer>, status: &FleetStatus) -> Visible {
    match viewer {
        None => Visible::All,
        Some(v) => v.visible(namespaces(status)).await,
    }
}

/// A warning about a namespace's object is shown only to who sees that namespace (by its
/// field, not its text); one about a node, to every viewer.
fn warning_visible(warning: &crate::snapshot::Warning, visible: &Visible) -> bool {
    warning
        .namespace
        .as_deref()
        .is_none_or(|namespace| visible.sees(namespace))
}

/// The fleet now, who asks, and what they may see of it (503 until the caches sync).
async fn seen<A: ClusterApi>(
    ui: &Ui<A>,
    viewer: Option<Extension<Viewer>>,
) -> Result<(Arc<FleetStatus>, Option<Viewer>, Visible), Response> {
    let status = ui.status().await.map_err(unavailable)?;
    let viewer = viewer.map(|Extension(v)| v);
    let visible = visible(viewer.as_ref(), &status).await;
    Ok((status, viewer, visible))
}

async fn fleet<A: ClusterApi>(
    State(ui): State<Arc<Ui<A>>>,
    viewer: Option<Extension<Viewer>>,
    Query(query): Query<FleetQuery>,
) -> Response {
    let (status, viewer, visible) = match seen(&ui, viewer).await {
        Ok(seen) => seen,
        Err(response) => return response,
    };
    let q = query.q.trim().to_lowercase();
    let mut matched: Vec<&NodeStatus> = status
        .nodes
        .iter()
        .filter(|n| q.is_empty() || node_matches(n, &q, &visible))
        .collect();
    let free = |n: &NodeStatus| {
        n.gpus
            .iter()
            .filter(|g| g.healthy && g.used_milli == 0)
            .count()
    };
    let used = |n: &NodeStatus| n.gpus.iter().map(|g| u64::from(g.used_milli)).sum::<u64>();
    match query.sort.as_str() {
        "free" => matched.sort_by_key(|n| std::cmp::Reverse(free(n))),
        "used" => matched.sort_by_key(|n| std::cmp::Reverse(used(n))),
        "frag" => matched.sort_by(|a, b| b.fragmentation_gpus.total_cmp(&a.fragmentation_gpus)),
        _ => {}
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let nodes = matched
        .iter()
        .take(limit)
        .map(|n| card(n, &visible))
        .collect();
    let pending: Vec<&PendingPod> = status
        .pending
        .iter()
        .filter(|p| visible.sees(&p.namespace))
        .filter(|p| q.is_empty() || format!("{}/{}", p.namespace, p.name).contains(&q))
        .collect();
    let answer = FleetAnswer {
        totals: &status.totals,
        models: models(&status.nodes),
        matched: matched.len(),
        nodes,
        pending_total: pending.len(),
        pending: pending.into_iter().take(MAX_PENDING).collect(),
        groups: status
            .groups
            .iter()
            .filter(|g| visible.sees(&g.namespace))
            .collect(),
        history: ui.history.points(),
        warnings: status
            .warnings
            .iter()
            .filter(|w| warning_visible(w, &visible))
            .collect(),
        viewer: viewer.map(|v| ViewerAnswer {
            user: v.user.name.clone(),
            namespaces: match &visible {
                Visible::All => None,
                Visible::Only(set) => Some(set.iter().cloned().collect()),
            },
        }),
    };
    json(&answer)
}

fn node_matches(node: &NodeStatus, q: &str, visible: &Visible) -> bool {
    node.name.to_lowercase().contains(q)
        || node.gpus.iter().any(|g| {
            g.holders.iter().any(|h| {
                visible.sees(&h.namespace) && format!("{}/{}", h.namespace, h.name).contains(q)
            })
        })
}

/// `holder` as the viewer may see it: another namespace's pod keeps only its share.
fn shown(holder: &status::Holder, visible: &Visible) -> status::Holder {
    if visible.sees(&holder.namespace) {
        holder.clone()
    } else {
        status::Holder {
            milli: holder.milli,
            ..status::Holder::default()
        }
    }
}

fn card(node: &NodeStatus, visible: &Visible) -> NodeCard {
    NodeCard {
        name: node.name.clone(),
        model: node.model.clone(),
        cells: node.gpus.iter().map(cell).collect(),
        free: node
            .gpus
            .iter()
            .filter(|g| g.healthy && g.used_milli == 0)
            .count(),
        frag: node.fragmentation_gpus,
        tips: node
            .gpus
            .iter()
            .map(|g| {
                let holders: Vec<String> = g
                    .holders
                    .iter()
                    .map(|h| {
                        let share = status::gpus_text(1, h.milli);
                        if visible.sees(&h.namespace) {
                            format!("{}/{} ({share})", h.namespace, h.name)
                        } else {
                            format!("a pod of another namespace ({share})")
                        }
                    })
                    .collect();
                let state = if !g.healthy {
                    "unhealthy".to_string()
                } else if holders.is_empty() {
                    "free".to_string()
                } else {
                    holders.join(", ")
                };
                format!("GPU {}: {state}", g.index)
            })
            .collect(),
    }
}

fn models(nodes: &[NodeStatus]) -> Vec<ModelTotals> {
    let mut by: BTreeMap<&str, ModelTotals> = BTreeMap::new();
    for node in nodes {
        let m = by
            .entry(node.model.as_str())
            .or_insert_with(|| ModelTotals {
                model: node.model.clone(),
                ..ModelTotals::default()
            });
        m.nodes += 1;
        for g in &node.gpus {
            m.gpus += 1;
            if g.healthy {
                m.capacity_milli += u64::from(g.capacity_milli);
                m.allocated_milli += u64::from(g.used_milli);
                m.free += usize::from(g.used_milli == 0);
            }
        }
    }
    by.into_values().collect()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NodeQuery {
    name: String,
}

async fn node<A: ClusterApi>(
    State(ui): State<Arc<Ui<A>>>,
    viewer: Option<Extension<Viewer>>,
    Query(query): Query<NodeQuery>,
) -> Response {
    let status = match ui.status().await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let Some(node) = status.nodes.iter().find(|n| n.name == query.name) else {
        let body = format!("no GPU node named {:?}", query.name);
        return secured((StatusCode::NOT_FOUND, body).into_response());
    };
    let Some(Extension(viewer)) = viewer else {
        return json(node);
    };
    let holders: Vec<&str> = node
        .gpus
        .iter()
        .flat_map(|g| g.holders.iter())
        .map(|h| h.namespace.as_str())
        .collect();
    let visible = viewer.visible(holders).await;
    let mut shown_node = node.clone();
    for g in &mut shown_node.gpus {
        g.holders = g.holders.iter().map(|h| shown(h, &visible)).collect();
    }
    json(&shown_node)
}

/// Pods sent unless asked otherwise, and at most.
const WAITING_DEFAULT_LIMIT: usize = 1_000;
const WAITING_MAX_LIMIT: usize = 10_000;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WaitingQuery {
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

/// `GET /ui/api/waiting`: every waiting GPU pod the viewer may see, with the scheduler's
/// structured record from its memory, oldest first.
async fn waiting<A: ClusterApi>(
    State(ui): State<Arc<Ui<A>>>,
    viewer: Option<Extension<Viewer>>,
    Query(query): Query<WaitingQuery>,
) -> Response {
    let (status, _, visible) = match seen(&ui, viewer).await {
        Ok(seen) => seen,
        Err(response) => return response,
    };
    let pending: Vec<&PendingPod> = status
        .pending
        .iter()
        .filter(|p| visible.sees(&p.namespace))
        .filter(|p| query.namespace.as_ref().is_none_or(|ns| &p.namespace == ns))
        .collect();
    let limit = query
        .limit
        .unwrap_or(WAITING_DEFAULT_LIMIT)
        .clamp(1, WAITING_MAX_LIMIT);
    json(&WaitingAnswer {
        total: pending.len(),
        pending: pending.into_iter().take(limit).collect(),
    })
}

/// The map's sign-in form with `line` on it, answered with `status` (401 or 403).
pub fn sign_in_page(status: StatusCode, line: &str) -> Response {
    let page = SIGN_IN.replace("{{why}}", &escape(line));
    let kind = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
    secured((status, kind, page).into_response())
}

/// `text` safe inside HTML text.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
