//! One request on its way through the server: the parsed request, what the filters learn of it
//! (who sent it, which logical cluster it addresses) and the record the outer filters read back
//! once it is answered. A [`Handler`] serves an exchange; every filter is a handler that wraps
//! the next one, and the router is the innermost.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::access::authn::Peer;
use crate::meta::body::Body;
use crate::meta::status::ApiError;
use crate::request::identity::Identity;
use crate::request::query::Query;
use crate::request::request_info::{self, ClusterTarget, RequestInfo, Target};

/// Largest request body accepted (as kube-apiserver: 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// How long a client may take to send a request body (a slow sender holds a request slot).
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How much of an oversized body is still read (and dropped) so the client, still sending, gets
/// its 413 instead of a reset connection.
const OVERSIZED_BODY_DRAIN: usize = 64 * 1024 * 1024;

/// Serves an exchange: a filter, which does its part and hands the exchange on, or the router.
pub trait Handler: Send + Sync + 'static {
    /// The response to `exchange`. Never fails: every refusal is a response.
    fn handle(&self, exchange: Box<Exchange>) -> impl Future<Output = Response<Body>> + Send;
}

/// The remote address of a request's connection (set by the listener as a request extension).
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub std::net::SocketAddr);

/// A request, and what the filters have learned of it so far.
pub struct Exchange {
    /// Method, URI, headers and extensions.
    pub parts: http::request::Parts,
    /// The body, unread.
    pub body: Incoming,
    /// The decoded query string.
    pub query: Query,
    /// What the path addresses. A path the server cannot read has [`Target::Unknown`] here and
    /// its error in `malformed`.
    pub info: RequestInfo,
    /// Why the path cannot be read, if it cannot.
    pub malformed: Option<ApiError>,
    /// The logical cluster as the path names it, before a workspace path is resolved.
    pub requested: ClusterTarget,
    /// The connection's client certificate, as the listener verified it.
    pub peer: Peer,
    /// Who the request acts as: set by authentication, replaced by impersonation; `None` for
    /// an anonymous request to a public path.
    pub user: Option<Arc<Identity>>,
    /// A bearer token no authenticator accepted, kept until the addressed workspace's own
    /// issuers have seen it.
    pub refused: Option<Refusal>,
    /// Whether this is a watch: long-running, with no request timeout and no in-flight slot.
    pub long_running: bool,
    /// The request's audit id, also its log lines' and its `Audit-Id` response header.
    pub audit_id: String,
    /// When the server began serving it.
    pub started: Instant,
    /// What the request turned out to be, for metrics, the log line and audit events.
    pub record: Arc<Mutex<RequestRecord>>,
    /// Whether it names a type the server serves, by a route it has (the handlers say so).
    pub served: ServedType,
}

/// Set once a request is known to name a type the server serves by a route it has; the
/// handlers set it. The request metrics count only such requests by type (so a path naming no
/// type adds no series), and count them however they are answered (a timeout, a panic).
#[derive(Clone, Debug, Default)]
pub struct ServedType(Arc<std::sync::atomic::AtomicBool>);

impl ServedType {
    /// Says the request names a served type.
    pub fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether it was said.
    pub fn is_marked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A bearer token the server's authenticators refused.
pub struct Refusal {
    /// Their answer.
    pub error: ApiError,
    /// The token.
    pub token: String,
}

impl Exchange {
    /// The exchange of a request that came in on a connection with `peer`. Boxed: it passes
    /// through every filter, and each filter's future holds what it passes on; a pointer keeps
    /// them small (a kilobyte moved at every step cost a tenth of a GET's CPU).
    pub fn new(peer: Peer, req: hyper::Request<Incoming>) -> Box<Exchange> {
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        let query = Query::parse(parts.uri.query());
        let (info, malformed) =
            match request_info::parse(&parts.method, parts.uri.path(), query.flag("watch")) {
                Ok(info) => (info, None),
                Err(e) => (
                    RequestInfo {
                        cluster: ClusterTarget::Name(request_info::ROOT_CLUSTER.to_string()),
                        target: Target::Unknown,
                        virtual_workspace: None,
                        view: None,
                        lifecycle: None,
                    },
                    Some(e),
                ),
            };
        let long_running = parts.method == Method::GET && is_watch(&info);
        let audit_id = audit_id(&parts.headers);
        Box::new(Exchange {
            requested: info.cluster.clone(),
            parts,
            body,
            query,
            info,
            malformed,
            peer,
            user: None,
            refused: None,
            long_running,
            audit_id,
            started,
            record: Arc::default(),
            served: ServedType::default(),
        })
    }

