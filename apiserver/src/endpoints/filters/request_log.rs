//! The outermost filter: each request's span and log line, its metrics, and the `Audit-Id`
//! header of its answer.

use std::sync::Arc;

use http::{HeaderValue, Response};

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::metrics::Metrics;

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
        let method = x.parts.method.clone();
        let started = x.started;
        let record = x.record.clone();
        let audit_id = x.audit_id.clone();
        let mut response = tracing::Instrument::instrument(self.next.handle(x), span.clone()).await;
        let record = record.lock().unwrap_or_else(|p| p.into_inner());
        let resource = record.resource_label();
        let verb = record.verb_or(&method);
        let code = response.status().as_u16();
        self.metrics
            .observe(&verb, &resource, code, started.elapsed().as_secs_f64());
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
