//! `ProvidersecretSubroutine`: a kubeconfig Secret in the runtime cluster for every provider
//! connection of a PlatformMesh.
//!
//! Admin connections get the controller's own kcp credentials pointed at the connection's
//! workspace (or raw path, or the URL of an APIExportEndpointSlice). Scoped connections get a
//! ServiceAccount in the connection's workspace, a ClusterRole derived from the APIExport (its
//! resources, their status, its permission claims, its content, its endpoint slices and
//! bindings, discovery), bindings to that role and to `system:kcp:workspace:access`, and a
//! token for it.
//!
//! Differences from upstream, on purpose: a scoped token is reused while it has more than half of
//! its life left and its ServiceAccount is the same (upstream asks for a new one on every
//! reconcile, so every reconcile rewrites every Secret); a slice without endpoints keeps the step
//! Pending instead of silently skipping the Secret; an external connection without
//! `spec.exposure.baseDomain` is an error (upstream dereferences nil); Secrets of connections
//! that were removed are deleted, and on deletion of the PlatformMesh every Secret, ServiceAccount,
//! ClusterRole and binding this step made is removed.

use std::time::Duration;

use api::core::{PlatformMeshSpec, ProviderConnection};
use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, PostParams};
use kube::config::Kubeconfig;
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use super::apply::{sync, Policy, Target};
use super::controller::PlatformMeshError;
use super::deployment::Context;
use super::kcp_setup::{no_kcp, FINALIZER};
use super::manifests::{has_toggle, ENABLE_TERMINAL};
use crate::cluster_providers::kcp::endpoint_urls;
use crate::kcp::Kcp;
use crate::kubeconfigs::{b64, to_text, token_kubeconfig};
use crate::objects::api_resource;
use crate::subroutines::{Step, Subroutine};

/// The condition type of the ProviderSecret step.
pub const PROVIDER_SECRET: &str = "ProvidersecretSubroutine";

/// Lifetime asked for scoped tokens (7 days, as upstream).
pub const TOKEN_SECONDS: i64 = 604_800;

/// How this step writes.
const POLICY: Policy = Policy {
    field_manager: "platform-mesh-provider-secret",
    prune: false,
    create_only: &["/Namespace"],
};

/// Label value marking what this step made for the PlatformMesh with `uid`.
pub fn secret_owner(uid: &str) -> String {
    format!("provider-secret.{uid}")
}

fn connection(
    secret: &str,
    path: Option<&str>,
    raw_path: Option<&str>,
    scoped_export: Option<&str>,
) -> ProviderConnection {
    ProviderConnection {
        secret: secret.into(),
        path: path.map(Into::into),
        raw_path: raw_path.map(Into::into),
        admin_auth: scoped_export.is_none().then_some(true),
        api_export_name: scoped_export.map(Into::into),
        ..Default::default()
    }
}

/// The connections used when the PlatformMesh names none.
pub fn default_connections() -> Vec<ProviderConnection> {
    const SYSTEM: &str = "root:platform-mesh-system";
    const CORE: &str = "core.platform-mesh.io";
    vec![
        connection("account-operator-kubeconfig", Some(SYSTEM), None, None),
        connection(
            "rebac-authz-webhook-kubeconfig",
            Some(SYSTEM),
            None,
            Some(CORE),
        ),
        connection("security-operator-kubeconfig", Some(SYSTEM), None, None),
        connection(
            "kubernetes-graphql-gateway-kubeconfig",
            Some(SYSTEM),
            None,
            None,
        ),
        connection(
            "virtual-workspace-clusteraccess-kubeconfig",
            None,
            Some("/services/marketplace"),
            None,
        ),
        connection(
            "extension-manager-operator-kubeconfig",
            Some(SYSTEM),
            None,
            Some(CORE),
        ),
        connection("iam-service-kubeconfig", Some(SYSTEM), None, Some(CORE)),
        connection(
            "portal-kubeconfig",
            Some("root:orgs"),
            Some("/services/contentconfigurations"),
            None,
        ),
        connection("security-initializer-kubeconfig", Some("root"), None, None),
        connection("security-terminator-kubeconfig", Some("root"), None, None),
        connection("virtual-workspaces-kubeconfig", Some(SYSTEM), None, None),
        connection("init-agent-kubeconfig", Some(SYSTEM), None, None),
    ]
}

