//! The request path from a decoded HTTP request to a response: panic guard, body limit,
//! authentication, request info, routing to discovery, OpenAPI, health, metrics and resources.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;
use serde_json::{json, Value};

use crate::endpoints::handlers::{self, ResourceCall};
use crate::meta::body::Body;
use crate::meta::metrics::Metrics;
use crate::meta::response::text_response;
pub use crate::meta::response::{bytes_response, error_response, json_response};
use crate::meta::status::ApiError;
use crate::registry::catalog::Catalog;
use crate::registry::openapi::KUBE_VERSION;
use crate::registry::Registry;
pub use crate::request::identity::Identity;
use crate::request::negotiation::aggregated_discovery_version;
use crate::request::query::Query;
use crate::request::request_info::{self, ClusterTarget, Target};
use crate::storage::Store;
use crate::{admission::namespaces, registry::discovery};

/// The log target of the one line (and span) per request: kube-apiserver writes its request
/// lines from verbosity 3, and the binary's `-v` turns this target on there.
pub const REQUESTS_TARGET: &str = "apiserver::requests";

/// Largest request body accepted (as kube-apiserver: 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Everything a request handler may use. No global state: the server is this value.
pub struct AppState {
    /// Where objects live: the backend given, wrapped so that every write invalidates the RBAC
    /// policies it changes.
    pub store: Arc<dyn Store>,
    /// What every logical cluster serves.
    pub catalog: Arc<Catalog>,
    /// Request counters and latency histograms, served at `/metrics`.
    pub metrics: Metrics,
    /// `host:port` clients reach the server at (for `/api`).
    pub advertise_address: String,
    /// Namespace bookkeeping: the `default` namespace, and refusing content in missing or
    /// terminating namespaces.
    pub namespaces: Arc<namespaces::NamespaceLifecycle>,
    /// The workspace tree and the hooks of the tenancy types.
    pub tenancy: Arc<crate::access::tenancy::Tenancy>,
    /// Short requests being served at once; beyond the limit the server answers 429.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// How requests authenticate.
    pub authn: crate::access::authn::Authn,

    /// How long a short request may take before it is answered 504 (`--request-timeout`).
    pub request_timeout: std::time::Duration,
    /// The write path of every type, with the types' strategies.
    pub objects: Arc<crate::registry::GenericStore>,
    /// The admission plugins every write passes: namespace lifecycle, kcp's path annotation,
    /// the object limit (`--max-objects-per-workspace`).
    pub admission: Arc<crate::admission::Chain>,
    /// The decoded RBAC policy of each workspace, kept until its RBAC objects change.
    pub policies: Arc<crate::access::rbac::PolicyCache>,
    /// RBAC authorization over the store and those policies.
    pub rbac: crate::access::authz::Rbac,
    /// What each user may make the server hold: unread list answers, open watches.
    pub budgets: Arc<crate::access::budget::Budgets>,
    /// Platform Mesh's virtual workspaces (marketplace, content configurations).
    pub views: Arc<crate::endpoints::views::Views>,
    /// The read-only generic store of each view, with no strategies and no admission.
    view_scopes: Vec<(crate::endpoints::views::ViewKind, handlers::ResourceScope)>,
    /// Extension mode: the kcp this server fronts, which resolves workspaces and authorizes the
    /// view requests (the server then serves nothing but the views).
    pub extension: Option<Arc<crate::endpoints::views::Extension>>,
    /// kcp's per-workspace authentication (WorkspaceAuthenticationConfigurations), when on.
    pub workspace_authn: Option<Arc<crate::access::workspace_authn::WorkspaceAuthn>>,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<Audit>>,
}

/// Auditing: which requests are recorded how (`--audit-policy-file`), and the log they go to
/// (`--audit-log-path`).
pub struct Audit {
    /// Decides each request's level and stages.
    pub policy: crate::meta::audit::Policy,
    /// Where events go.
    pub writer: crate::meta::audit::LogWriter,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit").finish_non_exhaustive()
    }
}

/// The remote address of a request's connection (set by the listener as a request extension).
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub std::net::SocketAddr);

/// What `AppState::new` needs beyond the store and the registry.
#[derive(Debug)]
pub struct StateOptions {
    /// `host:port` clients reach the server at.
    pub advertise_address: String,
    /// Short requests served at once before the server answers 429 (at least 1).
    pub max_requests_in_flight: usize,
    /// How requests authenticate.
    pub authn: crate::access::authn::Authn,
    /// Objects one logical cluster may hold; 0 for no limit.
    pub max_objects_per_workspace: usize,
    /// How long a short request may take before it is answered 504.
    pub request_timeout: std::time::Duration,
    /// Metrics added to `/metrics` beside the server's own.
    pub extra_metrics: Option<crate::meta::metrics::ExtraMetrics>,
    /// Per-user budgets of unread list answers and open watches.
    pub budgets: crate::access::budget::BudgetLimits,
    /// The labels, entity names and core export of Platform Mesh's virtual workspaces.
    pub views: crate::endpoints::views::ViewOptions,
    /// Extension mode: serve only the views, for the workspaces of this upstream kcp.
    pub extension: Option<Arc<crate::endpoints::views::Extension>>,
    /// Whether workspaces may admit users with their own JWT issuers (kcp's
    /// `WorkspaceAuthentication` feature); on unless turned off.
    pub workspace_authentication: bool,
    /// The audit policy and log, when auditing.
    pub audit: Option<Arc<Audit>>,
}

impl StateOptions {
    /// Defaults for a server reached at `advertise_address`.
    pub fn new(advertise_address: impl Into<String>) -> Self {
        StateOptions {
            advertise_address: advertise_address.into(),
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            authn: crate::access::authn::Authn::default(),
            max_objects_per_workspace: 0,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            extra_metrics: None,
            budgets: crate::access::budget::BudgetLimits::default(),
            views: crate::endpoints::views::ViewOptions::default(),
            extension: None,
            workspace_authentication: true,
            audit: None,
        }
    }
}

