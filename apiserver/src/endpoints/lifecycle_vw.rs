//! kcp's `initializingworkspaces` and `terminatingworkspaces` virtual workspaces, through which
//! an initializer (terminator) finds the workspaces waiting for it and finishes them:
//!
//! - `/services/initializingworkspaces/<id>/clusters/*/apis/core.kcp.io/v1alpha1/logicalclusters`:
//!   list and watch the LogicalClusters still waiting for `<id>` (selected by the labels only the
//!   server writes), read-only;
//! - `.../clusters/<name>/apis/core.kcp.io/v1alpha1/logicalclusters/cluster[/status]`: read it, and
//!   update its status removing `<id>` and nothing else;
//! - `.../clusters/<name>/<anything else>`: the workspace's own API, with the rights of the
//!   workspace's owner (kcp's mode without `initializerPermissions`) or, when the type lists
//!   `initializerPermissions`, only what those rules allow. Only while the workspace waits for
//!   `<id>`; afterwards 403 (and 404 for its LogicalCluster).
//!
//! Every request needs `initialize` (`terminate`) on the WorkspaceType `<type>` in the type's
//! workspace, `<id>` being `<logical cluster>:<type>`.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::access::rbac::PolicyRule;
use crate::access::tenancy::initializers::{self, OnlyOwnName};
use crate::endpoints::handlers::{self, ResourceCall};
use crate::meta::response::error_response;
use crate::meta::status::{ApiError, GroupResource};
use crate::request::identity::Identity;
use crate::request::query::Query;
use crate::request::request_info::{ClusterTarget, Lifecycle, ResourceRequest, Verb};

/// What a lifecycle request needs from the server.
pub struct LifecycleCall<'a> {
    /// The handles of the resource handlers (the store, admission, the catalog).
    pub scope: handlers::ResourceScope,
    /// The server's authorizer, which decides who may initialize (terminate).
    pub authorizer: &'a dyn crate::access::authz::Authorizer,
    /// Initializing or terminating.
    pub lifecycle: Lifecycle,
    /// The initializer's (terminator's) id.
    pub id: &'a str,
    /// `*` or one logical cluster.
    pub cluster: ClusterTarget,
    /// The resource request.
    pub request: ResourceRequest,
    /// Its query.
    pub query: Query,
    /// Its headers.
    pub headers: http::HeaderMap,
    /// Its body, read whole.
    pub body: Bytes,
    /// The caller.
    pub identity: Arc<Identity>,
}

fn logical_clusters(rr: &ResourceRequest) -> bool {
    rr.group == "core.kcp.io" && rr.resource == "logicalclusters"
}