/// The connections of a PlatformMesh: `providerConnections` (or the defaults) plus
/// `extraProviderConnections`, plus the terminal controller's while its toggle is on.
pub fn connections(spec: &PlatformMeshSpec) -> Vec<ProviderConnection> {
    let kcp = spec.kcp.as_ref();
    let mut out = kcp
        .and_then(|k| k.provider_connections.clone())
        .unwrap_or_else(default_connections);
    out.extend(
        kcp.and_then(|k| k.extra_provider_connections.clone())
            .unwrap_or_default(),
    );
    if has_toggle(spec, ENABLE_TERMINAL) {
        out.push(connection(
            "terminal-controller-manager-kubeconfig",
            Some("root:platform-mesh-system"),
            None,
            None,
        ));
    }
    out
}

/// The address a connection's kubeconfig points at before its path.
fn base(kcp: &Kcp, spec: &PlatformMeshSpec, c: &ProviderConnection) -> Result<String, String> {
    if !c.external.unwrap_or(false) {
        return Ok(kcp.url.trim_end_matches('/').to_string());
    }
    let exposure = spec.exposure.as_ref();
    let domain = exposure
        .and_then(|e| e.base_domain.as_deref())
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            format!(
                "connection {}: external needs spec.exposure.baseDomain",
                c.secret
            )
        })?;
    Ok(match exposure.and_then(|e| e.port).filter(|p| *p != 0) {
        Some(port) => format!("https://kcp.api.{domain}:{port}"),
        None => format!("https://kcp.api.{domain}"),
    })
}

/// Splits an endpoint URL into its path-and-query, refusing URLs without scheme, host or path.
pub fn endpoint_path(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("endpoint URL {url:?}: {e}"))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        return Err(format!("endpoint URL {url:?} has no scheme or host"));
    }
    let path = uri.path().trim_end_matches('/');
    if path.is_empty() {
        return Err(format!("endpoint URL {url:?} has no path"));
    }
    Ok(match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    })
}

/// The first endpoint of slice `name` in workspace `path`, and the slice; `Ok(None)` while it
/// has no endpoints.
async fn slice_endpoint(
    kcp: &Kcp,
    path: &str,
    name: &str,
) -> Result<Option<(String, Value)>, String> {
    let api: Api<DynamicObject> = Api::all_with(
        kcp.workspace(path),
        &api_resource(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
        ),
    );
    let slice = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading APIExportEndpointSlice {path}:{name}: {e}"))?
        .ok_or_else(|| format!("APIExportEndpointSlice {path}:{name} does not exist"))?;
    Ok(endpoint_urls(&slice.data)
        .into_iter()
        .next()
        .map(|u| (u, slice.data)))
}

/// The admin kubeconfig: the controller's kcp credentials with every server set to `server`
/// and the trust bundle inlined.
fn admin_kubeconfig(kcp: &Kcp, server: &str) -> Kubeconfig {
    let mut kc = kcp.kubeconfig.clone();
    for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        c.server = Some(server.to_string());
        c.certificate_authority = None;
        c.certificate_authority_data = (!kcp.ca_pem.is_empty()).then(|| b64(&kcp.ca_pem));
        c.insecure_skip_tls_verify = None;
    }
    kc
}

/// [`to_text`] for this module's text errors.
fn text(kc: &Kubeconfig) -> Result<String, String> {
    to_text(kc).map_err(|e| format!("encoding a kubeconfig: {e}"))
}

