//! The in-flight limit: beyond `--max-requests-inflight` short requests at once the server
//! answers 429, as kube-apiserver's max-in-flight filter. Watches are long-running and probes
//! must answer under load: neither takes a slot.

use std::sync::Arc;

use http::Response;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;

/// Holds a slot for each short request until its answer is sent.
pub struct MaxInFlight<N> {
    /// The slots.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for MaxInFlight<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        if x.long_running || x.is_probe() {
            return self.next.handle(x).await;
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return error_response(&ApiError::too_many_requests(1));
        };
        // The slot goes with the body: a large answer still being written holds it.
        self.next.handle(x).await.map(|body| body.holding(slot))
    }
}
