//! The kcp side of a PlatformMesh as files: `manifests/kcp/` (applied by KcpSetup) and
//! `manifests/features/<toggle>/` (applied by FeatureToggles), compiled into the binary.
//!
//! A directory is a workspace: the files directly in `manifests/kcp/` go to `root`, and a
//! sub-directory `NN-name` (two digits, a dash, a name) is the workspace `name` below the current
//! one (`NN-root` at `root` stays in `root`), entered once that Workspace is Ready. Files apply in
//! lexical order, then sub-directories in lexical order; other sub-directories are ignored. Every
//! file is a Go template rendered with the KcpSetup data (see [`kcp_data`]).

use std::collections::BTreeSet;

use api::core::PlatformMeshSpec;
use serde_json::{json, Value};

use super::render::{objects, RenderError};
use super::vars::{template_vars, Render};
use crate::kcp::IdpSettings;

/// A manifest compiled into the binary (path under `manifests/`, text).
pub use super::render::Template as Manifest;

macro_rules! manifest {
    ($path:literal) => {
        Manifest {
            path: $path,
            text: include_str!(concat!("../../../manifests/", $path)),
        }
    };
}

/// Every file of `manifests/kcp` and `manifests/features`, sorted by path (a test keeps this
/// list equal to the directories).
pub static MANIFESTS: &[Manifest] = &[
    manifest!("features/feature-accounts-in-accounts/01-platform-mesh-system/contentconfiguration-account-accounts.yaml"),
    manifest!("features/feature-enable-account-iam-ui/01-platform-mesh-system/contentconfiguration-account-iam-ui.yaml"),
    manifest!("features/feature-enable-getting-started/01-platform-mesh-system/contentconfiguration-main-home-overview-getting-started.yaml"),
    manifest!("features/feature-enable-terminal-controller-manager/01-platform-mesh-system/apiexport-terminal.platform-mesh.io.yaml"),
    manifest!("features/feature-enable-terminal-controller-manager/01-platform-mesh-system/apiresourceschema-terminals.terminal.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-accountinfos.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-accounts.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-apiexportpolicies.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-authorizationmodels.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-contentconfigurations.ui.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-identityproviderconfigurations.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-invites.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-providermetadatas.ui.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-providerpermissions.providers.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-providers.providers.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/10-apiresourceschema-stores.core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/20-apiexport-core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/20-apiexport-providers.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/20-apiexport-system.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/30-apiexportendpointslice-core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/40-apibinding-core.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/40-apibinding-system.platform-mesh.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-account-home.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-account-marketplace.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-account-namespaces.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-main-accounts.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-main-home.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-main-iam-ui.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-main-marketplace.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-main-os-accounts.yaml"),
    manifest!("kcp/01-platform-mesh-system/50-contentconfiguration-user-overview.yaml"),
    manifest!("kcp/01-platform-mesh-system/60-customresourcedefinition-inittargets.initialization.kcp.io.yaml"),
    manifest!("kcp/01-platform-mesh-system/60-customresourcedefinition-inittemplates.initialization.kcp.io.yaml"),
    manifest!("kcp/02-root/10-workspacetype-account.yaml"),
    manifest!("kcp/02-root/10-workspacetype-org.yaml"),
    manifest!("kcp/02-root/10-workspacetype-orgs.yaml"),
    manifest!("kcp/02-root/10-workspacetype-provider.yaml"),
    manifest!("kcp/02-root/20-workspace-orgs.yaml"),
    manifest!("kcp/03-orgs/10-apibinding-core.platform-mesh.io.yaml"),
    manifest!("kcp/03-orgs/10-apibinding-system.platform-mesh.io.yaml"),
    manifest!("kcp/03-orgs/20-store.yaml"),
    manifest!("kcp/03-platform-mesh-system/20-identityproviderconfiguration-welcome.yaml"),
    manifest!("kcp/03-providers/04-system/10-apibinding-providers.platform-mesh.io.yaml"),
    manifest!("kcp/03-providers/10-workspace-system.yaml"),
    manifest!("kcp/05-workspaceauthenticationconfiguration-orgs-authentication.yaml"),
    manifest!("kcp/10-workspacetype-providers.yaml"),
    manifest!("kcp/10-workspacetype-security.yaml"),
    manifest!("kcp/20-workspace-platform-mesh-system.yaml"),
    manifest!("kcp/20-workspace-providers.yaml"),
];

