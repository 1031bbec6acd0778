//! Cluster resolution: the logical cluster a request addresses, from a `/clusters/<name>`
//! prefix that may be a workspace path (`root:org:team`), resolved through the server's
//! workspace tree or, in extension mode, through the kcp the server fronts.

use std::sync::Arc;

use http::Response;

use crate::access::tenancy::Tenancy;
use crate::endpoints::exchange::{Exchange, Handler};
use crate::endpoints::views::Extension;
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;
use crate::request::request_info::{ClusterTarget, Target};

/// Where workspace paths are resolved.
pub enum Resolver {
    /// The server's own workspaces.
    Tenancy(Arc<Tenancy>),
    /// Extension mode: the upstream kcp's. The server then serves its views (and its health,
    /// version and metrics) and nothing of its own.
    Upstream(Arc<Extension>),
}

/// Replaces the exchange's cluster by the logical cluster it names.
pub struct ClusterResolution<N> {
    /// Where paths are resolved.
    pub resolver: Resolver,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for ClusterResolution<N> {
    async fn handle(&self, mut x: Box<Exchange>) -> Response<Body> {
        if let Resolver::Upstream(_) = self.resolver {
            let own = matches!(
                x.info.target,
                Target::Health { .. } | Target::Version | Target::Metrics
            );
            if !own && x.info.view.is_none() {
                return error_response(&ApiError::path_not_found());
            }
        }
        if x.cluster_scoped() {
            let target = std::mem::replace(&mut x.info.cluster, ClusterTarget::Wildcard);
            let resolved = match (&self.resolver, target) {
                (Resolver::Upstream(kcp), ClusterTarget::Name(c)) => {
                    Box::pin(kcp.resolve(&c)).await.map(ClusterTarget::Name)
                }
                (Resolver::Upstream(_), target) => Ok(target),
                (Resolver::Tenancy(tenancy), target) => tenancy.resolve(target),
            };
            match resolved {
                Ok(cluster) => x.info.cluster = cluster,
                // A request with a refused token stays 401 whatever its path names.
                Err(e) => return error_response(x.refused.as_ref().map_or(&e, |r| &r.error)),
            }
        }
        self.next.handle(x).await
    }
}
