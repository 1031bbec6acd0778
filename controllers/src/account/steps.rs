//! The four steps of an Account.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, DynamicObject};
use serde_json::{json, Value};

use super::{
    account_infos, condition_true, AccountContext, AccountError, INFO_NAME, INFO_WAIT, ORGS_PATH,
    WAIT,
};
use crate::ensure::ensure;
use crate::kcp::{workspace_types, workspaces};
use crate::subroutines::{Step, Subroutine};

/// Held by organisations until their WorkspaceTypes are deleted.
pub const WORKSPACE_TYPE_FINALIZER: &str = "workspacetype.core.platform-mesh.io/finalizer";
/// Held by every Account until its Workspace is gone.
pub const WORKSPACE_FINALIZER: &str = "account.core.platform-mesh.io/finalizer";

/// The label naming the organisation of a per-organisation WorkspaceType.
const ORG_LABEL: &str = "core.platform-mesh.io/org";

fn stop(message: &str) -> Step {
    Step::stop(message, WAIT)
}

/// The WorkspaceType of accounts of type `ty` in organisation `org`.
pub fn workspace_type_name(org: &str, ty: &str) -> String {
    format!("{org}-{ty}")
}

/// `{types: [{name, path: root:orgs}]}` for per-organisation type names.
fn orgs_types(names: &[&str]) -> Value {
    json!({"types": names.iter().map(|n| json!({"name": n, "path": ORGS_PATH})).collect::<Vec<_>>()})
}

/// The spec fields the controller owns on `<org>-org` and `<org>-account`.
fn workspace_type_spec(org: &str, base: &str) -> Value {
    let account = workspace_type_name(org, "account");
    let org_type = workspace_type_name(org, "org");
    let parents = if base == "org" {
        json!({"types": [{"name": "orgs", "path": "root"}]})
    } else {
        orgs_types(&[&org_type, &account])
    };
    json!({
        "extend": {"with": [{"name": base, "path": "root"}]},
        "defaultChildWorkspaceType": {"name": account, "path": ORGS_PATH},
        "limitAllowedParents": parents,
        "limitAllowedChildren": orgs_types(&[&account]),
    })
}

/// Creates a WorkspaceType, or sets the controller's fields on it (others' fields and labels
/// are kept); writes only when something differs.
async fn ensure_workspace_type(
    ctx: &AccountContext,
    org: &str,
    base: &str,
) -> Result<(), AccountError> {
    let owned = workspace_type_spec(org, base);
    let wanted = json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
        "metadata": {"name": workspace_type_name(org, base), "labels": {ORG_LABEL: org}},
        "spec": owned,
    });
    ensure(
        &ctx.api_at(ORGS_PATH, &workspace_types())?,
        wanted,
        |stored| {
            let mut updated = stored.clone();
            updated
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(ORG_LABEL.into(), org.into());
            if !updated.data["spec"].is_object() {
                updated.data["spec"] = json!({});
            }
            for (k, v) in owned.as_object().into_iter().flatten() {
                updated.data["spec"][k] = v.clone();
            }
            (updated.metadata.labels != stored.metadata.labels || updated.data != stored.data)
                .then_some(updated)
        },
    )
    .await
    .map(|_| ())
    .map_err(|source| AccountError::EnsureIn {
        context: format!("in {ORGS_PATH}"),
        source: Box::new(source),
    })
}

/// `WorkspaceTypeSubroutine`: an organisation gets WorkspaceTypes `<org>-org` and
/// `<org>-account` in `root:orgs`, extending the base types `org` and `account`.
pub struct WorkspaceTypeStep;

#[async_trait::async_trait]
impl Subroutine<AccountContext, AccountError> for WorkspaceTypeStep {
    fn name(&self) -> &'static str {
        "WorkspaceTypeSubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[WORKSPACE_TYPE_FINALIZER]
    }

    fn finalizers_for(&self, ctx: &AccountContext) -> &'static [&'static str] {
        if ctx.is_org() {
            &[WORKSPACE_TYPE_FINALIZER]
        } else {
            &[]
        }
    }

    async fn process(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        if !ctx.is_org() {
            return Ok(Step::done());
        }
        ensure_workspace_type(ctx, ctx.name(), "org").await?;
        ensure_workspace_type(ctx, ctx.name(), "account").await?;
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        if !ctx.is_org() {
            return Ok(Step::done());
        }
        let api = ctx.api_at(ORGS_PATH, &workspace_types())?;
        for base in ["org", "account"] {
            let name = workspace_type_name(ctx.name(), base);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(AccountError::kube(
                        format!("deleting WorkspaceType {ORGS_PATH}:{name}"),
                        e,
                    ))
                }
            }
        }
        Ok(Step::done())
    }
}