/// The toggle that skips every ContentConfiguration of KcpSetup.
pub const DISABLE_CONTENT_CONFIGURATIONS: &str = "feature-disable-contentconfigurations";
/// The toggle that relaxes e-mail verification (read by the sign-in configuration).
pub const DISABLE_EMAIL_VERIFICATION: &str = "feature-disable-email-verification";
/// The toggle that adds terminals (an APIExport, bindings and a kubeconfig).
pub const ENABLE_TERMINAL: &str = "feature-enable-terminal-controller-manager";

/// Whether `spec.featureToggles` names `toggle`.
pub fn has_toggle(spec: &PlatformMeshSpec, toggle: &str) -> bool {
    spec.feature_toggles
        .iter()
        .flatten()
        .any(|t| t.name.as_deref() == Some(toggle))
}

/// The data every kcp manifest is rendered with: addresses (`baseDomain`, `protocol`, `port`,
/// `baseDomainPort`), toggles as the strings `"true"`/`"false"`, identity settings, and what was
/// read from the kcp (`kcp_facts`): the identity hashes of root's kcp APIExports
/// (`apiExportRoot<Name>IdentityHash`, empty when the kcp does not export that API from root, as
/// `platform-mesh serve` does not), [`NATIVE_ACCOUNTS`] (`"false"` unless given) and
/// [`WORKSPACE_TYPE_TERMINATORS`] and [`WORKSPACE_AUTHENTICATION`] (`"true"` unless given).
pub fn kcp_data(
    namespace: &str,
    spec: &PlatformMeshSpec,
    idp: &IdpSettings,
    kcp_facts: &[(&str, String)],
) -> Value {
    let mut data = template_vars(namespace, spec);
    let flag = |t: &str| json!(if has_toggle(spec, t) { "true" } else { "false" });
    if let Value::Object(m) = &mut data {
        m.insert(
            "featureDisableEmailVerification".into(),
            flag(DISABLE_EMAIL_VERIFICATION),
        );
        m.insert(
            "featureDisableContentConfigurations".into(),
            flag(DISABLE_CONTENT_CONFIGURATIONS),
        );
        m.insert(
            "featureEnableTerminalControllerManager".into(),
            flag(ENABLE_TERMINAL),
        );
        m.insert(
            "registrationAllowed".into(),
            json!(idp.registration_allowed),
        );
        m.insert(
            "welcomeAdditionalRedirectUris".into(),
            json!(idp.redirect_uris),
        );
        m.insert(
            "welcomeAdditionalPostLogoutRedirectUris".into(),
            json!(idp.post_logout_redirect_uris),
        );
        m.insert("welcomeAudiences".into(), json!(idp.welcome_audiences));
        for (_, key) in ROOT_EXPORT_HASHES {
            m.insert((*key).to_string(), json!(""));
        }
        m.insert(NATIVE_ACCOUNTS.into(), json!("false"));
        m.insert(WORKSPACE_TYPE_TERMINATORS.into(), json!("true"));
        m.insert(WORKSPACE_AUTHENTICATION.into(), json!("true"));
        for (key, value) in kcp_facts {
            m.insert((*key).to_string(), json!(value));
        }
    }
    data
}

/// The data key that is `"true"` when the kcp serves Account and AccountInfo itself in every
/// workspace, as `platform-mesh serve` does. The core export then leaves their schemas out: a
/// binding of them would hide the served kinds in the bound workspaces (root:orgs, every org and
/// account) from the account controllers, which watch the served ones.
pub const NATIVE_ACCOUNTS: &str = "nativeAccounts";

/// The data key that is `"true"` when the kcp stores `spec.terminator` of WorkspaceTypes (kcp
/// v0.28 refuses an apply that sets it; later kcp releases and `platform-mesh serve` keep it).
/// The security WorkspaceType sets it only then.
pub const WORKSPACE_TYPE_TERMINATORS: &str = "workspaceTypeTerminators";

/// The data key that is `"true"` when the kcp serves WorkspaceAuthenticationConfigurations
/// (kcp's per-workspace authentication; kcp v0.28 does not): `orgs-authentication` and the
/// orgs type's reference to it are applied only then.
pub const WORKSPACE_AUTHENTICATION: &str = "workspaceAuthentication";