/// The claims of a JWT, unverified (only to decide whether to keep a token we issued).
fn claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The token of the existing Secret's kubeconfig, if it is still good for `sa_uid`: same
/// kubeconfig apart from the token, more than half of its life left.
fn reusable_token(
    existing: Option<&str>,
    server: &str,
    ca_pem: &str,
    sa_uid: &str,
) -> Option<String> {
    let text = existing?;
    // Our own output: JSON.
    let kc: Value = serde_json::from_str(text).ok()?;
    let token = kc.pointer("/users/0/user/token")?.as_str()?.to_string();
    if to_text(&token_kubeconfig(server, ca_pem, &token)).ok()? != text {
        return None;
    }
    let c = claims(&token)?;
    let uid = c
        .pointer("/kubernetes.io/serviceaccount/uid")
        .and_then(Value::as_str)?;
    let (iat, exp) = (c["iat"].as_i64()?, c["exp"].as_i64()?);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs() as i64;
    (uid == sa_uid && exp - now > (exp - iat) / 2).then_some(token)
}

/// The RBAC rules a scoped kubeconfig gets for APIExport `export` (v1alpha2 JSON).
pub fn scoped_rules(export_name: &str, export: &Value) -> Vec<Value> {
    let mut rules = Vec::new();
    for r in export["spec"]["resources"].as_array().into_iter().flatten() {
        let (group, name) = (
            r["group"].as_str().unwrap_or(""),
            r["name"].as_str().unwrap_or(""),
        );
        rules.push(json!({"apiGroups": [group], "resources": [name], "verbs": ["*"]}));
        rules.push(
            json!({"apiGroups": [group], "resources": [format!("{name}/status")],
            "verbs": ["get", "update", "patch"]}),
        );
    }
    for c in export["spec"]["permissionClaims"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let (group, resource) = (
            c["group"].as_str().unwrap_or(""),
            c["resource"].as_str().unwrap_or(""),
        );
        let verbs: Vec<String> = c["verbs"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .filter(|v: &Vec<String>| !v.is_empty())
            .unwrap_or_else(|| vec!["*".into()]);
        let writes_status = verbs
            .iter()
            .any(|v| v == "*" || v == "update" || v == "patch");
        rules.push(json!({"apiGroups": [group], "resources": [resource], "verbs": verbs}));
        if writes_status {
            rules.push(
                json!({"apiGroups": [group], "resources": [format!("{resource}/status")],
                "verbs": ["get", "update", "patch"]}),
            );
        }
    }
    rules.push(
        json!({"apiGroups": ["apis.kcp.io"], "resources": ["apiexports/content"],
        "resourceNames": [export_name], "verbs": ["*"]}),
    );
    rules.push(
        json!({"apiGroups": ["apis.kcp.io"], "resources": ["apiexportendpointslices"],
        "verbs": ["get", "list", "watch"]}),
    );
    rules.push(
        json!({"apiGroups": ["apis.kcp.io"], "resources": ["apibindings"],
        "verbs": ["get", "list", "watch"]}),
    );
    rules.push(
        json!({"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/clusters/*",
        "/services", "/services/*"], "verbs": ["get"]}),
    );
    rules
}

/// The objects a scoped connection needs in its workspace.
fn scoped_objects(secret: &str, rules: Vec<Value>) -> Vec<Value> {
    let name = format!("platform-mesh-provider-{secret}");
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": "default"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("platform-mesh-workspace-access-{secret}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "system:kcp:workspace:access"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}),
    ]
}

/// The kinds a scoped connection creates in its workspace (removed on deletion).
fn scoped_kinds() -> Vec<GroupVersionKind> {
    vec![
        GroupVersionKind::gvk("", "v1", "ServiceAccount"),
        GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
        GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ]
}

/// What a connection resolves to: its Secret's kubeconfig, or what it waits for.
enum Resolved {
    Kubeconfig(String),
    Waiting(String),
}

async fn existing_kubeconfig(runtime: &kube::Client, ns: &str, name: &str) -> Option<String> {
    let api: Api<Secret> = Api::namespaced(runtime.clone(), ns);
    let s = api.get_opt(name).await.ok()??;
    let bytes = s.data?.get("kubeconfig")?.0.clone();
    String::from_utf8(bytes).ok()
}