/// Serves one request of an initializing or terminating virtual workspace.
pub async fn serve(call: LifecycleCall<'_>) -> http::Response<crate::meta::body::Body> {
    match serve_inner(call).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn serve_inner(
    call: LifecycleCall<'_>,
) -> Result<http::Response<crate::meta::body::Body>, ApiError> {
    let mut scope = call.scope;
    let l = call.lifecycle;
    let Some((type_cluster, type_name)) = initializers::type_of(call.id) else {
        return Err(ApiError::path_not_found());
    };
    let workspace_types = GroupResource::new("tenancy.kcp.io", "workspacetypes");
    // The caller must be allowed to initialize (terminate) workspaces of this type.
    let allowed = crate::access::authz::allowed(
        call.authorizer,
        type_cluster,
        &call.identity,
        l.verb(),
        "tenancy.kcp.io",
        "workspacetypes",
        type_name,
    )
    .await?;
    if !allowed {
        return Err(ApiError::forbidden_object(
            &workspace_types,
            type_name,
            format!(
                "User {:?} cannot {} workspacetypes {type_name:?} in workspace {type_cluster:?}",
                call.identity.user,
                l.verb()
            ),
        ));
    }
    let wt = scope
        .objects
        .storage()
        .get(&format!(
            "/tenancy.kcp.io/workspacetypes/{type_cluster}/{type_name}"
        ))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .and_then(|kv| crate::registry::objects::decode_stored(&kv.value).ok());
    let rr = call.request;
    let mut forced_selector = None;
    let mut admission: Arc<dyn crate::admission::Admission> = scope.admission.clone();
    let view = match &call.cluster {
        ClusterTarget::Wildcard => {
            if !logical_clusters(&rr) || !matches!(rr.verb, Verb::List | Verb::Watch) {
                return Err(ApiError::method_not_allowed(
                    rr.verb.as_str(),
                    &GroupResource::new(&rr.group, &rr.resource),
                ));
            }
            let (key, value) = l.label(call.id);
            forced_selector = Some(match l {
                Lifecycle::Initializing => {
                    format!("{}=Initializing,{key}={value}", initializers::PHASE_LABEL)
                }
                Lifecycle::Terminating => format!("{key}={value}"),
            });
            scope.catalog.builtin_view()
        }
        ClusterTarget::Name(c) => {
            let lc = scope
                .objects
                .storage()
                .get(&format!("/core.kcp.io/logicalclusters/{c}/cluster"))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .and_then(|kv| crate::registry::objects::decode_stored(&kv.value).ok());
            let waiting = lc.as_ref().is_some_and(|lc| {
                let in_phase = match l {
                    Lifecycle::Initializing => lc["status"]["phase"] == "Initializing",
                    Lifecycle::Terminating => crate::registry::objects::is_deleting(lc),
                };
                in_phase && initializers::waiting(lc, l).iter().any(|i| i == call.id)
            });
            if logical_clusters(&rr) {
                if !waiting {
                    return Err(ApiError::not_found(
                        &GroupResource::new("core.kcp.io", "logicalclusters"),
                        rr.name.as_deref().unwrap_or("cluster"),
                    ));
                }
                let status_write = rr.subresource.as_deref() == Some("status")
                    && matches!(rr.verb, Verb::Update | Verb::Patch);
                if !(rr.verb == Verb::Get || status_write) {
                    return Err(ApiError::method_not_allowed(
                        rr.verb.as_str(),
                        &GroupResource::new(&rr.group, &rr.resource),
                    ));
                }
                if status_write {
                    admission = OnlyOwnName::wrap(l, call.id, admission);
                }
                scope.catalog.builtin_view()
            } else {
                if !waiting {
                    return Err(ApiError::forbidden(format!(
                        "{} {:?} cannot access this workspace",
                        match l {
                            Lifecycle::Initializing => "initializer",
                            Lifecycle::Terminating => "terminator",
                        },
                        call.id
                    )));
                }
                check_permissions(
                    wt.as_ref(),
                    l,
                    &call.identity,
                    cluster_name(&call.cluster),
                    &rr,
                )?;
                scope.catalog.view(c)
            }
        }
    };
    scope.admission = admission;
    let resource_call = ResourceCall {
        scope,
        view,
        virtual_workspace: false,
        export: None,
        claim: None,
        forced_selector,
        cluster: call.cluster,
        request: rr,
        query: call.query,
        headers: call.headers,
        body: call.body,
        identity: Some(call.identity),
    };
    Ok(handlers::serve(resource_call).await)
}

/// The logical cluster a lifecycle request addresses, unless it lists across all of them.
fn cluster_name(target: &ClusterTarget) -> Option<&str> {
    match target {
        ClusterTarget::Name(c) => Some(c),
        ClusterTarget::Wildcard => None,
    }
}

/// kcp's mode with `initializerPermissions` (`terminatorPermissions`): the request must fall
/// under one of the type's rules; without them the initializer acts as the workspace's owner.
fn check_permissions(
    wt: Option<&Value>,
    l: Lifecycle,
    identity: &Identity,
    cluster: Option<&str>,
    rr: &ResourceRequest,
) -> Result<(), ApiError> {
    let field = match l {
        Lifecycle::Initializing => "initializerPermissions",
        Lifecycle::Terminating => "terminatorPermissions",
    };
    let Some(rules) = wt
        .and_then(|t| t["spec"][field].as_array())
        .filter(|r| !r.is_empty())
    else {
        return Ok(());
    };
    let attrs = crate::access::authz::request_attributes(
        crate::access::authz::user_info(identity, cluster),
        rr,
    );
    if rules
        .iter()
        .any(|r| PolicyRule::from_value(r).allows(&attrs))
    {
        return Ok(());
    }
    Err(crate::access::authz::forbidden_in(
        identity,
        "",
        rr,
        &format!("not among the workspace type's {field}"),
    ))
}
