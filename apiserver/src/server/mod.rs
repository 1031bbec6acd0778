//! The HTTPS listener: TLS with an optional client certificate (rustls, ring), HTTP/1.1 and
//! HTTP/2 (hyper), and the per-connection client identity handed to every request.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

pub mod chain;
pub mod state;

pub use state::{AppState, StateOptions, DEFAULT_MAX_REQUESTS_IN_FLIGHT, DEFAULT_REQUEST_TIMEOUT};

/// PEM material for the listener.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The serving certificate, followed by its intermediates.
    pub cert_chain_pem: String,
    /// The private key of the serving certificate.
    pub key_pem: String,
    /// CA bundle that signs accepted client certificates.
    pub client_ca_pem: String,
    /// CA bundle of an authenticating proxy's client certificate (`--requestheader-client-ca-file`).
    pub requestheader_ca_pem: Option<String>,
}

/// Why the server cannot start: each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory cannot be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The listen address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A file named by a flag cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file is (e.g. "token file").
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The serving certificate or key is not PEM.
    #[error("{what} is not valid PEM: {source}")]
    Pem {
        /// "serving certificate" or "serving key".
        what: &'static str,
        /// What the PEM reader found.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A CA bundle cannot verify client certificates.
    #[error(transparent)]
    Ca(#[from] crate::access::authn::CaError),
    /// rustls refused the TLS configuration.
    #[error("TLS protocol versions: {0}")]
    Protocols(#[source] rustls::Error),
    /// The serving certificate and key are not a pair.
    #[error("serving certificate and key do not match: {0}")]
    KeyMismatch(#[source] rustls::Error),
    /// Only one of `--tls-cert-file` and `--tls-private-key-file` was given.
    #[error("--tls-cert-file and --tls-private-key-file must be given together")]
    HalfServingPair,
    /// The proxy's CA is the users' CA and no proxy name is required: anyone could claim any
    /// user.
    #[error("--requestheader-client-ca-file is the client CA: set --requestheader-allowed-names to the proxy's certificate names, or use a separate CA for the proxy")]
    ProxyCaIsClientCa,
    /// The token file has a bad line.
    #[error("token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// The bad line.
        #[source]
        source: crate::access::authn::TokenFileError,
    },
    /// The certificates or the admin kubeconfig could not be made or read.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// The service-account signing key cannot be had.
    #[error(transparent)]
    SigningKey(#[from] crate::access::serviceaccounts::SigningKeyError),
    /// The store failed while the server set itself up.
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
    /// The root workspace could not be set up.
    #[error("setting up the root workspace: {0}")]
    Root(#[source] crate::meta::status::ApiError),
    /// The workspace tree could not be set up.
    #[error("setting up the workspaces: {0}")]
    Tenancy(#[from] crate::access::tenancy::TenancyError),
    /// The listener's own address cannot be read.
    #[error("the listener's address: {0}")]
    LocalAddress(#[source] std::io::Error),
    /// The accept loop ended abnormally (it panicked or was cancelled).
    #[error("the accept loop ended: {0}")]
    AcceptLoop(#[from] tokio::task::JoinError),
}

/// Builds the rustls server configuration: ring only, h2 + http/1.1, client certificates
/// verified against the client CA when presented (a request without one is anonymous).
pub fn tls_config(m: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, StartError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(m.cert_chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|source| StartError::Pem {
                what: "serving certificate",
                source,
            })?;
    let key =
        PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).map_err(|source| StartError::Pem {
            what: "serving key",
            source,
        })?;
    // The handshake accepts certificates of either CA; which one signed a certificate decides,
    // per connection, whether it is a user's or the authenticating proxy's.
    let mut roots = RootCertStore::empty();
    for (pem, what) in std::iter::once((m.client_ca_pem.as_str(), "client CA")).chain(
        m.requestheader_ca_pem
            .as_deref()
            .map(|p| (p, "request-header client CA")),
    ) {
        for ca in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let ca = ca.map_err(|source| crate::access::authn::CaError::Pem { what, source })?;
            roots
                .add(ca)
                .map_err(|source| crate::access::authn::CaError::Rejected { what, source })?;
        }
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(crate::access::authn::CaError::from)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(StartError::Protocols)?
        .with_client_cert_verifier(crate::access::authn::AnyClientCertificate::new(verifier))
        .with_single_cert(certs, key)
        .map_err(StartError::KeyMismatch)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What one connection may take, with kube-apiserver's values (`k8s.io/apiserver`'s secure
/// serving on Go's `net/http` and `x/net/http2`), so that connections which never send a
/// request, or stop sending, do not hold file descriptors and memory forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From accepting the TCP connection to a finished TLS handshake. (kube-apiserver bounds it
    /// by its header timeout, 32 s; a real client needs milliseconds, so this is tighter.)
    pub tls_handshake_timeout: Duration,
    /// From the handshake to the first request's complete headers: Go's `ReadHeaderTimeout`,
    /// 32 s. (Later requests' headers are bounded by `idle_timeout` from the last response;
    /// kube-apiserver bounds each request's headers by 32 s.)
    pub header_read_timeout: Duration,
    /// How long a connection that served requests may sit with none in flight: Go's
    /// `IdleTimeout`, 90 s. A watch in flight keeps its connection open.
    pub idle_timeout: Duration,
    /// The largest request header block: Go's `MaxHeaderBytes`, 1 MiB (HTTP/1.1 answers 431
    /// beyond it; HTTP/2 refuses the stream).
    pub max_header_bytes: usize,
    /// HTTP/2 streams open at once on one connection: Go's default, 250.
    pub max_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
            max_streams: MAX_STREAMS_PER_CONNECTION,
        }
    }
}

/// Requests in flight on one connection and when the last one ended, for the idle timeout.
struct Activity {
    /// Requests whose response body has not been sent (or dropped) yet.
    open: std::sync::atomic::AtomicUsize,
    /// Whether any request was ever received.
    served: std::sync::atomic::AtomicBool,
    /// When the connection last became idle.
    since: std::sync::Mutex<tokio::time::Instant>,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: Default::default(),
            served: Default::default(),
            since: std::sync::Mutex::new(tokio::time::Instant::now()),
        })
    }

    /// A request started; the guard ends it when the response body is done with.
    fn start(self: &Arc<Self>) -> RequestGuard {
        self.served
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.open.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    /// When the connection may be closed if nothing happens before then (`None` while a
    /// request is in flight).
    fn close_at(&self, limits: &ConnectionLimits) -> Option<tokio::time::Instant> {
        if self.open.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return None;
        }
        let since = *self.since.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            since
                + if self.served.load(std::sync::atomic::Ordering::Relaxed) {
                    limits.idle_timeout
                } else {
                    limits.header_read_timeout
                },
        )
    }
}

