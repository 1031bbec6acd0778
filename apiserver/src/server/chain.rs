//! The handler chain, assembled in one place as kube-apiserver's `DefaultBuildHandlerChain`:
//! each filter wraps the next, from the request log outside to the router inside (the filters'
//! order and what each does: [`crate::endpoints::filters`]).

use std::sync::Arc;

use crate::endpoints::exchange::{Exchange, Handler};
use crate::endpoints::filters::{
    Auditing, Authentication, Authorization, ClusterResolution, Compression, Impersonation,
    MaxInFlight, Recovery, RequestLog, Resolver, Timeout, ValidPath, WorkspaceAuthentication,
    WorkspaceReadiness,
};
use crate::endpoints::nonresource::NonResource;
use crate::endpoints::router::Router;
use crate::endpoints::virtual_workspaces::{
    ApiExportVirtualWorkspace, LifecycleVirtualWorkspace, ViewsVirtualWorkspace,
};
use crate::endpoints::webhook;
use crate::endpoints::workspaces::Workspaces;
use crate::server::state::AppState;

/// The whole chain's type, outside in.
pub type Chain = RequestLog<
    MaxInFlight<
        Compression<
            Auditing<
                Timeout<
                    Recovery<
                        ValidPath<
                            Authentication<
                                ClusterResolution<
                                    WorkspaceAuthentication<
                                        Impersonation<WorkspaceReadiness<Authorization<Router>>>,
                                    >,
                                >,
                            >,
                        >,
                    >,
                >,
            >,
        >,
    >,
>;

/// Serves one request that came in on a connection with `peer`.
pub async fn handle(
    chain: &Chain,
    peer: crate::access::authn::Peer,
    req: hyper::Request<hyper::body::Incoming>,
) -> http::Response<crate::meta::body::Body> {
    chain.handle(Exchange::new(peer, req)).await
}

/// The chain over the parts of `state`.
pub fn build(state: &AppState) -> Chain {
    let nonresource = Arc::new(NonResource {
        metrics: state.metrics.clone(),
        advertise_address: state.advertise_address.clone(),
    });
    let workspaces = Arc::new(Workspaces {
        scope: state.resource_scope(),
        rbac: state.rbac.clone(),
        authn: state.authn.clone(),
        store: state.store.clone(),
        nonresource: nonresource.clone(),
    });
    let router = Router {
        virtual_workspaces: vec![
            Box::new(LifecycleVirtualWorkspace {
                workspaces: workspaces.clone(),
                authorizer: state.authorizer(),
            }),
            Box::new(ViewsVirtualWorkspace {
                views: state.views.clone(),
                scopes: state.view_scopes.clone(),
                authorizer: state.authorizer(),
                nonresource,
            }),
            Box::new(ApiExportVirtualWorkspace {
                tenancy: state.tenancy.clone(),
                rbac: state.rbac.clone(),
                workspaces: workspaces.clone(),
            }),
        ],
        webhook: webhook::Reviewer {
            catalog: state.catalog.clone(),
            objects: state.objects.clone(),
        },
        workspaces,
    };
    let authorization = Authorization {
        authorizer: state.authorizer(),
        rbac: state.rbac.clone(),
        next: router,
    };
    let readiness = WorkspaceReadiness {
        tenancy: state.tenancy.clone(),
        next: authorization,
    };
    let impersonation = Impersonation {
        rbac: state.rbac.clone(),
        next: readiness,
    };
    let workspace_authentication = WorkspaceAuthentication {
        issuers: state.workspace_authn.clone(),
        next: impersonation,
    };
    let cluster = ClusterResolution {
        resolver: match &state.extension {
            Some(kcp) => Resolver::Upstream(kcp.clone()),
            None => Resolver::Tenancy(state.tenancy.clone()),
        },
        next: workspace_authentication,
    };
    let authentication = Authentication {
        authn: state.authn.clone(),
        store: state.store.clone(),
        catalog: state.catalog.clone(),
        workspace_issuers: state.workspace_authn.is_some(),
        next: cluster,
    };
    RequestLog {
        metrics: state.metrics.clone(),
        next: MaxInFlight {
            slots: state.in_flight.clone(),
            next: Compression {
                next: Auditing {
                    audit: state.audit.clone(),
                    paths: state.tenancy.clone(),
                    next: Timeout {
                        timeout: state.request_timeout,
                        next: Recovery {
                            next: ValidPath {
                                next: authentication,
                            },
                        },
                    },
                },
            },
        },
    }
}
