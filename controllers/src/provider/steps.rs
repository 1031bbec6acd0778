//! The two steps of a Provider.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::config::KubeConfigOptions;
use serde_json::json;

use super::{ensure, phase, secret_text, stop, ProviderContext, ProviderReconcileError};
use crate::kcp::workspaces;
use crate::kubeconfigs::{to_text, token_kubeconfig};
use crate::objects::api_resource;
use crate::subroutines::{Step, Subroutine};

/// Held until the provider workspace is deleted.
pub const WORKSPACE_FINALIZER: &str = "providers.platform-mesh.io/provider-workspace";
/// Held until the ServiceAccount, its binding and token and the kubeconfig Secret are deleted.
pub const KUBECONFIG_FINALIZER: &str = "providers.platform-mesh.io/scoped-kubeconfig";
/// The parent of every provider workspace.
pub const PROVIDERS_PATH: &str = "root:providers";

fn core(kind: &str, plural: &str) -> kube::api::ApiResource {
    api_resource("", "v1", kind, plural)
}

fn rbac(kind: &str, plural: &str) -> kube::api::ApiResource {
    api_resource("rbac.authorization.k8s.io", "v1", kind, plural)
}

/// The provider workspace in `root:providers`, if it exists.
async fn provider_workspace(
    ctx: &ProviderContext,
) -> Result<Option<DynamicObject>, ProviderReconcileError> {
    let name = ctx.workspace_name();
    Api::<DynamicObject>::all_with(ctx.kcp.workspace(PROVIDERS_PATH), &workspaces())
        .get_opt(&name)
        .await
        .map_err(|e| {
            ProviderReconcileError::kube(format!("getting Workspace {PROVIDERS_PATH}:{name}"), e)
        })
}

/// `ProviderWorkspaceSubroutine`: workspace `<name>-<cluster>` of type `provider` under
/// `root:providers`.
pub struct ProviderWorkspace;

#[async_trait::async_trait]
impl Subroutine<ProviderContext, ProviderReconcileError> for ProviderWorkspace {
    fn name(&self) -> &'static str {
        "ProviderWorkspaceSubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[WORKSPACE_FINALIZER]
    }

    async fn process(&self, ctx: &ProviderContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.start_phase(phase::PENDING);
        let name = ctx.workspace_name();
        let api = Api::<DynamicObject>::all_with(ctx.kcp.workspace(PROVIDERS_PATH), &workspaces());
        let ws = ensure(
            &api,
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                   "metadata": {"name": name}, "spec": {"type": {"name": "provider", "path": "root"}}}),
            |_| None,
        )
        .await?;
        let have = ws.data["spec"]["type"]["name"].as_str().unwrap_or("");
        if have != "provider" {
            return Err(ProviderReconcileError::WorkspaceType {
                name,
                have: have.to_string(),
            });
        }
        if ws.data["status"]["phase"] != "Ready" {
            ctx.status.set_phase(phase::PROVISIONING_WORKSPACE);
            return Ok(stop("Waiting for the provider workspace to be ready"));
        }
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &ProviderContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.set_phase(phase::DELETING);
        let name = ctx.workspace_name();
        let api = Api::<DynamicObject>::all_with(ctx.kcp.workspace(PROVIDERS_PATH), &workspaces());
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(stop("Waiting for provider workspace to be deleted")),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Step::done()),
            Err(e) => Err(ProviderReconcileError::kube(
                format!("deleting Workspace {PROVIDERS_PATH}:{name}"),
                e,
            )),
        }
    }
}

/// Names of the objects in the provider workspace.
fn service_account_name(ctx: &ProviderContext) -> String {
    format!("{}-provider", ctx.name())
}

fn token_secret_name(ctx: &ProviderContext) -> String {
    format!("{}-provider-token", ctx.name())
}