    /// Records into the request's record, whatever state a panic elsewhere left it in.
    pub fn note(&self, f: impl FnOnce(&mut RequestRecord)) {
        f(&mut self.record.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Whether the target lives in a logical cluster (everything but health, version, metrics
    /// and the admission webhooks).
    pub fn cluster_scoped(&self) -> bool {
        !matches!(
            self.info.target,
            Target::Health { .. } | Target::Version | Target::Metrics | Target::Admission(_)
        )
    }

    /// Whether the request addresses a workspace directly, not through a virtual workspace.
    pub fn is_direct(&self) -> bool {
        self.info.virtual_workspace.is_none()
            && self.info.lifecycle.is_none()
            && self.info.view.is_none()
    }

    /// Where the request's RBAC is evaluated: its cluster, or the export's workspace for an
    /// APIExport's virtual workspace.
    pub fn scope(&self) -> crate::access::authz::Scope<'_> {
        scope(&self.info.virtual_workspace, &self.info.cluster)
    }

    /// The `Accept` header, if it is text.
    pub fn accept(&self) -> Option<&str> {
        accept(&self.parts)
    }

    /// Whether the path is one of the probes and scrapes that come every few seconds and must
    /// answer under load: they take no in-flight slot and log below `-v 3`.
    pub fn is_probe(&self) -> bool {
        matches!(
            self.parts.uri.path(),
            "/livez" | "/readyz" | "/healthz" | "/version" | "/metrics"
        )
    }
}

/// A resource request taken apart for what serves it, its body read.
pub struct ResourceExchange {
    /// Group, version, resource, namespace, name, subresource and verb.
    pub request: request_info::ResourceRequest,
    /// The body, read whole (empty for reads).
    pub body: Bytes,
    /// Method, URI, headers and extensions.
    pub parts: http::request::Parts,
    /// The decoded query string.
    pub query: Query,
    /// The logical cluster, resolved.
    pub cluster: ClusterTarget,
    /// The APIExport virtual workspace it came through, if it did.
    pub virtual_workspace: Option<(String, String)>,
    /// Who the request acts as.
    pub user: Option<Arc<Identity>>,
    /// Whether it names a served type (the handlers say so).
    pub served: ServedType,
}

impl ResourceExchange {
    /// Where the request's RBAC is evaluated (see [`Exchange::scope`]).
    pub fn scope(&self) -> crate::access::authz::Scope<'_> {
        scope(&self.virtual_workspace, &self.cluster)
    }

    /// The `Accept` header, if it is text.
    pub fn accept(&self) -> Option<&str> {
        accept(&self.parts)
    }
}

/// The request's cluster, or the export's workspace for an APIExport's virtual workspace.
fn scope<'a>(
    virtual_workspace: &'a Option<(String, String)>,
    cluster: &'a ClusterTarget,
) -> crate::access::authz::Scope<'a> {
    match (virtual_workspace, cluster) {
        (Some((c, e)), _) => crate::access::authz::Scope::VirtualWorkspace(c, e),
        (None, ClusterTarget::Name(c)) => crate::access::authz::Scope::Cluster(c),
        (None, ClusterTarget::Wildcard) => crate::access::authz::Scope::Wildcard,
    }
}

fn accept(parts: &http::request::Parts) -> Option<&str> {
    parts
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
}

impl Exchange {
    /// The resource request with its body read; both go into the record for the log line and
    /// the audit events (the resource first, so a body that cannot be read is still recorded
    /// against it).
    pub async fn into_resource(self: Box<Self>) -> Result<ResourceExchange, ApiError> {
        let Exchange {
            parts,
            body,
            query,
            info,
            user,
            record,
            served,
            ..
        } = *self;
        let Target::Resource(request) = info.target else {
            return Err(ApiError::path_not_found());
        };
        record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_resource(&request);
        let body = resource_body(&parts.method, body).await?;
        record.lock().unwrap_or_else(|p| p.into_inner()).body = Some(body.clone());
        Ok(ResourceExchange {
            request,
            body,
            parts,
            query,
            cluster: info.cluster,
            virtual_workspace: info.virtual_workspace,
            user,
            served,
        })
    }
}

/// What the server learned about a request, for the metrics, the request's log line and span,
/// and audit events. Filled in as the filters and the router get to know each part.
#[derive(Clone, Default)]
pub struct RequestRecord {
    /// The RBAC verb (`get`, `list`, `watch`, `create`, …), empty until known.
    pub verb: String,
    /// The resource request, once the router has one.
    pub resource: Option<request_info::ResourceRequest>,
    /// The logical cluster the request was resolved to.
    pub cluster: Option<String>,
    /// Who the request acts as (after impersonation).
    pub user: Option<Arc<Identity>>,
    /// Who authenticated, when that user impersonates another.
    pub impersonator: Option<Arc<Identity>>,
    /// The request body of a write.
    pub body: Option<Bytes>,
    /// What a handler panicked with, if it did.
    pub panicked: Option<String>,
}

impl RequestRecord {
    /// Records the resource request being served.
    pub fn set_resource(&mut self, rr: &request_info::ResourceRequest) {
        self.verb = rr.verb.as_str().to_string();
        self.resource = Some(rr.clone());
    }

