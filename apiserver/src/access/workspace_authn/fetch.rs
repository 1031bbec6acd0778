//! Reading an issuer's discovery document and key set: one HTTPS GET, with the issuer's own CA
//! (`certificateAuthority`) or the system's roots, a time limit and a size limit. The URLs come
//! from objects tenants write, so nothing here follows redirects, speaks plain HTTP or reads more
//! than [`MAX_BODY`] bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The most a discovery document or key set may be.
pub const MAX_BODY: usize = 1 << 20;
/// How long one fetch (connect, handshake, request, body) may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a document could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL is not an absolute `https://` URL.
    #[error("{0:?} is not an https URL")]
    NotHttps(String),
    /// `certificateAuthority` holds no PEM certificate.
    #[error("certificateAuthority holds no PEM certificate")]
    BadCa,
    /// The host name cannot be a TLS server name.
    #[error("{0:?} is not a valid server name")]
    ServerName(String),
    /// Resolving, connecting or the TLS handshake failed.
    #[error("connecting to {0}: {1}")]
    Connect(String, std::io::Error),
    /// HTTP failed on the connection.
    #[error("GET {0}: {1}")]
    Http(String, String),
    /// The answer was not 200.
    #[error("GET {0}: {1}")]
    Status(String, StatusCode),
    /// The body is larger than [`MAX_BODY`].
    #[error("GET {0}: the answer is larger than {MAX_BODY} bytes")]
    TooLarge(String),
    /// The fetch took longer than [`FETCH_TIMEOUT`].
    #[error("GET {0}: no answer within {FETCH_TIMEOUT:?}")]
    Timeout(String),
    /// The body is not the JSON expected.
    #[error("GET {0}: {1}")]
    Json(String, serde_json::Error),
}

/// The roots a connection to an issuer trusts: its `certificateAuthority` when given, else the
/// system's.
pub fn roots(ca_pem: &str) -> Result<Arc<RootCertStore>, FetchError> {
    let mut roots = RootCertStore::empty();
    if ca_pem.trim().is_empty() {
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
        return Ok(Arc::new(roots));
    }
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let c = c.map_err(|_| FetchError::BadCa)?;
        roots.add(c).map_err(|_| FetchError::BadCa)?;
    }
    if roots.is_empty() {
        return Err(FetchError::BadCa);
    }
    Ok(Arc::new(roots))
}

/// GETs `url` and decodes its JSON body.
pub async fn get_json<T: serde::de::DeserializeOwned>(
    url: &str,
    roots: Arc<RootCertStore>,
) -> Result<T, FetchError> {
    let body = tokio::time::timeout(FETCH_TIMEOUT, get(url, roots))
        .await
        .map_err(|_| FetchError::Timeout(url.to_string()))??;
    serde_json::from_slice(&body).map_err(|e| FetchError::Json(url.to_string(), e))
}

async fn get(url: &str, roots: Arc<RootCertStore>) -> Result<Bytes, FetchError> {
    let uri: Uri = url
        .parse()
        .map_err(|_| FetchError::NotHttps(url.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Err(FetchError::NotHttps(url.to_string()));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| FetchError::NotHttps(url.to_string()))?
        .clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| FetchError::ServerName(host.to_string()))?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| FetchError::Http(url.to_string(), e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| FetchError::Connect(authority.to_string(), e))?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .map_err(|e| FetchError::Connect(authority.to_string(), e))?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| FetchError::Http(url.to_string(), e.to_string()))?;
    let driver = tokio::spawn(conn);
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Http(url.to_string(), e.to_string()))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| FetchError::Http(url.to_string(), e.to_string()))?;
        if response.status() != StatusCode::OK {
            return Err(FetchError::Status(url.to_string(), response.status()));
        }
        Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::TooLarge(url.to_string())
                } else {
                    FetchError::Http(url.to_string(), e.to_string())
                }
            })
    }
    .await;
    driver.abort();
    result
}
