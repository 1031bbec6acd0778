//! The account controllers: every `core.platform-mesh.io` Account gets a workspace of its own
//! next to it (organisations under `root:orgs`, accounts inside their parent's workspace) and an
//! AccountInfo `account` in that workspace describing the account, its organisation and its
//! parent; every AccountInfo is held until no Account is left in its workspace.
//!
//! The steps and conditions are the account operator's (`WorkspaceTypeSubroutine`,
//! `WorkspaceSubroutine`, `ManageAccountInfoSubroutine`, `WorkspaceReadySubroutine`, `Ready`).
//! Differences, on purpose: the controller also watches the Workspaces it creates (through their
//! owner reference), so an account moves on when its workspace does instead of on the next
//! timed requeue.
//!
//! Every workspace is reached as upstream's operator reaches it: through the cluster provider
//! that engaged the Account's own workspace (on kcp, the `core.platform-mesh.io` export's
//! virtual workspace and its permission claims on Workspaces and WorkspaceTypes), `root:orgs`
//! by its path and a new account's workspace by its logical cluster once it is engaged. The
//! controller holds no other credentials for tenant workspaces.

mod info;
mod steps;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};

use crate::ensure::EnsureError;
use crate::kcp::{workspaces, Kcp};
use crate::objects::{api_resource, condition_true};
use crate::runtime::{
    kube_error_is_transient, Action, ClusterContext, ClusterName, Controller, ReconcileError,
    Reconciler, Request, ResourceKind,
};
use crate::subroutines::{drive, Lifecycle, WriteError};

pub use info::{info_controller, AccountInfoReconciler, INFO_FINALIZER};
pub use steps::{
    ManageAccountInfo, WorkspaceReady, WorkspaceStep, WorkspaceTypeStep, WORKSPACE_FINALIZER,
    WORKSPACE_TYPE_FINALIZER,
};

/// The controller's name (as upstream's).
pub const CONTROLLER: &str = "AccountReconciler";
/// The workspace holding every organisation, and the per-organisation WorkspaceTypes.
pub const ORGS_PATH: &str = "root:orgs";
/// The name of the one AccountInfo in each account workspace.
pub const INFO_NAME: &str = "account";
/// The account type of organisations.
pub const ORG: &str = "org";

/// `core.platform-mesh.io/v1alpha1` Account (cluster-scoped).
pub fn accounts() -> ApiResource {
    api_resource("core.platform-mesh.io", "v1alpha1", "Account", "accounts")
}

/// `core.platform-mesh.io/v1alpha1` AccountInfo (cluster-scoped).
pub fn account_infos() -> ApiResource {
    api_resource(
        "core.platform-mesh.io",
        "v1alpha1",
        "AccountInfo",
        "accountinfos",
    )
}

