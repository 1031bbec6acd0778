//! The PlatformMesh controller end to end: three servers stand in for kcp, the infra cluster and
//! the runtime cluster, and a small reconciler stands in for Flux, marking HelmReleases and
//! Kustomizations Ready. The scenarios are upstream's: full bootstrap to Ready, extra
//! workspaces, scoped kubeconfigs via endpoint slice and via APIExport name, feature toggles on
//! and off, a profile change rolling out, deletion cleaning up; plus a second reconcile of an
//! unchanged PlatformMesh writing nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::Kubeconfig;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::deploy::writes;
use super::{eventually, TestServer};
use controllers::lifecycle::drive;
use controllers::platformmesh::api_resource as res;
use controllers::platformmesh::controller::{
    controller, lifecycle, platform_meshes, ready_condition,
};
use controllers::platformmesh::deployment::{Clusters, Context};
use controllers::platformmesh::kcp::Kcp;
use controllers::platformmesh::vars::Render;
use controllers::providers::fixed::FixedClusters;
use controllers::runtime::{Cluster, Manager, ManagerOptions};
use gotemplate::Engine;

const NS: &str = "platform-mesh-system";

fn helm_releases() -> ApiResource {
    res(
        "helm.toolkit.fluxcd.io",
        "v2",
        "HelmRelease",
        "helmreleases",
    )
}

fn kustomizations() -> ApiResource {
    res(
        "kustomize.toolkit.fluxcd.io",
        "v1",
        "Kustomization",
        "kustomizations",
    )
}