/// One request in flight on a connection.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until it is sent or dropped.
struct Tracked {
    body: crate::meta::body::Body,
    _guard: RequestGuard,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The TLS acceptor of new connections: replaced when the serving certificate or client CA
/// files change (see `spawn_tls_reloader`).
pub type SharedAcceptor = Arc<std::sync::RwLock<TlsAcceptor>>;

/// Accepts connections until `shutdown` resolves, then stops accepting and lets open
/// connections finish their requests.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let acceptor = Arc::new(std::sync::RwLock::new(TlsAcceptor::from(tls)));
    serve_with(
        listener,
        acceptor,
        ConnectionLimits::default(),
        state,
        shutdown,
    )
    .await
}

/// [`serve`] with the acceptor given (it may be swapped while serving) and these limits.
pub async fn serve_with(
    listener: TcpListener,
    acceptor: SharedAcceptor,
    limits: ConnectionLimits,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let local: SocketAddr = listener.local_addr().map_err(StartError::LocalAddress)?;
    let chain = Arc::new(chain::build(&state));
    info!(address = %local, "serving");
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.read().unwrap_or_else(|p| p.into_inner()).clone();
        let state = state.clone();
        let chain = chain.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let who = state.authn.peer(tls.get_ref().1.peer_certificates());
            let activity = Activity::new();
            let service = service_fn({
                let activity = activity.clone();
                move |mut req: Request<Incoming>| {
                    let chain = chain.clone();
                    let who = who.clone();
                    let guard = activity.start();
                    req.extensions_mut()
                        .insert(crate::endpoints::exchange::RemoteAddr(peer));
                    // Boxed: HTTP/2 runs each stream as a task holding this future or, once
                    // it is done, the response's body, in one allocation as large as the
                    // larger of the two. Unboxed, every open watch kept the handler's ~11 KiB
                    // for its whole life; boxed, the handler's state goes when the answer starts.
                    Box::pin(async move {
                        let response = chain::handle(&chain, who, req).await;
                        Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                            body,
                            _guard: guard,
                        }))
                    })
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Slow or missing headers are bounded by the watch below, not by hyper's own
            // header timer: that one arms a timer for every request, which cost about a tenth
            // of the GET throughput (`bench --only serving`).
            builder
                .http1()
                .max_buf_size(limits.max_header_bytes.max(8192));
            // Each stream buffers at most hyper's 400 KB for a peer that does not read.
            builder
                .http2()
                .max_concurrent_streams(limits.max_streams)
                .max_header_list_size(limits.max_header_bytes.try_into().unwrap_or(u32::MAX));
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            // Closed when silent or idle for too long: gracefully (HTTP/2 says GOAWAY), so a
            // request that raced the decision still completes.
            let mut closing = false;
            loop {
                let close_at = match closing {
                    false => activity.close_at(&limits),
                    true => None,
                };
                // Checked again at least this often while requests are in flight; once closing,
                // a connection that does not end within the grace period is dropped.
                let wake = close_at.unwrap_or_else(|| {
                    tokio::time::Instant::now()
                        + match closing {
                            false => limits.idle_timeout.min(limits.header_read_timeout),
                            true => CLOSE_GRACE,
                        }
                });
                tokio::select! {
                    ended = conn.as_mut() => {
                        if let Err(e) = ended {
                            debug!(%peer, error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = tokio::time::sleep_until(wake) => {
                        if closing {
                            if activity.open.load(std::sync::atomic::Ordering::Acquire) == 0 {
                                debug!(%peer, "dropping a connection that did not close in time");
                                break;
                            }
                            continue;
                        }
                        if close_at.is_some_and(|at| at <= tokio::time::Instant::now())
                            && activity.close_at(&limits).is_some_and(|at| at <= tokio::time::Instant::now())
                        {
                            debug!(%peer, "closing a silent or idle connection");
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                        }
                    }
                }
            }
        });
    }
    Ok(())
}

