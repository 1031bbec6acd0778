//! Workspace readiness, kcp's rules for requests straight into a workspace: one that is still
//! initializing or already terminating is its initializers', terminators' and the
//! administrators' only (its users wait for Ready); one marked inactive refuses everyone, its
//! administrators too, but on its LogicalCluster, where the mark is taken off again. The
//! lifecycle virtual workspaces are how initializers and terminators reach them.

use std::sync::Arc;

use http::Response;

use crate::access::tenancy::Tenancy;
use crate::endpoints::exchange::{Exchange, Handler};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::{ApiError, GroupResource};
use crate::request::request_info::{ClusterTarget, Target};

/// Refuses requests into workspaces that are not open to their users.
pub struct WorkspaceReadiness<N> {
    /// The workspace tree, with each workspace's phase.
    pub tenancy: Arc<Tenancy>,
    /// The rest of the chain.
    pub next: N,
}

impl<N: Handler> Handler for WorkspaceReadiness<N> {
    async fn handle(&self, x: Box<Exchange>) -> Response<Body> {
        if let (ClusterTarget::Name(c), true, true) =
            (&x.info.cluster, x.is_direct(), x.cluster_scoped())
        {
            let admin = x.user.as_deref().is_some_and(|id| id.is_unscoped_admin());
            if x.user.is_some() && !admin && !self.tenancy.is_ready(c) {
                return error_response(&ApiError::workspace_forbidden());
            }
            let to_logical_cluster = matches!(&x.info.target, Target::Resource(rr)
                if rr.group == "core.kcp.io" && rr.resource == "logicalclusters");
            if !to_logical_cluster && self.tenancy.is_inactive(c) {
                // Only the administrators, who set the mark, are told why: to anyone else it
                // is a workspace they cannot reach, which says nothing of what exists.
                return error_response(&if admin {
                    ApiError::forbidden_object(
                        &GroupResource::new("core.kcp.io", "logicalclusters"),
                        c,
                        "logical cluster is marked inactive",
                    )
                } else {
                    ApiError::workspace_forbidden()
                });
            }
        }
        self.next.handle(x).await
    }
}
