//! The Wait step against a real server: the default rule waits for the operator's HelmReleases
//! in the instance's namespace; explicit rules by name and selector.

use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::deploy::install_helm_release_crd;
use super::TestServer;
use controllers::platformmesh::deployment::{Clusters, Context};
use controllers::platformmesh::wait::Wait;
use controllers::subroutines::{Step, Subroutine};

fn helm_releases() -> ApiResource {
    ApiResource {
        group: "helm.toolkit.fluxcd.io".into(),
        version: "v2".into(),
        api_version: "helm.toolkit.fluxcd.io/v2".into(),
        kind: "HelmRelease".into(),
        plural: "helmreleases".into(),
    }
}

fn context(client: &kube::Client, spec: serde_json::Value) -> Context {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "PlatformMesh",
        "metadata": {"name": "pm", "namespace": "pm-system", "uid": "u-1"}, "spec": spec
    }))
    .unwrap();
    Context::new(
        object,
        Arc::new(Clusters {
            infra: client.clone(),
            runtime: client.clone(),
            remote: None,
            kcp: None,
            images: Default::default(),
            gates: Default::default(),
        }),
    )
    .expect("context")
}

fn message(step: &Step) -> String {
    match step {
        Step::Stop { message, .. } => message.clone(),
        other => format!("{other:?}"),
    }
}

async fn set_ready(api: &Api<DynamicObject>, name: &str, status: &str) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"conditions": [{"type": "Ready", "status": status,
            "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        ),
    )
    .await
    .expect("status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_holds_until_every_release_is_ready() {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;

    // Without the HelmRelease kind, the default rule has nothing to wait for.
    let step = Wait.process(&context(&client, json!({}))).await.unwrap();
    assert_eq!(step, Step::done());

    install_helm_release_crd(&client).await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for n in ["pm-system", "elsewhere"] {
        ns.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let hr: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "pm-system", &helm_releases());
    for name in ["a", "b"] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": name, "labels": {"core.platform-mesh.io/operator-created": "true"}},
            "spec": {}}))
        .unwrap();
        hr.create(&PostParams::default(), &obj).await.unwrap();
    }
    // A release elsewhere or not the operator's does not count.
    let other: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "elsewhere", &helm_releases());
    other
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                "metadata": {"name": "x", "labels": {"core.platform-mesh.io/operator-created": "true"}}, "spec": {}}))
            .unwrap(),
        )
        .await
        .unwrap();

    let ctx = context(&client, json!({}));
    let step = Wait.process(&ctx).await.unwrap();
    assert_eq!(
        message(&step),
        "HelmRelease pm-system/a, pm-system/b not Ready=True yet"
    );
    set_ready(&hr, "a", "True").await;
    set_ready(&hr, "b", "False").await;
    assert_eq!(
        message(&Wait.process(&ctx).await.unwrap()),
        "HelmRelease pm-system/b not Ready=True yet"
    );
    set_ready(&hr, "b", "True").await;
    assert_eq!(Wait.process(&ctx).await.unwrap(), Step::done());

    // Explicit rules: by name (missing, then present but not ready), and a bad selector.
    let by_name = context(
        &client,
        json!({"wait": {"resourceTypes": [{"group": "helm.toolkit.fluxcd.io", "version": "v2",
            "kind": "HelmRelease", "namespace": "elsewhere", "name": "y"}]}}),
    );
    assert_eq!(
        message(&Wait.process(&by_name).await.unwrap()),
        "HelmRelease elsewhere/y does not exist yet"
    );
    let by_name = context(
        &client,
        json!({"wait": {"resourceTypes": [{"group": "helm.toolkit.fluxcd.io", "version": "v2",
            "kind": "HelmRelease", "namespace": "elsewhere", "name": "x"}]}}),
    );
    assert_eq!(
        message(&Wait.process(&by_name).await.unwrap()),
        "HelmRelease elsewhere/x not Ready=True yet"
    );
    let unserved = context(
        &client,
        json!({"wait": {"resourceTypes": [{"group": "argoproj.io", "version": "v1alpha1", "kind": "Application"}]}}),
    );
    assert!(message(&Wait.process(&unserved).await.unwrap())
        .contains("is not served by the infra cluster"));
    ts.stop().await;
}