/// Why reconciling an Account or an AccountInfo failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// The controller's watch cache could not be read (it did not sync in time).
    #[error("reading the watch cache: {0}")]
    Cache(#[from] crate::runtime::CacheError),
    /// A call to the API server failed; `context` says which.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A workspace the Account needs (by path or logical cluster) is not engaged: its binding
    /// of the export is missing or not ready yet.
    #[error("workspace {0} is not reachable through the controller's export (not bound, or its binding is not ready yet)")]
    NotEngaged(String),
    /// Reading the Account's own Workspace failed (it may not be visible yet).
    #[error("getting Account's Workspace: {0}")]
    Workspace(#[source] kube::Error),
    /// Creating or updating a WorkspaceType or the Workspace failed.
    #[error(transparent)]
    Ensure(#[from] EnsureError),
    /// Creating or updating an object failed; `context` says where or which.
    #[error("{context}: {source}")]
    EnsureIn {
        /// Where or which object.
        context: String,
        /// The failure.
        #[source]
        source: Box<EnsureError>,
    },
    /// The Account's owner reference does not decode (a bug).
    #[error("{0}")]
    OwnerReference(#[source] serde_json::Error),
    /// A Workspace of the Account's name exists with another type, which cannot change.
    #[error("Workspace {name} exists with type {have}, the account needs {wanted} (a workspace's type cannot change)")]
    WorkspaceType {
        /// The Workspace.
        name: String,
        /// Its type, `path:name`.
        have: String,
        /// The type the Account needs, `path:name`.
        wanted: String,
    },
    /// The Account's Workspace has no usable URL yet.
    #[error("workspace URL is {0}")]
    WorkspaceUrl(&'static str),
    /// The Account's Workspace has no logical cluster yet.
    #[error("the Account's Workspace has no logical cluster yet")]
    NoLogicalCluster,
    /// Updating an AccountInfo's finalizers failed.
    #[error("AccountInfo {name}: updating finalizers: {source}")]
    InfoFinalizers {
        /// The AccountInfo.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Writing the Account's finalizers or status failed.
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl AccountError {
    /// A failed API call, with what it was doing.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        AccountError::Kube {
            context: context.into(),
            source,
        }
    }
}

impl ReconcileError for AccountError {
    /// Client errors as [`kube_error_is_transient`] says, except that the Account's Workspace
    /// and the AccountInfo inside it may not be visible yet (404 while kcp sets the workspace
    /// up is retried). A Workspace of the wrong type is retried too: it is not watched, so its
    /// deletion would bring no event. A refusal (403) is retried with backoff, as upstream's
    /// controller retries every error: when the controllers run as a user that is no admin,
    /// kcp asks `use` of workspace types and `bind` of exports, which an installer may grant
    /// after the controllers started. An undecodable owner reference is fatal.
    fn is_transient(&self) -> bool {
        let forbidden = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
        match self {
            AccountError::Cache(e) => e.is_transient(),
            AccountError::Kube { source, .. } | AccountError::InfoFinalizers { source, .. } => {
                kube_error_is_transient(source) || forbidden(source)
            }
            AccountError::Workspace(source) => {
                matches!(source, kube::Error::Api(s) if s.code == 404)
                    || kube_error_is_transient(source)
            }
            AccountError::Ensure(e) => e.is_transient() || e.kube().is_some_and(forbidden),
            AccountError::EnsureIn { source, .. } => {
                source.is_not_found()
                    || source.is_transient()
                    || source.kube().is_some_and(forbidden)
            }
            AccountError::OwnerReference(_) => false,
            AccountError::WorkspaceType { .. }
            | AccountError::NotEngaged(_)
            | AccountError::WorkspaceUrl(_)
            | AccountError::NoLogicalCluster => true,
            AccountError::Write(e) => e.is_transient(),
        }
    }
}

/// What a step of an Account sees.
pub struct AccountContext {
    /// The Account as read at the start of the reconcile.
    pub account: DynamicObject,
    /// Its logical cluster (the workspace holding it, the parent of its own).
    pub cluster: String,
    /// The Account's cluster, and through it the provider's other engaged workspaces.
    pub clusters: ClusterContext,
    /// What the controller knows of kcp (its CA, for AccountInfo); not a way into workspaces.
    pub kcp: Arc<Kcp>,
}

impl AccountContext {
    /// The Account's name.
    pub fn name(&self) -> &str {
        self.account.metadata.name.as_deref().unwrap_or_default()
    }

    /// `spec.type`.
    pub fn account_type(&self) -> &str {
        self.account.data["spec"]["type"].as_str().unwrap_or("")
    }

    /// Whether the Account is an organisation.
    pub fn is_org(&self) -> bool {
        self.account_type() == ORG
    }

    /// An API of `ar` in the Account's cluster.
    pub fn api(&self, ar: &ApiResource) -> Api<DynamicObject> {
        self.clusters.cluster().dynamic_api(ar, None)
    }

    /// An API of `ar` in another workspace, by path or logical cluster name, reached the way
    /// the Account's own is; `None` while the controllers do not know that workspace (sharded,
    /// it may be another replica's to reconcile: writing there is still this one's job).
    pub fn api_in(&self, cluster: &str, ar: &ApiResource) -> Option<Api<DynamicObject>> {
        Some(
            self.clusters
                .reachable_cluster(cluster)?
                .dynamic_api(ar, None),
        )
    }

    /// An API of `ar` in the workspace at `path`, which must be engaged.
    pub fn api_at(&self, path: &str, ar: &ApiResource) -> Result<Api<DynamicObject>, AccountError> {
        self.api_in(path, ar)
            .ok_or_else(|| AccountError::NotEngaged(path.to_string()))
    }
}

/// Reconciles Accounts in every engaged workspace.
pub struct AccountReconciler {
    lifecycle: Lifecycle<AccountContext, AccountError>,
    kcp: Arc<Kcp>,
}

impl Reconciler for AccountReconciler {
    type Error = AccountError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, AccountError> {
        let api: Api<DynamicObject> = ctx.cluster().dynamic_api(&accounts(), None);
        // The object as the controller's watch cache holds it: no request to the API server.
        let Some(account) = ctx.requested_object(&req).await?.map(|o| (*o).clone()) else {
            return Ok(Action::await_change());
        };
        let context = AccountContext {
            account: account.clone(),
            cluster: ctx.cluster_name().to_string(),
            clusters: ctx.clone(),
            kcp: self.kcp.clone(),
        };
        match drive(&self.lifecycle, &api, &account, &context).await {
            Ok(Some(after)) => Ok(Action::requeue_after(after)),
            Ok(None) => Ok(Action::await_change()),
            Err(e) => Err(e.flatten()),
        }
    }
}

/// The steps of an Account, in order (reversed on deletion).
pub fn lifecycle() -> Lifecycle<AccountContext, AccountError> {
    Lifecycle::new()
        .step(WorkspaceTypeStep)
        .step(WorkspaceStep)
        .step(ManageAccountInfo)
        .step(WorkspaceReady)
}

/// The Accounts named as owners of a Workspace (any owner reference of kind Account; the
/// controller's own carry no `controller` flag, as upstream's).
fn owning_accounts(cluster: &ClusterName, obj: &DynamicObject) -> Vec<Request> {
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == "Account" && r.api_version.starts_with("core.platform-mesh.io/"))
        .map(|r| Request::cluster_scoped(cluster.clone(), r.name.clone()))
        .collect()
}

/// The Account controller: Accounts of every engaged workspace, woken also by their Workspaces.
pub fn controller(kcp: Arc<Kcp>, workers: usize) -> Controller<AccountReconciler> {
    Controller::new(
        CONTROLLER,
        AccountReconciler {
            lifecycle: lifecycle(),
            kcp,
        },
    )
    .for_kind(ResourceKind::dynamic(accounts(), false))
    .watches_kind(
        ResourceKind::dynamic(workspaces(), false),
        Arc::new(owning_accounts),
    )
    .workers(workers)
}

/// How long a step waits before looking again (upstream's effective constant delays).
pub(crate) const WAIT: Duration = Duration::from_secs(2);
/// How long ManageAccountInfo waits (upstream: 1 s).
pub(crate) const INFO_WAIT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_refused_workspace_is_tried_again_an_invalid_one_is_not() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure(
                    "no",
                    if code == 403 { "Forbidden" } else { "Invalid" },
                )
                .with_code(code)
                .boxed(),
            )
        };
        let create = |code| {
            AccountError::Ensure(EnsureError::Create {
                kind: "Workspace".into(),
                name: "acme".into(),
                source: api(code),
            })
        };
        assert!(
            create(403).is_transient(),
            "kcp's use/bind refusal may be granted later"
        );
        assert!(!create(422).is_transient());
        assert!(AccountError::kube("reading", api(403)).is_transient());
    }

    #[test]
    fn workspaces_map_to_the_accounts_owning_them() {
        let ws: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "team", "ownerReferences": [
                {"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account", "name": "team", "uid": "1"},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "2"}]}}))
        .unwrap();
        let reqs = owning_accounts(&"c1".into(), &ws);
        assert_eq!(reqs, vec![Request::cluster_scoped("c1", "team")]);
        let bare: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": "x"}}))
        .unwrap();
        assert!(owning_accounts(&"c1".into(), &bare).is_empty());
    }
}