/// Default `--request-timeout` (kube-apiserver's).
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Default limit of short (non-watch) requests served at once.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: usize = 400;

impl AppState {
    /// The server's state over `store` (wrapped to keep the RBAC policy cache current) and the
    /// types of `registry`, with namespace and tenancy machinery built on them.
    pub fn new(store: Arc<dyn Store>, registry: Registry, options: StateOptions) -> Arc<Self> {
        let catalog = Arc::new(Catalog::new(registry.resources().to_vec()));
        // Every write made through this process invalidates the policies it changes before it
        // is acknowledged, so a client's next request is authorized by its own RBAC change.
        let policies = Arc::new(crate::access::rbac::PolicyCache::new());
        let observer = policies.clone();
        let store: Arc<dyn Store> = Arc::new(crate::storage::ObservedStore::new(
            store,
            Arc::new(move |key: &str, revision| observer.observe_write(key, revision)),
        ));
        let rbac = crate::access::authz::Rbac::new(store.clone(), policies.clone());
        let namespaces = Arc::new(namespaces::NamespaceLifecycle::new(
            store.clone(),
            catalog.clone(),
            options
                .authn
                .service_accounts
                .as_ref()
                .map(|tokens| tokens.ca_pem().to_string()),
        ));
        let tenancy = crate::access::tenancy::Tenancy::new(crate::access::tenancy::TenancyDeps {
            store: store.clone(),
            catalog: catalog.clone(),
            advertise_address: options.advertise_address.clone(),
            rbac: rbac.clone(),
            namespaces: namespaces.clone(),
            policies: policies.clone(),
        });
        // Each type's behaviour, contributed by the layer that owns it.
        let mut strategies = crate::registry::StrategiesBuilder::default();
        crate::admission::rules::register(&mut strategies);
        strategies.add(
            "",
            "secrets",
            Arc::new(crate::access::serviceaccounts::LegacyTokenSecrets {
                store: store.clone(),
                catalog: catalog.clone(),
                signer: options.authn.service_accounts.clone(),
            }),
        );
        crate::access::authz::RbacEscalation::register(&rbac, &mut strategies);
        namespaces.add_strategies(&mut strategies);
        tenancy.add_strategies(&mut strategies);
        let objects = Arc::new(crate::registry::GenericStore::new(
            store.clone(),
            strategies.build(),
            crate::meta::heavy::HeavyWork::default(),
        ));
        let admission = Arc::new(crate::admission::Chain::new(vec![
            namespaces.clone(),
            Arc::new(crate::access::tenancy::PathAnnotation(tenancy.clone())),
            Arc::new(crate::access::tenancy::ClaimLabels(tenancy.clone())),
            Arc::new(crate::admission::limits::ObjectCountLimit::new(
                crate::admission::limits::ObjectLimit::new(options.max_objects_per_workspace),
                store.clone(),
                catalog.clone(),
            )),
        ]));
        let paths: Arc<dyn crate::endpoints::views::WorkspacePaths> = match &options.extension {
            Some(x) => x.clone(),
            None => tenancy.clone(),
        };
        let views = crate::endpoints::views::Views::new(store.clone(), paths, options.views);
        let budgets = Arc::new(crate::access::budget::Budgets::new(options.budgets));
        let view_scopes = [
            crate::endpoints::views::ViewKind::ContentConfigurations,
            crate::endpoints::views::ViewKind::Marketplace,
        ]
        .into_iter()
        .map(|kind| {
            let scope = handlers::ResourceScope {
                objects: Arc::new(crate::registry::GenericStore::new(
                    views.store(kind),
                    crate::registry::Strategies::default(),
                    objects.heavy().clone(),
                )),
                admission: Arc::new(crate::admission::Chain::default()),
                catalog: catalog.clone(),
                namespaces: namespaces.clone(),
                budgets: budgets.clone(),
            };
            (kind, scope)
        })
        .collect();
        let workspace_authn = (options.workspace_authentication && options.extension.is_none())
            .then(|| {
                crate::access::workspace_authn::WorkspaceAuthn::new(store.clone(), tenancy.clone())
            });
        Arc::new(AppState {
            views,
            view_scopes,
            workspace_authn,
            audit: options.audit,
            extension: options.extension,
            policies,
            rbac,
            budgets,
            objects,
            admission,
            namespaces,
            tenancy,
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                options.max_requests_in_flight.max(1),
            )),
            authn: options.authn,

            request_timeout: options.request_timeout,
            store,
            catalog,
            metrics: Metrics::with_extra(options.extra_metrics.as_ref()),
            advertise_address: options.advertise_address,
        })
    }
}

impl AppState {
    /// Who decides what a caller may do: RBAC of the server's workspaces, or in extension mode
    /// the kcp it fronts.
    pub fn authorizer(&self) -> &dyn crate::access::authz::Authorizer {
        match &self.extension {
            Some(x) => x.as_ref(),
            None => &self.rbac,
        }
    }

    /// The handles the resource handlers work with.
    pub fn resource_scope(&self) -> handlers::ResourceScope {
        handlers::ResourceScope {
            objects: self.objects.clone(),
            admission: self.admission.clone(),
            catalog: self.catalog.clone(),
            namespaces: self.namespaces.clone(),
            budgets: self.budgets.clone(),
        }
    }

    /// The store and the built-in types, for the service-account code.
    pub fn objects(&self) -> crate::access::serviceaccounts::Objects<'_> {
        crate::access::serviceaccounts::Objects {
            store: self.store.as_ref(),
            catalog: &self.catalog,
        }
    }
}

/// Paths anyone may read without a client certificate.
/// Admission webhooks are called by a kube-apiserver, which presents no client certificate by
/// default; they only compute answers and never touch storage.
fn is_public(target: &Target) -> bool {
    matches!(
        target,
        Target::Health { .. } | Target::Version | Target::Admission(_)
    )
}

