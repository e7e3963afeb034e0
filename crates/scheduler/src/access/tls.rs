//! TLS for the guarded surfaces: the certificate and key from PEM files (a Secret mounted
//! as files; re-read within 10 s of a change, as cert-manager rotates them, the old pair
//! kept if the new one does not load) or, without files, a self-signed pair made at start
//! (as kube-scheduler does). The connections themselves: [`super::listener`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// How often the certificate files are looked at for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {why}")]
    NoKey { path: PathBuf, why: String },
    #[error("the key in {path} cannot sign with TLS: {why}")]
    BadKey { path: PathBuf, why: String },
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("TLS settings refused: {0}")]
    Config(String),
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files (the chain, then the key).
    Files { cert: PathBuf, key: PathBuf },
    /// Made at start for these DNS names and IP addresses.
    SelfSigned { names: Vec<String> },
}

fn read(path: &Path) -> Result<(Vec<u8>, Option<SystemTime>), TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Ok((bytes, modified))
}

/// The pair in `cert` and `key` (PEM), ready to sign.
pub fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let (cert_pem, _) = read(cert)?;
    let (key_pem, _) = read(key)?;
    pair_from_pem(&cert_pem, cert, &key_pem, key)
}

fn pair_from_pem(
    cert_pem: &[u8],
    cert: &Path,
    key_pem: &[u8],
    key: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.to_path_buf(),
        });
    }
    let der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
        path: key.to_path_buf(),
        why: e.to_string(),
    })?;
    let signer = provider::sign::any_supported_type(&der).map_err(|e| TlsError::BadKey {
        path: key.to_path_buf(),
        why: e.to_string(),
    })?;
    Ok(CertifiedKey::new(chain, signer))
}

/// A self-signed pair for `names`.
pub fn self_signed(names: &[String]) -> Result<CertifiedKey, TlsError> {
    let made = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    let der = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let signer = provider::sign::any_supported_type(&der)
        .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    Ok(CertifiedKey::new(vec![made.cert.der().clone()], signer))
}

/// The pair loaded last from the files, and when the files were last looked at.
struct Loaded {
    pair: Arc<CertifiedKey>,
    modified: (Option<SystemTime>, Option<SystemTime>),
    looked: Instant,
}

/// Serves the pair in two files, re-read when they change.
#[derive(Debug)]
struct FileResolver {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("modified", &self.modified)
            .finish()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl FileResolver {
    fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let pair = load_pair(cert, key)?;
        Ok(FileResolver {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            loaded: Mutex::new(Loaded {
                pair: Arc::new(pair),
                modified: (modified(cert), modified(key)),
                looked: Instant::now(),
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.looked.elapsed() >= RELOAD_EVERY {
            loaded.looked = Instant::now();
            let now = (modified(&self.cert), modified(&self.key));
            if now != loaded.modified {
                match load_pair(&self.cert, &self.key) {
                    Ok(pair) => {
                        info!(cert = %self.cert.display(), "serving certificate reloaded");
                        loaded.pair = Arc::new(pair);
                        loaded.modified = now;
                    }
                    Err(e) => warn!(error = %e, "keeping the previous serving certificate"),
                }
            }
        }
        Arc::clone(&loaded.pair)
    }
}

impl ResolvesServerCert for FileResolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The server's TLS settings for `source` (TLS 1.2 and 1.3, HTTP/1.1).
pub fn server_config(source: &CertSource) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder =
        rustls::ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth();
    let mut config = match source {
        CertSource::Files { cert, key } => {
            builder.with_cert_resolver(Arc::new(FileResolver::new(cert, key)?))
        }
        CertSource::SelfSigned { names } => {
            let pair = self_signed(names)?;
            builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(pair)))
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
