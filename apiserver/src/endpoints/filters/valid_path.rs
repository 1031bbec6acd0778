//! A path the server cannot read (a bad name, a malformed `/clusters/` prefix) is answered
//! before its credentials are looked at: its error says what is wrong with the path.

use http::Response;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;

/// Answers requests whose path did not parse.
pub struct ValidPath<N> {
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for ValidPath<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        match &x.malformed {
            Some(e) => error_response(e),
            None => self.next.handle(x).await,
        }
    }
}