/// The root APIExports whose identity hashes the manifests may use, and their data keys.
pub const ROOT_EXPORT_HASHES: &[(&str, &str)] = &[
    ("tenancy.kcp.io", "apiExportRootTenancyKcpIoIdentityHash"),
    ("shards.core.kcp.io", "apiExportRootShardsKcpIoIdentityHash"),
    ("topology.kcp.io", "apiExportRootTopologyKcpIoIdentityHash"),
];

/// One rendered object and the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Path under `manifests/`.
    pub source: &'static str,
    /// The object.
    pub object: Value,
}

/// A workspace and what goes into it, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The workspace path, e.g. `root:platform-mesh-system`.
    pub workspace: String,
    /// The Workspace (parent path, name) that must be Ready before this stage is applied.
    pub awaits: Option<(String, String)>,
    /// The objects, in apply order.
    pub objects: Vec<Planned>,
}

/// Whether a directory name is a workspace directory (`NN-name`), and the name.
pub fn workspace_dir(name: &str) -> Option<&str> {
    let b = name.as_bytes();
    let ok = b.len() > 3
        && b[0].is_ascii_digit()
        && b[1].is_ascii_digit()
        && b[2] == b'-'
        && b[3..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-');
    ok.then(|| &name[3..])
}

/// The manifests of directory `dir` (`kcp` or `features/<toggle>`), rendered with `data` and
/// arranged by workspace, starting at `root`. ContentConfigurations are dropped when
/// [`DISABLE_CONTENT_CONFIGURATIONS`] is set, and WorkspaceTypes get the
/// `spec.kcp.extraDefaultAPIBindings` whose `workspaceTypePath` is `<workspace>:<type name>`.
pub fn plan(
    render: &dyn Render,
    dir: &str,
    data: &Value,
    spec: &PlatformMeshSpec,
) -> Result<Vec<Stage>, RenderError> {
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let files: Vec<&Manifest> = MANIFESTS
        .iter()
        .filter(|m| m.path.starts_with(&prefix))
        .collect();
    let mut out = Vec::new();
    plan_dir(render, &files, &prefix, "root", None, data, spec, &mut out)?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn plan_dir(
    render: &dyn Render,
    files: &[&Manifest],
    prefix: &str,
    workspace: &str,
    awaits: Option<(String, String)>,
    data: &Value,
    spec: &PlatformMeshSpec,
    out: &mut Vec<Stage>,
) -> Result<(), RenderError> {
    let skip_content = has_toggle(spec, DISABLE_CONTENT_CONFIGURATIONS);
    let mut stage = Stage {
        workspace: workspace.to_string(),
        awaits,
        objects: Vec::new(),
    };
    let mut subdirs = BTreeSet::new();
    for m in files {
        let Some(rest) = m.path.strip_prefix(prefix) else {
            continue;
        };
        if let Some((sub, _)) = rest.split_once('/') {
            subdirs.insert(sub);
            continue;
        }
        let text =
            render
                .render(m.path, m.text, data)
                .map_err(|message| RenderError::Template {
                    template: m.path,
                    message,
                })?;
        for mut object in objects(m.path, &text)? {
            if skip_content
                && object["kind"] == "ContentConfiguration"
                && object["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("ui.platform-mesh.io/"))
            {
                continue;
            }
            if object["kind"] == "WorkspaceType"
                && object["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("tenancy.kcp.io/"))
            {
                add_default_bindings(&mut object, workspace, spec);
            }
            stage.objects.push(Planned {
                source: m.path,
                object,
            });
        }
    }
    out.push(stage);
    for sub in subdirs {
        let Some(name) = workspace_dir(sub) else {
            continue;
        };
        let (child, awaits) = if name == workspace {
            (workspace.to_string(), None)
        } else {
            (
                format!("{workspace}:{name}"),
                Some((workspace.to_string(), name.to_string())),
            )
        };
        plan_dir(
            render,
            files,
            &format!("{prefix}{sub}/"),
            &child,
            awaits,
            data,
            spec,
            out,
        )?;
    }
    Ok(())
}

fn add_default_bindings(object: &mut Value, workspace: &str, spec: &PlatformMeshSpec) {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let type_path = format!("{workspace}:{name}");
    let extra: Vec<Value> = spec
        .kcp
        .as_ref()
        .and_then(|k| k.extra_default_api_bindings.as_ref())
        .into_iter()
        .flatten()
        .filter(|b| b.workspace_type_path == type_path)
        .map(|b| json!({"export": b.export, "path": b.path}))
        .collect();
    if extra.is_empty() {
        return;
    }
    if !object["spec"].is_object() {
        object["spec"] = json!({});
    }
    let list = &mut object["spec"]["defaultAPIBindings"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(items) = list.as_array_mut() {
        for e in extra {
            if !items.contains(&e) {
                items.push(e);
            }
        }
    }
}

/// The feature toggles with manifests (`manifests/features/<name>/`).
pub fn toggles_with_manifests() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for m in MANIFESTS {
        if let Some(rest) = m.path.strip_prefix("features/") {
            if let Some((toggle, _)) = rest.split_once('/') {
                if !out.contains(&toggle) {
                    out.push(toggle);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gotemplate::Engine;

    #[test]
    fn the_compiled_list_is_the_directories() {
        let on_disk = crate::platformmesh::render::files_below("manifests", &["kcp", "features"]);
        let compiled: Vec<String> = MANIFESTS.iter().map(|m| m.path.to_string()).collect();
        assert_eq!(
            compiled, on_disk,
            "MANIFESTS must list every file of manifests/kcp and manifests/features"
        );
    }

    fn spec(v: Value) -> PlatformMeshSpec {
        serde_json::from_value(v).unwrap()
    }

    fn data(s: &PlatformMeshSpec) -> Value {
        kcp_data("pm", s, &IdpSettings::default(), &[])
    }

    #[test]
    fn directories_are_workspaces_in_lexical_order() {
        let s = spec(json!({}));
        let stages = plan(&Engine::default(), "kcp", &data(&s), &s).unwrap();
        let order: Vec<(&str, Option<&str>)> = stages
            .iter()
            .map(|st| {
                (
                    st.workspace.as_str(),
                    st.awaits.as_ref().map(|a| a.1.as_str()),
                )
            })
            .collect();
        assert_eq!(
            order,
            vec![
                ("root", None),
                ("root:platform-mesh-system", Some("platform-mesh-system")),
                ("root", None),
                ("root:orgs", Some("orgs")),
                ("root:platform-mesh-system", Some("platform-mesh-system")),
                ("root:providers", Some("providers")),
                ("root:providers:system", Some("system")),
            ]
        );
        // Files in lexical order: the providers type before the workspace that uses it.
        let first: Vec<&str> = stages[0].objects.iter().map(|p| p.source).collect();
        assert_eq!(
            first,
            vec![
                "kcp/05-workspaceauthenticationconfiguration-orgs-authentication.yaml",
                "kcp/10-workspacetype-providers.yaml",
                "kcp/10-workspacetype-security.yaml",
                "kcp/20-workspace-platform-mesh-system.yaml",
                "kcp/20-workspace-providers.yaml"
            ]
        );
        assert_eq!(
            workspace_dir("01-platform-mesh-system"),
            Some("platform-mesh-system")
        );
        assert_eq!(workspace_dir("1-x"), None);
        assert_eq!(workspace_dir("01-a_b"), None);
        assert_eq!(workspace_dir("01-"), None);
    }

    #[test]
    fn toggles_and_extra_bindings_shape_the_plan() {
        let count = |s: &PlatformMeshSpec| {
            plan(&Engine::default(), "kcp", &data(s), s)
                .unwrap()
                .iter()
                .flat_map(|st| st.objects.iter())
                .filter(|p| p.object["kind"] == "ContentConfiguration")
                .count()
        };
        let plain = spec(json!({}));
        assert!(count(&plain) > 0);
        let off = spec(json!({"featureToggles": [{"name": DISABLE_CONTENT_CONFIGURATIONS}]}));
        assert_eq!(count(&off), 0);

        let s = spec(json!({
        "featureToggles": [{"name": ENABLE_TERMINAL}],
        "kcp": {"extraDefaultAPIBindings": [
            {"workspaceTypePath": "root:account", "export": "widgets.example.io", "path": "root:providers:acme"},
            {"workspaceTypePath": "root:elsewhere:account", "export": "no.example.io", "path": "root"},
        ]}}));
        let stages = plan(&Engine::default(), "kcp", &data(&s), &s).unwrap();
        let account = stages
            .iter()
            .flat_map(|st| st.objects.iter())
            .find(|p| {
                p.object["kind"] == "WorkspaceType" && p.object["metadata"]["name"] == "account"
            })
            .unwrap();
        let exports: Vec<&str> = account.object["spec"]["defaultAPIBindings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["export"].as_str().unwrap())
            .collect();
        assert_eq!(
            exports,
            vec![
                "core.platform-mesh.io",
                "terminal.platform-mesh.io",
                "widgets.example.io"
            ]
        );
    }

    #[test]
    fn every_manifest_renders_to_objects() {
        let s = spec(json!({"featureToggles": [{"name": ENABLE_TERMINAL}],
            "exposure": {"baseDomain": "example.com", "port": 443}}));
        let d = kcp_data(
            "pm",
            &s,
            &IdpSettings {
                registration_allowed: true,
                redirect_uris: vec!["https://extra.example.com/cb".into()],
                post_logout_redirect_uris: vec![],
                welcome_audiences: vec!["welcome".into(), "welcome-kubectl".into()],
            },
            &[
                ("apiExportRootTenancyKcpIoIdentityHash", "abc".into()),
                // Where root:orgs predates its type (serve), its two bindings are rendered too.
                (NATIVE_ACCOUNTS, "true".into()),
            ],
        );
        let mut seen = 0;
        for dir in std::iter::once("kcp".to_string()).chain(
            toggles_with_manifests()
                .iter()
                .map(|t| format!("features/{t}")),
        ) {
            for st in plan(&Engine::default(), &dir, &d, &s).unwrap() {
                seen += st.objects.len();
            }
        }
        assert_eq!(seen, MANIFESTS.len(), "one object per manifest file");
        let ipc = plan(&Engine::default(), "kcp", &d, &s)
            .unwrap()
            .into_iter()
            .flat_map(|st| st.objects)
            .find(|p| p.object["kind"] == "IdentityProviderConfiguration")
            .unwrap();
        assert_eq!(ipc.object["spec"]["registrationAllowed"], true);
        assert_eq!(
            ipc.object["spec"]["clients"][0]["redirectUris"],
            json!([
                "https://example.com/callback*",
                "https://extra.example.com/cb"
            ])
        );
    }

    /// One object as the upstream comparison sees it.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct ObjectKey {
        workspace: String,
        api_version: String,
        kind: String,
        name: String,
    }

    impl std::fmt::Display for ObjectKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "{} {} {} in {}",
                self.api_version, self.kind, self.name, self.workspace
            )
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Difference {
        Missing,
        Extra,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KnownDifference {
        difference: Difference,
        object: ObjectKey,
        reason: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Reference {
        upstream: Vec<ObjectKey>,
        known_differences: Vec<KnownDifference>,
    }

    /// `manifests/kcp-reference.yaml`: upstream's manifests/kcp objects and the known differences.
    const REFERENCE: &str = include_str!("../../../manifests/kcp-reference.yaml");

    /// The key of a rendered object; an APIResourceSchema is named `<plural>.<group>` (its
    /// `v<date>-<hash>.` prefix is a content hash).
    fn key_of(workspace: &str, object: &Value) -> ObjectKey {
        let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let mut name = field(&object["metadata"]["name"]);
        if object["kind"] == "APIResourceSchema" {
            if let Some((_, rest)) = name.split_once('.') {
                name = rest.to_string();
            }
        }
        ObjectKey {
            workspace: workspace.to_string(),
            api_version: field(&object["apiVersion"]),
            kind: field(&object["kind"]),
            name,
        }
    }

    /// Every problem of `ours` against `upstream`: each difference not in `known`, each known
    /// difference that is not (or no longer) one, and each known difference without a reason.
    fn compare(
        upstream: &[ObjectKey],
        ours: &[ObjectKey],
        known: &[KnownDifference],
    ) -> Vec<String> {
        let up: BTreeSet<&ObjectKey> = upstream.iter().collect();
        let here: BTreeSet<&ObjectKey> = ours.iter().collect();
        let mut problems = Vec::new();
        for (list, what) in [(upstream, "upstream list"), (ours, "manifests/kcp")] {
            let mut seen = BTreeSet::new();
            for k in list {
                if !seen.insert(k) {
                    problems.push(format!("listed twice in the {what}: {k}"));
                }
            }
        }
        let is_known = |d: Difference, k: &ObjectKey| {
            known.iter().any(|x| x.difference == d && x.object == *k)
        };
        for k in up.difference(&here) {
            if !is_known(Difference::Missing, k) {
                problems.push(format!("missing (upstream has it): {k}"));
            }
        }
        for k in here.difference(&up) {
            if !is_known(Difference::Extra, k) {
                problems.push(format!("extra (upstream does not have it): {k}"));
            }
        }
        for x in known {
            let still = match x.difference {
                Difference::Missing => up.contains(&x.object) && !here.contains(&x.object),
                Difference::Extra => here.contains(&x.object) && !up.contains(&x.object),
            };
            if !still {
                problems.push(format!(
                    "known difference ({:?}) is not one: {}; remove it from knownDifferences",
                    x.difference, x.object
                ));
            }
            if x.reason.trim().is_empty() {
                problems.push(format!("known difference without a reason: {}", x.object));
            }
        }
        problems
    }

    /// manifests/kcp rendered with the KcpSetup data and every toggle off.
    fn rendered_kcp() -> Vec<Stage> {
        let s = spec(json!({}));
        plan(&Engine::default(), "kcp", &data(&s), &s).unwrap()
    }

    #[test]
    fn manifests_match_the_upstream_list() {
        let reference: Reference = serde_saphyr::from_str(REFERENCE).unwrap();
        let ours: Vec<ObjectKey> = rendered_kcp()
            .iter()
            .flat_map(|st| st.objects.iter().map(|p| key_of(&st.workspace, &p.object)))
            .collect();
        let problems = compare(&reference.upstream, &ours, &reference.known_differences);
        assert!(
            problems.is_empty(),
            "manifests/kcp differs from upstream platform-mesh-operator's list \
             (manifests/kcp-reference.yaml):\n  {}\nadd or remove the manifests, or list a \
             difference that must stay under knownDifferences with its reason",
            problems.join("\n  ")
        );
    }

    #[test]
    fn the_upstream_comparison_names_each_difference() {
        let key = |kind: &str, name: &str| ObjectKey {
            workspace: "root".into(),
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
        };
        let upstream = vec![key("A", "a"), key("B", "b"), key("C", "c")];
        let ours = vec![key("A", "a"), key("D", "d"), key("E", "e")];
        let known = vec![
            KnownDifference {
                difference: Difference::Missing,
                object: key("B", "b"),
                reason: "not served".into(),
            },
            KnownDifference {
                difference: Difference::Extra,
                object: key("A", "a"),
                reason: String::new(),
            },
        ];
        let problems = compare(&upstream, &ours, &known);
        assert_eq!(
            problems,
            vec![
                "missing (upstream has it): v1 C c in root",
                "extra (upstream does not have it): v1 D d in root",
                "extra (upstream does not have it): v1 E e in root",
                "known difference (Extra) is not one: v1 A a in root; remove it from knownDifferences",
                "known difference without a reason: v1 A a in root",
            ]
        );
        assert!(compare(&upstream, &upstream, &[])
            .iter()
            .all(|p| !p.starts_with("missing")));
        assert_eq!(
            compare(&[key("A", "a"), key("A", "a")], &[key("A", "a")], &[]),
            vec!["listed twice in the upstream list: v1 A a in root"]
        );
        // Schema names compare without their version-hash prefix.
        let schema = json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": {"name": "v260101-0123abcd.widgets.example.io"}});
        assert_eq!(key_of("root", &schema).name, "widgets.example.io");
    }

    #[test]
    fn every_exported_schema_is_in_the_exports_workspace() {
        let stages = rendered_kcp();
        let schemas: BTreeSet<(String, String)> = stages
            .iter()
            .flat_map(|st| {
                st.objects
                    .iter()
                    .filter(|p| p.object["kind"] == "APIResourceSchema")
                    .map(|p| {
                        let name = p.object["metadata"]["name"].as_str().unwrap_or_default();
                        (st.workspace.clone(), name.to_string())
                    })
            })
            .collect();
        let mut exports = 0;
        for st in &stages {
            for p in st
                .objects
                .iter()
                .filter(|p| p.object["kind"] == "APIExport")
            {
                exports += 1;
                let spec = &p.object["spec"];
                let names: Vec<&str> = spec["latestResourceSchemas"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .chain(
                        spec["resources"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|r| &r["schema"]),
                    )
                    .filter_map(Value::as_str)
                    .collect();
                assert!(!names.is_empty(), "{} lists no schemas", p.source);
                for n in names {
                    assert!(
                        schemas.contains(&(st.workspace.clone(), n.to_string())),
                        "{} names the schema {n}, which manifests/kcp does not create in {} \
                         (after a schema change, `cargo run -- crds` renames it in the exports)",
                        p.source,
                        st.workspace
                    );
                }
            }
        }
        assert_eq!(exports, 3);
    }

    #[test]
    fn content_configurations_hold_luigi_json() {
        let mut seen = 0;
        for st in rendered_kcp() {
            for p in st
                .objects
                .iter()
                .filter(|p| p.object["kind"] == "ContentConfiguration")
            {
                seen += 1;
                let name = p.object["metadata"]["name"].as_str().unwrap();
                let entity = &p.object["metadata"]["labels"]["ui.platform-mesh.io/entity"];
                assert!(
                    entity == "main" || entity == "core_platform-mesh_io_account",
                    "{name}: entity {entity}"
                );
                let inline = &p.object["spec"]["inlineConfiguration"];
                assert_eq!(inline["contentType"], "json", "{name}");
                let content: Value = serde_json::from_str(inline["content"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("{name}: content is not JSON: {e}"));
                assert!(
                    content["name"].as_str().is_some_and(|n| !n.is_empty()),
                    "{name}: no name"
                );
                let nodes = content["luigiConfigFragment"]["data"]["nodes"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{name}: no nodes"));
                assert!(!nodes.is_empty(), "{name}");
                for n in nodes {
                    assert!(
                        n["pathSegment"].is_string() && n["label"].is_string(),
                        "{name}"
                    );
                    let url = n["url"].as_str().unwrap_or_default();
                    assert!(
                        url.starts_with("https://") || url.starts_with("http://"),
                        "{name}: {url}"
                    );
                }
            }
        }
        assert_eq!(seen, 9);
    }

    /// The object `kind`/`name` KcpSetup plans for a default PlatformMesh on a kcp of `facts`.
    fn planned_kcp_object(kind: &str, name: &str, facts: &[(&str, String)]) -> Value {
        let s = spec(json!({}));
        let d = kcp_data("pm", &s, &IdpSettings::default(), facts);
        plan(&Engine::default(), "kcp", &d, &s)
            .unwrap()
            .into_iter()
            .flat_map(|st| st.objects)
            .find(|p| p.object["kind"] == kind && p.object["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} planned"))
            .object
    }

    #[test]
    fn the_core_export_leaves_out_accounts_where_the_kcp_serves_them() {
        let schemas = |facts: &[(&str, String)]| -> Vec<String> {
            planned_kcp_object("APIExport", "core.platform-mesh.io", facts)["spec"]
                ["latestResourceSchemas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().split_once('.').unwrap().1.to_string())
                .collect()
        };
        let kcp = schemas(&[]);
        assert_eq!(kcp.len(), 7, "{kcp:?}");
        assert!(kcp.contains(&"accounts.core.platform-mesh.io".to_string()));
        assert!(kcp.contains(&"accountinfos.core.platform-mesh.io".to_string()));
        let serve = schemas(&[(NATIVE_ACCOUNTS, "true".into())]);
        assert_eq!(serve.len(), 5, "{serve:?}");
        assert!(serve.iter().all(|n| !n.starts_with("account")), "{serve:?}");
    }

    #[test]
    fn the_security_type_sets_a_terminator_only_where_the_kcp_keeps_it() {
        let security = |facts: &[(&str, String)]| -> Value {
            planned_kcp_object("WorkspaceType", "security", facts)["spec"].clone()
        };
        assert_eq!(
            security(&[]),
            json!({"initializer": true, "terminator": true})
        );
        assert_eq!(
            security(&[(WORKSPACE_TYPE_TERMINATORS, "false".into())]),
            json!({"initializer": true})
        );
    }
}