/// Installs a namespaced CRD with an open spec and status.
pub(super) async fn open_crd(client: &kube::Client, r: &ApiResource) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &res(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", r.plural, r.group)},
        "spec": {"group": r.group, "scope": "Namespaced",
            "names": {"plural": r.plural, "singular": r.kind.to_lowercase(), "kind": r.kind,
                "listKind": format!("{}List", r.kind)},
            "versions": [{"name": r.version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": open, "status": open}}}}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let typed: Api<DynamicObject> = Api::all_with(client.clone(), r);
    eventually(Duration::from_secs(10), "CRD served", || {
        let typed = typed.clone();
        async move { typed.list(&Default::default()).await.is_ok() }
    })
    .await;
}

/// Flux's part: every HelmRelease and Kustomization of the infra cluster becomes Ready for its
/// generation while `enabled`; `last` is when it last marked one.
struct FluxStandIn {
    enabled: Arc<AtomicBool>,
    last: Arc<Mutex<Option<Instant>>>,
    stop: CancellationToken,
}

impl FluxStandIn {
    fn start(infra: kube::Client) -> FluxStandIn {
        let enabled = Arc::new(AtomicBool::new(true));
        let last = Arc::new(Mutex::new(None));
        let stop = CancellationToken::new();
        let (e, l, s) = (enabled.clone(), last.clone(), stop.clone());
        tokio::spawn(async move {
            while !s.is_cancelled() {
                if e.load(Ordering::SeqCst) {
                    for r in [helm_releases(), kustomizations()] {
                        let all: Api<DynamicObject> = Api::all_with(infra.clone(), &r);
                        let Ok(list) = all.list(&ListParams::default()).await else {
                            continue;
                        };
                        for item in list.items {
                            let generation = item.metadata.generation.unwrap_or(0);
                            let ready = item.data["status"]["observedGeneration"] == generation
                                && item.data["status"]["conditions"][0]["status"] == "True";
                            if ready {
                                continue;
                            }
                            let api: Api<DynamicObject> = Api::namespaced_with(
                                infra.clone(),
                                item.metadata.namespace.as_deref().unwrap_or("default"),
                                &r,
                            );
                            let status = json!({"status": {"observedGeneration": generation,
                                "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                                    "message": "stand-in", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
                            if api
                                .patch_status(
                                    item.metadata.name.as_deref().unwrap_or(""),
                                    &PatchParams::default(),
                                    &Patch::Merge(&status),
                                )
                                .await
                                .is_ok()
                            {
                                *l.lock().unwrap() = Some(Instant::now());
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        });
        FluxStandIn {
            enabled,
            last,
            stop,
        }
    }
}

struct Env {
    kcp: TestServer,
    infra: TestServer,
    runtime: TestServer,
    clusters: Arc<Clusters>,
    engine: Arc<dyn Render + Send + Sync>,
    flux: FluxStandIn,
    stop: CancellationToken,
    pm: Api<DynamicObject>,
}

impl Env {
    async fn start() -> Env {
        let (kcp, infra, runtime) = (
            TestServer::start().await,
            TestServer::start().await,
            TestServer::start().await,
        );
        let infra_client = infra.client("root").await;
        let runtime_client = runtime.client("root").await;
        open_crd(&infra_client, &helm_releases()).await;
        open_crd(&infra_client, &kustomizations()).await;
        open_crd(
            &runtime_client,
            &res("delivery.ocm.software", "v1alpha1", "Resource", "resources"),
        )
        .await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        for c in [&infra_client, &runtime_client] {
            Api::<Namespace>::all(c.clone())
                .create(&PostParams::default(), &ns)
                .await
                .expect("namespace");
        }
        let kcp_access = Kcp::from_kubeconfig(kcp.kubeconfig_for("root"), None)
            .await
            .expect("kcp access");
        let clusters = Arc::new(Clusters {
            infra: infra_client.clone(),
            runtime: runtime_client.clone(),
            remote: None,
            kcp: Some(kcp_access),
        });
        let engine: Arc<dyn Render + Send + Sync> = Arc::new(Engine::default());
        let manager = Manager::new(ManagerOptions::default());
        manager
            .add(controller(engine.clone(), clusters.clone()))
            .expect("controller");
        let stop = CancellationToken::new();
        let provider = Arc::new(FixedClusters::new([Cluster::new(
            "runtime",
            runtime_client.clone(),
        )]));
        tokio::spawn({
            let (m, stop) = (manager.clone(), stop.clone());
            async move { m.run(provider, async move { stop.cancelled().await }).await }
        });
        let flux = FluxStandIn::start(infra_client);
        let pm = Api::namespaced_with(runtime_client, NS, &platform_meshes());
        Env {
            kcp,
            infra,
            runtime,
            clusters,
            engine,
            flux,
            stop,
            pm,
        }
    }

    async fn put_profile(&self, text: &str) {
        let cms: Api<ConfigMap> = Api::namespaced(self.clusters.runtime.clone(), NS);
        let mut cm: Value = serde_saphyr::from_str(text).expect("profile YAML");
        cm["metadata"]["namespace"] = json!(NS);
        cms.patch(
            cm["metadata"]["name"].as_str().unwrap(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&cm),
        )
        .await
        .expect("profile");
    }

    async fn ready(&self, name: &str, timeout: Duration) -> DynamicObject {
        let pm = self.pm.clone();
        let name2 = name.to_string();
        let last = Arc::new(Mutex::new(None));
        let l2 = last.clone();
        let result = tokio::time::timeout(timeout, async move {
            loop {
                if let Ok(obj) = pm.get(&name2).await {
                    let generation = obj.metadata.generation;
                    let ok = ready_condition(&obj).is_some_and(|c| c["status"] == "True")
                        && obj.data["status"]["observedGeneration"].as_i64() == generation;
                    *l2.lock().unwrap() = Some(obj.data["status"].clone());
                    if ok {
                        return obj;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        match result {
            Ok(obj) => obj,
            Err(_) => panic!(
                "PlatformMesh {name} not Ready in {timeout:?}; status: {}",
                serde_json::to_string_pretty(&*last.lock().unwrap()).unwrap()
            ),
        }
    }

    async fn patch_spec(&self, name: &str, spec: Value) {
        self.pm
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .expect("patch PlatformMesh");
    }

    fn writes(&self) -> u64 {
        writes(&self.kcp) + writes(&self.infra) + writes(&self.runtime)
    }

    async fn secret_kubeconfig(&self, name: &str) -> String {
        let secrets: Api<Secret> = Api::namespaced(self.clusters.runtime.clone(), NS);
        let s = secrets.get(name).await.expect("kubeconfig Secret");
        String::from_utf8(s.data.unwrap()["kubeconfig"].0.clone()).unwrap()
    }

    async fn kcp_get(&self, path: &str, r: &ApiResource, name: &str) -> Option<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::all_with(self.clusters.kcp.as_ref().unwrap().workspace(path), r);
        api.get_opt(name).await.expect("kcp read")
    }
}

fn reference(file: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/reference/platform-mesh-operator/e2e-samples")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs kubectl with `kubeconfig`; (success, stdout + stderr).
/// Runs `kubectl.<version>` (beside the kubectl on PATH) with `kubeconfig`.
async fn kubectl_version(version: &str, kubeconfig: &str, args: &[&str]) -> (bool, String) {
    let which = std::process::Command::new("sh")
        .args(["-c", "readlink -f \"$(command -v kubectl)\""])
        .output()
        .expect("find kubectl");
    let bin = std::path::PathBuf::from(String::from_utf8_lossy(&which.stdout).trim())
        .parent()
        .expect("kubectl directory")
        .join(format!("kubectl.{version}"));
    assert!(bin.exists(), "{} is not installed", bin.display());
    run_kubectl(&bin, kubeconfig, args).await
}

/// The server URL of a kubeconfig's first cluster.
fn server_of(kubeconfig: &str) -> String {
    let kc: Kubeconfig = Kubeconfig::from_yaml(kubeconfig).unwrap();
    kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap()
}

pub(super) async fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String) {
    run_kubectl(std::path::Path::new("kubectl"), kubeconfig, args).await
}

/// Runs kubectl `bin` with `kubeconfig` (in a file of its own) and `args`: whether it succeeded,
/// and its output.
async fn run_kubectl(bin: &std::path::Path, kubeconfig: &str, args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(&path)
        .args(args)
        .output()
        .await
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn workspaces() -> ApiResource {
    res("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces")
}

/// A provider workspace `root:providers:<name>` with an APIExport of widgets bound to itself.
async fn provider_workspace(env: &Env, name: &str) {
    let kcp = env.clusters.kcp.as_ref().unwrap();
    let create = |path: &str, obj: Value| {
        let client = kcp.workspace(path);
        async move {
            let gvk = obj["apiVersion"].as_str().unwrap().to_string();
            let (group, version) = gvk.split_once('/').unwrap();
            let kind = obj["kind"].as_str().unwrap();
            let plural = format!("{}s", kind.to_lowercase());
            let api: Api<DynamicObject> =
                Api::all_with(client, &res(group, version, kind, &plural));
            api.create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .expect("create in kcp");
        }
    };
    create(
        "root:providers",
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"type": {"name": "provider", "path": "root"}}}),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "provider workspace Ready",
        || async {
            env.kcp_get("root:providers", &workspaces(), name)
                .await
                .is_some_and(|w| w.data["status"]["phase"] == "Ready")
        },
    )
    .await;
    let path = format!("root:providers:{name}");
    create(
        &path,
        json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": {"name": "v1.widgets.e2e.example.io"},
            "spec": {"group": "e2e.example.io", "scope": "Namespaced",
                "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}]}}),
    )
    .await;
    create(
        &path,
        json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
            "metadata": {"name": "widgets.e2e.example.io"},
            "spec": {"latestResourceSchemas": ["v1.widgets.e2e.example.io"]}}),
    )
    .await;
    create(
        &path,
        json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "widgets.e2e.example.io"},
            "spec": {"reference": {"export": {"name": "widgets.e2e.example.io"}}}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_mesh_bootstraps_kcp_hands_out_kubeconfigs_and_cleans_up() {
    let env = Env::start().await;
    env.put_profile(&reference("default-profile.yaml")).await;
    let pm: DynamicObject =
        serde_saphyr::from_str(&reference("platform-mesh.yaml")).expect("PlatformMesh YAML");
    env.pm
        .create(&PostParams::default(), &pm)
        .await
        .expect("create");
    let name = "platform-mesh";

    // 1. Full bootstrap to Ready.
    let obj = env.ready(name, Duration::from_secs(60)).await;
    for step in [
        "DeploymentSubroutine",
        "KcpsetupSubroutine",
        "ProvidersecretSubroutine",
        "FeatureToggleSubroutine",
        "WaitSubroutine",
    ] {
        let c = obj.data["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == step)
            .unwrap_or_else(|| panic!("condition {step}"));
        assert_eq!(c["status"], "True", "{step}: {c}");
    }
    // The workspace tree and the platform's APIs.
    assert!(env
        .kcp_get("root:providers", &workspaces(), "system")
        .await
        .is_some());
    let exports = res("apis.kcp.io", "v1alpha1", "APIExport", "apiexports");
    assert!(env
        .kcp_get(
            "root:platform-mesh-system",
            &exports,
            "core.platform-mesh.io"
        )
        .await
        .is_some());
    let stores = res("core.platform-mesh.io", "v1alpha1", "Store", "stores");
    assert!(env.kcp_get("root:orgs", &stores, "orgs").await.is_some());
    let ccs = res(
        "ui.platform-mesh.io",
        "v1alpha1",
        "ContentConfiguration",
        "contentconfigurations",
    );
    for cc in [
        "main-home",
        "main-home-overview-getting-started",
        "account-accounts",
    ] {
        assert!(
            env.kcp_get("root:platform-mesh-system", &ccs, cc)
                .await
                .is_some(),
            "ContentConfiguration {cc}"
        );
    }
    assert!(env
        .kcp_get("root:platform-mesh-system", &ccs, "account-iam-ui")
        .await
        .is_none());
    // Every default kubeconfig Secret, and they work with exactly their rights.
    let secrets: Api<Secret> = Api::namespaced(env.clusters.runtime.clone(), NS);
    let listed = secrets.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        listed
            .items
            .iter()
            .filter(|s| s
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.ends_with("-kubeconfig")))
            .count(),
        12
    );
    let admin = env.secret_kubeconfig("account-operator-kubeconfig").await;
    let (ok, out) = kubectl(&admin, &["get", "apiexports", "-o", "name"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("apiexport.apis.kcp.io/core.platform-mesh.io"),
        "{out}"
    );
    let scoped = env.secret_kubeconfig("iam-service-kubeconfig").await;
    let (ok, out) = kubectl(&scoped, &["get", "stores.core.platform-mesh.io"]).await;
    assert!(
        ok,
        "a scoped kubeconfig reads the exported resources: {out}"
    );
    let (ok, out) = kubectl(&scoped, &["get", "configmaps", "-A"]).await;
    assert!(!ok && out.contains("Forbidden"), "but nothing else: {out}");
    let server = server_of(&scoped);
    assert!(
        server.ends_with("/clusters/root:platform-mesh-system"),
        "{server}"
    );
    let (ok, out) = kubectl(
        &scoped,
        &[
            "--server",
            &server.replace("root:platform-mesh-system", "root:orgs"),
            "get",
            "stores.core.platform-mesh.io",
        ],
    )
    .await;
    assert!(
        !ok && out.contains("Forbidden"),
        "nor in another workspace: {out}"
    );

    // Every default Secret: admin ones have every right in their workspace, scoped ones exactly
    // the export's; the two raw paths point at virtual workspaces other components serve.
    for c in controllers::platformmesh::providersecret::default_connections() {
        let text = env.secret_kubeconfig(&c.secret).await;
        let server = server_of(&text);
        if let Some(raw) = &c.raw_path {
            assert_eq!(
                server,
                format!("{}{raw}", env.kcp.root_url()),
                "{}",
                c.secret
            );
            continue;
        }
        let path = c.path.clone().unwrap();
        assert_eq!(
            server,
            format!("{}/clusters/{path}", env.kcp.root_url()),
            "{}",
            c.secret
        );
        let (_, all) = kubectl(&text, &["auth", "can-i", "*", "*"]).await;
        let (_, stores) = kubectl(
            &text,
            &["auth", "can-i", "create", "stores.core.platform-mesh.io"],
        )
        .await;
        let (_, cms) = kubectl(&text, &["auth", "can-i", "list", "configmaps"]).await;
        if c.admin_auth == Some(true) {
            assert!(all.starts_with("yes"), "{}: {all}", c.secret);
        } else {
            assert!(all.starts_with("no"), "{}: {all}", c.secret);
            assert!(stores.starts_with("yes"), "{}: {stores}", c.secret);
            assert!(cms.starts_with("no"), "{}: {cms}", c.secret);
        }
    }

    // 2. A second reconcile of the unchanged instance writes nothing.
    let context = {
        let mut c = Context::new(env.pm.get(name).await.unwrap(), env.clusters.clone()).unwrap();
        c.cluster = Some("runtime".into());
        c
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = env.writes();
    let obj = env.pm.get(name).await.unwrap();
    drive(&lifecycle(env.engine.clone()), &env.pm, &obj, &context)
        .await
        .expect("second reconcile");
    assert_eq!(
        env.writes(),
        before,
        "a reconcile of an unchanged PlatformMesh writes nothing"
    );

    // 3. Extra workspaces and an extra admin connection (external address).
    env.patch_spec(
        name,
        json!({"kcp": {
            "extraWorkspaces": [{"path": "root:orgs:extra1", "type": {"name": "org", "path": "root"}}],
            "extraDefaultAPIBindings": [{"workspaceTypePath": "root:account",
                "export": "widgets.e2e.example.io", "path": "root:providers:provider2"}],
            "extraProviderConnections": [
                {"path": "root:orgs:extra1", "secret": "extra1-kubeconfig", "adminAuth": true, "external": true}]}}),
    )
    .await;
    env.ready(name, Duration::from_secs(30)).await;
    assert!(env
        .kcp_get("root:orgs", &workspaces(), "extra1")
        .await
        .is_some());
    let account_type = env
        .kcp_get(
            "root",
            &res(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceType",
                "workspacetypes",
            ),
            "account",
        )
        .await
        .unwrap();
    assert!(
        account_type.data["spec"]["defaultAPIBindings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["export"] == "widgets.e2e.example.io"),
        "extra default API binding: {}",
        account_type.data["spec"]
    );
    let extra1 = env.secret_kubeconfig("extra1-kubeconfig").await;
    assert!(
        extra1.contains("https://kcp.api.portal.localhost:8443/clusters/root:orgs:extra1"),
        "{extra1}"
    );

    // 4. Scoped kubeconfigs via an endpoint slice and via an APIExport name, and an admin one
    //    via the core slice.
    provider_workspace(&env, "provider1").await;
    provider_workspace(&env, "provider2").await;
    env.patch_spec(
        name,
        json!({"kcp": {"extraProviderConnections": [
            {"path": "root:providers:provider1", "secret": "provider1-kubeconfig",
                "endpointSliceName": "widgets.e2e.example.io"},
            {"path": "root:providers:provider2", "secret": "provider2-kubeconfig",
                "apiExportName": "widgets.e2e.example.io"},
            {"path": "root:platform-mesh-system", "secret": "core-admin-kubeconfig",
                "adminAuth": true, "endpointSliceName": "core.platform-mesh.io"}]}}),
    )
    .await;
    env.ready(name, Duration::from_secs(30)).await;
    assert!(
        secrets
            .get_opt("extra1-kubeconfig")
            .await
            .unwrap()
            .is_none(),
        "the Secret of a removed connection is removed"
    );
    let p2 = env.secret_kubeconfig("provider2-kubeconfig").await;
    let widget = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        widget.path(),
        "apiVersion: e2e.example.io/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: default\nspec:\n  size: 1\n",
    )
    .unwrap();
    let (ok, out) = kubectl(&p2, &["apply", "-f", widget.path().to_str().unwrap()]).await;
    assert!(ok, "provider2 applies its own widgets: {out}");
    let (ok, out) = kubectl(&p2, &["get", "widgets", "-n", "default", "w1"]).await;
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&p2, &["get", "secrets", "-n", "default"]).await;
    assert!(!ok && out.contains("Forbidden"), "{out}");
    let p1 = env.secret_kubeconfig("provider1-kubeconfig").await;
    let vw = server_of(&p1);
    assert!(vw.contains("/services/apiexport/"), "{vw}");
    let (ok, out) = kubectl(
        &p1,
        &[
            "--server",
            &format!("{vw}/clusters/*"),
            "get",
            "widgets",
            "-A",
        ],
    )
    .await;
    assert!(ok, "provider1 reads its export's virtual workspace: {out}");
    let core_admin = env.secret_kubeconfig("core-admin-kubeconfig").await;
    assert!(core_admin.contains("/services/apiexport/"), "{core_admin}");

    // The default connections of the portal and the marketplace reach Platform Mesh's virtual
    // workspaces: with a workspace after them (as the portal and the gateway add it), kubectl
    // 1.27 and 1.33 list, get and watch both views.
    for (secret, service, resource) in [
        (
            "portal-kubeconfig",
            "/services/contentconfigurations",
            "contentconfigurations",
        ),
        (
            "virtual-workspace-clusteraccess-kubeconfig",
            "/services/marketplace",
            "marketplaceentries",
        ),
    ] {
        let text = env.secret_kubeconfig(secret).await;
        let server = server_of(&text);
        assert!(server.ends_with(service), "{secret}: {server}");
        let view = format!("{server}/clusters/root:orgs:extra1");
        for version in ["1.27", "1.33"] {
            let (ok, out) =
                kubectl_version(version, &text, &["--server", &view, "get", resource]).await;
            assert!(ok, "{secret}, kubectl {version}: {out}");
            let (ok, out) = kubectl_version(
                version,
                &text,
                &[
                    "--server",
                    &view,
                    "get",
                    resource,
                    "--watch",
                    "--request-timeout=1s",
                ],
            )
            .await;
            assert!(
                !out.contains("Forbidden") && !out.contains("NotFound"),
                "{secret}, kubectl {version} watches: {ok} {out}"
            );
            let (ok, out) = kubectl_version(
                version,
                &text,
                &["--server", &view, "get", resource, "nothing"],
            )
            .await;
            assert!(
                !ok && out.contains("NotFound"),
                "{secret}, kubectl {version}: {out}"
            );
        }
    }

    // 5. Feature toggles off and on again.
    env.patch_spec(
        name,
        json!({"featureToggles": [{"name": "feature-accounts-in-accounts"}, {"name": "feature-enable-account-iam-ui"}]}),
    )
    .await;
    env.ready(name, Duration::from_secs(30)).await;
    assert!(env
        .kcp_get(
            "root:platform-mesh-system",
            &ccs,
            "main-home-overview-getting-started"
        )
        .await
        .is_none());
    assert!(env
        .kcp_get("root:platform-mesh-system", &ccs, "account-iam-ui")
        .await
        .is_some());
    assert!(
        env.kcp_get("root:platform-mesh-system", &ccs, "main-home")
            .await
            .is_some(),
        "KcpSetup's own objects stay"
    );

    // 6. A profile change rolls out (no change to the PlatformMesh itself).
    let profile = reference("default-profile.yaml").replacen("interval: 1m", "interval: 7m", 1);
    env.put_profile(&profile).await;
    let hr: Api<DynamicObject> =
        Api::namespaced_with(env.clusters.infra.clone(), "default", &helm_releases());
    let all_hr: Api<DynamicObject> = Api::all_with(env.clusters.infra.clone(), &helm_releases());
    let _ = hr;
    eventually(
        Duration::from_secs(30),
        "the profile change reaches a HelmRelease",
        || async {
            all_hr
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.iter().any(|h| h.data["spec"]["interval"] == "7m"))
        },
    )
    .await;

    // 7. Deletion removes what the instance deployed and the kubeconfigs it handed out.
    env.pm.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(Duration::from_secs(30), "PlatformMesh gone", || async {
        env.pm.get_opt(name).await.is_ok_and(|o| o.is_none())
    })
    .await;
    assert!(all_hr
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    let left: Vec<String> = secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .filter(|n| n.ends_with("-kubeconfig"))
        .collect();
    assert!(left.is_empty(), "kubeconfig Secrets left: {left:?}");
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(
        env.clusters
            .kcp
            .as_ref()
            .unwrap()
            .workspace("root:providers:provider2"),
        "default",
    );
    assert!(sas
        .get_opt("platform-mesh-provider-provider2-kubeconfig")
        .await
        .unwrap()
        .is_none());
    env.flux.stop.cancel();
    env.stop.cancel();
}

/// A profile with `n` component services and no infra components.
fn services_profile(n: usize) -> String {
    let mut services = String::new();
    for i in 0..n {
        services.push_str(&format!("        svc-{i:02}:\n          enabled: true\n"));
    }
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: many-profile\ndata:\n  profile.yaml: |\n    infra:\n      deploymentTechnology: fluxcd\n    components:\n      deploymentTechnology: fluxcd\n      ocm:\n        component:\n          name: platform-mesh\n        repo:\n          name: platform-mesh\n      services:\n{services}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_services_are_ready_soon_after_their_helm_releases() {
    let env = Env::start().await;
    env.flux.enabled.store(false, Ordering::SeqCst);
    env.put_profile(&services_profile(30)).await;
    let pm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
        "metadata": {"name": "many", "namespace": NS},
        "spec": {"kcp": {"providerConnections": []}}
    }))
    .unwrap();
    env.pm.create(&PostParams::default(), &pm).await.unwrap();
    let hr: Api<DynamicObject> =
        Api::namespaced_with(env.clusters.infra.clone(), NS, &helm_releases());
    eventually(
        Duration::from_secs(60),
        "30 HelmReleases deployed",
        || async {
            hr.list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.len() >= 30)
        },
    )
    .await;
    // Not Ready while the releases are not.
    eventually(Duration::from_secs(30), "Wait holds", || async {
        env.pm.get("many").await.is_ok_and(|o| {
            o.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "WaitSubroutine" && c["status"] == "False")
        })
    })
    .await;
    env.flux.enabled.store(true, Ordering::SeqCst);
    let obj = env.ready("many", Duration::from_secs(30)).await;
    let ready_at = Instant::now();
    let last = env.flux.last.lock().unwrap().expect("releases were marked");
    let items = hr.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(items.len(), 30);
    assert!(ready_condition(&obj).is_some_and(|c| c["status"] == "True"));
    // A figure, not a timed assertion: the README records it (target 2 s).
    println!(
        "platformmesh: 30 services Ready {} ms after the last HelmRelease became Ready",
        ready_at.saturating_duration_since(last).as_millis()
    );
    env.flux.stop.cancel();
    env.stop.cancel();
}
