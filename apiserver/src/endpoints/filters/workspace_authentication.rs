//! kcp's per-workspace authentication: a bearer token the server's authenticators refused is
//! tried against the issuers the addressed workspace trusts (its WorkspaceAuthenticationConfigurations);
//! if they refuse it too, the first refusal is the answer.

use std::sync::Arc;

use http::Response;

use crate::access::workspace_authn::WorkspaceAuthn;
use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::request::request_info::ClusterTarget;

/// Admits a kept refusal when the workspace's issuers accept the token.
pub struct WorkspaceAuthentication<N> {
    /// The workspaces' issuers; `None` when the feature is off (and in extension mode).
    pub issuers: Option<Arc<WorkspaceAuthn>>,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for WorkspaceAuthentication<N> {
    async fn handle(&self, mut x: Box<Exchange>) -> Response<Body> {
        if let Some(refusal) = x.refused.take() {
            let admitted = match (&self.issuers, &x.info.cluster) {
                (Some(issuers), ClusterTarget::Name(c)) if x.cluster_scoped() && x.is_direct() => {
                    match Box::pin(issuers.authenticate(c, &refusal.token)).await {
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
                Some(id) => x.user = Some(id),
                None => return error_response(&refusal.error),
            }
        }
        // Who and where are known from here on.
        x.note(|r| {
            r.user = x.user.clone();
            if let ClusterTarget::Name(c) = &x.info.cluster {
                r.cluster = Some(c.clone());
            }
        });
        self.next.handle(x).await
    }
}
