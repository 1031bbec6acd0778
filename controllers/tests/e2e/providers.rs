//! The Provider controller against the server: a Provider gets its workspace under
//! `root:providers` and a kubeconfig that kubectl uses to export an API there, and that reads
//! nothing elsewhere; deleting the Provider removes the workspace and the Secret.

use std::time::Duration;

use base64::Engine as _;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use serde_json::json;

use super::accounts::Env;
use super::eventually;
use super::platformmesh::kubectl;
use controllers::kcp::workspaces;
use controllers::objects::api_resource;
use controllers::objects::condition_true;
use controllers::provider::{providers, KUBECONFIG_FINALIZER, WORKSPACE_FINALIZER};

const EXPORT: &str = r#"{"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
  "metadata": {"name": "widgets.example.io"}, "spec": {}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_gets_a_workspace_and_a_kubeconfig_that_works_only_there() {
    let env = Env::start(4).await;
    let home = "root:platform-mesh-system";
    let provider: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "widgets"},
        "spec": {"providerKubeconfigSecret": {"name": "widgets-kc", "namespace": "providers", "key": "config"}},
    }))
    .unwrap();
    let api = env.api(home, &providers());
    api.create(&PostParams::default(), &provider).await.unwrap();
    eventually(Duration::from_secs(20), "Provider Ready", || {
        let api = api.clone();
        async move {
            api.get("widgets").await.is_ok_and(|p| {
                p.data["status"]["phase"] == "Ready" && condition_true(&p.data, "Ready")
            })
        }
    })
    .await;
    let p = api.get("widgets").await.unwrap();
    assert_eq!(
        p.data["status"]["providerKubeconfigSecretRef"],
        json!({"name": "widgets-kc", "namespace": "providers"})
    );
    assert_eq!(
        p.metadata.finalizers.clone().unwrap_or_default(),
        vec![WORKSPACE_FINALIZER, KUBECONFIG_FINALIZER]
    );
    for c in ["ProviderWorkspaceSubroutine", "ScopedKubeconfigSubroutine"] {
        assert!(condition_true(&p.data, c), "{c}");
    }
    // The workspace is named after the Provider and the cluster holding it.
    let pms = env
        .api("root", &workspaces())
        .get("platform-mesh-system")
        .await
        .unwrap();
    let ws_name = format!("widgets-{}", pms.data["spec"]["cluster"].as_str().unwrap());
    let ws = env
        .api("root:providers", &workspaces())
        .get(&ws_name)
        .await
        .unwrap();
    assert_eq!(ws.data["spec"]["type"]["name"], "provider");

    // The kubeconfig: an APIExport in its own workspace, nothing in root:orgs.
    let secrets = env.api_ns(
        home,
        "providers",
        &api_resource("", "v1", "Secret", "secrets"),
    );
    let secret = secrets.get("widgets-kc").await.unwrap();
    let text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret.data["data"]["config"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export.json");
    std::fs::write(&export, EXPORT).unwrap();
    let (ok, out) = kubectl(&text, &["create", "-f", export.to_str().unwrap()]).await;
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&text, &["get", "apiexports"]).await;
    assert!(ok && out.contains("widgets.example.io"), "{out}");
    let orgs = format!("{}/clusters/root:orgs", env.ts.root_url());
    for what in ["accounts", "secrets", "workspaces"] {
        let (ok, out) = kubectl(&text, &["--server", &orgs, "get", what]).await;
        assert!(!ok && out.contains("Forbidden"), "{what}: {out}");
    }

    // A steady Provider is not written again.
    let rv = api.get("widgets").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        api.get("widgets").await.unwrap().metadata.resource_version,
        rv
    );

    // A host override goes into the kubeconfig (tried at the controller's own address); the
    // Secret has its default place.
    let other: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "providers.platform-mesh.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "gadgets"}, "spec": {"hostOverride": "https://kcp.example.com:8443"},
    }))
    .unwrap();
    api.create(&PostParams::default(), &other).await.unwrap();
    let defaults = env.api_ns(
        home,
        "default",
        &api_resource("", "v1", "Secret", "secrets"),
    );
    eventually(Duration::from_secs(20), "gadgets kubeconfig", || {
        let d = defaults.clone();
        async move { matches!(d.get_opt("gadgets-provider-kubeconfig").await, Ok(Some(_))) }
    })
    .await;
    let s = defaults.get("gadgets-provider-kubeconfig").await.unwrap();
    let text = base64::engine::general_purpose::STANDARD
        .decode(s.data["data"]["kubeconfig"].as_str().unwrap())
        .unwrap();
    let kc: kube::config::Kubeconfig = serde_json::from_slice(&text).unwrap();
    let server = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    assert!(
        server.starts_with("https://kcp.example.com:8443/clusters/"),
        "{server}"
    );
    api.delete("gadgets", &DeleteParams::default())
        .await
        .unwrap();

    // Deleting it removes the kubeconfig Secret and the workspace, then the Provider.
    api.delete("widgets", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "Provider, Secret and workspace gone",
        || {
            let (a, s, w) = (
                api.clone(),
                secrets.clone(),
                env.api("root:providers", &workspaces()),
            );
            let ws_name = ws_name.clone();
            async move {
                matches!(a.get_opt("widgets").await, Ok(None))
                    && matches!(s.get_opt("widgets-kc").await, Ok(None))
                    && matches!(w.get_opt(&ws_name).await, Ok(None))
            }
        },
    )
    .await;
    env.stop().await;
}