/// The organisation of an account, from the AccountInfo of the workspace holding it; a stop
/// step while that is not written yet.
async fn organisation_of_parent(
    ctx: &AccountContext,
) -> Result<Result<String, Step>, AccountError> {
    let info = ctx
        .api(&account_infos())
        .get_opt(INFO_NAME)
        .await
        .map_err(|e| AccountError::kube("getting parent AccountInfo", e))?;
    let Some(info) = info else {
        return Ok(Err(stop("AccountInfo not found yet")));
    };
    match info.data["spec"]["organization"]["name"].as_str() {
        Some(org) if !org.is_empty() => Ok(Ok(org.to_string())),
        _ => Ok(Err(stop("AccountInfo organization name not set yet"))),
    }
}

/// `WorkspaceSubroutine`: the Account's Workspace, named like it, of the organisation's type for
/// its account type, owned by the Account.
pub struct WorkspaceStep;

#[async_trait::async_trait]
impl Subroutine<AccountContext, AccountError> for WorkspaceStep {
    fn name(&self) -> &'static str {
        "WorkspaceSubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[WORKSPACE_FINALIZER]
    }

    async fn process(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        let type_name = if ctx.is_org() {
            workspace_type_name(ctx.name(), "org")
        } else {
            match organisation_of_parent(ctx).await? {
                Ok(org) => workspace_type_name(&org, ctx.account_type()),
                Err(step) => return Ok(step),
            }
        };
        let wst = ctx
            .api_at(ORGS_PATH, &workspace_types())?
            .get_opt(&type_name)
            .await
            .map_err(|e| {
                AccountError::kube(format!("getting WorkspaceType {ORGS_PATH}:{type_name}"), e)
            })?;
        if !wst.is_some_and(|t| condition_true(&t.data, "Ready")) {
            return Ok(stop("Workspace type not ready yet"));
        }
        let name = ctx.name();
        let uid = ctx.account.metadata.uid.clone().unwrap_or_default();
        let owner = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
            "name": name, "uid": uid});
        let owner_ref: OwnerReference =
            serde_json::from_value(owner.clone()).map_err(AccountError::OwnerReference)?;
        let wanted_type = json!({"name": type_name, "path": ORGS_PATH});
        let same_type = |ws: &DynamicObject| ws.data["spec"]["type"]["name"] == wanted_type["name"];
        let ws = ensure(
            &ctx.api(&workspaces()),
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                   "metadata": {"name": name, "ownerReferences": [owner]},
                   "spec": {"type": wanted_type}}),
            // An existing workspace of this type gets the owner reference it lacks.
            |stored| {
                let refs = stored
                    .metadata
                    .owner_references
                    .as_deref()
                    .unwrap_or_default();
                (same_type(stored) && !refs.iter().any(|r| r.uid == uid)).then(|| {
                    let mut updated = stored.clone();
                    updated
                        .metadata
                        .owner_references
                        .get_or_insert_with(Vec::new)
                        .push(owner_ref.clone());
                    updated
                })
            },
        )
        .await?;
        if !same_type(&ws) {
            let have = &ws.data["spec"]["type"];
            return Err(AccountError::WorkspaceType {
                name: name.to_string(),
                have: format!(
                    "{}:{}",
                    have["path"].as_str().unwrap_or("root"),
                    have["name"].as_str().unwrap_or("")
                ),
                wanted: format!("{ORGS_PATH}:{type_name}"),
            });
        }
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        let api = ctx.api(&workspaces());
        let name = ctx.name();
        let ws = match api.get_opt(name).await {
            Ok(ws) => ws,
            // The kind is not served (any more): nothing to wait for.
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => return Err(AccountError::kube(format!("getting Workspace {name}"), e)),
        };
        let Some(ws) = ws else {
            return Ok(Step::done());
        };
        if ws.metadata.deletion_timestamp.is_none() {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Step::done()),
                Err(e) => return Err(AccountError::kube(format!("deleting Workspace {name}"), e)),
            }
        }
        Ok(stop("Waiting for Workspace deletion"))
    }
}

/// The Account's Workspace, for the steps after it; an error when missing (the workspace step
/// before made it).
async fn account_workspace(ctx: &AccountContext) -> Result<DynamicObject, AccountError> {
    ctx.api(&workspaces())
        .get(ctx.name())
        .await
        .map_err(AccountError::Workspace)
}

/// Where an account is: `path` and `url` from its Workspace's URL.
fn location(ctx: &AccountContext, ws: &DynamicObject) -> Result<Value, AccountError> {
    let url = ws.data["spec"]["URL"].as_str().unwrap_or("");
    if url.is_empty() {
        return Err(AccountError::WorkspaceUrl("empty"));
    }
    let parts: Vec<&str> = url.split('/').collect();
    if parts.len() < 3 {
        return Err(AccountError::WorkspaceUrl("invalid"));
    }
    let path = parts.last().copied().unwrap_or("").trim();
    if path.is_empty() {
        return Err(AccountError::WorkspaceUrl("empty"));
    }
    Ok(json!({
        "name": ctx.name(),
        "generatedClusterId": ws.data["spec"]["cluster"].as_str().unwrap_or(""),
        "originClusterId": ctx.cluster,
        "path": path,
        "url": url,
        "type": ctx.account_type(),
    }))
}

