//! The request timeout: a short request not answered within `--request-timeout` is answered
//! 504, as kube-apiserver's timeout filter does; watches end by their own timeout.

use http::Response;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;

/// Answers 504 when a short request takes longer than `timeout`.
pub struct Timeout<N> {
    /// `--request-timeout`.
    pub timeout: std::time::Duration,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for Timeout<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        if x.long_running {
            return self.next.handle(x).await;
        }
        match tokio::time::timeout(self.timeout, self.next.handle(x)).await {
            Ok(response) => response,
            Err(_) => error_response(&ApiError::timeout(
                "the request did not complete within the allowed duration",
            )),
        }
    }
}