/// Serves one request. Never panics: a panic inside a handler becomes a 500 Status.
pub async fn handle(
    state: Arc<AppState>,
    peer: crate::access::authn::Peer,
    req: Request<Incoming>,
) -> Response<Body> {
    let started = Instant::now();
    let method = req.method().clone();
    // Watches are long-running and health checks must answer under load: neither counts.
    // The request is parsed once: the long-running decision and the router read the same.
    let query = Query::parse(req.uri().query());
    let info = request_info::parse(&method, req.uri().path(), query.flag("watch"));
    let long_running = method == Method::GET && is_watch(&info);
    let gzip = !long_running && accepts_gzip(req.headers());
    let audit_id = audit_id(req.headers());
    let audited = state.audit.as_ref().map(|_| AuditedRequest {
        uri: req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string()),
        path: req.uri().path().to_string(),
        user_agent: req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        source: req
            .extensions()
            .get::<RemoteAddr>()
            .map(|a| a.0.ip().to_string()),
        received: time::OffsetDateTime::now_utc(),
    });
    let span = tracing::info_span!(
        target: REQUESTS_TARGET,
        "request",
        id = %audit_id,
        method = %method,
        path = %req.uri().path(),
        cluster = tracing::field::Empty,
        user = tracing::field::Empty,
        verb = tracing::field::Empty,
        resource = tracing::field::Empty,
        name = tracing::field::Empty,
        code = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    );
    let exempt = long_running
        || matches!(
            req.uri().path(),
            "/livez" | "/readyz" | "/healthz" | "/version" | "/metrics"
        );
    let slot = if exempt {
        None
    } else {
        match state.in_flight.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let response = error_response(&ApiError::too_many_requests(1));
                state.metrics.observe(
                    &method.as_str().to_ascii_lowercase(),
                    "",
                    429,
                    started.elapsed().as_secs_f64(),
                );
                return response;
            }
        }
    };
    let record = std::sync::Mutex::new(RequestRecord::default());
    // The router's future holds the state of every handler it may run, several KiB: boxed at
    // once, the wrappers below move a pointer instead of copying it, as they did for 6% of a
    // GET's CPU.
    let routed = tracing::Instrument::instrument(
        AssertUnwindSafe(Box::pin(route(&state, peer, req, query, info, &record))).catch_unwind(),
        span.clone(),
    );
    // Short requests end within the request timeout; watches have their own.
    let result = if long_running {
        Ok(routed.await)
    } else {
        tokio::time::timeout(state.request_timeout, routed)
            .await
            .map_err(|_| ())
    };
    let mut panicked = None;
    let mut response = match result {
        Err(()) => error_response(&ApiError::timeout(
            "the request did not complete within the allowed duration",
        )),
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "handler panicked");
            panicked = Some(what);
            error_response(&ApiError::internal(
                "an internal error occurred while serving the request",
            ))
        }
    };
    let record = record.into_inner().unwrap_or_else(|p| p.into_inner());
    if let (Some(audit), Some(request)) = (&state.audit, audited) {
        response = audit_request(
            audit,
            &state,
            &record,
            AuditContext {
                request,
                id: &audit_id,
                method: &method,
                long_running,
                panicked: panicked.as_deref(),
            },
            response,
        )
        .await;
    }
    if gzip {
        response = compress(response).await;
    }
    if let Some(slot) = slot {
        response = response.map(|body| body.holding(slot));
    }
    let resource = record.resource_label();
    let verb = if record.verb.is_empty() {
        method.as_str().to_ascii_lowercase()
    } else {
        record.verb.clone()
    };
    state.metrics.observe(
        &verb,
        &resource,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    let code = response.status().as_u16();
    let latency_ms = started.elapsed().as_millis() as u64;
    span.record("verb", verb.as_str());
    span.record("resource", resource.as_str());
    span.record("code", code);
    span.record("latency_ms", latency_ms);
    if let Some(c) = &record.cluster {
        span.record("cluster", c.as_str());
    }
    if let Some(u) = &record.user {
        span.record("user", u.user.as_str());
    }
    if let Some(name) = record.resource.as_ref().and_then(|r| r.name.as_deref()) {
        span.record("name", name);
    }
    // One line per request, written only when its target is asked for (`-v 3`; probes and
    // metrics scrapes at debug, as they come every few seconds); a watch's line is written when
    // it starts. Its span is off too below `-v 3`, so recording the fields above costs nothing.
    span.in_scope(|| {
        if exempt && !long_running {
            tracing::debug!(target: REQUESTS_TARGET, "served");
        } else {
            tracing::info!(target: REQUESTS_TARGET, "served");
        }
    });
    if let Ok(v) = HeaderValue::from_str(&audit_id) {
        response.headers_mut().insert("audit-id", v);
    }
    response
}

/// What audit events say about a request beyond what routing learned.
struct AuditedRequest {
    /// The path with the query, as the client sent it.
    uri: String,
    /// The path alone.
    path: String,
    user_agent: String,
    /// The connection's remote address.
    source: Option<String>,
    received: time::OffsetDateTime,
}

/// One request's audit inputs.
struct AuditContext<'a> {
    request: AuditedRequest,
    id: &'a str,
    method: &'a Method,
    long_running: bool,
    panicked: Option<&'a str>,
}

fn audit_user(id: &Identity) -> crate::meta::audit::UserInfo {
    crate::meta::audit::UserInfo {
        username: id.user.clone(),
        uid: id.uid.clone(),
        groups: id.groups.clone(),
        extra: id.extra.clone(),
    }
}