/// How long a connection being closed for idleness may take to finish (a request that raced
/// the decision) before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// HTTP/2 streams one connection may have open at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 250;

/// Which storage backend to run on.
#[derive(Clone, Debug)]
pub enum StoreKind {
    /// Durable, embedded: `<data-dir>/store.redb`.
    Redb,
    /// In memory only (tests, benchmarks).
    Memory,
    /// An etcd cluster, shared by every replica.
    #[cfg(feature = "etcd")]
    Etcd(crate::storage::EtcdOptions),
}

impl StoreKind {
    /// Whether other servers may write to the same store (replicas on one etcd).
    pub fn is_shared(&self) -> bool {
        match self {
            StoreKind::Redb | StoreKind::Memory => false,
            #[cfg(feature = "etcd")]
            StoreKind::Etcd(_) => true,
        }
    }
}

/// Options of `platform-mesh serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where the server keeps its PKI (`pki/`), the redb store and `admin.kubeconfig`.
    pub data_dir: std::path::PathBuf,
    /// Serving certificate (PEM) to use instead of the generated one; needs `tls_private_key_file`.
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// Private key (PEM) of `tls_cert_file`; needs `tls_cert_file`.
    pub tls_private_key_file: Option<std::path::PathBuf>,
    /// CA bundle (PEM) that signs accepted client certificates; the generated CA when `None`.
    pub client_ca_file: Option<std::path::PathBuf>,
    /// The storage backend.
    pub store: StoreKind,
    /// The watch cache in front of the store (`None`: every read goes to the store).
    pub watch_cache: Option<crate::storage::CacheOptions>,
    /// Short requests served at once before the server answers 429.
    pub max_requests_in_flight: usize,
    /// A kube-apiserver style token file (`token,user,uid,"group1,group2"`).
    pub token_auth_file: Option<std::path::PathBuf>,
    /// PKCS#8 P-256 key that signs ServiceAccount tokens (default `<data-dir>/pki/service-account.key`).
    pub service_account_key_file: Option<std::path::PathBuf>,
    /// `iss` of ServiceAccount tokens.
    pub service_account_issuer: String,
    /// Audiences accepted in tokens (default: the issuer).
    pub api_audiences: Vec<String>,
    /// CA of an authenticating proxy's client certificate; enables request-header authentication.
    pub requestheader_client_ca_file: Option<std::path::PathBuf>,
    /// Common names the proxy certificate may have (empty: any, allowed only with a separate CA).
    pub requestheader_allowed_names: Vec<String>,
    /// Headers the proxy sets with the user name (empty: `X-Remote-User`).
    pub requestheader_username_headers: Vec<String>,
    /// Headers the proxy sets with the user's uid (empty: `X-Remote-Uid`).
    pub requestheader_uid_headers: Vec<String>,
    /// Headers the proxy sets with the user's groups (empty: `X-Remote-Group`).
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of headers the proxy sets with extra attributes (empty: `X-Remote-Extra-`).
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Objects one logical cluster may hold; 0 for no limit.
    pub max_objects_per_workspace: usize,
    /// How long a short request may take (504 beyond).
    pub request_timeout: Duration,
    /// Metrics added to `/metrics` beside the server's own.
    pub extra_metrics: Option<crate::meta::metrics::ExtraMetrics>,
    /// Timeouts and sizes each connection is held to.
    pub connection_limits: ConnectionLimits,
    /// The audit policy and log (`--audit-policy-file`, `--audit-log-path`), when auditing.
    pub audit: Option<Arc<crate::meta::audit::Audit>>,
    /// How often the files of `tls_cert_file`, `tls_private_key_file` and `client_ca_file` are
    /// checked for new content.
    pub tls_reload_interval: Duration,
    /// Per-user budgets: unread list answers, open watches.
    pub budgets: crate::access::budget::BudgetLimits,
    /// Upstream's flags of Platform Mesh's virtual workspaces (labels, entity names, the core
    /// export and its workspace).
    pub views: crate::endpoints::views::ViewOptions,
    /// Extension mode: serve only the views, in front of this kcp (which resolves workspaces,
    /// reviews bearer tokens and authorizes); the caller mirrors what the views are computed
    /// from into the store.
    pub extension: Option<Arc<crate::endpoints::views::Extension>>,
}

