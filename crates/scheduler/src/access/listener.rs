//! The connection loop of every surface the binary serves beside its work (metrics, the
//! probes, the map), open or over TLS, bounded so that no caller can block the others:
//!
//! - the accept loop only accepts: each connection's TLS handshake and HTTP run in a task
//!   of their own, so `/healthz` never waits behind anyone's handshake;
//! - a handshake has [`Limits::handshake`] to finish, and at most
//!   [`Limits::max_handshaking`] run at once: past it the oldest one is cut, so idle
//!   connections that never speak cannot crowd out a new one (a probe's handshake takes
//!   milliseconds);
//! - request headers must arrive within [`Limits::header_read`] (also between requests on a
//!   kept-alive connection), and be at most [`Limits::max_header_bytes`];
//! - at most [`Limits::max_connections`] connections are held; past it a new one is closed
//!   at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::debug;

/// The bounds of a served surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest a client may take over its TLS handshake.
    pub handshake: Duration,
    /// Handshakes in progress at once; past it the oldest is cut.
    pub max_handshaking: usize,
    /// The longest a client may take to send a request's headers (and to start the next
    /// one on a kept-alive connection).
    pub header_read: Duration,
    /// The most bytes of a request's head (a bearer token over 16 KiB is refused anyway).
    pub max_header_bytes: usize,
    /// Connections held at once, handshaking or served.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(5),
            max_handshaking: 256,
            header_read: Duration::from_secs(5),
            max_header_bytes: 64 * 1024,
            max_connections: 2048,
        }
    }
}

/// The handshakes in progress, oldest first, each with what cuts it short.
#[derive(Default)]
struct Handshaking {
    next: AtomicU64,
    running: Mutex<VecDeque<(u64, Arc<Notify>)>>,
}

impl Handshaking {
    /// Registers a handshake; cuts the oldest ones while more than `max` run.
    fn start(&self, max: usize) -> (u64, Arc<Notify>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let cut = Arc::new(Notify::new());
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        while running.len() >= max.max(1) {
            if let Some((_, oldest)) = running.pop_front() {
                // Stored if the task is not waiting yet: it stops at its next look.
                oldest.notify_one();
            }
        }
        running.push_back((id, Arc::clone(&cut)));
        (id, cut)
    }

    fn done(&self, id: u64) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = running.iter().position(|(i, _)| *i == id) {
            running.remove(at);
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) within `limits`, until the task is
/// dropped. Only an accept error the loop cannot wait out ends it.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
) -> std::io::Result<()> {
    let held = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let handshaking = Arc::new(Handshaking::default());
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: wait as axum's own accept loop does.
                debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Finished connections leave the set as new ones come.
        while connections.try_join_next().is_some() {}
        let Ok(permit) = Arc::clone(&held).try_acquire_owned() else {
            debug!(%peer, "connection refused: {} held", limits.max_connections);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (app, tls, handshaking) = (app.clone(), tls.clone(), Arc::clone(&handshaking));
        // Owned by the set: dropping the server (its task) ends every connection.
        connections.spawn(async move {
            connection(tcp, peer, app, tls, handshaking, limits, permit).await;
        });
    }
}

/// One connection: its handshake (bounded, cut when newer ones need the room), then HTTP/1.1.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    tls: Option<TlsAcceptor>,
    handshaking: Arc<Handshaking>,
    limits: Limits,
    _held: OwnedSemaphorePermit,
) {
    let Some(acceptor) = tls else {
        return http(tcp, peer, app, limits).await;
    };
    let (id, cut) = handshaking.start(limits.max_handshaking);
    let handshake = tokio::time::timeout(limits.handshake, acceptor.accept(tcp));
    let done = tokio::select! {
        done = handshake => done,
        () = cut.notified() => {
            debug!(%peer, "TLS handshake cut: newer connections needed the room");
            return;
        }
    };
    handshaking.done(id);
    match done {
        Ok(Ok(stream)) => http(stream, peer, app, limits).await,
        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => debug!(%peer, "TLS handshake timed out"),
    }
}

async fn http<S>(stream: S, peer: SocketAddr, app: Router, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        app.clone().oneshot(request)
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        debug!(%peer, error = %e, "connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_the_oldest_handshakes_are_cut() {
        let h = Handshaking::default();
        let started: Vec<_> = (0..4).map(|_| h.start(3)).collect();
        let running: Vec<u64> = h.running.lock().unwrap().iter().map(|(i, _)| *i).collect();
        assert_eq!(running, vec![1, 2, 3], "the first was cut");
        h.done(started[2].0);
        let running: Vec<u64> = h.running.lock().unwrap().iter().map(|(i, _)| *i).collect();
        assert_eq!(running, vec![1, 3]);
    }
}
