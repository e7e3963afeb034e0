//! The one metrics and health server every long-running component of the binary uses:
//! `/metrics` (OpenMetrics text), `/healthz` and `/readyz` answered by the component's own
//! probes (200 with their text, or 503 with the reason).
//!
//! On a loopback address it is plain HTTP for anyone on the host; on any other address it
//! is TLS (the certificate from `--tls-cert-file`/`--tls-private-key-file`, else
//! self-signed at start) and every request but the probes needs a bearer token the API
//! server accepts with `get` on the path (`gpuplace::access`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use gpuplace_scheduler::access::kube_reviews::KubeReviews;
use gpuplace_scheduler::access::tls::{CertSource, server_config};
use gpuplace_scheduler::access::{self, Exposure, Guard};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

/// The serving certificate of a non-loopback metrics address.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct TlsArgs {
    /// PEM certificate (chain) served on a metrics address that is not loopback, e.g. a
    /// mounted Secret's tls.crt; re-read within 10 s of a change [default: a self-signed
    /// certificate made at start].
    #[arg(
        long,
        env = "GPUPLACE_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "GPUPLACE_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
}

/// The names a self-signed certificate is made for.
fn self_signed_names(addr: &SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string()];
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
    {
        names.push(host);
    }
    if !addr.ip().is_unspecified() {
        names.push(addr.ip().to_string());
    }
    names
}

/// How `addr` is served: open on loopback; otherwise TLS and the API server's reviews
/// through `client` (the map's sign-in form when `map`).
pub async fn exposure(
    addr: SocketAddr,
    tls: &TlsArgs,
    client: Option<kube::Client>,
    map: bool,
) -> anyhow::Result<Exposure<KubeReviews>> {
    if access::may_serve_open(&addr) {
        if tls.tls_cert_file.is_some() {
            warn!(%addr, "loopback address: --tls-cert-file unused, served without TLS or authentication");
        } else {
            info!(%addr, "loopback address: served without TLS or authentication");
        }
        return Ok(Exposure::Open);
    }
    let client = match client {
        Some(c) => c,
        None => crate::kube_client::client(None).await.with_context(|| {
            format!(
                "{addr} is not a loopback address, so its callers are checked by the API \
                 server (TokenReview, SubjectAccessReview), which needs a Kubernetes client"
            )
        })?,
    };
    let source = match (&tls.tls_cert_file, &tls.tls_private_key_file) {
        (Some(cert), Some(key)) => CertSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => CertSource::SelfSigned {
            names: self_signed_names(&addr),
        },
    };
    let tls = server_config(&source).context("cannot set up TLS for the metrics address")?;
    let mut guard = Guard::new(KubeReviews::new(client));
    if map {
        guard = guard.with_sign_in(Arc::new(gpuplace_scheduler::ui::sign_in_page));
    }
    info!(
        %addr,
        certificate = match &source {
            CertSource::Files { cert, .. } => cert.display().to_string(),
            CertSource::SelfSigned { .. } => "self-signed".to_string(),
        },
        "served over TLS; every request but /healthz and /readyz needs a bearer token allowed `get` on its path"
    );
    Ok(Exposure::Guarded { tls, guard })
}

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
        .merge(probes_router(probes))
        .fallback(|| async { StatusCode::NOT_FOUND.into_response() })
}

/// `/healthz` and `/readyz` alone (for an address where the metrics are not served).
pub fn probes_router(probes: Probes) -> Router {
    let (live, ready) = (probes.healthz, probes.readyz);
    Router::new()
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
}

/// Serves (with `extra` routes beside, such as the scheduler's map) as `exposure` says,
/// until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    probes: Probes,
    extra: Option<Router>,
    exposure: Exposure<KubeReviews>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving metrics and health");
    }
    let app = match extra {
        Some(extra) => router(registry, probes).merge(extra),
        None => router(registry, probes),
    };
    if let Err(e) = access::serve(listener, app, exposure).await {
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