impl ServeOptions {
    /// Defaults of the CLI, for a data directory.
    pub fn new(listen: SocketAddr, data_dir: impl Into<std::path::PathBuf>) -> Self {
        ServeOptions {
            listen,
            data_dir: data_dir.into(),
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            store: StoreKind::Redb,
            watch_cache: Some(crate::storage::CacheOptions::default()),
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            token_auth_file: None,
            service_account_key_file: None,
            service_account_issuer: crate::access::serviceaccounts::DEFAULT_ISSUER.to_string(),
            api_audiences: Vec::new(),
            requestheader_client_ca_file: None,
            requestheader_allowed_names: Vec::new(),
            requestheader_username_headers: Vec::new(),
            requestheader_uid_headers: Vec::new(),
            requestheader_group_headers: Vec::new(),
            requestheader_extra_headers_prefix: Vec::new(),
            max_objects_per_workspace: 0,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            extra_metrics: None,
            connection_limits: ConnectionLimits::default(),
            audit: None,
            tls_reload_interval: Duration::from_secs(10),
            budgets: crate::access::budget::BudgetLimits::default(),
            views: crate::endpoints::views::ViewOptions::default(),
            extension: None,
        }
    }
}

/// A started server.
pub struct RunningServer {
    /// The address actually bound (useful with port 0).
    pub address: SocketAddr,
    /// `<data-dir>/admin.kubeconfig`.
    pub kubeconfig: std::path::PathBuf,
    /// The server's shared state: store, registry, authentication, metrics.
    pub state: Arc<AppState>,
    /// The server's PKI and the URL its kubeconfigs name, for [`RunningServer::write_user_kubeconfig`].
    pki: certs::Pki,
    url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), StartError>>,
}

