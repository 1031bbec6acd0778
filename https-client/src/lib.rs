//! A minimal HTTPS client for talking to a server of ours from tests, benchmarks and health
//! probes: one HTTP/1.1 connection with a client certificate, no connection pool.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Why a request of this client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A CA, certificate or key given to the client is not PEM.
    #[error("not valid PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    /// rustls refused the TLS settings or the handshake.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The server name is not a valid DNS name.
    #[error("server name: {0}")]
    ServerName(#[from] rustls::pki_types::InvalidDnsNameError),
    /// Connecting or the TLS handshake failed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP failed on the connection.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The request could not be built (a bad path or header).
    #[error("request: {0}")]
    Request(#[from] http::Error),
    /// The body could not be encoded as JSON.
    #[error("JSON body: {0}")]
    Json(#[from] serde_json::Error),
}

/// TLS settings for connecting to a server.
#[derive(Clone)]
pub struct ClientConfig {
    tls: Arc<rustls::ClientConfig>,
    address: std::net::SocketAddr,
}

impl ClientConfig {
    /// Trusts `ca_pem`; presents `cert_pem`/`key_pem` when given.
    pub fn new(
        address: std::net::SocketAddr,
        ca_pem: &str,
        client: Option<(&str, &str)>,
    ) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c?)?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let tls = match client {
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>()?;
                builder
                    .with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes())?)?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(ClientConfig {
            tls: Arc::new(tls),
            address,
        })
    }

    /// Opens one connection.
    pub async fn connect(&self) -> Result<Connection, ClientError> {
        self.connect_to("localhost").await
    }

    /// Opens one HTTP/2 connection (ALPN `h2`), on which many requests can run at once.
    pub async fn connect_h2(
        &self,
    ) -> Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>, ClientError> {
        self.connect_h2_with_window(None).await
    }

    /// As [`ClientConfig::connect_h2`], with the stream and connection receive windows set to
    /// `window` bytes: a client that reads slowly (or not at all) holds the server back sooner.
    pub async fn connect_h2_with_window(
        &self,
        window: Option<u32>,
    ) -> Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>, ClientError> {
        let mut tls = (*self.tls).clone();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = TcpStream::connect(self.address).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("localhost".to_string())?;
        let tls = TlsConnector::from(Arc::new(tls)).connect(name, tcp).await?;
        let mut builder =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        if let Some(w) = window {
            builder
                .initial_stream_window_size(w)
                .initial_connection_window_size(w);
        }
        let (sender, conn) = builder.handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Opens one TLS connection (ALPN `http/1.1`) and leaves the HTTP to the caller, for tests
    /// of what the server does with connections that send nothing or something odd.
    pub async fn connect_tls(
        &self,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ClientError> {
        let mut tls = (*self.tls).clone();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tcp = TcpStream::connect(self.address).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("localhost".to_string())?;
        Ok(TlsConnector::from(Arc::new(tls)).connect(name, tcp).await?)
    }

    /// Opens one connection, verifying the server's certificate for `server_name` (as
    /// kube-apiserver does for `<service>.<namespace>.svc`).
    pub async fn connect_to(&self, server_name: &str) -> Result<Connection, ClientError> {
        let tcp = TcpStream::connect(self.address).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(server_name.to_string())?;
        let tls = TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await?;
        let (sender, conn) = http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Connection { sender })
    }
}

/// One open HTTP/1.1 connection.
pub struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
}

/// A buffered response.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status of the response.
    pub status: StatusCode,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The whole response body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl Connection {
    /// Sends a request and reads the whole response.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<Reply, ClientError> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .header(http::header::ACCEPT, "application/json");
        if let Some(ct) = content_type {
            req = req.header(http::header::CONTENT_TYPE, ct);
        }
        let resp = self
            .sender
            .send_request(req.body(Full::new(body.into()))?)
            .await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a request with extra headers.
    pub async fn send_with_headers(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, ClientError> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .sender
            .send_request(req.body(Full::new(body.into()))?)
            .await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends a GET for `path` and reads the whole response.
    pub async fn get(&mut self, path: &str) -> Result<Reply, ClientError> {
        self.send(Method::GET, path, None, Bytes::new()).await
    }

    /// POSTs `body` as JSON to `path` and reads the whole response.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<Reply, ClientError> {
        self.send(
            Method::POST,
            path,
            Some("application/json"),
            serde_json::to_vec(body)?,
        )
        .await
    }
}