/// Writes the audit events of one request, as kube-apiserver's audit filter does: the policy
/// decides from the authenticated user (not the impersonated one), the verb and the resource or
/// path (without its `/clusters/<name>` prefix); the events carry the logical cluster as kcp's
/// annotations. A watch gets `ResponseStarted` now and `ResponseComplete` when its stream ends.
/// Events are written before the response goes (kube's blocking mode).
async fn audit_request(
    audit: &Audit,
    state: &AppState,
    record: &RequestRecord,
    ctx: AuditContext<'_>,
    response: Response<Body>,
) -> Response<Body> {
    use crate::meta::audit::{
        Attributes, EventBuilder, Level, ResourceAttributes, Target as AuditTarget,
    };
    let authenticated = record.impersonator.as_ref().or(record.user.as_ref());
    let verb = if record.verb.is_empty() {
        ctx.method.as_str().to_ascii_lowercase()
    } else {
        record.verb.clone()
    };
    let target = match &record.resource {
        Some(rr) => AuditTarget::Resource(ResourceAttributes {
            api_group: rr.group.clone(),
            api_version: rr.version.clone(),
            resource: rr.resource.clone(),
            subresource: rr.subresource.clone().unwrap_or_default(),
            namespace: rr.namespace.clone().unwrap_or_default(),
            name: rr.name.clone().unwrap_or_default(),
        }),
        None => AuditTarget::NonResource {
            path: without_cluster_prefix(&ctx.request.path).to_string(),
        },
    };
    let attributes = Attributes {
        user: authenticated.map(|u| u.user.clone()).unwrap_or_default(),
        groups: authenticated.map(|u| u.groups.clone()).unwrap_or_default(),
        verb,
        target,
    };
    let decision = audit.policy.decide(&attributes);
    if decision.level == Level::None {
        return response;
    }
    let mut events = EventBuilder::new(decision, &attributes, ctx.id, ctx.request.uri)
        .received_at(ctx.request.received)
        .source_ips(ctx.request.source.into_iter().collect())
        .user_agent(ctx.request.user_agent);
    if let Some(user) = authenticated {
        events = events.user(audit_user(user));
    }
    if let (Some(_), Some(acting)) = (&record.impersonator, &record.user) {
        events.set_impersonated_user(audit_user(acting));
    }
    if let Some(cluster) = &record.cluster {
        let path = state.tenancy.path_of(cluster).unwrap_or_default();
        events.set_logical_cluster(cluster, &path);
    }
    if let Some(body) = record.body.as_ref().filter(|b| !b.is_empty()) {
        if let Ok(object) = serde_json::from_slice::<Value>(body) {
            events.set_request_object(&object);
        }
    }
    let code = response.status().as_u16();
    if events.wants_response_object() || code >= 400 {
        if let Some(object) = response
            .body()
            .full_bytes()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        {
            events.set_response_object(&object);
        }
    }
    if let Some(event) = events.request_received() {
        audit.writer.send(event).await;
    }
    if let Some(message) = ctx.panicked {
        if let Some(event) = events.panicked(message) {
            audit.writer.send(event).await;
        }
        return response;
    }
    if ctx.long_running && code == 200 {
        if let Some(event) = events.response_started(code) {
            audit.writer.send(event).await;
        }
        let writer = audit.writer.clone();
        return response.map(|body| {
            body.on_drop(move || {
                let (Some(event), Ok(runtime)) = (
                    events.response_complete(code),
                    tokio::runtime::Handle::try_current(),
                ) else {
                    return;
                };
                runtime.spawn(async move { writer.send(event).await });
            })
        });
    }
    if let Some(event) = events.response_complete(code) {
        audit.writer.send(event).await;
    }
    response
}

/// `path` without a leading `/clusters/<name>`.
fn without_cluster_prefix(path: &str) -> &str {
    match path.strip_prefix("/clusters/") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => path,
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

/// What routing learned about a request, for the metrics, the request's log line and span,
/// and audit events. Filled in as the router gets to know each part.
#[derive(Default)]
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
}

impl RequestRecord {
    fn set_resource(&mut self, rr: &request_info::ResourceRequest) {
        self.verb = rr.verb.as_str().to_string();
        self.resource = Some(rr.clone());
    }

    /// The resource as the metrics label it (`configmaps`; empty outside resource requests).
    fn resource_label(&self) -> String {
        match &self.resource {
            Some(rr) => rr.resource.clone(),
            None => String::new(),
        }
    }
}

/// Records into `record`, whatever state a panic elsewhere left it in.
fn note(record: &std::sync::Mutex<RequestRecord>, f: impl FnOnce(&mut RequestRecord)) {
    f(&mut record.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Responses of at least this many bytes are compressed for clients that accept gzip:
/// kube-apiserver's threshold (`APIResponseCompression`).
pub const GZIP_MIN_BYTES: usize = 128 * 1024;

/// Whether the request's `Accept-Encoding` lists gzip (with a non-zero quality).
fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !zero
        })
}

/// `response` gzipped when its whole body is [`GZIP_MIN_BYTES`] or more, as kube-apiserver
/// does (its fastest level; the work runs off the async threads). Streams (watches) and
/// smaller bodies go as they are.
async fn compress(mut response: Response<Body>) -> Response<Body> {
    let Some(bytes) = response.body().full_bytes().cloned() else {
        return response;
    };
    if bytes.len() < GZIP_MIN_BYTES
        || response
            .headers()
            .contains_key(http::header::CONTENT_ENCODING)
    {
        return response;
    }
    let gzipped = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(
            Vec::with_capacity(bytes.len() / 4),
            flate2::Compression::fast(),
        );
        encoder.write_all(&bytes)?;
        encoder.finish()
    })
    .await;
    let Ok(Ok(gzipped)) = gzipped else {
        // Compression into memory does not fail; if it did, the plain body still serves.
        return response;
    };
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_ENCODING,
        http::HeaderValue::from_static("gzip"),
    );
    headers.append(
        http::header::VARY,
        http::HeaderValue::from_static("Accept-Encoding"),
    );
    headers.remove(http::header::CONTENT_LENGTH);
    response.body_mut().replace_full(gzipped.into());
    response
}

/// Whether a request is a watch, decided as the router decides it (from the parsed path and
/// query, `GET` only), as kube-apiserver's long-running check does: a `watch` flag elsewhere in
/// the query, a namespace named `watch` or a `POST ...?watch=1` is a short request and keeps its
/// in-flight slot and timeout.
pub fn is_long_running(method: &Method, uri: &http::Uri) -> bool {
    let query = Query::parse(uri.query());
    method == Method::GET
        && is_watch(&request_info::parse(
            method,
            uri.path(),
            query.flag("watch"),
        ))
}

