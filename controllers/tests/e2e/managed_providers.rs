//! The ManagedProvider controller against the server (kcp and runtime cluster at once) with the
//! Provider controller and a stand-in for Flux and OCM: the lifecycle upstream's end-to-end test
//! runs, with and without `cleanupOnDelete`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::accounts::Env;
use super::eventually;
use super::platformmesh::{kubectl, open_crd};
use controllers::cluster_providers::fixed::FixedClusters;
use controllers::kcp::workspaces;
use controllers::objects::api_resource;
use controllers::objects::condition_true;
use controllers::objects::platform_meshes;
use controllers::provider::managed::{
    controller, helm_releases, helm_repositories, managed_providers, oci_repositories, ocm,
    DEPLOY_FINALIZER, KUBECONFIG_FINALIZER, PROVIDER_FINALIZER,
};
use controllers::provider::providers;
use controllers::runtime::{Cluster, Manager, ManagerOptions};

const NS: &str = "platform-mesh-system";

/// Flux and OCM's part: HelmReleases become Ready, sources observe their generation, OCM
/// Resources resolve to a chart image.
fn stand_in(client: kube::Client, stop: CancellationToken) {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            for ar in [
                helm_releases(),
                oci_repositories(),
                helm_repositories(),
                ocm("Resource"),
            ] {
                let Ok(list) = Api::<DynamicObject>::all_with(client.clone(), &ar)
                    .list(&ListParams::default())
                    .await
                else {
                    continue;
                };
                for item in list.items {
                    let generation = item.metadata.generation.unwrap_or(0);
                    if item.data["status"]["observedGeneration"] == generation {
                        continue;
                    }
                    let mut status = json!({"observedGeneration": generation,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                            "message": "stand-in", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
                    if ar.kind == "Resource" {
                        status["resource"] = json!({"version": "0.3.0",
                            "access": {"imageReference": "ghcr.io/platform-mesh/charts/quickstart:0.3.0"}});
                    }
                    let api: Api<DynamicObject> = Api::namespaced_with(
                        client.clone(),
                        item.metadata.namespace.as_deref().unwrap_or("default"),
                        &ar,
                    );
                    let _ = api
                        .patch_status(
                            item.metadata.name.as_deref().unwrap_or(""),
                            &PatchParams::default(),
                            &Patch::Merge(&json!({ "status": status })),
                        )
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    });
}

fn managed_provider(cleanup: bool) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "ManagedProvider",
        "metadata": {"name": "my-managed-provider", "namespace": NS},
        "spec": {
            "platformMeshRef": {"name": "platform-mesh"},
            "cleanupOnDelete": cleanup,
            "runtimeDeployments": [
                {"flux": {"registry": "ghcr.io/platform-mesh/helm-charts", "chart": "example-httpbin-operator",
                          "version": "0.5.14", "values": {"replicas": 1}}},
                {"flux": {"type": "helm", "registry": "https://stefanprodan.github.io/podinfo",
                          "chart": "podinfo", "version": "6.7.1"}},
                {"ocm": {"registry": "ghcr.io/platform-mesh",
                         "component": "github.com/platform-mesh/provider-quickstart", "version": "0.3.0"}},
            ],
        },
    }))
    .unwrap()
}

/// (kind, name) of every object the reference ManagedProvider deploys.
fn deployed() -> Vec<(ApiResource, &'static str)> {
    vec![
        (helm_releases(), "example-httpbin-operator"),
        (oci_repositories(), "example-httpbin-operator"),
        (helm_releases(), "podinfo"),
        (helm_repositories(), "podinfo"),
        (helm_releases(), "provider-quickstart"),
        (oci_repositories(), "provider-quickstart"),
        (ocm("Repository"), "provider-quickstart"),
        (ocm("Component"), "provider-quickstart"),
        (ocm("Resource"), "provider-quickstart"),
    ]
}

