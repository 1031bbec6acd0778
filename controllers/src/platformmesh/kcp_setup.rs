//! The kcp side of a PlatformMesh: `KcpsetupSubroutine`, which applies
//! `manifests/kcp` workspace by workspace and creates `spec.kcp.extraWorkspaces`.
//!
//! Differences from upstream, on purpose: a root APIExport that kcp does not serve (as
//! `platform-mesh serve` serves no `tenancy.kcp.io` export) gives an empty identity hash instead
//! of an error; a workspace directory waits for the Workspace in its parent (upstream looks in
//! `root` whatever the depth); an existing Workspace is left as it is (its type is immutable);
//! nothing is written when every object is already as rendered; on a kcp that serves Account
//! and AccountInfo itself (`platform-mesh serve`) the core export leaves them out (see
//! [`NATIVE_ACCOUNTS`]); the security WorkspaceType's terminator is left out where the kcp
//! would refuse it (kcp v0.28, see [`WORKSPACE_TYPE_TERMINATORS`]).

use std::time::Duration;

use kube::api::{Api, DynamicObject};
use serde_json::{json, Value};

use super::apply::{sync, Policy, Target};
use super::controller::PlatformMeshError;
use super::deployment::Context;
use super::manifests::{
    kcp_data, plan, Stage, NATIVE_ACCOUNTS, ROOT_EXPORT_HASHES, WORKSPACE_AUTHENTICATION,
    WORKSPACE_TYPE_TERMINATORS,
};
use super::vars::Render;
use crate::kcp::{serves_workspace_authentication, Kcp};
use crate::objects::api_resource;
use crate::subroutines::{Step, Subroutine};

/// How KcpSetup writes: upstream's field manager; Workspaces only created.
pub const KCP_SETUP_POLICY: Policy = Policy {
    field_manager: "platform-mesh-operator",
    prune: false,
    create_only: &["tenancy.kcp.io/Workspace"],
};

/// How long a workspace directory waits for its Workspace to be Ready in one reconcile.
const WORKSPACE_WAIT: Duration = Duration::from_secs(15);

/// Whether Workspace `name` in `parent` is Ready; `Ok(false)` while it is not (or not there).
async fn workspace_ready(kcp: &Kcp, parent: &str, name: &str) -> Result<bool, String> {
    let api: Api<DynamicObject> = Api::all_with(
        kcp.workspace(parent),
        &api_resource("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces"),
    );
    let ws = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading Workspace {parent}:{name}: {e}"))?;
    Ok(ws.is_some_and(|w| w.data["status"]["phase"] == "Ready"))
}