/// Whether a parsed request is a watch.
fn is_watch(info: &Result<request_info::RequestInfo, ApiError>) -> bool {
    matches!(
        info,
        Ok(request_info::RequestInfo { target: Target::Resource(rr), .. })
            if rr.verb == request_info::Verb::Watch
    )
}

async fn route(
    state: &Arc<AppState>,
    peer: crate::access::authn::Peer,
    req: Request<Incoming>,
    query: Query,
    info: Result<request_info::RequestInfo, ApiError>,
    record: &std::sync::Mutex<RequestRecord>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let info = match info {
        Ok(i) => i,
        Err(e) => return error_response(&e),
    };
    let bearer = crate::access::authn::bearer(
        parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .map(str::to_string);
    // A bearer token nobody accepts may still be one of the addressed workspace's own issuers
    // (kcp's per-workspace authentication); that is decided once the workspace is known, and
    // until then the refusal is kept: whatever else fails, the answer stays 401, so a client
    // without valid credentials learns nothing about which workspaces exist.
    let (identity, refused) = match crate::access::authn::authenticate(
        &state.authn,
        state.objects(),
        &peer,
        &mut parts.headers,
    )
    .await
    {
        Ok(id) => (id, None),
        Err(e) if bearer.is_some() && state.workspace_authn.is_some() => (None, Some(e)),
        Err(e) => return error_response(&e),
    };
    if identity.is_none() && refused.is_none() && !is_public(&info.target) {
        return error_response(&ApiError::unauthorized());
    }
    let mut info = info;
    let cluster_scoped = !matches!(
        info.target,
        Target::Health { .. } | Target::Version | Target::Metrics | Target::Admission(_)
    );
    // In extension mode the server serves the views (and its health, version and metrics)
    // and nothing of its own.
    let own = matches!(
        info.target,
        Target::Health { .. } | Target::Version | Target::Metrics
    );
    if state.extension.is_some() && !own && info.view.is_none() {
        return error_response(&ApiError::path_not_found());
    }
    let requested = info.cluster.clone();
    if cluster_scoped {
        let target = std::mem::replace(&mut info.cluster, ClusterTarget::Wildcard);
        info.cluster = match (&state.extension, target) {
            (Some(x), ClusterTarget::Name(c)) => match x.resolve(&c).await {
                Ok(name) => ClusterTarget::Name(name),
                Err(e) => return error_response(refused.as_ref().unwrap_or(&e)),
            },
            (_, target) => match state.tenancy.resolve(target) {
                Ok(c) => c,
                Err(e) => return error_response(refused.as_ref().unwrap_or(&e)),
            },
        };
    }
    let identity = match refused {
        None => identity,
        Some(refusal) => {
            let admitted = match (
                &state.workspace_authn,
                &info.cluster,
                &info.virtual_workspace,
                &info.lifecycle,
                &info.view,
                bearer.as_deref(),
            ) {
                (Some(w), ClusterTarget::Name(c), None, None, None, Some(token))
                    if cluster_scoped && state.extension.is_none() =>
                {
                    match w.authenticate(c, token).await {
                        Ok(id) => Some(Arc::new(id)),
                        Err(why) => {
                            tracing::debug!(cluster = %c, reason = %why, "workspace authentication refused a token");
                            None
                        }
                    }
                }
                _ => None,
            };
            match admitted {
                Some(id) => Some(id),
                None => return error_response(&refusal),
            }
        }
    };
    // Impersonation is checked in the addressed workspace (the export's, for a virtual workspace).
    let scope = match (&info.virtual_workspace, &info.cluster) {
        (Some((c, e)), _) => crate::access::authz::Scope::VirtualWorkspace(c, e),
        (None, ClusterTarget::Name(c)) => crate::access::authz::Scope::Cluster(c),
        (None, ClusterTarget::Wildcard) => crate::access::authz::Scope::Wildcard,
    };
    note(record, |r| {
        r.user = identity.clone();
        if let ClusterTarget::Name(c) = &info.cluster {
            r.cluster = Some(c.clone());
        }
    });
    let identity = match identity {
        Some(id) => {
            match crate::access::authz::impersonate(
                &state.rbac,
                scope.cluster(),
                &id,
                &mut parts.headers,
            )
            .await
            {
                Ok(Some(other)) => {
                    let other = Arc::new(other);
                    note(record, |r| {
                        r.impersonator = Some(id);
                        r.user = Some(other.clone());
                    });
                    Some(other)
                }
                Ok(None) => Some(id),
                Err(e) => return error_response(&e),
            }
        }
        None => None,
    };
    // kcp's initializing and terminating virtual workspaces authorize by their own rules, and
    // address a workspace by its logical-cluster name only (a path is not resolved there).
    if let (Some((lifecycle, id)), Target::Resource(rr), Some(who)) =
        (&info.lifecycle, &info.target, &identity)
    {
        if requested != info.cluster {
            return error_response(&ApiError::path_not_found());
        }
        let body = match resource_body(&parts.method, body).await {
            Ok(b) => b,
            Err(e) => return error_response(&e),
        };
        note(record, |r| {
            r.set_resource(rr);
            r.body = Some(body.clone());
        });
        return crate::endpoints::lifecycle_vw::serve(
            crate::endpoints::lifecycle_vw::LifecycleCall {
                scope: state.resource_scope(),
                authorizer: state.authorizer(),
                lifecycle: *lifecycle,
                id,
                cluster: info.cluster.clone(),
                request: rr.clone(),
                query,
                headers: parts.headers,
                body,
                identity: who.clone(),
            },
        )
        .await;
    }
    // A workspace that is initializing or terminating is its initializers', terminators' and the
    // administrators' only (kcp's rule): its users wait for Ready.
    if let (Some(id), ClusterTarget::Name(c), None, None, None) = (
        identity.as_deref(),
        &info.cluster,
        &info.virtual_workspace,
        &info.lifecycle,
        info.view,
    ) {
        if cluster_scoped && !state.tenancy.is_ready(c) && !id.is_unscoped_admin() {
            return error_response(&ApiError::workspace_forbidden());
        }
    }
    // A logical cluster marked inactive refuses everyone, its administrators too, but on its
    // LogicalCluster (kcp's rule), where the mark is taken off again.
    if let (ClusterTarget::Name(c), None, None, None) = (
        &info.cluster,
        &info.virtual_workspace,
        &info.lifecycle,
        info.view,
    ) {
        let to_logical_cluster = matches!(&info.target, Target::Resource(rr)
            if rr.group == "core.kcp.io" && rr.resource == "logicalclusters");
        if cluster_scoped && !to_logical_cluster && state.tenancy.is_inactive(c) {
            // Only the administrators, who set the mark, are told why: to anyone else it is
            // a workspace they cannot reach, which says nothing of what exists.
            return error_response(&match identity.as_deref() {
                Some(id) if id.is_unscoped_admin() => ApiError::forbidden_object(
                    &crate::meta::status::GroupResource::new("core.kcp.io", "logicalclusters"),
                    c,
                    "logical cluster is marked inactive",
                ),
                _ => ApiError::workspace_forbidden(),
            });
        }
    }
    if let (Some(id), true, false) = (
        identity.as_deref(),
        cluster_scoped,
        matches!(info.target, Target::Resource(_)),
    ) {
        let verb = parts.method.as_str().to_ascii_lowercase();
        if let Err(e) = crate::access::authz::authorize_non_resource(
            state.authorizer(),
            scope,
            id,
            &verb,
            parts.uri.path(),
        )
        .await
        {
            return error_response(&e);
        }
    }
    // `/metrics` shows every tenant's request counts: RBAC on the non-resource URL in `root`,
    // as kube-apiserver's `system:monitoring` role grants it.
    if matches!(info.target, Target::Metrics) {
        let Some(id) = identity.as_deref() else {
            return error_response(&ApiError::unauthorized());
        };
        let verb = parts.method.as_str().to_ascii_lowercase();
        if let Err(e) = crate::access::authz::authorize_root_non_resource(
            &state.rbac,
            id,
            &verb,
            parts.uri.path(),
        )
        .await
        {
            return error_response(&e);
        }
    }
    // A virtual-workspace request is authorized before its export is looked up, so a missing
    // export and a forbidden one answer alike.
    if let (Some((export_cluster, export)), Some(id), Target::Resource(rr)) =
        (&info.virtual_workspace, identity.as_deref(), &info.target)
    {
        if let Err(e) = crate::access::authz::authorize_export_content(
            &state.rbac,
            id,
            export_cluster,
            export,
            rr.verb.as_str(),
        )
        .await
        {
            return error_response(&e);
        }
    }
    // Through an APIExport's virtual workspace a provider reaches only the workspaces bound to
    // that export; any other one answers as a workspace that does not exist.
    if let (Some((export_cluster, export)), ClusterTarget::Name(c)) =
        (&info.virtual_workspace, &info.cluster)
    {
        match crate::access::tenancy::is_bound(&state.tenancy, c, export_cluster, export).await {
            Ok(true) => {}
            Ok(false) => return error_response(&ApiError::workspace_forbidden()),
            Err(e) => return error_response(&e),
        }
    }
    // The API surface the request sees: its cluster's, or an APIExport's virtual workspace.
    let mut export_api = None;
    let mut claim = None;
    let view = match (&info.virtual_workspace, info.view) {
        (_, Some(kind)) => state.views.api(kind),
        (Some((export_cluster, export)), None) => {
            match crate::access::tenancy::export_view(&state.tenancy, export_cluster, export).await
            {
                Ok(api) => {
                    if let (Target::Resource(rr), Some(id)) = (&info.target, identity.as_deref()) {
                        match authorize_claim(
                            state,
                            &api,
                            export_cluster,
                            export,
                            &info.cluster,
                            rr,
                            id,
                        )
                        .await
                        {
                            Ok(c) => claim = c,
                            Err(e) => return error_response(&e),
                        }
                    }
                    let view = api.view.clone();
                    export_api = Some(api);
                    view
                }
                Err(e) => return error_response(&e),
            }
        }
        (None, None) => match &info.cluster {
            ClusterTarget::Name(c) => state.catalog.view(c),
            ClusterTarget::Wildcard => state.catalog.builtin_view(),
        },
    };
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match info.target {
        Target::Resource(rr) => {
            note(record, |r| r.set_resource(&rr));
            let body = match resource_body(&parts.method, body).await {
                Ok(b) => b,
                Err(e) => return error_response(&e),
            };
            note(record, |r| r.body = Some(body.clone()));
            if let Some(kind) = info.view {
                return serve_view(
                    state,
                    kind,
                    view,
                    info.cluster,
                    rr,
                    query,
                    parts.headers,
                    identity,
                )
                .await;
            }
            if crate::endpoints::reviews::is_review(&rr) {
                let Some(id) = identity.as_deref() else {
                    return error_response(&ApiError::unauthorized());
                };
                if let Err(e) = crate::request::negotiation::refuse_tables_only(accept.as_deref()) {
                    return error_response(&e);
                }
                return crate::endpoints::reviews::serve(
                    &state.rbac,
                    info.cluster.name(),
                    id,
                    &rr,
                    &body,
                )
                .await;
            }
            if let Some(id) = identity.as_deref() {
                if let Err(e) = crate::access::authz::authorize(&state.rbac, scope, id, &rr).await {
                    return error_response(&e);
                }
            }
            if crate::endpoints::reviews::is_special(&rr) && info.virtual_workspace.is_none() {
                if let Err(e) = crate::request::negotiation::refuse_tables_only(accept.as_deref()) {
                    return error_response(&e);
                }
                return crate::endpoints::reviews::serve_special(
                    &state.rbac,
                    &state.authn,
                    state.objects(),
                    info.cluster.name(),
                    &rr,
                    &body,
                )
                .await;
            }
            // Let into one workspace through an export, the write then runs with kcp's warrant.
            let identity = match (&info.virtual_workspace, &info.cluster, identity) {
                (Some(_), ClusterTarget::Name(c), Some(id)) => Some(Arc::new(Identity {
                    warrant: Some(c.clone()),
                    ..(*id).clone()
                })),
                (_, _, identity) => identity,
            };
            let call = ResourceCall {
                scope: state.resource_scope(),
                view,
                virtual_workspace: info.virtual_workspace.is_some(),
                export: export_api,
                claim,
                forced_selector: None,
                cluster: info.cluster,
                request: rr,
                query,
                headers: parts.headers,
                body,
                identity,
            };
            handlers::serve(call).await
        }
        Target::Admission(review) => {
            note(record, |r| {
                r.verb = "admit".to_string();
                r.resource = Some(request_info::ResourceRequest {
                    group: "admission.k8s.io".into(),
                    version: "v1".into(),
                    resource: "admissionreviews".into(),
                    namespace: None,
                    name: None,
                    subresource: None,
                    verb: request_info::Verb::Create,
                });
            });
            if parts.method != Method::POST {
                return error_response(&ApiError::method_not_allowed(
                    parts.method.as_str(),
                    &crate::meta::status::GroupResource::new(
                        "admission.k8s.io",
                        "admissionreviews",
                    ),
                ));
            }
            match read_body(body).await {
                Ok(b) => {
                    let reviewer = crate::endpoints::webhook::Reviewer {
                        catalog: state.catalog.clone(),
                        objects: state.objects.clone(),
                    };
                    crate::endpoints::webhook::serve(reviewer, review, &query, b).await
                }
                Err(e) => error_response(&e),
            }
        }
        other => {
            if parts.method != Method::GET && parts.method != Method::HEAD {
                return error_response(&ApiError::method_not_allowed(
                    parts.method.as_str(),
                    &crate::meta::status::GroupResource::new("", parts.uri.path()),
                ));
            }
            serve_non_resource(state, &view, other, accept.as_deref(), &query)
        }
    }
}

/// kcp's bound-API authorizer for a request through an APIExport's virtual workspace into one
/// workspace: the export's own resources pass; a claimed resource needs a claim the workspace
/// accepted whose verbs (the intersection of both sides') allow the verb; APIBindings are
/// readable and writable only through such a claim. Wildcard requests skip it (the claim label
/// filters what they see). Returns the claim that allowed the request.
async fn authorize_claim(
    state: &Arc<AppState>,
    api: &crate::registry::catalog::ExportApi,
    export_cluster: &str,
    export: &str,
    cluster: &ClusterTarget,
    rr: &request_info::ResourceRequest,
    identity: &crate::request::identity::Identity,
) -> Result<Option<crate::access::tenancy::claims::AcceptedClaim>, ApiError> {
    let ClusterTarget::Name(c) = cluster else {
        return Ok(None);
    };
    let Some(resource) = api
        .view
        .registry
        .lookup(&rr.group, &rr.version, &rr.resource)
    else {
        return Ok(None);
    };
    if api.selector_for(resource).is_none() {
        return Ok(None);
    }
    let claimed = crate::access::tenancy::claims::ClaimedResource::of(resource);
    let key = crate::access::tenancy::claims::claim_label_key(export_cluster, export);
    let verb = rr.verb.as_str();
    let claims = state.tenancy.claims_of(c).await;
    let accepted = claims
        .iter()
        .find(|a| a.key == key && a.claimed == claimed && a.allows(verb));
    if let Some(a) = accepted {
        return Ok(Some(a.clone()));
    }
    let bindings = claimed.group == "apis.kcp.io" && claimed.resource == "apibindings";
    if bindings && rr.verb.is_read_only() {
        return Ok(None);
    }
    // kcp's authorizer denies both a claimed resource without a fitting claim and a write to
    // APIBindings; its chain words the answer as a plain denial, and so does this one.
    Err(crate::access::authz::forbidden_in(
        identity,
        c,
        rr,
        "access denied",
    ))
}

/// Serves a resource request of one of Platform Mesh's virtual workspaces: read-only, for one
/// workspace, to a caller allowed to read what the view is computed from there.
#[allow(clippy::too_many_arguments)]
async fn serve_view(
    state: &Arc<AppState>,
    kind: crate::endpoints::views::ViewKind,
    view: Arc<crate::registry::catalog::ApiView>,
    cluster: ClusterTarget,
    rr: request_info::ResourceRequest,
    query: Query,
    headers: http::HeaderMap,
    identity: Option<Arc<crate::request::identity::Identity>>,
) -> Response<Body> {
    use request_info::Verb;
    let Some(id) = identity.as_deref() else {
        return error_response(&ApiError::unauthorized());
    };
    let ClusterTarget::Name(c) = &cluster else {
        return error_response(&ApiError::bad_request(format!(
            "the {} virtual workspace is computed for one workspace: name it (by name or path) instead of *",
            kind.as_str()
        )));
    };
    if !matches!(rr.verb, Verb::Get | Verb::List | Verb::Watch) {
        let gr = crate::meta::status::GroupResource::new(rr.group.clone(), rr.resource.clone());
        return error_response(&ApiError::method_not_allowed(rr.verb.as_str(), &gr));
    }
    // Reading a view takes `list` (or `watch`) on what it is computed from, in that workspace.
    let source = crate::endpoints::views::Views::source(kind);
    let needed = request_info::ResourceRequest {
        group: source.group.clone(),
        version: "v1alpha1".into(),
        resource: source.resource.clone(),
        namespace: None,
        name: None,
        subresource: None,
        verb: if rr.verb == Verb::Watch {
            Verb::Watch
        } else {
            Verb::List
        },
    };
    if let Err(e) = crate::access::authz::authorize(
        state.authorizer(),
        crate::access::authz::Scope::Cluster(c),
        id,
        &needed,
    )
    .await
    {
        return error_response(&e);
    }
    if let Err(e) = state.views.check(kind, c).await {
        return error_response(&e);
    }
    let Some(scope) = state
        .view_scopes
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, scope)| scope.clone())
    else {
        return error_response(&ApiError::path_not_found());
    };
    handlers::serve(ResourceCall {
        scope,
        view,
        virtual_workspace: false,
        export: None,
        claim: None,
        forced_selector: None,
        cluster,
        request: rr,
        query,
        headers,
        body: Bytes::new(),
        identity,
    })
    .await
}

