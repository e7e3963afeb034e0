//! `gpuplace status --scheduler URL`: the waiting pods' records read from a running
//! scheduler's memory (`GET /ui/api/waiting` on its metrics port), typed and whole, where
//! the Events carry them as last written (cut at 1 KiB, positions as of that write).
//!
//! Plain HTTP (a loopback address or `kubectl port-forward`) or HTTPS with the CA that
//! signed the scheduler's certificate; a bearer token when the scheduler is served off
//! loopback (it answers each viewer with the namespaces they may list pods in).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use gpuplace_core::waiting::Waiting;
use gpuplace_scheduler::status::FleetStatus;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Deserialize;

/// How long a read of the scheduler may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (10,000 records of a few KiB).
const MAX_BODY: usize = 64 << 20;
/// Records asked for at most (the scheduler's own bound).
const LIMIT: usize = 10_000;

/// Where the records are read from.
#[derive(clap::Args, Debug, Clone)]
pub struct SourceArgs {
    /// Read why pods wait from this running scheduler (its metrics address, e.g.
    /// http://127.0.0.1:9911 through `kubectl port-forward`) instead of the Events.
    #[arg(long, value_name = "URL")]
    scheduler: Option<String>,
    /// A file with the bearer token to show the scheduler (e.g. `kubectl create token`).
    #[arg(long, env = "GPUPLACE_TOKEN_FILE", requires = "scheduler")]
    token_file: Option<PathBuf>,
    /// The CA that signed the scheduler's certificate (PEM), for an https URL.
    #[arg(long, requires = "scheduler")]
    scheduler_ca: Option<PathBuf>,
}

/// One waiting pod as the scheduler serves it (the fields read here).
#[derive(Deserialize)]
struct Served {
    namespace: String,
    name: String,
    reason: Option<String>,
    record: Option<Waiting>,
}

#[derive(Deserialize)]
struct Answer {
    pending: Vec<Served>,
}

/// A parsed `--scheduler` target.
pub struct Source {
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    token: Option<String>,
}

impl Source {
    /// The source `args` name, if any; a bad URL, token file or CA is an error that says so.
    pub fn from_args(args: &SourceArgs) -> anyhow::Result<Option<Source>> {
        let Some(url) = &args.scheduler else {
            return Ok(None);
        };
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("--scheduler {url:?} is not a URL"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!("--scheduler {url:?}: use http:// or https://"),
        };
        let host = uri
            .host()
            .with_context(|| format!("--scheduler {url:?} names no host"))?
            .trim_matches(|c| c == '[' || c == ']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let ca = args.scheduler_ca.as_ref().with_context(|| {
                format!("--scheduler {url:?} is https: give --scheduler-ca with the CA that signed its certificate")
            })?;
            Some(connector(ca)?)
        } else {
            None
        };
        let token = match &args.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --token-file {}", path.display()))?;
                let token = text.trim().to_string();
                if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    bail!("--token-file {}: not one token", path.display());
                }
                Some(token)
            }
            None => None,
        };
        Ok(Some(Source {
            host,
            port,
            tls,
            token,
        }))
    }

    /// The scheduler's records of the waiting pods (of `namespace`, when given), by
    /// `namespace/name`.
    async fn records(&self, namespace: Option<&str>) -> anyhow::Result<HashMap<String, Served>> {
        let mut path = format!("/ui/api/waiting?limit={LIMIT}");
        if let Some(ns) = namespace {
            // Namespace names are DNS labels; anything else is refused rather than encoded.
            if !ns.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                bail!("--namespace {ns:?} is not a namespace name");
            }
            path.push_str(&format!("&namespace={ns}"));
        }
        let body = tokio::time::timeout(TIMEOUT, self.get(&path))
            .await
            .map_err(|_| anyhow::anyhow!("the scheduler did not answer within {TIMEOUT:?}"))??;
        let answer: Answer = serde_json::from_slice(&body)
            .context("the scheduler's answer is not the waiting pods' records")?;
        Ok(answer
            .pending
            .into_iter()
            .map(|p| (format!("{}/{}", p.namespace, p.name), p))
            .collect())
    }

    async fn get(&self, path: &str) -> anyhow::Result<Bytes> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| {
                format!("cannot reach the scheduler at {}:{}", self.host, self.port)
            })?;
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone())
                    .with_context(|| format!("{:?} is not a TLS server name", self.host))?;
                let stream = tls
                    .connect(name, stream)
                    .await
                    .context("TLS with the scheduler failed")?;
                self.exchange(stream, path).await
            }
            None => self.exchange(stream, path).await,
        }
    }

    async fn exchange<S>(&self, stream: S, path: &str) -> anyhow::Result<Bytes>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .context("HTTP with the scheduler failed")?;
        // The connection's task ends with the exchange (the sender is dropped after it).
        let connection = tokio::spawn(conn);
        let mut request = hyper::Request::get(path)
            .header(hyper::header::HOST, host_header(&self.host, self.port))
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = sender
            .send_request(request.body(Empty::<Bytes>::new())?)
            .await
            .context("the scheduler closed the connection")?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the scheduler's answer: {e}"))?
            .to_bytes();
        drop(sender);
        connection.abort();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            bail!(
                "the scheduler answered {status}: {}",
                text.lines().next().unwrap_or("")
            );
        }
        Ok(body)
    }
}

