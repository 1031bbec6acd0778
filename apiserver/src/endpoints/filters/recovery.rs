//! Panic recovery: a panic while serving a request becomes a 500 Status for that request alone,
//! and is logged and recorded for the audit events.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use http::Response;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;

/// Catches what the rest of the chain panics with.
pub struct Recovery<N> {
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for Recovery<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        let record = x.record.clone();
        match AssertUnwindSafe(self.next.handle(x)).catch_unwind().await {
            Ok(response) => response,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "handler panicked");
                record.lock().unwrap_or_else(|p| p.into_inner()).panicked = Some(what);
                error_response(&ApiError::internal(
                    "an internal error occurred while serving the request",
                ))
            }
        }
    }
}