async fn resolve(
    ctx: &Context,
    kcp: &Kcp,
    c: &ProviderConnection,
    namespace: &str,
) -> Result<Resolved, String> {
    let base = base(kcp, &ctx.spec, c)?;
    let path = c.path.as_deref().filter(|p| !p.is_empty());
    let slice = c
        .endpoint_slice_name
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    if c.admin_auth.unwrap_or(false) {
        let url_path = match (slice, path) {
            (Some(slice), Some(path)) => match slice_endpoint(kcp, path, slice).await? {
                Some((url, _)) => endpoint_path(&url)?,
                None => {
                    return Ok(Resolved::Waiting(format!(
                        "APIExportEndpointSlice {path}:{slice} has no endpoints yet"
                    )))
                }
            },
            (Some(_), None) => {
                return Err(format!(
                    "connection {}: endpointSliceName needs path (the slice's workspace)",
                    c.secret
                ))
            }
            (None, _) => match (c.raw_path.as_deref().filter(|p| !p.is_empty()), path) {
                (Some(raw), _) => format!("/{}", raw.trim_start_matches('/')),
                (None, Some(path)) => format!("/clusters/{path}"),
                (None, None) => {
                    return Err(format!("connection {}: set path or rawPath", c.secret))
                }
            },
        };
        return Ok(Resolved::Kubeconfig(text(&admin_kubeconfig(
            kcp,
            &format!("{base}{url_path}"),
        ))?));
    }
    let path =
        path.ok_or_else(|| format!("connection {}: a scoped connection needs path", c.secret))?;
    let export_name = c
        .api_export_name
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let (server, export_path, export_name) = match (slice, export_name) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "connection {}: set only one of endpointSliceName and apiExportName",
                c.secret
            ))
        }
        (None, None) => {
            return Err(format!(
                "connection {}: a scoped connection requires endpointSliceName or apiExportName",
                c.secret
            ))
        }
        (Some(slice), None) => match slice_endpoint(kcp, path, slice).await? {
            None => {
                return Ok(Resolved::Waiting(format!(
                    "APIExportEndpointSlice {path}:{slice} has no endpoints yet"
                )))
            }
            Some((url, slice_obj)) => {
                let export = &slice_obj["spec"]["export"];
                let (name, export_path) = (
                    export["name"].as_str().unwrap_or(""),
                    export["path"].as_str().unwrap_or(path),
                );
                if name.is_empty() {
                    return Err(format!(
                        "APIExportEndpointSlice {path}:{slice} names no export"
                    ));
                }
                (
                    format!("{base}{}", endpoint_path(&url)?),
                    export_path.to_string(),
                    name.to_string(),
                )
            }
        },
        (None, Some(name)) => (
            format!("{base}/clusters/{path}"),
            path.to_string(),
            name.to_string(),
        ),
    };
    let exports: Api<DynamicObject> = Api::all_with(
        kcp.workspace(&export_path),
        &api_resource("apis.kcp.io", "v1alpha2", "APIExport", "apiexports"),
    );
    let Some(export) = exports
        .get_opt(&export_name)
        .await
        .map_err(|e| format!("reading APIExport {export_path}:{export_name}: {e}"))?
    else {
        return Ok(Resolved::Waiting(format!(
            "APIExport {export_path}:{export_name} does not exist yet"
        )));
    };
    let workspace = kcp.workspace(path);
    let owner = secret_owner(ctx.uid());
    sync(
        &Target {
            client: &workspace,
            owner: &owner,
            default_namespace: "default",
            annotations: &[],
            policy: POLICY,
        },
        &scoped_objects(&c.secret, scoped_rules(&export_name, &export.data)),
        &[],
    )
    .await
    .map_err(|e| format!("connection {} in {path}: {e}", c.secret))?;
    let sa_name = format!("platform-mesh-provider-{}", c.secret);
    let accounts: Api<ServiceAccount> = Api::namespaced(workspace, "default");
    let sa_uid = accounts
        .get(&sa_name)
        .await
        .map_err(|e| format!("reading ServiceAccount {path}:default/{sa_name}: {e}"))?
        .metadata
        .uid
        .unwrap_or_default();
    let existing = existing_kubeconfig(&ctx.clusters.runtime, namespace, &c.secret).await;
    let token = match reusable_token(existing.as_deref(), &server, &kcp.ca_pem, &sa_uid) {
        Some(t) => t,
        None => {
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(TOKEN_SECONDS),
                    audiences: vec![],
                    ..Default::default()
                },
                ..Default::default()
            };
            accounts
                .create_token_request(&sa_name, &PostParams::default(), &request)
                .await
                .map_err(|e| format!("token for ServiceAccount {path}:default/{sa_name}: {e}"))?
                .status
                .map(|s| s.token)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    format!("no token issued for ServiceAccount {path}:default/{sa_name}")
                })?
        }
    };
    Ok(Resolved::Kubeconfig(text(&token_kubeconfig(
        &server,
        &kcp.ca_pem,
        &token,
    ))?))
}