/// Applies `stages` in order (waiting for each stage's Workspace); objects carry `owner` in
/// their deployed-by label. `Ok(None)` when all were applied, `Ok(Some(step))` when a workspace
/// is not Ready in time.
pub async fn apply_stages(
    kcp: &Kcp,
    stages: &[Stage],
    owner: &str,
    policy: Policy,
) -> Result<Option<Step>, String> {
    for stage in stages {
        if let Some((parent, name)) = &stage.awaits {
            let deadline = tokio::time::Instant::now() + WORKSPACE_WAIT;
            while !workspace_ready(kcp, parent, name).await? {
                if tokio::time::Instant::now() >= deadline {
                    return Ok(Some(Step::Stop {
                        message: format!("workspace {parent}:{name} is not Ready yet"),
                        after: Some(Duration::from_secs(5)),
                    }));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let client = kcp.workspace(&stage.workspace);
        let objects: Vec<Value> = stage.objects.iter().map(|p| p.object.clone()).collect();
        sync(
            &Target {
                client: &client,
                owner,
                default_namespace: "default",
                annotations: &[],
                policy,
            },
            &objects,
            &[],
        )
        .await
        .map_err(|e| format!("workspace {}: {e}", stage.workspace))?;
    }
    Ok(None)
}

/// The identity hashes of root's kcp APIExports, empty for those kcp does not serve.
pub async fn root_identity_hashes(kcp: &Kcp) -> Result<Vec<(&'static str, String)>, String> {
    let api: Api<DynamicObject> = Api::all_with(
        kcp.workspace("root"),
        &api_resource("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
    );
    let mut out = Vec::new();
    for (export, key) in ROOT_EXPORT_HASHES {
        let hash = api
            .get_opt(export)
            .await
            .map_err(|e| format!("reading APIExport root:{export}: {e}"))?
            .and_then(|e| {
                e.data["status"]["identityHash"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default();
        out.push((*key, hash));
    }
    Ok(out)
}

/// Whether the kcp serves `core.platform-mesh.io/v1alpha1` Accounts in root without any binding
/// (`platform-mesh serve` serves them in every workspace; a kcp only through the core export).
pub async fn serves_accounts(kcp: &Kcp) -> Result<bool, String> {
    match kcp
        .workspace("root")
        .list_api_group_resources("core.platform-mesh.io/v1alpha1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "accounts")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(format!(
            "discovering core.platform-mesh.io/v1alpha1 in root: {e}"
        )),
    }
}

/// Whether the kcp stores `spec.terminator` of WorkspaceTypes, from its OpenAPI document of
/// `tenancy.kcp.io/v1alpha1` in root; `false` when it does not show us that document.
pub async fn stores_workspace_type_terminators(kcp: &Kcp) -> Result<bool, String> {
    let request = http::Request::get("/openapi/v3/apis/tenancy.kcp.io/v1alpha1")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match kcp.workspace("root").request::<Value>(request).await {
        Ok(doc) => Ok(workspace_type_spec_keeps(&doc, "terminator")),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Ok(false),
        Err(e) => Err(format!(
            "reading the OpenAPI document of tenancy.kcp.io/v1alpha1 in root: {e}"
        )),
    }
}

/// The client ids of the `welcome` realm, from `status.managedClients` of the welcome
/// IdentityProviderConfiguration in `root:platform-mesh-system` (none before the identity
/// provider has made them, or before the workspace exists).
pub async fn welcome_audiences(kcp: &Kcp) -> Result<Vec<String>, String> {
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        kcp.workspace("root:platform-mesh-system"),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "core.platform-mesh.io",
                "v1alpha1",
                "IdentityProviderConfiguration",
            ),
            "identityproviderconfigurations",
        ),
    );
    match api.get_opt("welcome").await {
        Ok(Some(ipc)) => Ok(ipc.data["status"]["managedClients"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, c)| c["clientId"].as_str().map(str::to_string))
            .collect()),
        Ok(None) => Ok(Vec::new()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Ok(Vec::new()),
        Err(e) => Err(format!(
            "reading IdentityProviderConfiguration welcome in root:platform-mesh-system: {e}"
        )),
    }
}

/// Whether the WorkspaceType schema of an OpenAPI v3 document declares `spec.<field>` or keeps
/// unknown spec fields.
fn workspace_type_spec_keeps(doc: &Value, field: &str) -> bool {
    let Some(schemas) = doc["components"]["schemas"].as_object() else {
        return false;
    };
    schemas
        .iter()
        .filter(|(name, _)| name.ends_with(".WorkspaceType"))
        .any(|(_, schema)| {
            let spec = &schema["properties"]["spec"];
            spec["properties"][field].is_object()
                || spec["x-kubernetes-preserve-unknown-fields"] == true
        })
}

/// The step result when no kcp is configured.
pub fn no_kcp() -> Step {
    Step::Skip {
        message: "no kcp configured".into(),
    }
}

/// The KcpSetup step.
pub struct KcpSetup {
    /// The template engine.
    pub engine: std::sync::Arc<dyn Render + Send + Sync>,
}

/// The condition type of the KcpSetup step.
pub const KCP_SETUP: &str = "KcpsetupSubroutine";

/// The finalizer of a PlatformMesh (one for every step that cleans up).
pub const FINALIZER: &str = "platform-mesh.core.platform-mesh.io/finalizer";

/// Label value marking what KcpSetup applied for the PlatformMesh with `uid`.
pub fn kcp_owner(uid: &str) -> String {
    format!("kcp-setup.{uid}")
}

#[async_trait::async_trait]
impl Subroutine<Context, PlatformMeshError> for KcpSetup {
    fn name(&self) -> &'static str {
        KCP_SETUP
    }

    async fn process(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let Some(kcp) = ctx.clusters.kcp.as_ref() else {
            return Ok(no_kcp());
        };
        // Upstream's gate: kcp-operator's RootShard and FrontProxy Available first.
        if let Some(waiting) = super::gates::kcp_operator_waiting(&ctx.clusters).await {
            return Ok(Step::stop(waiting, super::gates::RECHECK));
        }
        let mut facts = root_identity_hashes(kcp).await?;
        facts.push((NATIVE_ACCOUNTS, serves_accounts(kcp).await?.to_string()));
        facts.push((
            WORKSPACE_TYPE_TERMINATORS,
            stores_workspace_type_terminators(kcp).await?.to_string(),
        ));
        facts.push((
            WORKSPACE_AUTHENTICATION,
            serves_workspace_authentication(kcp, "root")
                .await?
                .to_string(),
        ));
        let mut idp = kcp.idp.clone();
        idp.welcome_audiences = welcome_audiences(kcp).await?;
        let data = kcp_data(ctx.namespace(), &ctx.spec, &idp, &facts);
        let stages =
            plan(self.engine.as_ref(), "kcp", &data, &ctx.spec).map_err(|e| e.to_string())?;
        let owner = kcp_owner(ctx.uid());
        if let Some(step) = apply_stages(kcp, &stages, &owner, KCP_SETUP_POLICY).await? {
            return Ok(step);
        }
        let mut skipped = Vec::new();
        let mut created = 0;
        for ws in ctx
            .spec
            .kcp
            .as_ref()
            .and_then(|k| k.extra_workspaces.as_ref())
            .into_iter()
            .flatten()
        {
            let Some((parent, name)) = ws.path.rsplit_once(':') else {
                skipped.push(ws.path.clone());
                continue;
            };
            let object = json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name},
                "spec": {"type": {"name": ws.type_.name, "path": ws.type_.path}},
            });
            sync(
                &Target {
                    client: &kcp.workspace(parent),
                    owner: &owner,
                    default_namespace: "default",
                    annotations: &[],
                    policy: KCP_SETUP_POLICY,
                },
                &[object],
                &[],
            )
            .await
            .map_err(|e| format!("extra workspace {}: {e}", ws.path))?;
            created += 1;
        }
        let objects: usize = stages.iter().map(|s| s.objects.len()).sum();
        let mut message = format!("{objects} objects in kcp; {created} extra workspaces");
        if !skipped.is_empty() {
            message.push_str(&format!(
                "; skipped extra workspaces without a parent (path must be <parent>:<name>): {}",
                skipped.join(", ")
            ));
        }
        Ok(Step::Done {
            message,
            requeue: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminators_are_kept_where_the_schema_declares_them_or_is_open() {
        let doc = |spec: Value| {
            json!({"components": {"schemas": {
                "io.kcp.tenancy.v1alpha1.Workspace": {"properties": {"spec": {"type": "object"}}},
                "io.kcp.tenancy.v1alpha1.WorkspaceType": {"properties": {"spec": spec}},
            }}})
        };
        let declared = doc(json!({"properties": {"terminator": {"type": "boolean"}}}));
        assert!(workspace_type_spec_keeps(&declared, "terminator"));
        let open = doc(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        assert!(workspace_type_spec_keeps(&open, "terminator"));
        let v0_28 = doc(json!({"properties": {"initializer": {"type": "boolean"}}}));
        assert!(!workspace_type_spec_keeps(&v0_28, "terminator"));
        assert!(workspace_type_spec_keeps(&v0_28, "initializer"));
        assert!(!workspace_type_spec_keeps(&json!({}), "terminator"));
    }
}
