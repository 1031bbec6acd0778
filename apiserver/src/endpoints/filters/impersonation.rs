//! Impersonation: `Impersonate-User`, `-Group`, `-Uid` and `-Extra-*` headers, each authorized
//! by RBAC in the addressed workspace (the export's, for an APIExport's virtual workspace), as
//! kube-apiserver's impersonation filter. The request then acts as the impersonated user; the
//! audit events name both.

use std::sync::Arc;

use http::Response;

use crate::access::authz::{self, Rbac};
use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;

/// Replaces the exchange's user by the one it may impersonate.
pub struct Impersonation<N> {
    /// RBAC of the server's workspaces.
    pub rbac: Rbac,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for Impersonation<N> {
    async fn handle(&self, mut x: Box<Exchange>) -> Response<Body> {
        let asks = x
            .parts
            .headers
            .keys()
            .any(|k| k.as_str().starts_with("impersonate-"));
        if let (Some(id), true) = (x.user.clone(), asks) {
            let cluster = x.scope().cluster().map(str::to_string);
            // Boxed: most requests impersonate no one, and the filter's future stays small.
            let impersonated = Box::pin(authz::impersonate(
                &self.rbac,
                cluster.as_deref(),
                &id,
                &mut x.parts.headers,
            ))
            .await;
            match impersonated {
                Ok(Some(other)) => {
                    let other = Arc::new(other);
                    x.note(|r| {
                        r.impersonator = Some(id);
                        r.user = Some(other.clone());
                    });
                    x.user = Some(other);
                }
                Ok(None) => {}
                Err(e) => return error_response(&e),
            }
        }
        self.next.handle(x).await
    }
}
