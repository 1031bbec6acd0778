//! A workspace's own API: the resource requests of `/clusters/<name>/...` (and of `/clusters/*`
//! across every workspace), each authorized by the workspace's RBAC and served by the generic
//! handlers; the access reviews, token reviews and TokenRequests, which have handlers of their
//! own; and the workspace's discovery and OpenAPI. An APIExport's virtual workspace serves its
//! resource requests through here too, with the export's view of the workspace.

use std::sync::Arc;

use http::Response;

use crate::access::authn::Authn;
use crate::access::authz::{self, Rbac};
use crate::endpoints::exchange::{Exchange, ResourceExchange};
use crate::endpoints::handlers::{self, ResourceCall, ResourceScope, TypeLookup, Visibility};
use crate::endpoints::nonresource::NonResource;
use crate::endpoints::reviews;
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;
use crate::registry::catalog::ApiView;
use crate::request::identity::Identity;
use crate::request::negotiation::refuse_tables_only;
use crate::request::request_info::{ClusterTarget, Target};
use crate::storage::Store;

/// Serves the workspaces' own APIs.
pub struct Workspaces {
    /// The handles of the resource handlers.
    pub scope: ResourceScope,
    /// RBAC of the server's workspaces.
    pub rbac: Rbac,
    /// The authenticators, which TokenReviews ask.
    pub authn: Arc<Authn>,
    /// The store ServiceAccounts and their tokens are read from.
    pub store: Arc<dyn Store>,
    /// Discovery, OpenAPI and the other non-resource paths.
    pub nonresource: Arc<NonResource>,
}

/// How a resource request reaches a workspace's objects.
pub struct Route {
    /// The API the request sees.
    pub view: Arc<ApiView>,
    /// Where its type is looked up.
    pub types: TypeLookup,
    /// Which objects it sees; `None` for all.
    pub visibility: Option<Arc<dyn Visibility>>,
    /// The scope of the handlers, when a virtual workspace adds admission of its own.
    pub scope: Option<ResourceScope>,
    /// Through an APIExport's virtual workspace: no TokenRequests or TokenReviews there, and
    /// a request let into one workspace writes with kcp's warrant for it.
    pub through_export: bool,
}

impl Workspaces {
    /// The API of the request's cluster (the built-in types for `/clusters/*`).
    pub fn view(&self, cluster: &ClusterTarget) -> Arc<ApiView> {
        match cluster {
            ClusterTarget::Name(c) => self.scope.catalog.view(c),
            ClusterTarget::Wildcard => self.scope.catalog.builtin_view(),
        }
    }

    /// Serves a request straight into a workspace.
    pub async fn serve(&self, x: Box<Exchange>) -> Response<Body> {
        let view = self.view(&x.info.cluster);
        match x.info.target {
            Target::Resource(_) => {
                let route = Route {
                    view,
                    types: TypeLookup::Workspaces,
                    visibility: None,
                    scope: None,
                    through_export: false,
                };
                self.serve_resource(x, route)
                    .await
                    .unwrap_or_else(|e| error_response(&e))
            }
            _ => self.nonresource.serve(&view, &x),
        }
    }

    /// Serves a resource request into a workspace the way `route` says.
    pub async fn serve_resource(
        &self,
        x: Box<Exchange>,
        route: Route,
    ) -> Result<Response<Body>, ApiError> {
        let r = x.into_resource().await?;
        let target = r.cluster.name();
        if reviews::is_review(&r.request) {
            let Some(id) = r.user.as_deref() else {
                return Err(ApiError::unauthorized());
            };
            refuse_tables_only(r.accept())?;
            r.served.mark();
            return Ok(reviews::serve(&self.rbac, target, id, &r.request, &r.body).await);
        }
        if let Some(id) = r.user.as_deref() {
            authz::authorize(&self.rbac, r.scope(), id, &r.request).await?;
        }
        if reviews::is_special(&r.request) && !route.through_export {
            refuse_tables_only(r.accept())?;
            let objects = crate::access::serviceaccounts::Objects {
                store: self.store.as_ref(),
                catalog: &self.scope.catalog,
            };
            r.served.mark();
            return Ok(reviews::serve_special(
                &self.rbac,
                &self.authn,
                objects,
                target,
                &r.request,
                &r.body,
            )
            .await);
        }
        let ResourceExchange {
            request: rr,
            body,
            parts,
            query,
            cluster,
            user,
            served,
            ..
        } = r;
        // Let into one workspace through an export, the write then runs with kcp's warrant.
        let identity = match (route.through_export, &cluster, user) {
            (true, ClusterTarget::Name(c), Some(id)) => Some(Arc::new(Identity {
                warrant: Some(c.clone()),
                ..(*id).clone()
            })),
            (_, _, identity) => identity,
        };
        Ok(handlers::serve(ResourceCall {
            scope: route.scope.unwrap_or_else(|| self.scope.clone()),
            view: route.view,
            types: route.types,
            visibility: route.visibility,
            cluster,
            request: rr,
            query,
            headers: parts.headers,
            body,
            identity,
            served,
        })
        .await)
    }
}
