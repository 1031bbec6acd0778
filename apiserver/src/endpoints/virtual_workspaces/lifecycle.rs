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
//! workspace, `<id>` being `<logical cluster>:<type>`. Discovery and OpenAPI are the
//! workspace's own.

use std::sync::Arc;

use http::Response;

use bytes::Bytes;
use serde_json::Value;

use futures::future::BoxFuture;

use crate::access::authz::Authorizer;
use crate::access::rbac::PolicyRule;
use crate::access::tenancy::initializers::{self, OnlyOwnName};
use crate::endpoints::exchange::{Exchange, ResourceExchange};
use crate::endpoints::handlers::{self, Labelled, ResourceCall, TypeLookup, Visibility};
use crate::endpoints::virtual_workspaces::VirtualWorkspace;
use crate::endpoints::workspaces::Workspaces;
use crate::meta::body::Body;
use crate::meta::response::error_response;
use crate::meta::status::{ApiError, GroupResource};
use crate::request::identity::Identity;
use crate::request::query::Query;
use crate::request::request_info::{
    ClusterTarget, Lifecycle, RequestInfo, ResourceRequest, Target, Verb,
};

/// The initializing and terminating virtual workspaces.
pub struct LifecycleVirtualWorkspace {
    /// The workspaces' APIs: the handlers' scope, and what serves the non-resource paths.
    pub workspaces: Arc<Workspaces>,
    /// Who decides who may initialize (terminate): the server's RBAC.
    pub authorizer: Arc<dyn Authorizer>,
}

impl VirtualWorkspace for LifecycleVirtualWorkspace {
    fn matches(&self, info: &RequestInfo) -> bool {
        info.lifecycle.is_some()
    }

    fn serve(&self, x: Box<Exchange>) -> BoxFuture<'_, Response<Body>> {
        Box::pin(self.serve_exchange(x))
    }
}

impl LifecycleVirtualWorkspace {
    async fn serve_exchange(&self, x: Box<Exchange>) -> Response<Body> {
        let (Some((lifecycle, id)), Target::Resource(_), Some(user)) =
            (x.info.lifecycle.clone(), &x.info.target, x.user.clone())
        else {
            // Discovery and OpenAPI: the workspace's own.
            return self.workspaces.serve(x).await;
        };
        // A workspace is addressed by its logical-cluster name only; a path is not resolved
        // here.
        if x.requested != x.info.cluster {
            return error_response(&ApiError::path_not_found());
        }
        let ResourceExchange {
            request,
            body,
            parts,
            query,
            cluster,
            served,
            ..
        } = match x.into_resource().await {
            Ok(r) => r,
            Err(e) => return error_response(&e),
        };
        serve(LifecycleCall {
            scope: self.workspaces.scope.clone(),
            authorizer: self.authorizer.as_ref(),
            lifecycle,
            id: &id,
            cluster,
            request,
            query,
            headers: parts.headers,
            body,
            identity: user,
            served,
        })
        .await
    }
}

/// One lifecycle request.
struct LifecycleCall<'a> {
    /// The handles of the resource handlers (the store, admission, the catalog).
    scope: handlers::ResourceScope,
    /// The server's authorizer, which decides who may initialize (terminate).
    authorizer: &'a dyn Authorizer,
    /// Initializing or terminating.
    lifecycle: Lifecycle,
    /// The initializer's (terminator's) id.
    id: &'a str,
    /// `*` or one logical cluster.
    cluster: ClusterTarget,
    /// The resource request.
    request: ResourceRequest,
    /// Its query.
    query: Query,
    /// Its headers.
    headers: http::HeaderMap,
    /// Its body, read whole.
    body: Bytes,
    /// The caller.
    identity: Arc<Identity>,
    /// Marked once the request names a served type.
    served: crate::endpoints::exchange::ServedType,
}

fn logical_clusters(rr: &ResourceRequest) -> bool {
    rr.group == "core.kcp.io" && rr.resource == "logicalclusters"
}

/// Serves one request of an initializing or terminating virtual workspace.
async fn serve(call: LifecycleCall<'_>) -> Response<Body> {
    match serve_inner(call).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn serve_inner(call: LifecycleCall<'_>) -> Result<Response<Body>, ApiError> {
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
    let wt = read(
        &scope,
        "tenancy.kcp.io",
        "workspacetypes",
        type_cluster,
        type_name,
    )
    .await?;
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
            let lc = read(&scope, "core.kcp.io", "logicalclusters", c, "cluster").await?;
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
        types: TypeLookup::Workspaces,
        visibility: forced_selector.map(|s| Arc::new(Labelled(s)) as Arc<dyn Visibility>),
        cluster: call.cluster,
        request: rr,
        query: call.query,
        headers: call.headers,
        body: call.body,
        identity: Some(call.identity),
        served: call.served,
    };
    Ok(handlers::serve(resource_call).await)
}

/// A kcp object of a built-in type, `None` when it does not exist (or cannot be decoded).
async fn read(
    scope: &handlers::ResourceScope,
    group: &str,
    resource: &str,
    cluster: &str,
    name: &str,
) -> Result<Option<Value>, ApiError> {
    let view = scope.catalog.builtin_view();
    let Some(resource) = view.registry.lookup(group, "v1alpha1", resource) else {
        return Ok(None);
    };
    match scope.objects.get(resource, cluster, None, name).await {
        Ok(kv) => Ok(crate::registry::objects::decode_stored(&kv.value).ok()),
        Err(e) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
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