/// `ManageAccountInfoSubroutine`: AccountInfo `account` in the new workspace, once the
/// workspace is initializing or ready.
pub struct ManageAccountInfo;

#[async_trait::async_trait]
impl Subroutine<AccountContext, AccountError> for ManageAccountInfo {
    fn name(&self) -> &'static str {
        "ManageAccountInfoSubroutine"
    }

    async fn process(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        let ws = account_workspace(ctx).await?;
        let phase = ws.data["status"]["phase"].as_str().unwrap_or("");
        if phase != "Initializing" && phase != "Ready" {
            return Ok(Step::stop("Workspace not ready yet", INFO_WAIT));
        }
        let me = location(ctx, &ws)?;
        let cluster = ws.data["spec"]["cluster"].as_str().unwrap_or("");
        if cluster.is_empty() {
            return Err(AccountError::NoLogicalCluster);
        }
        // The fields this step owns, set (or removed when None); the FGA store and OIDC
        // settings of an organisation are others' to write and kept as found.
        let mut owned: Vec<(&str, Option<Value>)> = vec![
            ("account", Some(me.clone())),
            ("clusterInfo", Some(json!({"ca": ctx.kcp.ca_pem}))),
        ];
        if ctx.is_org() {
            owned.push(("organization", Some(me)));
            owned.push(("parentAccount", None));
        } else {
            let parent = ctx
                .api(&account_infos())
                .get_opt(INFO_NAME)
                .await
                .map_err(|e| AccountError::kube("getting parent AccountInfo", e))?;
            let Some(parent) = parent else {
                return Ok(Step::stop(
                    "Parent AccountInfo does not exist yet",
                    INFO_WAIT,
                ));
            };
            let p = &parent.data["spec"];
            owned.push(("parentAccount", Some(p["account"].clone())));
            owned.push(("organization", Some(p["organization"].clone())));
            let store = p["fga"]["store"]["id"].as_str().unwrap_or("");
            owned.push(("fga", Some(json!({"store": {"id": store}}))));
            owned.push(("oidc", p.get("oidc").filter(|o| !o.is_null()).cloned()));
        }
        let apply = |spec: &mut Value| {
            if !spec.is_object() {
                *spec = json!({});
            }
            for (k, v) in &owned {
                match v {
                    Some(v) => spec[*k] = v.clone(),
                    None => {
                        if let Some(m) = spec.as_object_mut() {
                            m.remove(*k);
                        }
                    }
                }
            }
            // Required by the schema; an organisation's store id is written later by others.
            if spec["fga"]["store"]["id"].as_str().is_none() {
                spec["fga"] = json!({"store": {"id": ""}});
            }
        };
        let mut spec = json!({});
        apply(&mut spec);
        // The new workspace is engaged once its binding of the export is ready (kcp binds it
        // while the workspace initializes).
        let Some(infos) = ctx.api_in(cluster, &account_infos()) else {
            return Ok(Step::stop(
                "Account workspace not reachable through the export yet",
                INFO_WAIT,
            ));
        };
        ensure(
            &infos,
            json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "AccountInfo",
                   "metadata": {"name": INFO_NAME}, "spec": spec}),
            |stored| {
                let mut updated = stored.clone();
                apply(&mut updated.data["spec"]);
                (updated.data != stored.data).then_some(updated)
            },
        )
        .await
        .map_err(|source| AccountError::EnsureIn {
            context: "creating or updating AccountInfo".into(),
            source: Box::new(source),
        })?;
        Ok(Step::done())
    }
}

/// `WorkspaceReadySubroutine`: Ready only when the workspace is.
pub struct WorkspaceReady;

#[async_trait::async_trait]
impl Subroutine<AccountContext, AccountError> for WorkspaceReady {
    fn name(&self) -> &'static str {
        "WorkspaceReadySubroutine"
    }

    async fn process(&self, ctx: &AccountContext) -> Result<Step, AccountError> {
        let ws = account_workspace(ctx).await?;
        if ws.data["status"]["phase"] != "Ready" {
            return Ok(stop("Workspace not ready yet"));
        }
        Ok(Step::done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_organisation_types_extend_the_base_types() {
        let org = workspace_type_spec("acme", "org");
        assert_eq!(
            org["extend"]["with"][0],
            json!({"name": "org", "path": "root"})
        );
        assert_eq!(
            org["limitAllowedParents"],
            json!({"types": [{"name": "orgs", "path": "root"}]})
        );
        assert_eq!(
            org["defaultChildWorkspaceType"],
            json!({"name": "acme-account", "path": "root:orgs"})
        );
        let account = workspace_type_spec("acme", "account");
        assert_eq!(
            account["limitAllowedParents"],
            json!({"types": [{"name": "acme-org", "path": "root:orgs"},
                             {"name": "acme-account", "path": "root:orgs"}]})
        );
        assert_eq!(
            account["limitAllowedChildren"],
            json!({"types": [{"name": "acme-account", "path": "root:orgs"}]})
        );
        assert_eq!(workspace_type_name("acme", "trial"), "acme-trial");
    }
}
