//! Who may read what the binary serves beside its work (`/metrics`, the GPU map): served
//! without authentication only on a loopback address; anywhere else over TLS, every request
//! carrying a bearer token that the API server authenticates (TokenReview) and authorizes
//! (SubjectAccessReview), as kube-scheduler's secure port and kube-rbac-proxy do.
//!
//! - [`review`]: the boundary (one trait, answered by the API server or the in-memory one);
//! - [`kube_reviews`]: the API server's answer, through kube-rs;
//! - [`cache`]: answers kept briefly (10 s), so a page polling every second costs the API
//!   server a review per token and path every 10 s, not per request;
//! - [`guard`]: the HTTP middleware (401 without a valid token, 403 without the right) and
//!   the namespaces a map viewer may see pods of;
//! - [`tls`]: the certificate (files, re-read when they change, or self-signed at start);
//! - [`listener`]: the connection loop, bounded in handshakes, header time and size, and
//!   connections, so that idle or slow callers cannot keep `/healthz` from answering.

pub mod cache;
pub mod guard;
pub mod kube_reviews;
pub mod listener;
pub mod review;
pub mod tls;

pub use cache::Cached;
pub use guard::{Guard, Viewer, Visible};
pub use review::{Access, Decision, ReviewError, Reviews, User};

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;

/// How a surface is served.
#[derive(Clone)]
pub enum Exposure<R> {
    /// Plain HTTP, no authentication: only for a loopback address.
    Open,
    /// TLS, and every request but the probes reviewed by `guard`.
    Guarded {
        tls: Arc<rustls::ServerConfig>,
        guard: Guard<R>,
    },
}

/// Whether `addr` may be served [`Exposure::Open`]: a loopback address only.
pub fn may_serve_open(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// `router` behind `guard`: every route, and the sign-in form's posts.
pub fn guarded<R: Reviews>(router: Router, guard: Guard<R>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        guard,
        guard::check::<R>,
    ))
}

/// Serves `app` on `listener` as `exposure` says, within [`listener::Limits`], until the
/// task is dropped.
pub async fn serve<R: Reviews>(
    listener: TcpListener,
    app: Router,
    exposure: Exposure<R>,
) -> std::io::Result<()> {
    let limits = listener::Limits::default();
    match exposure {
        Exposure::Open => listener::serve(listener, app, None, limits).await,
        Exposure::Guarded { tls, guard } => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            listener::serve(listener, guarded(app, guard), Some(acceptor), limits).await
        }
    }
}