impl RunningServer {
    /// Writes `<data-dir>/<file>`: a kubeconfig of this server for `user` in `groups`, with a
    /// client certificate of the server's CA valid for a year. What the user may do is up to
    /// RBAC, as for any other user.
    pub fn write_user_kubeconfig(
        &self,
        file: &str,
        user: &str,
        groups: &[String],
    ) -> Result<std::path::PathBuf, StartError> {
        let (cert, key) = self.pki.issue_client_certificate(user, groups, 365)?;
        let mut opts = self.pki.admin_kubeconfig_options(&self.url);
        opts.user_name = user.to_string();
        opts.client_cert_pem = Some(cert);
        opts.client_key_pem = Some(key);
        let path = self
            .kubeconfig
            .parent()
            .map(|d| d.join(file))
            .unwrap_or_else(|| file.into());
        certs::write_kubeconfig(&path, &opts)?;
        Ok(path)
    }

    /// Stops accepting connections and waits for the accept loop to end.
    pub async fn shutdown(mut self) -> Result<(), StartError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.await?
    }

    /// Waits until the server stops by itself (it only does on error).
    pub async fn wait(self) -> Result<(), StartError> {
        self.task.await?
    }
}

/// The TLS files flags named; the rest of [`TlsMaterial`] is the generated PKI's and stays.
struct TlsFiles {
    /// `--tls-cert-file` and `--tls-private-key-file`.
    serving: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// `--client-ca-file`.
    client_ca: Option<std::path::PathBuf>,
    /// The generated CA, trusted beside the file's.
    own_ca_pem: String,
}

impl TlsFiles {
    /// `current` with what the files hold now.
    fn read(&self, current: &TlsMaterial) -> Result<TlsMaterial, StartError> {
        let mut next = current.clone();
        if let Some((cert, key)) = &self.serving {
            next.cert_chain_pem = read_file(cert, "serving certificate")?;
            next.key_pem = read_file(key, "serving key")?;
        }
        if let Some(ca) = &self.client_ca {
            next.client_ca_pem =
                client_ca_bundle(Some(&read_file(ca, "client CA file")?), &self.own_ca_pem);
        }
        Ok(next)
    }
}

/// Follows the serving certificate, its key and the client CA files (as cert-manager renews
/// a Secret mounted as files): when their content changes, new connections get the new
/// certificate and client certificates are verified against the new CA. Files that cannot be
/// used (half-written, a key that does not match) leave the previous material in place and are
/// said once per change. Stops when the server's acceptor is gone.
fn spawn_tls_reloader(
    files: TlsFiles,
    mut current: TlsMaterial,
    acceptor: std::sync::Weak<std::sync::RwLock<TlsAcceptor>>,
    client_ca: Arc<crate::access::authn::ClientCa>,
    every: Duration,
) {
    tokio::spawn(async move {
        let mut seen = current.clone();
        loop {
            tokio::time::sleep(every).await;
            let Some(acceptor) = acceptor.upgrade() else {
                return;
            };
            let next = match files.read(&current) {
                Ok(next) => next,
                Err(e) => {
                    debug!(error = %e, "reading the TLS files");
                    continue;
                }
            };
            if same_material(&next, &seen) {
                continue;
            }
            seen = next.clone();
            let built = tls_config(&next).and_then(|config| {
                let verifier = crate::access::authn::chain_verifier(
                    crate::access::authn::root_store(&next.client_ca_pem, "client CA")?,
                )?;
                Ok((config, verifier))
            });
            match built {
                Ok((config, verifier)) => {
                    *acceptor.write().unwrap_or_else(|p| p.into_inner()) =
                        TlsAcceptor::from(config);
                    client_ca.replace(verifier);
                    current = next;
                    info!("reloaded the serving certificate and client CA from their files");
                }
                Err(e) => warn!(
                    error = %e,
                    "the TLS files changed but cannot be used; serving with the previous ones"
                ),
            }
        }
    });
}

fn same_material(a: &TlsMaterial, b: &TlsMaterial) -> bool {
    a.cert_chain_pem == b.cert_chain_pem
        && a.key_pem == b.key_pem
        && a.client_ca_pem == b.client_ca_pem
}

/// The CAs client certificates are verified against: `--client-ca-file`'s, then the generated
/// one.
fn client_ca_bundle(file_pem: Option<&str>, own_ca_pem: &str) -> String {
    match file_pem {
        Some(file) => format!("{}\n{own_ca_pem}", file.trim_end()),
        None => own_ca_pem.to_string(),
    }
}