/// `Host` for `host` and `port` (an IPv6 address in brackets).
fn host_header(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn connector(ca: &PathBuf) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let pem = std::fs::read(ca)
        .with_context(|| format!("cannot read --scheduler-ca {}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.with_context(|| format!("--scheduler-ca {}: not PEM", ca.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("--scheduler-ca {}: not a CA certificate", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("--scheduler-ca {}: no certificate in it", ca.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS set-up")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `fleet`'s waiting pods with the scheduler's records where it has them (a pod it does
/// not know keeps what the Events said); how many it had.
pub async fn merge(
    source: &Source,
    fleet: &mut FleetStatus,
    namespace: Option<&str>,
) -> anyhow::Result<usize> {
    let mut records = source.records(namespace).await?;
    let mut merged = 0;
    for pod in fleet.pending.iter_mut() {
        let Some(served) = records.remove(&format!("{}/{}", pod.namespace, pod.name)) else {
            continue;
        };
        if let Some(reason) = served.reason {
            pod.waiting = Some(Waiting::parse(&reason));
            pod.reason = Some(reason);
        }
        pod.record = served.record;
        merged += 1;
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_scheduler::status::PendingPod;
    use gpuplace_scheduler::{Scheduler, SchedulerConfig, ui};
    use gpuplace_testkit::MemoryApi;
    use serde_json::json;

    fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a test object")
    }

    /// A scheduler that has told `ml/big` (16 GPUs, on one 8-GPU node) why it waits, its
    /// map served on loopback.
    async fn served() -> std::net::SocketAddr {
        let api = MemoryApi::new();
        api.put_node(object(json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"}}
        })));
        api.put_pod(object(json!({
            "metadata": {"name": "big", "namespace": "ml"},
            "spec": {"schedulerName": "gpuplace", "containers": [{"name": "main",
                "resources": {"limits": {"nvidia.com/gpu": "16"}}}]},
            "status": {"phase": "Pending"}
        })));
        let mut scheduler = Scheduler::new(api.clone(), SchedulerConfig::default());
        let map = Arc::new(ui::Ui::new("nvidia.com/gpu"));
        map.attach(api.clone(), scheduler.reasons());
        scheduler
            .round(std::time::Instant::now())
            .await
            .expect("a round");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, ui::router(map)).await });
        addr
    }

    fn args(url: &str) -> SourceArgs {
        SourceArgs {
            scheduler: Some(url.into()),
            token_file: None,
            scheduler_ca: None,
        }
    }

    fn waiting(namespace: &str, name: &str) -> PendingPod {
        PendingPod {
            namespace: namespace.into(),
            name: name.into(),
            reason: Some("as the Event said".into()),
            ..PendingPod::default()
        }
    }

    #[tokio::test]
    async fn the_records_come_typed_from_the_schedulers_memory() {
        let addr = served().await;
        let source = Source::from_args(&args(&format!("http://{addr}")))
            .unwrap()
            .unwrap();
        let mut fleet = FleetStatus {
            pending: vec![waiting("ml", "big"), waiting("ml", "unknown")],
            ..FleetStatus::default()
        };
        let merged = merge(&source, &mut fleet, Some("ml")).await.unwrap();
        assert_eq!(merged, 1);
        let big = &fleet.pending[0];
        let record = big.record.as_ref().expect("the scheduler's record");
        assert_eq!(record.blocker.label(), "capacity (gpu)");
        assert!(
            big.reason
                .as_deref()
                .unwrap()
                .starts_with("blocked by: capacity (gpu)")
        );
        assert_eq!(
            big.waiting.as_ref().unwrap().blocked_by.as_deref(),
            Some("capacity (gpu)")
        );
        // A pod the scheduler does not know keeps what the Events said.
        let other = &fleet.pending[1];
        assert!(other.record.is_none());
        assert_eq!(other.reason.as_deref(), Some("as the Event said"));
    }

    #[test]
    fn an_ipv6_host_is_bracketed() {
        let source = Source::from_args(&args("http://[::1]:9911"))
            .unwrap()
            .unwrap();
        assert_eq!(source.host, "::1");
        assert_eq!(host_header(&source.host, source.port), "[::1]:9911");
        assert_eq!(host_header("127.0.0.1", 80), "127.0.0.1:80");
    }

    #[tokio::test]
    async fn what_cannot_be_read_says_why() {
        for (url, expected) in [
            ("ftp://x", "use http:// or https://"),
            ("https://127.0.0.1:1", "give --scheduler-ca"),
            ("not a url", "is not a URL"),
        ] {
            let e = Source::from_args(&args(url)).err().expect(url).to_string();
            assert!(e.contains(expected), "{url}: {e}");
        }
        // Nothing listening.
        let source = Source::from_args(&args("http://127.0.0.1:1"))
            .unwrap()
            .unwrap();
        let e = merge(&source, &mut FleetStatus::default(), None)
            .await
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("cannot reach the scheduler"),
            "{e:#}"
        );
        // A namespace that is not a name is not sent.
        let addr = served().await;
        let source = Source::from_args(&args(&format!("http://{addr}")))
            .unwrap()
            .unwrap();
        let e = merge(&source, &mut FleetStatus::default(), Some("a&b=c"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("is not a namespace name"), "{e}");
        // A token file with two words is refused.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "two words").unwrap();
        let mut bad = args("http://127.0.0.1:1");
        bad.token_file = Some(path);
        let e = Source::from_args(&bad).err().unwrap().to_string();
        assert!(e.contains("not one token"), "{e}");
    }
}