    /// The resource as the metrics label it (`configmaps`; empty outside resource requests).
    pub fn resource_label(&self) -> String {
        match &self.resource {
            Some(rr) => rr.resource.clone(),
            None => String::new(),
        }
    }

    /// The verb as the metrics and audit name it: the RBAC verb once known, else the method.
    pub fn verb_or(&self, method: &Method) -> String {
        if self.verb.is_empty() {
            method.as_str().to_ascii_lowercase()
        } else {
            self.verb.clone()
        }
    }
}

/// The request's audit id: the client's `Audit-ID` header when it is a plausible id (as
/// kube-apiserver keeps a caller's id), else a new UUID. A tenant's header goes into logs, so
/// only short ids of letters, digits, `-`, `_` and `.` are kept.
fn audit_id(headers: &http::HeaderMap) -> String {
    headers
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
        .map(str::to_string)
        // A version-4 UUID from the thread's generator: no system call per request.
        .unwrap_or_else(|| {
            uuid::Builder::from_random_bytes(rand::random())
                .into_uuid()
                .to_string()
        })
}

/// Whether a request is a watch, decided as the router decides it (from the parsed path and
/// query, `GET` only), as kube-apiserver's long-running check does: a `watch` flag elsewhere in
/// the query, a namespace named `watch` or a `POST ...?watch=1` is a short request and keeps its
/// in-flight slot and timeout.
pub fn is_long_running(method: &Method, uri: &http::Uri) -> bool {
    let query = Query::parse(uri.query());
    method == Method::GET
        && request_info::parse(method, uri.path(), query.flag("watch"))
            .is_ok_and(|info| is_watch(&info))
}

/// Whether a parsed request is a watch.
fn is_watch(info: &RequestInfo) -> bool {
    matches!(&info.target, Target::Resource(rr) if rr.verb == request_info::Verb::Watch)
}

/// The body of a resource request: read for the methods that carry one, empty for reads.
pub async fn resource_body(method: &Method, body: Incoming) -> Result<Bytes, ApiError> {
    match *method {
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE => read_body(body).await,
        _ => Ok(Bytes::new()),
    }
}

/// The whole body, up to [`MAX_BODY_BYTES`] and within the time a client has to send it.
pub async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(BODY_READ_TIMEOUT, collect_limited(body)).await {
        Ok(result) => result,
        Err(_) => Err(ApiError::timeout("the request body did not arrive in time")),
    }
}

async fn collect_limited(mut body: Incoming) -> Result<Bytes, ApiError> {
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen <= MAX_BODY_BYTES {
            buf.extend_from_slice(&data);
        } else if seen > OVERSIZED_BODY_DRAIN {
            break;
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(method: Method, uri: &str) -> bool {
        is_long_running(&method, &uri.parse().expect("uri"))
    }

    #[test]
    fn only_what_the_router_serves_as_a_watch_is_long_running() {
        assert!(long(
            Method::GET,
            "/api/v1/namespaces/d/configmaps?watch=true"
        ));
        assert!(long(
            Method::GET,
            "/clusters/root/api/v1/configmaps?watch=1"
        ));
        assert!(long(Method::GET, "/api/v1/watch/namespaces/d/configmaps"));
        // A namespace named `watch`, a `watch` flag on a write, a false flag, a non-resource
        // path: short requests, with their slot and timeout.
        assert!(!long(Method::GET, "/api/v1/namespaces/watch/configmaps"));
        assert!(!long(
            Method::GET,
            "/api/v1/namespaces/watch/configmaps/watch"
        ));
        assert!(!long(
            Method::POST,
            "/api/v1/namespaces/d/configmaps?watch=1"
        ));
        assert!(!long(
            Method::PUT,
            "/api/v1/namespaces/d/configmaps/x?watch=true"
        ));
        assert!(!long(
            Method::GET,
            "/api/v1/namespaces/d/configmaps?watch=false"
        ));
        assert!(!long(
            Method::GET,
            "/api/v1/namespaces/d/configmaps?watchx=1"
        ));
        assert!(!long(Method::GET, "/openapi/v2?watch=1"));
        assert!(!long(Method::GET, "/healthz/watch"));
        // Repeated flags are read as the router reads them: whatever it decides, both agree.
        for uri in [
            "/api/v1/configmaps?watch=1&watch=0",
            "/api/v1/configmaps?watch=0&watch=1",
        ] {
            let query = Query::parse(uri.split_once('?').map(|(_, q)| q));
            let routed = request_info::parse(&Method::GET, "/api/v1/configmaps", query.flag("watch"))
                .map(|i| matches!(i.target, Target::Resource(rr) if rr.verb == request_info::Verb::Watch))
                .unwrap_or(false);
            assert_eq!(long(Method::GET, uri), routed, "{uri}");
        }
    }
}
