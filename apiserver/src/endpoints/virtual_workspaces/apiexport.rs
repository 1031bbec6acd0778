//! kcp's APIExport virtual workspace,
//! `/services/apiexport/<export cluster>/<export>/clusters/<name|*>/...`: an export's owner
//! reaches the workspaces bound to the export, and in them the export's own resources and the
//! resources its permission claims were accepted for (only the objects those claims select).
//!
//! Its rules, kcp's: the caller needs the `content` subresource of the export in the export's
//! workspace; a workspace not bound to the export is a workspace that does not exist; a claimed
//! resource needs an accepted claim whose verbs allow the verb (kcp's bound-API authorizer);
//! writes through a claim with a label selector stay inside it; a request into one workspace
//! writes with kcp's warrant for that workspace.

use std::sync::Arc;

use futures::future::BoxFuture;
use http::Response;

use crate::access::authz;
use crate::access::tenancy::claims::{self, AcceptedClaim, ClaimedResource, SelectorAdmission};
use crate::access::tenancy::{self, Tenancy};
use crate::endpoints::exchange::Exchange;
use crate::endpoints::handlers::{TypeLookup, Visibility};
use crate::endpoints::virtual_workspaces::VirtualWorkspace;
use crate::endpoints::workspaces::{Route, Workspaces};
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::ApiError;
use crate::registry::catalog::ExportApi;
use crate::registry::Resource;
use crate::request::identity::Identity;
use crate::request::request_info::{ClusterTarget, RequestInfo, ResourceRequest, Target};

/// The APIExport virtual workspace.
pub struct ApiExportVirtualWorkspace {
    /// The workspace tree: bindings, exports and accepted claims.
    pub tenancy: Arc<Tenancy>,
    /// RBAC of the server's workspaces.
    pub rbac: authz::Rbac,
    /// The workspaces' APIs, which serve what this lets through.
    pub workspaces: Arc<Workspaces>,
}

/// Through an export, a claimed resource (and APIBindings) shows only the objects carrying the
/// export's claim label.
impl Visibility for ExportApi {
    fn selector(&self, resource: &Resource) -> Option<String> {
        self.selector_for(resource).map(str::to_string)
    }
}

impl VirtualWorkspace for ApiExportVirtualWorkspace {
    fn matches(&self, info: &RequestInfo) -> bool {
        info.virtual_workspace.is_some()
    }

    fn serve(&self, x: Box<Exchange>) -> BoxFuture<'_, Response<Body>> {
        Box::pin(async move {
            self.serve_inner(x)
                .await
                .unwrap_or_else(|e| error_response(&e))
        })
    }
}

impl ApiExportVirtualWorkspace {
    async fn serve_inner(&self, x: Box<Exchange>) -> Result<Response<Body>, ApiError> {
        let Some((export_cluster, export)) = x.info.virtual_workspace.clone() else {
            return Err(ApiError::path_not_found());
        };
        // Authorized before the export is looked up, so a missing export and a forbidden one
        // answer alike.
        if let (Some(id), Target::Resource(rr)) = (x.user.as_deref(), &x.info.target) {
            authz::authorize_export_content(
                &self.rbac,
                id,
                &export_cluster,
                &export,
                rr.verb.as_str(),
            )
            .await?;
        }
        // Only the workspaces bound to the export are reachable; any other one answers as a
        // workspace that does not exist.
        if let ClusterTarget::Name(c) = &x.info.cluster {
            if !tenancy::is_bound(&self.tenancy, c, &export_cluster, &export).await? {
                return Err(ApiError::workspace_forbidden());
            }
        }
        let api = tenancy::export_view(&self.tenancy, &export_cluster, &export).await?;
        let Target::Resource(rr) = &x.info.target else {
            return Ok(self.workspaces.nonresource.serve(&api.view, &x));
        };
        let claim = match x.user.as_deref() {
            Some(id) => {
                self.authorize_claim(&api, &export_cluster, &export, &x.info.cluster, rr, id)
                    .await?
            }
            None => None,
        };
        // Writes through a claim with a label selector must stay inside it.
        let scope = match claim {
            Some(claim) if !rr.verb.is_read_only() => {
                let mut scope = self.workspaces.scope.clone();
                scope.admission = SelectorAdmission::wrap(&claim, scope.admission);
                Some(scope)
            }
            _ => None,
        };
        let route = Route {
            view: api.view.clone(),
            types: TypeLookup::ViewOnly,
            visibility: Some(api),
            scope,
            through_export: true,
        };
        self.workspaces.serve_resource(x, route).await
    }

    /// kcp's bound-API authorizer for a request into one workspace: the export's own resources
    /// pass; a claimed resource needs a claim the workspace accepted whose verbs (the
    /// intersection of both sides') allow the verb; APIBindings are readable and writable only
    /// through such a claim. Wildcard requests skip it (the claim label filters what they see).
    /// Returns the claim that allowed the request.
    async fn authorize_claim(
        &self,
        api: &ExportApi,
        export_cluster: &str,
        export: &str,
        cluster: &ClusterTarget,
        rr: &ResourceRequest,
        identity: &Identity,
    ) -> Result<Option<AcceptedClaim>, ApiError> {
        let ClusterTarget::Name(c) = cluster else {
            return Ok(None);
        };
        let Some(resource) = api
            .view
            .registry
            .lookup(&rr.group, &rr.version, &rr.resource)
        else {
            return Ok(None);
        };
        if api.selector_for(resource).is_none() {
            return Ok(None);
        }
        let claimed = ClaimedResource::of(resource);
        let key = claims::claim_label_key(export_cluster, export);
        let verb = rr.verb.as_str();
        let accepted = self.tenancy.claims_of(c).await;
        if let Some(a) = accepted
            .iter()
            .find(|a| a.key == key && a.claimed == claimed && a.allows(verb))
        {
            return Ok(Some(a.clone()));
        }
        let bindings = claimed.group == "apis.kcp.io" && claimed.resource == "apibindings";
        if bindings && rr.verb.is_read_only() {
            return Ok(None);
        }
        // kcp's authorizer denies both a claimed resource without a fitting claim and a write
        // to APIBindings; its chain words the answer as a plain denial, and so does this one.
        Err(authz::forbidden_in(identity, c, rr, "access denied"))
    }
}
