//! The account controllers: every `core.platform-mesh.io` Account gets a workspace of its own
//! next to it (organisations under `root:orgs`, accounts inside their parent's workspace) and an
//! AccountInfo `account` in that workspace describing the account, its organisation and its
//! parent; every AccountInfo is held until no Account is left in its workspace.
//!
//! The steps and conditions are the account operator's (`WorkspaceTypeSubroutine`,
//! `WorkspaceSubroutine`, `ManageAccountInfoSubroutine`, `WorkspaceReadySubroutine`, `Ready`).
//! Differences, on purpose: the controller also watches the Workspaces it creates (through their
//! owner reference), so an account moves on when its workspace does instead of on the next
//! timed requeue; Workspaces and WorkspaceTypes are read and written with kcp access
//! ([`Kcp`]) instead of through the APIExport virtual workspace.

mod info;
mod steps;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use crate::lifecycle::{drive, DriveError, Lifecycle};
use crate::platformmesh::api_resource;
use crate::platformmesh::kcp::Kcp;
use crate::runtime::{
    Action, ClusterContext, ClusterName, Controller, Reconciler, Request, ResourceKind,
};

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

/// `tenancy.kcp.io/v1alpha1` Workspace.
pub fn workspaces() -> ApiResource {
    api_resource("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces")
}

/// `tenancy.kcp.io/v1alpha1` WorkspaceType.
pub fn workspace_types() -> ApiResource {
    api_resource(
        "tenancy.kcp.io",
        "v1alpha1",
        "WorkspaceType",
        "workspacetypes",
    )
}

/// What a step of an Account sees.
pub struct AccountContext {
    /// The Account as read at the start of the reconcile.
    pub account: DynamicObject,
    /// Its logical cluster (the workspace holding it, the parent of its own).
    pub cluster: String,
    /// A client of that cluster.
    pub client: kube::Client,
    /// kcp access for `root:orgs` and the new workspace.
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
        Api::all_with(self.client.clone(), ar)
    }

    /// An API of `ar` in the workspace at `path` (or logical cluster name).
    pub fn api_at(&self, path: &str, ar: &ApiResource) -> Api<DynamicObject> {
        Api::all_with(self.kcp.workspace(path), ar)
    }
}

/// Reconciles Accounts in every engaged workspace.
pub struct AccountReconciler {
    lifecycle: Lifecycle<AccountContext>,
    kcp: Arc<Kcp>,
}

impl Reconciler for AccountReconciler {
    type Error = String;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, String> {
        let api: Api<DynamicObject> = ctx.cluster().dynamic_api(&accounts(), None);
        let Some(account) = api
            .get_opt(&req.name)
            .await
            .map_err(|e| format!("reading Account {req}: {e}"))?
        else {
            return Ok(Action::await_change());
        };
        let context = AccountContext {
            account: account.clone(),
            cluster: ctx.cluster_name().to_string(),
            client: ctx.client(),
            kcp: self.kcp.clone(),
        };
        match drive(&self.lifecycle, &api, &account, &context).await {
            Ok(Some(after)) => Ok(Action::requeue_after(after)),
            Ok(None) => Ok(Action::await_change()),
            Err(DriveError::Subroutine(e)) => Err(e),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The steps of an Account, in order (reversed on deletion).
pub fn lifecycle() -> Lifecycle<AccountContext> {
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

/// A condition of an object as JSON, if it has one.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether an object's condition `type_` is `True`.
pub fn condition_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
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