/// How long a client may take to send a request body (a slow sender holds a request slot).
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How much of an oversized body is still read (and dropped) so the client, still sending, gets
/// its 413 instead of a reset connection.
const OVERSIZED_BODY_DRAIN: usize = 64 * 1024 * 1024;

/// The body of a resource request: read for the methods that carry one, empty for reads.
async fn resource_body(method: &Method, body: Incoming) -> Result<Bytes, ApiError> {
    match *method {
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE => read_body(body).await,
        _ => Ok(Bytes::new()),
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
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

fn serve_non_resource(
    state: &AppState,
    view: &crate::registry::catalog::ApiView,
    target: Target,
    accept: Option<&str>,
    query: &Query,
) -> Response<Body> {
    let docs = view.discovery();
    match target {
        Target::CoreRoot => match aggregated_discovery_version(accept) {
            Some("v2") => discovery_response(docs.core_v2.clone(), "v2"),
            Some(_) => discovery_response(docs.core_v2beta1.clone(), "v2beta1"),
            None => json_response(
                StatusCode::OK,
                &discovery::core_versions(&state.advertise_address),
            ),
        },
        Target::GroupList => match aggregated_discovery_version(accept) {
            Some("v2") => discovery_response(docs.apis_v2.clone(), "v2"),
            Some(_) => discovery_response(docs.apis_v2beta1.clone(), "v2beta1"),
            None => bytes_response(StatusCode::OK, "application/json", docs.group_list.clone()),
        },
        Target::Group(g) => match discovery::group(&view.registry, &g) {
            Some(v) => json_response(StatusCode::OK, &v),
            None => error_response(&ApiError::path_not_found()),
        },
        Target::ResourceList { group, version } => {
            match discovery::resource_list(&view.registry, &group, &version) {
                Some(v) => json_response(StatusCode::OK, &v),
                None => error_response(&ApiError::path_not_found()),
            }
        }
        Target::OpenApiV3Root => {
            bytes_response(StatusCode::OK, "application/json", view.openapi().root())
        }
        Target::OpenApiV3Group { group, version } => {
            match view.openapi().document(&group, &version) {
                Some((doc, hash)) => {
                    let mut r = bytes_response(StatusCode::OK, "application/json", doc);
                    if let Ok(v) = HeaderValue::from_str(&format!("\"{hash}\"")) {
                        r.headers_mut().insert(header::ETAG, v);
                    }
                    if query.get("hash") == Some(hash) {
                        r.headers_mut().insert(
                            header::CACHE_CONTROL,
                            HeaderValue::from_static("public, immutable"),
                        );
                    }
                    r
                }
                None => error_response(&ApiError::path_not_found()),
            }
        }
        Target::OpenApiV2 => {
            let wants_proto = accept.is_some_and(|a| a.contains("protobuf"));
            if wants_proto {
                bytes_response(
                    StatusCode::OK,
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                    view.openapi().v2_protobuf(),
                )
            } else {
                bytes_response(StatusCode::OK, "application/json", view.openapi().v2_json())
            }
        }
        Target::Version => json_response(StatusCode::OK, &version_info()),
        Target::Health { endpoint, check } => health(&endpoint, check.as_deref(), query),
        Target::Metrics => bytes_response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            Bytes::from(state.metrics.render()),
        ),
        Target::Resource(_) | Target::Admission(_) | Target::Unknown => {
            error_response(&ApiError::path_not_found())
        }
    }
}

/// What `/version` says of the build: stamped by the binary at start ([`set_build`]), as a
/// library cannot know the commit of the program it is linked into.
#[derive(Clone, Debug, Default)]
pub struct Build {
    /// The full git commit.
    pub commit: &'static str,
    /// `clean`, or `dirty` when the tree had changes to tracked files.
    pub tree_state: &'static str,
    /// RFC 3339, UTC.
    pub date: &'static str,
}

static BUILD: std::sync::OnceLock<Build> = std::sync::OnceLock::new();

/// Records the build `/version` reports (the first call wins; a process has one build).
pub fn set_build(build: Build) {
    let _ = BUILD.set(build);
}

/// `/version`.
pub fn version_info() -> Value {
    let build = BUILD.get().cloned().unwrap_or_default();
    let minor = KUBE_VERSION
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .unwrap_or("33");
    json!({
        "major": "1",
        "minor": minor,
        "gitVersion": format!("{KUBE_VERSION}+platform-mesh-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": build.commit,
        "gitTreeState": if build.tree_state.is_empty() { "clean" } else { build.tree_state },
        "buildDate": if build.date.is_empty() { "1970-01-01T00:00:00Z" } else { build.date },
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

const HEALTH_CHECKS: &[&str] = &["ping", "storage"];

fn health(endpoint: &str, check: Option<&str>, query: &Query) -> Response<Body> {
    if let Some(c) = check {
        return if HEALTH_CHECKS.contains(&c) {
            text_response(StatusCode::OK, "ok".into())
        } else {
            error_response(&ApiError::path_not_found())
        };
    }
    if query.get("verbose").is_some() {
        let mut out = String::new();
        for c in HEALTH_CHECKS {
            out.push_str(&format!("[+]{c} ok\n"));
        }
        out.push_str(&format!("{endpoint} check passed\n"));
        text_response(StatusCode::OK, out)
    } else {
        text_response(StatusCode::OK, "ok".into())
    }
}

fn discovery_response(body: Bytes, version: &str) -> Response<Body> {
    let mut r = bytes_response(StatusCode::OK, "application/json", body);
    if let Ok(v) = HeaderValue::from_str(&discovery::aggregated_content_type(version)) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
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
