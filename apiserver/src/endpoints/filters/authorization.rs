//! Authorization of non-resource paths (discovery, OpenAPI, `/metrics`) by RBAC's
//! `nonResourceURLs`. Resource requests are authorized where they are served: a workspace's by
//! its RBAC, a virtual workspace's by that workspace's own rules (kcp's virtual workspaces each
//! bring their authorizer), the access reviews not at all (anyone may ask about themselves).

use std::sync::Arc;

use http::Response;

use crate::access::authz::{self, Authorizer, Rbac};
use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;
use crate::request::request_info::Target;

/// Refuses non-resource requests the caller may not make.
pub struct Authorization<N> {
    /// Who decides in a workspace: its RBAC, or the fronted kcp in extension mode.
    pub authorizer: Arc<dyn Authorizer>,
    /// RBAC of `root`, which decides who reads `/metrics`.
    pub rbac: Rbac,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for Authorization<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        let path = x.parts.uri.path();
        // Only non-resource requests need the verb (most requests are resource requests).
        let verb = || x.parts.method.as_str().to_ascii_lowercase();
        if let (Some(id), true, false) = (
            x.user.as_deref(),
            x.cluster_scoped(),
            matches!(x.info.target, Target::Resource(_)),
        ) {
            if let Err(e) = Box::pin(authz::authorize_non_resource(
                self.authorizer.as_ref(),
                x.scope(),
                id,
                &verb(),
                path,
            ))
            .await
            {
                return error_response(&e);
            }
        }
        // `/metrics` shows every tenant's request counts: RBAC on the non-resource URL in
        // `root`, as kube-apiserver's `system:monitoring` role grants it.
        if matches!(x.info.target, Target::Metrics) {
            let Some(id) = x.user.as_deref() else {
                return error_response(&ApiError::unauthorized());
            };
            if let Err(e) = Box::pin(authz::authorize_root_non_resource(
                &self.rbac,
                id,
                &verb(),
                path,
            ))
            .await
            {
                return error_response(&e);
            }
        }
        self.next.handle(x).await
    }
}
