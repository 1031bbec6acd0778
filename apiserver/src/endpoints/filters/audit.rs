//! Auditing, as kube-apiserver's audit filter: the policy decides from the authenticated user
//! (not the impersonated one), the verb and the resource or path (without its `/clusters/<name>`
//! prefix); the events carry the logical cluster as kcp's annotations. A watch gets
//! `ResponseStarted` when it starts and `ResponseComplete` when its stream ends. Events are
//! written before the response goes (kube's blocking mode).

use std::sync::Arc;

use http::{header, Method, Response};
use serde_json::Value;

use crate::endpoints::exchange::{Exchange, Handler, RemoteAddr, RequestRecord};
use crate::endpoints::views::WorkspacePaths;
use crate::meta::audit::{
    Attributes, Audit, EventBuilder, Level, ResourceAttributes, Target as AuditTarget, UserInfo,
};
use crate::meta::body::Body;
use crate::request::identity::Identity;

/// Writes the audit events of every request, when auditing is on.
pub struct Auditing<N> {
    /// The policy and the log; `None` when auditing is off.
    pub audit: Option<Arc<Audit>>,
    /// The workspace path of a logical cluster, for the events' annotations.
    pub paths: Arc<dyn WorkspacePaths>,
    /// The rest of the chain.
    pub next: N,
}

/// What audit events say about a request beyond what the inner filters record.
struct Received {
    /// The path with the query, as the client sent it.
    uri: String,
    /// The path alone.
    path: String,
    user_agent: String,
    /// The connection's remote address.
    source: Option<String>,
    at: time::OffsetDateTime,
    id: String,
    method: Method,
    long_running: bool,
}

impl<N: Handler> Handler for Auditing<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        let Some(audit) = &self.audit else {
            return self.next.handle(x).await;
        };
        let uri = &x.parts.uri;
        let received = Received {
            uri: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
            path: uri.path().to_string(),
            user_agent: x
                .parts
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            source: x
                .parts
                .extensions
                .get::<RemoteAddr>()
                .map(|a| a.0.ip().to_string()),
            at: time::OffsetDateTime::now_utc(),
            id: x.audit_id.clone(),
            method: x.parts.method.clone(),
            long_running: x.long_running,
        };
        let record = x.record.clone();
        let response = self.next.handle(x).await;
        // A copy: the lock is not held while the events are written.
        let record = record.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(write_events(
            audit,
            self.paths.as_ref(),
            &record,
            received,
            response,
        ))
        .await
    }
}

fn user_info(id: &Identity) -> UserInfo {
    UserInfo {
        username: id.user.clone(),
        uid: id.uid.clone(),
        groups: id.groups.clone(),
        extra: id.extra.clone(),
    }
}

/// Writes the events of one answered request and returns its response (a watch's with the
/// `ResponseComplete` event bound to the end of its stream).
async fn write_events(
    audit: &Audit,
    paths: &dyn WorkspacePaths,
    record: &RequestRecord,
    request: Received,
    response: Response<Body>,
) -> Response<Body> {
    let authenticated = record.impersonator.as_ref().or(record.user.as_ref());
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
            path: without_cluster_prefix(&request.path).to_string(),
        },
    };
    let attributes = Attributes {
        user: authenticated.map(|u| u.user.clone()).unwrap_or_default(),
        groups: authenticated.map(|u| u.groups.clone()).unwrap_or_default(),
        verb: record.verb_or(&request.method),
        target,
    };
    let decision = audit.policy.decide(&attributes);
    if decision.level == Level::None {
        return response;
    }
    let mut events = EventBuilder::new(decision, &attributes, &request.id, request.uri)
        .received_at(request.at)
        .source_ips(request.source.into_iter().collect())
        .user_agent(request.user_agent);
    if let Some(user) = authenticated {
        events = events.user(user_info(user));
    }
    if let (Some(_), Some(acting)) = (&record.impersonator, &record.user) {
        events.set_impersonated_user(user_info(acting));
    }
    if let Some(cluster) = &record.cluster {
        let path = paths.path_of(cluster).unwrap_or_default();
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
    if let Some(message) = &record.panicked {
        if let Some(event) = events.panicked(message) {
            audit.writer.send(event).await;
        }
        return response;
    }
    if request.long_running && code == 200 {
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