/// Whether two PEM bundles hold the same certificates.
fn same_certs(a: &str, b: &str) -> bool {
    let ders = |p: &str| -> Vec<Vec<u8>> {
        CertificateDer::pem_slice_iter(p.as_bytes())
            .filter_map(Result::ok)
            .map(|c| c.as_ref().to_vec())
            .collect()
    };
    let (a, b) = (ders(a), ders(b));
    a.iter().any(|c| b.contains(c))
}

fn read_file(path: &std::path::Path, what: &'static str) -> Result<String, StartError> {
    std::fs::read_to_string(path).map_err(|source| StartError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Sets up PKI, storage and state, binds the listener and starts serving.
pub async fn start(opts: ServeOptions) -> Result<RunningServer, StartError> {
    // Both TLS providers may be compiled in through dependencies; this process uses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::create_dir_all(&opts.data_dir).map_err(|source| StartError::DataDir {
        path: opts.data_dir.clone(),
        source,
    })?;
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| StartError::Listen {
            address: opts.listen,
            source,
        })?;
    let address = listener.local_addr().map_err(StartError::LocalAddress)?;
    let mut hosts = vec![address.ip().to_string()];
    if address.ip().is_unspecified() {
        if let Ok(h) = std::env::var("HOSTNAME") {
            hosts.push(h);
        }
    }
    let pki = certs::load_or_create(&opts.data_dir.join("pki"), &hosts)?;
    let (cert_chain_pem, key_pem) = match (&opts.tls_cert_file, &opts.tls_private_key_file) {
        (Some(c), Some(k)) => certs::load_pem_files(c, k)?,
        (None, None) => (
            pki.serving_cert_pem().to_string(),
            pki.serving_key_pem().to_string(),
        ),
        _ => return Err(StartError::HalfServingPair),
    };
    // The generated CA stays trusted beside a `--client-ca-file`: it signs the certificates of
    // admin.kubeconfig and of the co-located controllers, which would otherwise be refused.
    // Its key never leaves <data-dir>/pki, so it admits no one the server did not issue to.
    let own_ca_pem = pki.ca_cert_pem().to_string();
    let client_ca_file_pem = match &opts.client_ca_file {
        Some(p) => Some(read_file(p, "client CA file")?),
        None => None,
    };
    let client_ca_pem = client_ca_bundle(client_ca_file_pem.as_deref(), &own_ca_pem);
    let requestheader_ca_pem = match &opts.requestheader_client_ca_file {
        Some(p) => Some(read_file(p, "request-header client CA file")?),
        None => None,
    };
    let request_header = match &requestheader_ca_pem {
        Some(pem) => {
            // A proxy CA that also signs users' certificates, with any CN allowed, would let
            // every user claim to be anyone (NCC Group's Kubernetes audit, finding F9W).
            if opts.requestheader_allowed_names.is_empty()
                && same_certs(pem, client_ca_file_pem.as_deref().unwrap_or(&own_ca_pem))
            {
                return Err(StartError::ProxyCaIsClientCa);
            }
            Some(crate::access::authn::RequestHeader::new(
                pem,
                opts.requestheader_allowed_names.clone(),
                opts.requestheader_username_headers.clone(),
                opts.requestheader_uid_headers.clone(),
                opts.requestheader_group_headers.clone(),
                opts.requestheader_extra_headers_prefix.clone(),
            )?)
        }
        None => None,
    };
    let client_ca = Arc::new(crate::access::authn::ClientCa::new(
        crate::access::authn::chain_verifier(crate::access::authn::root_store(
            &client_ca_pem,
            "client CA",
        )?)?,
    ));
    let material = TlsMaterial {
        cert_chain_pem,
        key_pem,
        client_ca_pem,
        requestheader_ca_pem,
    };
    let acceptor: SharedAcceptor = Arc::new(std::sync::RwLock::new(TlsAcceptor::from(tls_config(
        &material,
    )?)));
    let files = TlsFiles {
        serving: opts
            .tls_cert_file
            .clone()
            .zip(opts.tls_private_key_file.clone()),
        client_ca: opts.client_ca_file.clone(),
        own_ca_pem,
    };
    if files.serving.is_some() || files.client_ca.is_some() {
        spawn_tls_reloader(
            files,
            material,
            Arc::downgrade(&acceptor),
            client_ca.clone(),
            opts.tls_reload_interval,
        );
    }
    let store: Arc<dyn crate::storage::Store> = match &opts.store {
        StoreKind::Redb => Arc::new(crate::storage::redb_store::RedbStore::open(
            &opts.data_dir.join("store.redb"),
        )?),
        StoreKind::Memory => Arc::new(crate::storage::memory::MemoryStore::new()),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd(etcd) => Arc::new(crate::storage::EtcdStore::connect(etcd.clone()).await?),
    };
    crate::storage::spawn_compactor(store.clone(), 10_000, Duration::from_secs(60));
    let (store, extra_metrics) = match &opts.watch_cache {
        Some(cache) => {
            let cached = crate::storage::CachedStore::new(store, cache.clone());
            let metrics = crate::storage::cache::footprint_metrics(
                cached.downgrade(),
                opts.extra_metrics.clone(),
            );
            (
                Arc::new(cached) as Arc<dyn crate::storage::Store>,
                Some(metrics),
            )
        }
        None => (store, opts.extra_metrics.clone()),
    };
    let host = if address.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else if address.is_ipv6() {
        format!("[{}]", address.ip())
    } else {
        address.ip().to_string()
    };
    let advertise = format!("{host}:{}", address.port());
    let tokens = match &opts.token_auth_file {
        Some(p) => crate::access::authn::StaticTokens::parse(&read_file(p, "token file")?)
            .map_err(|source| StartError::TokenFile {
                path: p.clone(),
                source,
            })?,
        None => crate::access::authn::StaticTokens::default(),
    };
    let sa_key = opts
        .service_account_key_file
        .clone()
        .unwrap_or_else(|| opts.data_dir.join("pki").join("service-account.key"));
    let service_accounts = crate::access::serviceaccounts::ServiceAccountTokens::load_or_create(
        &sa_key,
        &opts.service_account_issuer,
        &opts.api_audiences,
        pki.ca_cert_pem(),
    )?;
    let state = AppState::new(
        store,
        crate::registry::Registry::builtin(),
        StateOptions {
            advertise_address: advertise.clone(),
            max_requests_in_flight: opts.max_requests_in_flight,
            authn: crate::access::authn::Authn {
                tokens,
                service_accounts: Some(std::sync::Arc::new(service_accounts)),
                request_header,
                client_ca: Some(client_ca),
                delegated: opts.extension.as_ref().map(|x| x.authenticator()),
            },
            max_objects_per_workspace: opts.max_objects_per_workspace,
            request_timeout: opts.request_timeout,
            extra_metrics,
            budgets: opts.budgets,
            views: opts.views.clone(),
            extension: opts.extension.clone(),
            workspace_authentication: true,
            audit: opts.audit.clone(),
        },
    );
    state
        .namespaces
        .ensure_cluster(crate::request::request_info::ROOT_CLUSTER)
        .await
        .map_err(StartError::Root)?;
    // Other replicas may write to a shared store: follow their tenancy changes from here on.
    let follow_from = match opts.store.is_shared() {
        true => Some(state.store.latest_revision().await?),
        false => None,
    };
    state.tenancy.bootstrap().await?;
    state.namespaces.resume().await?;
    if let Some(revision) = follow_from {
        crate::access::tenancy::follow(&state.tenancy, revision);
    }
    let kubeconfig = opts.data_dir.join("admin.kubeconfig");
    // As kcp's admin kubeconfig: the current context is the root workspace (so `kubectl ws`
    // works from the start), the base address stays as the first cluster and its own context.
    // In extension mode the server has no workspaces of its own: the base address only.
    certs::write_kubeconfig(
        &kubeconfig,
        &certs::KubeconfigOptions {
            workspace: opts
                .extension
                .is_none()
                .then(|| crate::request::request_info::ROOT_CLUSTER.to_string()),
            ..pki.admin_kubeconfig_options(&format!("https://{advertise}"))
        },
    )?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(serve_with(
        listener,
        acceptor,
        opts.connection_limits,
        state.clone(),
        async {
            let _ = rx.await;
        },
    ));
    Ok(RunningServer {
        address,
        kubeconfig,
        state,
        pki,
        url: format!("https://{advertise}"),
        shutdown: Some(tx),
        task,
    })
}