/// Where the kubeconfig Secret goes in the Provider's workspace: `spec.providerKubeconfigSecret`
/// or `<name>-provider-kubeconfig` in `default` under key `kubeconfig`.
pub fn target_secret(provider: &DynamicObject) -> (String, String, String) {
    let name = provider.metadata.name.as_deref().unwrap_or_default();
    let s = &provider.data["spec"]["providerKubeconfigSecret"];
    let field = |k: &str, default: String| {
        s[k].as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .unwrap_or(default)
    };
    (
        field("name", format!("{name}-provider-kubeconfig")),
        field("namespace", "default".into()),
        field("key", "kubeconfig".into()),
    )
}

/// Whether a kubeconfig authenticates and reaches its workspace, tried at `reachable` (the
/// controller's own address of kcp; a host override may be one only clients can reach).
/// Why a kubeconfig does not work (yet).
#[derive(Debug, thiserror::Error)]
enum KubeconfigCheck {
    #[error("decoding the kubeconfig: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("{0}")]
    Load(#[source] kube::config::KubeconfigError),
    #[error("{0}")]
    Client(#[source] kube::Error),
}

async fn kubeconfig_works(text: &str, reachable: &str) -> Result<(), KubeconfigCheck> {
    let mut kc: kube::config::Kubeconfig =
        serde_json::from_str(text).map_err(KubeconfigCheck::Decode)?;
    for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        c.server = Some(reachable.to_string());
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(KubeconfigCheck::Load)?;
    let client = kube::Client::try_from(config).map_err(KubeconfigCheck::Client)?;
    Api::<Namespace>::all(client)
        .get("default")
        .await
        .map(|_| ())
        .map_err(KubeconfigCheck::Client)
}

/// `ScopedKubeconfigSubroutine`: in the provider workspace a ServiceAccount bound to
/// `cluster-admin` and its token Secret; the kubeconfig built from them, in the Provider's
/// workspace.
pub struct ScopedKubeconfig;

#[async_trait::async_trait]
impl Subroutine<ProviderContext, ProviderReconcileError> for ScopedKubeconfig {
    fn name(&self) -> &'static str {
        "ScopedKubeconfigSubroutine"
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[KUBECONFIG_FINALIZER]
    }

    async fn process(&self, ctx: &ProviderContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.set_phase(phase::PROVISIONING_KUBECONFIG);
        let Some(ws) = provider_workspace(ctx)
            .await?
            .filter(|w| w.data["status"]["phase"] == "Ready")
        else {
            ctx.status.set_phase(phase::PROVISIONING_WORKSPACE);
            return Ok(stop("Waiting for the provider workspace to be ready"));
        };
        let cluster = ws.data["spec"]["cluster"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let inside = ctx.kcp.workspace(&cluster);
        let sa = service_account_name(ctx);
        let token = token_secret_name(ctx);
        let at = |ar: &kube::api::ApiResource, ns: Option<&str>| match ns {
            Some(ns) => Api::<DynamicObject>::namespaced_with(inside.clone(), ns, ar),
            None => Api::<DynamicObject>::all_with(inside.clone(), ar),
        };
        ensure(
            &at(&core("Namespace", "namespaces"), None),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}),
            |_| None,
        )
        .await?;
        ensure(
            &at(&core("ServiceAccount", "serviceaccounts"), Some("default")),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": "default"}}),
            |_| None,
        )
        .await?;
        // `cluster-admin` is one of the roles every workspace shares, on kcp and on this server.
        let role_ref = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"});
        let subjects = json!([{"kind": "ServiceAccount", "name": sa, "namespace": "default"}]);
        ensure(
            &at(&rbac("ClusterRoleBinding", "clusterrolebindings"), None),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": sa}, "roleRef": role_ref, "subjects": subjects}),
            |stored| {
                (stored.data["subjects"] != subjects).then(|| {
                    let mut s = stored.clone();
                    s.data["subjects"] = subjects.clone();
                    s
                })
            },
        )
        .await?;
        let secret = ensure(
            &at(&core("Secret", "secrets"), Some("default")),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                   "metadata": {"name": token, "namespace": "default",
                                "annotations": {"kubernetes.io/service-account.name": sa}}}),
            |_| None,
        )
        .await?;
        let (Some(bearer), Some(ca)) = (
            secret_text(&secret.data["data"], "token"),
            secret_text(&secret.data["data"], "ca.crt"),
        ) else {
            return Ok(stop("waiting for SA token to be populated"));
        };
        let host = ctx.provider.data["spec"]["hostOverride"]
            .as_str()
            .filter(|h| !h.is_empty())
            .unwrap_or(&ctx.kcp.url)
            .trim_end_matches('/')
            .to_string();
        let text = to_text(&token_kubeconfig(
            &format!("{host}/clusters/{cluster}"),
            &ca,
            &bearer,
        ))
        .map_err(ProviderReconcileError::EncodeKubeconfig)?;
        let reachable = format!("{}/clusters/{cluster}", ctx.kcp.url.trim_end_matches('/'));
        if let Err(e) = kubeconfig_works(&text, &reachable).await {
            return Ok(stop(format!("the kubeconfig does not work yet: {e}")));
        }
        let (name, namespace, key) = target_secret(&ctx.provider);
        let user = |ar: &kube::api::ApiResource, ns: Option<&str>| match ns {
            Some(ns) => Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, ar),
            None => Api::<DynamicObject>::all_with(ctx.client.clone(), ar),
        };
        ensure(
            &user(&core("Namespace", "namespaces"), None),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            |_| None,
        )
        .await?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(&text);
        let data = json!({ key.clone(): encoded });
        ensure(
            &user(&core("Secret", "secrets"), Some(&namespace)),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
                   "data": data}),
            |stored| {
                (stored.data["data"] != data).then(|| {
                    let mut s = stored.clone();
                    s.data["data"] = data.clone();
                    s
                })
            },
        )
        .await?;
        ctx.status.set(
            "providerKubeconfigSecretRef",
            json!({"name": name, "namespace": namespace}),
        );
        ctx.status.set_phase(phase::READY);
        Ok(Step::done())
    }

    async fn finalize(&self, ctx: &ProviderContext) -> Result<Step, ProviderReconcileError> {
        ctx.status.set_phase(phase::DELETING);
        if let Some(ws) = provider_workspace(ctx).await? {
            let cluster = ws.data["spec"]["cluster"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let inside = ctx.kcp.workspace(&cluster);
            let deletes = [
                (
                    rbac("ClusterRoleBinding", "clusterrolebindings"),
                    None,
                    service_account_name(ctx),
                ),
                (
                    core("Secret", "secrets"),
                    Some("default"),
                    token_secret_name(ctx),
                ),
                (
                    core("ServiceAccount", "serviceaccounts"),
                    Some("default"),
                    service_account_name(ctx),
                ),
            ];
            for (ar, ns, name) in deletes {
                let api = match ns {
                    Some(ns) => Api::<DynamicObject>::namespaced_with(inside.clone(), ns, &ar),
                    None => Api::<DynamicObject>::all_with(inside.clone(), &ar),
                };
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {}
                    Err(e) => {
                        return Err(ProviderReconcileError::kube(
                            format!("deleting {} {name}", ar.kind),
                            e,
                        ))
                    }
                }
            }
        }
        let reference = ctx.status.get("providerKubeconfigSecretRef");
        if let (Some(name), Some(ns)) =
            (reference["name"].as_str(), reference["namespace"].as_str())
        {
            let api = Api::<DynamicObject>::namespaced_with(
                ctx.client.clone(),
                ns,
                &core("Secret", "secrets"),
            );
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(ProviderReconcileError::kube(
                        format!("deleting Secret {ns}/{name}"),
                        e,
                    ))
                }
            }
        }
        Ok(Step::done())
    }
}
