//! The one metrics and health server every long-running component of the binary uses:
//! `/metrics` (OpenMetrics text), `/healthz` and `/readyz` answered by the component's own
//! probes (200 with their text, or 503 with the reason).

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

/// A probe: `Ok(text)` when fine, `Err(reason)` otherwise.
pub type Probe = Arc<dyn Fn() -> Result<&'static str, &'static str> + Send + Sync>;

/// What `/healthz` and `/readyz` ask.
#[derive(Clone)]
pub struct Probes {
    pub healthz: Probe,
    pub readyz: Probe,
}

fn answer(probe: &Probe) -> (StatusCode, &'static str) {
    match probe() {
        Ok(text) => (StatusCode::OK, text),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

/// The server's routes.
pub fn router(registry: Arc<Registry>, probes: Probes) -> Router {
    let (live, ready) = (probes.healthz.clone(), probes.readyz.clone());
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut out = String::new();
                    // Writing into a String cannot fail.
                    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        out,
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let live = live.clone();
                async move { answer(&live) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move { answer(&ready) }
            }),
        )
        .fallback(|| async { StatusCode::NOT_FOUND.into_response() })
}

/// Serves (with `extra` routes beside, such as the scheduler's map) until the task is
/// dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    probes: Probes,
    extra: Option<Router>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving metrics and health");
    }
    let app = match extra {
        Some(extra) => router(registry, probes).merge(extra),
        None => router(registry, probes),
    };
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_answer_200_or_503_with_their_text() {
        let ok: Probe = Arc::new(|| Ok("ok"));
        let down: Probe = Arc::new(|| Err("not registered with the kubelet"));
        assert_eq!(answer(&ok), (StatusCode::OK, "ok"));
        assert_eq!(
            answer(&down),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not registered with the kubelet"
            )
        );
    }
}