async fn all_deployed(runtime: &kube::Client, present: bool) -> bool {
    for (ar, name) in deployed() {
        let api: Api<DynamicObject> = Api::namespaced_with(runtime.clone(), NS, &ar);
        let found = api
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading {name}: {e}"));
        if found.is_some() != present {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_provider_onboards_a_service_and_cleans_up_as_asked() {
    let env = Env::start(4).await;
    let runtime = env.ts.client("root").await;
    for ar in [
        helm_releases(),
        oci_repositories(),
        helm_repositories(),
        ocm("Repository"),
        ocm("Component"),
        ocm("Resource"),
    ] {
        open_crd(&runtime, &ar).await;
    }
    let stop = CancellationToken::new();
    stand_in(runtime.clone(), stop.clone());
    let manager = Manager::new(ManagerOptions::default());
    manager.add(controller(env.kcp.clone(), 2)).unwrap();
    let clusters = Arc::new(FixedClusters::new([Cluster::new(
        "runtime",
        runtime.clone(),
    )]));
    let run = tokio::spawn({
        let stop = stop.clone();
        async move {
            manager
                .run(clusters, async move { stop.cancelled().await })
                .await
        }
    });

    // The platform: root:providers:system, and a Ready PlatformMesh.
    let system: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": "system"},
        "spec": {"type": {"name": "provider", "path": "root"}}})).unwrap();
    env.api("root:providers", &workspaces())
        .create(&PostParams::default(), &system)
        .await
        .unwrap();
    let namespaces = Api::<DynamicObject>::all_with(
        runtime.clone(),
        &api_resource("", "v1", "Namespace", "namespaces"),
    );
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let mps: Api<DynamicObject> = Api::namespaced_with(runtime.clone(), NS, &managed_providers());
    mps.create(&PostParams::default(), &managed_provider(false))
        .await
        .unwrap();
    // Nothing moves before the PlatformMesh is Ready.
    eventually(
        Duration::from_secs(10),
        "waiting for the PlatformMesh",
        || {
            let mps = mps.clone();
            async move {
                mps.get("my-managed-provider")
                    .await
                    .is_ok_and(|m| m.data["status"]["phase"] == "WaitingForPlatformMesh")
            }
        },
    )
    .await;
    let pms: Api<DynamicObject> = Api::namespaced_with(runtime.clone(), NS, &platform_meshes());
    let pm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
        "metadata": {"name": "platform-mesh", "namespace": NS},
        "spec": {"exposure": {"baseDomain": "portal.localhost", "port": 8443, "protocol": "https"}}})).unwrap();
    pms.create(&PostParams::default(), &pm).await.unwrap();
    // Set by the PlatformMesh controller in the product; it does not run here.
    pms.patch_status("platform-mesh", &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Complete", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})))
        .await
        .unwrap();

    let ready = |mps: Api<DynamicObject>| async move {
        eventually(Duration::from_secs(30), "ManagedProvider Ready", || {
            let mps = mps.clone();
            async move {
                mps.get("my-managed-provider").await.is_ok_and(|m| {
                    m.data["status"]["phase"] == "Ready" && condition_true(&m.data, "Ready")
                })
            }
        })
        .await;
    };
    ready(mps.clone()).await;
    let mp = mps.get("my-managed-provider").await.unwrap();
    for c in [
        "WaitPlatformMeshSubroutine",
        "ProviderResourceSubroutine",
        "WaitProviderSubroutine",
        "KubeconfigCopySubroutine",
        "DeploySubroutine",
    ] {
        assert!(condition_true(&mp.data, c), "{c}");
    }
    assert_eq!(
        mp.metadata.finalizers.clone().unwrap_or_default(),
        vec![KUBECONFIG_FINALIZER, DEPLOY_FINALIZER]
    );
    let secret_ref = json!({"name": "my-managed-provider-provider-kubeconfig", "namespace": NS});
    assert_eq!(mp.data["status"]["providerKubeconfigSecretRef"], secret_ref);

    // The Provider in root:providers:system, its workspace, and its kubeconfig in both places.
    let provider_api = env.api("root:providers:system", &providers());
    let p = provider_api.get("my-managed-provider").await.unwrap();
    assert_eq!(p.data["status"]["phase"], "Ready");
    assert_eq!(p.data["status"]["providerKubeconfigSecretRef"], secret_ref);
    let system_cluster = env
        .api("root:providers", &workspaces())
        .get("system")
        .await
        .unwrap()
        .data["spec"]["cluster"]
        .as_str()
        .unwrap()
        .to_string();
    let provider_ws = format!("my-managed-provider-{system_cluster}");
    assert!(env
        .api("root:providers", &workspaces())
        .get_opt(&provider_ws)
        .await
        .unwrap()
        .is_some());
    let copy = Api::<DynamicObject>::namespaced_with(
        runtime.clone(),
        NS,
        &api_resource("", "v1", "Secret", "secrets"),
    );
    let text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(
                copy.get("my-managed-provider-provider-kubeconfig")
                    .await
                    .unwrap()
                    .data["data"]["kubeconfig"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap(),
    )
    .unwrap();
    let (ok, out) = kubectl(&text, &["-n", "default", "get", "configmaps"]).await;
    assert!(ok, "{out}");
    assert!(all_deployed(&runtime, true).await);
    let release = Api::<DynamicObject>::namespaced_with(runtime.clone(), NS, &helm_releases())
        .get("provider-quickstart")
        .await
        .unwrap();
    assert_eq!(
        release.data["spec"]["chartRef"],
        json!({"kind": "OCIRepository", "name": "provider-quickstart", "namespace": NS})
    );
    let source = Api::<DynamicObject>::namespaced_with(runtime.clone(), NS, &oci_repositories())
        .get("provider-quickstart")
        .await
        .unwrap();
    assert_eq!(
        source.data["spec"]["url"],
        "oci://ghcr.io/platform-mesh/charts/quickstart"
    );
    assert_eq!(source.data["spec"]["ref"], json!({"tag": "0.3.0"}));
    let podinfo = Api::<DynamicObject>::namespaced_with(runtime.clone(), NS, &helm_releases())
        .get("podinfo")
        .await
        .unwrap();
    assert_eq!(
        podinfo.data["spec"]["chart"]["spec"]["sourceRef"],
        json!({"kind": "HelmRepository", "name": "podinfo", "namespace": NS})
    );

    // Without cleanupOnDelete: the deployments and the copy go, the Provider stays Ready.
    mps.delete("my-managed-provider", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "ManagedProvider and its deployments gone",
        || {
            let (mps, copy, runtime) = (mps.clone(), copy.clone(), runtime.clone());
            async move {
                matches!(mps.get_opt("my-managed-provider").await, Ok(None))
                    && matches!(
                        copy.get_opt("my-managed-provider-provider-kubeconfig")
                            .await,
                        Ok(None)
                    )
                    && all_deployed(&runtime, false).await
            }
        },
    )
    .await;
    let p = provider_api.get("my-managed-provider").await.unwrap();
    assert_eq!(p.data["status"]["phase"], "Ready");
    assert!(p.metadata.deletion_timestamp.is_none());

    // With cleanupOnDelete: the Provider and its workspace go too.
    mps.create(&PostParams::default(), &managed_provider(true))
        .await
        .unwrap();
    ready(mps.clone()).await;
    let mp = mps.get("my-managed-provider").await.unwrap();
    assert_eq!(
        mp.metadata.finalizers.clone().unwrap_or_default(),
        vec![PROVIDER_FINALIZER, KUBECONFIG_FINALIZER, DEPLOY_FINALIZER]
    );
    mps.delete("my-managed-provider", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "ManagedProvider, Provider and workspace gone",
        || {
            let (mps, p, w, runtime) = (
                mps.clone(),
                provider_api.clone(),
                env.api("root:providers", &workspaces()),
                runtime.clone(),
            );
            let provider_ws = provider_ws.clone();
            async move {
                matches!(mps.get_opt("my-managed-provider").await, Ok(None))
                    && matches!(p.get_opt("my-managed-provider").await, Ok(None))
                    && matches!(w.get_opt(&provider_ws).await, Ok(None))
                    && all_deployed(&runtime, false).await
            }
        },
    )
    .await;
    stop.cancel();
    let _ = run.await;
    env.stop().await;
}
