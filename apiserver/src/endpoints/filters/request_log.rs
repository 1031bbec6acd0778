//! The outermost filter: each request's span and log line, its metrics, and the `Audit-Id`
//! header of its answer.

use std::sync::Arc;

use http::{HeaderValue, Response};

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::metrics::{Metrics, RequestLabels};
use crate::request::query::Query;
use crate::request::request_info::{ResourceRequest, Target, Verb};

/// The log target of the one line (and span) per request: kube-apiserver writes its request
/// lines from verbosity 3, and the binary's `-v` turns this target on there.
pub const REQUESTS_TARGET: &str = "apiserver::requests";

/// Logs, counts and times every request.
pub struct RequestLog<N> {
    /// The request counters and latency histograms.
    pub metrics: Arc<Metrics>,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for RequestLog<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        let span = tracing::info_span!(
            target: REQUESTS_TARGET,
            "request",
            id = %x.audit_id,
            method = %x.parts.method,
            path = %x.parts.uri.path(),
            cluster = tracing::field::Empty,
            user = tracing::field::Empty,
            verb = tracing::field::Empty,
            resource = tracing::field::Empty,
            name = tracing::field::Empty,
            code = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
        );
        let quiet = x.is_probe() && !x.long_running;
        let long_running = x.long_running;
        let served = x.served.clone();
        let nonresource = nonresource_labels(&x.info.target);
        let apply = x
            .parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/apply-patch"));
        let dry_run = dry_run_label(&x.query);
        let method = x.parts.method.clone();
        let started = x.started;
        let record = x.record.clone();
        let audit_id = x.audit_id.clone();
        let mut response = tracing::Instrument::instrument(self.next.handle(x), span.clone()).await;
        let record = record.lock().unwrap_or_else(|p| p.into_inner());
        let resource = record.resource_label();
        let verb = record.verb_or(&method);
        let code = response.status().as_u16();
        let labels = match &record.resource {
            Some(rr) if served.is_marked() => Some(resource_labels(rr, apply, dry_run)),
            Some(_) => None,
            None => nonresource,
        };
        if let Some(labels) = labels {
            let seconds = started.elapsed().as_secs_f64();
            self.metrics.observe(labels, code, seconds, long_running);
        }
        span.record("verb", verb.as_str());
        span.record("resource", resource.as_str());
        span.record("code", code);
        span.record("latency_ms", started.elapsed().as_millis() as u64);
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
        // metrics scrapes at debug, as they come every few seconds); a watch's line is written
        // when it starts. Its span is off too below `-v 3`, so recording the fields above costs
        // nothing.
        span.in_scope(|| {
            if quiet {
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
}

/// kube-apiserver's labels of a request for a served type: its route's verb (a create is
/// `POST`, a server-side apply `APPLY`, a collection's deletion `DELETE`) and scope (one object or
/// a create is `resource`; a collection in a namespace `namespace`; else `cluster`).
fn resource_labels(rr: &ResourceRequest, apply: bool, dry_run: &'static str) -> RequestLabels {
    let verb = match rr.verb {
        Verb::Get => "GET",
        Verb::List => "LIST",
        Verb::Watch => "WATCH",
        Verb::Create => "POST",
        Verb::Update => "PUT",
        Verb::Patch if apply => "APPLY",
        Verb::Patch => "PATCH",
        Verb::Delete | Verb::DeleteCollection => "DELETE",
    };
    let scope = if rr.name.is_some() || rr.verb == Verb::Create {
        "resource"
    } else if rr.namespace.is_some() {
        "namespace"
    } else {
        "cluster"
    };
    RequestLabels {
        verb,
        dry_run,
        group: rr.group.clone(),
        version: rr.version.clone(),
        resource: rr.resource.clone(),
        subresource: rr.subresource.clone().unwrap_or_default(),
        scope,
        component: "apiserver",
    }
}

/// kube-apiserver's labels of the non-resource paths it counts: the discovery roots, the
/// health endpoints and OpenAPI v3, each under a fixed name. The others (version, OpenAPI v2,
/// a group's discovery, `/metrics`) it does not count, and neither does this server.
fn nonresource_labels(target: &Target) -> Option<RequestLabels> {
    let (subresource, component) = match target {
        Target::CoreRoot => ("api", "apiserver"),
        Target::GroupList => ("apis", "apiserver"),
        Target::Health { endpoint, .. } => match endpoint.as_str() {
            "healthz" => ("/healthz", ""),
            "livez" => ("/livez", ""),
            "readyz" => ("/readyz", ""),
            _ => return None,
        },
        Target::OpenApiV3Root | Target::OpenApiV3Group { .. } => ("openapi/v3/", ""),
        _ => return None,
    };
    Some(RequestLabels {
        verb: "GET",
        subresource: subresource.to_string(),
        component,
        ..RequestLabels::default()
    })
}

/// kube-apiserver's `dry_run` label: empty without `dryRun`, `All` for a valid one, `invalid`
/// for any other value.
fn dry_run_label(query: &Query) -> &'static str {
    let values = query.dry_run_values();
    if values.is_empty() {
        ""
    } else if values.iter().all(|v| v == "All") {
        "All"
    } else {
        "invalid"
    }
}
