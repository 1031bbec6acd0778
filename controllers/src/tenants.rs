//! The controllers of the workspace tree, run over every engaged workspace: Account,
//! AccountInfo and Provider.

use std::sync::Arc;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use crate::kcp::Kcp;
use crate::objects::api_resource;
use crate::runtime::{Manager, ManagerError};
use crate::{account, provider};

/// Adds the Account, AccountInfo and Provider controllers to `manager`, each with `workers`
/// concurrent reconciles, reaching workspaces other than a request's through `kcp`.
pub fn add(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    add_accounts(manager, kcp.clone(), workers)?;
    add_providers(manager, kcp, workers)
}

/// Adds the Account and AccountInfo controllers (the kinds of the `core.platform-mesh.io`
/// export).
pub fn add_accounts(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    manager.add(account::controller(kcp, workers))?;
    manager.add(account::info_controller(workers))
}

/// Adds the Provider controller (the kind of the `providers.platform-mesh.io` export).
pub fn add_providers(manager: &Manager, kcp: Arc<Kcp>, workers: usize) -> Result<(), ManagerError> {
    manager.add(provider::controller(kcp, workers))
}

/// The name of the ClusterRoles and ClusterRoleBindings of [`grant`].
pub const GRANT_NAME: &str = "platform-mesh:workspace-controllers";

/// The workspace of the Platform Mesh exports.
const EXPORT_WORKSPACE: &str = "root:platform-mesh-system";

/// What the Account and AccountInfo controllers and the security initializer need outside the
/// virtual workspaces when they run under an identity of their own, per workspace: use the core
/// export (kcp's `apiexports/content`), read its endpoint slice, and `bind` it (kcp binds a new
/// workspace's default APIs as its creator) in the export workspace;
/// finish workspaces of type `security` (kcp's `initialize` and `terminate`) and `use` the types
/// the organisations' types extend (kcp asks `use` of every type in the chain) in `root`; and in
/// `root:orgs`, where the organisations' Accounts and their WorkspaceTypes live, `use` those
/// types (kcp asks it of whoever creates a workspace of a type, and the workspace of an account
/// is not in `root:orgs`), read the Accounts and write the IdentityProviderConfigurations, the
/// WorkspaceAuthenticationConfigurations and the organisations' WorkspaceTypes' references to
/// them (the security initializer's steps). For the Provider controller: the `providers.platform-mesh.io`
/// export's content, `use` of the `provider` type in `root`, and the Workspaces of
/// `root:providers`, where it makes the provider workspaces (which, as their creator, it owns).
/// In each of them `access` to `/`, which kcp asks of anyone entering a workspace. Nothing
/// inside an organisation, account or other tenant workspace.
pub fn workspace_controller_rules() -> Vec<(&'static str, Value)> {
    let read = ["get", "list", "watch"];
    // kcp lets only those with `access` to `/` into a workspace at all.
    let enter = json!({"nonResourceURLs": ["/"], "verbs": ["access"]});
    let rules = vec![
        (
            EXPORT_WORKSPACE,
            json!([
                {"apiGroups": ["apis.kcp.io"], "resources": ["apiexports/content"],
                 "resourceNames": ["core.platform-mesh.io", provider::EXPORT], "verbs": ["*"]},
                {"apiGroups": ["apis.kcp.io"], "resources": ["apiexports"],
                 "resourceNames": ["core.platform-mesh.io"], "verbs": ["bind"]},
                {"apiGroups": ["apis.kcp.io"], "resources": ["apiexports", "apiexportendpointslices"],
                 "verbs": read},
            ]),
        ),
        (
            "root",
            json!([
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"],
                 "resourceNames": ["security"], "verbs": ["get", "initialize", "terminate"]},
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"],
                 "resourceNames": ["org", "account", "security", "provider"], "verbs": ["use"]},
            ]),
        ),
        (
            provider::PROVIDERS_PATH,
            json!([
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspaces"],
                 "verbs": ["get", "list", "watch", "create", "delete"]},
            ]),
        ),
        (
            account::ORGS_PATH,
            json!([
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"], "verbs": ["use"]},
                {"apiGroups": ["core.platform-mesh.io"], "resources": ["accounts"], "verbs": ["get"]},
                {"apiGroups": ["core.platform-mesh.io"], "resources": ["identityproviderconfigurations"],
                 "verbs": ["get", "create", "update", "patch", "delete"]},
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspaceauthenticationconfigurations"],
                 "verbs": ["get", "create", "update", "patch"]},
                {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"],
                 "verbs": ["list", "patch"]},
            ]),
        ),
    ];
    rules
        .into_iter()
        .map(|(workspace, mut rules)| {
            if let Some(list) = rules.as_array_mut() {
                list.push(enter.clone());
            }
            (workspace, rules)
        })
        .collect()
}

/// Grants `user` [`workspace_controller_rules`] as a ClusterRole and ClusterRoleBinding
/// ([`GRANT_NAME`]) in each of those workspaces, with `admin` access, as an installer would.
pub async fn grant(admin: &Kcp, user: &str) -> Result<(), GrantError> {
    let rbac =
        |kind: &str, plural: &str| api_resource("rbac.authorization.k8s.io", "v1", kind, plural);
    let (roles, bindings) = (
        rbac("ClusterRole", "clusterroles"),
        rbac("ClusterRoleBinding", "clusterrolebindings"),
    );
    let params = PatchParams::apply("platform-mesh").force();
    for (workspace, rules) in workspace_controller_rules() {
        let client = admin.workspace(workspace);
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": GRANT_NAME}, "rules": rules});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": GRANT_NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": GRANT_NAME},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
        for (ar, obj) in [(&roles, role), (&bindings, binding)] {
            Api::<DynamicObject>::all_with(client.clone(), ar)
                .patch(GRANT_NAME, &params, &Patch::Apply(obj))
                .await
                .map_err(|source| GrantError {
                    workspace,
                    kind: ar.kind.clone(),
                    source,
                })?;
        }
    }
    Ok(())
}

/// Writing one of [`grant`]'s objects failed.
#[derive(Debug, thiserror::Error)]
#[error("granting the workspace controllers their rights in {workspace} ({kind}): {source}")]
pub struct GrantError {
    /// The workspace.
    pub workspace: &'static str,
    /// The kind written.
    pub kind: String,
    /// The client error.
    #[source]
    pub source: kube::Error,
}