fn secret_kinds() -> Vec<GroupVersionKind> {
    vec![GroupVersionKind::gvk("", "v1", "Secret")]
}

/// The ProviderSecret step.
pub struct ProviderSecret;

#[async_trait::async_trait]
impl Subroutine<Context, PlatformMeshError> for ProviderSecret {
    fn name(&self) -> &'static str {
        PROVIDER_SECRET
    }

    fn finalizers(&self) -> &'static [&'static str] {
        &[FINALIZER]
    }

    async fn process(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let Some(kcp) = ctx.clusters.kcp.as_ref() else {
            return Ok(no_kcp());
        };
        // Upstream's gate: kcp-operator's RootShard and FrontProxy Available first.
        if let Some(waiting) = super::gates::kcp_operator_waiting(&ctx.clusters).await {
            return Ok(Step::stop(waiting, super::gates::RECHECK));
        }
        let mut secrets = Vec::new();
        let mut waiting = Vec::new();
        for c in connections(&ctx.spec) {
            let namespace = c
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| kcp.secret_namespace.clone());
            match resolve(ctx, kcp, &c, &namespace).await? {
                Resolved::Kubeconfig(text) => secrets.push(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": c.secret, "namespace": namespace},
                    "type": "Opaque",
                    "data": {"kubeconfig": b64(&text)},
                })),
                Resolved::Waiting(why) => waiting.push(format!("{}: {why}", c.secret)),
            }
        }
        let owner = secret_owner(ctx.uid());
        // While a connection waits, what an earlier reconcile wrote for it stays: no pruning.
        let policy = Policy {
            prune: waiting.is_empty(),
            ..POLICY
        };
        let outcome = sync(
            &Target {
                client: &ctx.clusters.runtime,
                owner: &owner,
                default_namespace: &kcp.secret_namespace,
                annotations: &[],
                policy,
            },
            &secrets,
            &secret_kinds(),
        )
        .await
        .map_err(|e| format!("runtime cluster: {e}"))?;
        if !outcome.applied.is_empty() || !outcome.pruned.is_empty() {
            tracing::info!(platformmesh = %ctx.name(), written = ?outcome.applied,
                removed = ?outcome.pruned, "provider kubeconfigs");
        }
        if !waiting.is_empty() {
            return Ok(Step::Pending {
                message: waiting.join("; "),
                after: Duration::from_secs(5),
            });
        }
        Ok(Step::Done {
            message: format!("{} kubeconfig Secrets", secrets.len()),
            requeue: None,
        })
    }

    async fn finalize(&self, ctx: &Context) -> Result<Step, PlatformMeshError> {
        let Some(kcp) = ctx.clusters.kcp.as_ref() else {
            return Ok(Step::done());
        };
        let owner = secret_owner(ctx.uid());
        let prune = Policy {
            prune: true,
            ..POLICY
        };
        sync(
            &Target {
                client: &ctx.clusters.runtime,
                owner: &owner,
                default_namespace: &kcp.secret_namespace,
                annotations: &[],
                policy: prune,
            },
            &[],
            &secret_kinds(),
        )
        .await
        .map_err(|e| format!("runtime cluster: {e}"))?;
        let mut paths: Vec<String> = connections(&ctx.spec)
            .into_iter()
            .filter(|c| !c.admin_auth.unwrap_or(false))
            .filter_map(|c| c.path)
            .collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let result = sync(
                &Target {
                    client: &kcp.workspace(&path),
                    owner: &owner,
                    default_namespace: "default",
                    annotations: &[],
                    policy: prune,
                },
                &[],
                &scoped_kinds(),
            )
            .await;
            match result {
                Ok(_) => {}
                // A workspace that is gone took its objects with it.
                Err(e) if e.to_string().contains("403") || e.to_string().contains("404") => {}
                Err(source) => {
                    return Err(PlatformMeshError::Deploy {
                        context: format!("workspace {path}"),
                        source,
                    })
                }
            }
        }
        Ok(Step::done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_lists_follow_the_spec() {
        let spec = |v: Value| -> PlatformMeshSpec { serde_json::from_value(v).unwrap() };
        assert_eq!(connections(&spec(json!({}))).len(), 12);
        let extra = json!({"secret": "x", "path": "root:orgs", "adminAuth": true});
        assert_eq!(
            connections(&spec(json!({"kcp": {"extraProviderConnections": [extra]}}))).len(),
            13
        );
        let own = json!({"secret": "y", "path": "root", "adminAuth": true});
        let both = connections(&spec(
            json!({"kcp": {"providerConnections": [own], "extraProviderConnections": [extra]}}),
        ));
        assert_eq!(
            both.iter().map(|c| c.secret.as_str()).collect::<Vec<_>>(),
            vec!["y", "x"]
        );
        let terminal = connections(&spec(
            json!({"featureToggles": [{"name": ENABLE_TERMINAL}]}),
        ));
        assert_eq!(
            terminal.last().unwrap().secret,
            "terminal-controller-manager-kubeconfig"
        );
    }

    #[test]
    fn endpoint_paths_keep_path_and_query() {
        assert_eq!(
            endpoint_path("https://shard:6443/services/apiexport/abc/x.io/").unwrap(),
            "/services/apiexport/abc/x.io"
        );
        assert_eq!(
            endpoint_path("https://shard/services/x?a=b").unwrap(),
            "/services/x?a=b"
        );
        assert!(endpoint_path("https://shard/").is_err());
        assert!(endpoint_path("/services/x").is_err());
    }

    #[test]
    fn scoped_rules_follow_the_export() {
        let export = json!({"spec": {
            "resources": [{"group": "widgets.example.io", "name": "widgets"}],
            "permissionClaims": [
                {"group": "", "resource": "configmaps", "verbs": ["get", "list"]},
                {"group": "", "resource": "secrets"}]}});
        let rules = scoped_rules("widgets.example.io", &export);
        assert_eq!(rules[0]["resources"], json!(["widgets"]));
        assert_eq!(rules[1]["resources"], json!(["widgets/status"]));
        assert_eq!(rules[2]["verbs"], json!(["get", "list"]));
        // Read-only claims get no status rule; `*` claims do.
        assert_eq!(rules[3]["resources"], json!(["secrets"]));
        assert_eq!(rules[4]["resources"], json!(["secrets/status"]));
        assert_eq!(rules[5]["resourceNames"], json!(["widgets.example.io"]));
        assert_eq!(rules.len(), 9);
    }

    #[test]
    fn a_token_is_reused_only_when_fresh_and_for_the_same_account() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let token = |iat: i64, exp: i64, uid: &str| {
            let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
                json!({"iat": iat, "exp": exp, "kubernetes.io": {"serviceaccount": {"uid": uid}}})
                    .to_string(),
            );
            format!("e30.{payload}.sig")
        };
        let text = |t: &str| to_text(&token_kubeconfig("https://kcp/clusters/a", "CA", t)).unwrap();
        let fresh = token(now - 10, now + 1000, "u1");
        assert_eq!(
            reusable_token(Some(&text(&fresh)), "https://kcp/clusters/a", "CA", "u1"),
            Some(fresh.clone())
        );
        // Another account, another server, half its life gone, nothing there.
        assert!(
            reusable_token(Some(&text(&fresh)), "https://kcp/clusters/a", "CA", "u2").is_none()
        );
        assert!(
            reusable_token(Some(&text(&fresh)), "https://kcp/clusters/b", "CA", "u1").is_none()
        );
        let old = token(now - 1000, now + 10, "u1");
        assert!(reusable_token(Some(&text(&old)), "https://kcp/clusters/a", "CA", "u1").is_none());
        assert!(reusable_token(None, "https://kcp/clusters/a", "CA", "u1").is_none());
    }
}
