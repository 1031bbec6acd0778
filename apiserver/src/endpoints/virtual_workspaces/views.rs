//! Platform Mesh's virtual workspaces, `/services/marketplace/clusters/<name|path>/...` and
//! `/services/contentconfigurations/...`: read-only, computed for one workspace (see
//! [`crate::endpoints::views`]), to a caller allowed to read what the view is computed from
//! there. Served over the server's own workspaces, or in extension mode over the kcp it fronts.

use std::sync::Arc;

use futures::future::BoxFuture;
use http::Response;

use crate::access::authz::{self, Authorizer};
use crate::endpoints::exchange::{Exchange, ResourceExchange};
use crate::endpoints::handlers::{self, ResourceCall, ResourceScope, TypeLookup};
use crate::endpoints::nonresource::NonResource;
use crate::endpoints::views::{ViewKind, Views};
use crate::endpoints::virtual_workspaces::VirtualWorkspace;
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::{ApiError, GroupResource};
use crate::request::request_info::{ClusterTarget, RequestInfo, ResourceRequest, Target, Verb};

/// The marketplace and contentconfigurations virtual workspaces.
pub struct ViewsVirtualWorkspace {
    /// What the views are computed from, and their API surfaces.
    pub views: Arc<Views>,
    /// The read-only handlers' scope of each view: its computed store, no strategies, no
    /// admission.
    pub scopes: Vec<(ViewKind, ResourceScope)>,
    /// Who decides whether the caller may read the view's sources: the server's RBAC, or in
    /// extension mode the kcp it fronts.
    pub authorizer: Arc<dyn Authorizer>,
    /// Discovery and OpenAPI of the views.
    pub nonresource: Arc<NonResource>,
}

impl VirtualWorkspace for ViewsVirtualWorkspace {
    fn matches(&self, info: &RequestInfo) -> bool {
        info.view.is_some()
    }

    fn serve(&self, x: Box<Exchange>) -> BoxFuture<'_, Response<Body>> {
        Box::pin(async move {
            self.serve_inner(x)
                .await
                .unwrap_or_else(|e| error_response(&e))
        })
    }
}

impl ViewsVirtualWorkspace {
    async fn serve_inner(&self, x: Box<Exchange>) -> Result<Response<Body>, ApiError> {
        let Some(kind) = x.info.view else {
            return Err(ApiError::path_not_found());
        };
        let view = self.views.api(kind);
        if !matches!(x.info.target, Target::Resource(_)) {
            return Ok(self.nonresource.serve(&view, &x));
        }
        // The body is read (a client still sending gets its answer) but a view takes none.
        let ResourceExchange {
            request: rr,
            parts,
            query,
            cluster,
            user,
            served,
            ..
        } = x.into_resource().await?;
        let Some(id) = user.as_deref() else {
            return Err(ApiError::unauthorized());
        };
        let ClusterTarget::Name(c) = &cluster else {
            return Err(ApiError::bad_request(format!(
                "the {} virtual workspace is computed for one workspace: name it (by name or path) instead of *",
                kind.as_str()
            )));
        };
        if !matches!(rr.verb, Verb::Get | Verb::List | Verb::Watch) {
            let gr = GroupResource::new(rr.group.clone(), rr.resource.clone());
            return Err(ApiError::method_not_allowed(rr.verb.as_str(), &gr));
        }
        // Reading a view takes `list` (or `watch`) on what it is computed from, in that
        // workspace.
        let source = Views::source(kind);
        let needed = ResourceRequest {
            group: source.group.clone(),
            version: "v1alpha1".into(),
            resource: source.resource.clone(),
            namespace: None,
            name: None,
            subresource: None,
            verb: if rr.verb == Verb::Watch {
                Verb::Watch
            } else {
                Verb::List
            },
        };
        authz::authorize(
            self.authorizer.as_ref(),
            authz::Scope::Cluster(c),
            id,
            &needed,
        )
        .await?;
        self.views.check(kind, c).await?;
        let Some(scope) = self
            .scopes
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, scope)| scope.clone())
        else {
            return Err(ApiError::path_not_found());
        };
        Ok(handlers::serve(ResourceCall {
            scope,
            view,
            types: TypeLookup::Workspaces,
            visibility: None,
            cluster,
            request: rr,
            query,
            headers: parts.headers,
            body: bytes::Bytes::new(),
            identity: user,
            served,
        })
        .await)
    }
}
