//! The Deployment step's sync against a real server: applied once, no writes when nothing
//! changed (counted from the server's own request metrics), drift and render changes applied,
//! objects no longer rendered pruned.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use super::{eventually, TestServer};
use controllers::platformmesh::apply::{sync, Policy, Target, DEPLOYED_BY_LABEL};
use std::time::Duration;

fn helm_releases() -> ApiResource {
    ApiResource {
        group: "helm.toolkit.fluxcd.io".into(),
        version: "v2".into(),
        api_version: "helm.toolkit.fluxcd.io/v2".into(),
        kind: "HelmRelease".into(),
        plural: "helmreleases".into(),
    }
}

/// Installs a HelmRelease CRD (schema open below spec and status) in the client's cluster.
pub(crate) async fn install_helm_release_crd(client: &kube::Client) {
    let crds = ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &crds);
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "helmreleases.helm.toolkit.fluxcd.io"},
        "spec": {"group": "helm.toolkit.fluxcd.io", "scope": "Namespaced",
            "names": {"plural": "helmreleases", "singular": "helmrelease", "kind": "HelmRelease", "listKind": "HelmReleaseList"},
            "versions": [{"name": "v2", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    }))
    .expect("crd");
    api.create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let hr: Api<DynamicObject> = Api::all_with(client.clone(), &helm_releases());
    eventually(Duration::from_secs(10), "HelmRelease served", || {
        let hr = hr.clone();
        async move { hr.list(&Default::default()).await.is_ok() }
    })
    .await;
}

fn release(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": name, "namespace": "platform-mesh-system",
            "labels": {"core.platform-mesh.io/operator-created": "true"}},
        "spec": {"interval": "1m", "releaseName": name, "values": {"replicas": replicas, "image": {"tag": "v1"}}}})
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

/// Write requests the server has answered: creates, updates, patches and deletes.
pub(crate) fn writes(ts: &TestServer) -> u64 {
    ts.server
        .state
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            [
                "\"POST\"",
                "\"PUT\"",
                "\"PATCH\"",
                "\"DELETE\"",
                "\"APPLY\"",
            ]
            .iter()
            .any(|v| l.contains(&format!("verb={v}")))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// A server whose root workspace serves HelmReleases and has the namespace
/// `platform-mesh-system`, and a client of it.
async fn release_server() -> (TestServer, kube::Client) {
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    install_helm_release_crd(&client).await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "platform-mesh-system"}})).unwrap(),
    )
    .await
    .expect("namespace");
    (ts, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_applies_once_writes_nothing_when_unchanged_and_prunes_what_is_no_longer_rendered() {
    let (ts, client) = release_server().await;
    let target = Target {
        client: &client,
        owner: "0d7e6a52-uid",
        default_namespace: "platform-mesh-system",
        annotations: &[],
        policy: Policy::DEPLOYMENT,
    };
    let objects = vec![release("a", 1), release("b", 1), config_map("settings")];

    let first = sync(&target, &objects, &[]).await.expect("first sync");
    assert_eq!(first.applied.len(), 3, "{first:?}");
    assert_eq!(first.kinds.len(), 2);
    let hr: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "platform-mesh-system", &helm_releases());
    let a = hr.get("a").await.expect("a applied");
    assert_eq!(a.data["spec"]["values"]["replicas"], 1);
    assert_eq!(
        a.metadata.labels.as_ref().unwrap()[DEPLOYED_BY_LABEL],
        "0d7e6a52-uid"
    );
    assert!(
        a.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|m| m.manager.as_deref() == Some("platform-mesh-deployment")
                && m.operation.as_deref() == Some("Apply")),
        "applied with the deployment field manager"
    );

    // Unchanged: zero writes, counted by the server (which did count the first sync's).
    let before = writes(&ts);
    assert!(before >= 3, "the write counter sees applies: {before}");
    let second = sync(&target, &objects, &first.kinds)
        .await
        .expect("second sync");
    assert!(
        second.applied.is_empty() && second.pruned.is_empty(),
        "{second:?}"
    );
    assert_eq!(second.unchanged, 3);
    assert_eq!(
        writes(&ts),
        before,
        "a second sync of the same render writes nothing"
    );

    // Someone changes a rendered field: the next sync puts it back.
    hr.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"values": {"replicas": 5}}})),
    )
    .await
    .expect("drift");
    let third = sync(&target, &objects, &second.kinds)
        .await
        .expect("sync after drift");
    assert_eq!(third.applied, vec!["HelmRelease platform-mesh-system/a"]);
    assert_eq!(
        hr.get("a").await.unwrap().data["spec"]["values"]["replicas"],
        1
    );

    // A new render: b changes, a and the ConfigMap go (the ConfigMap's kind no longer rendered).
    let next = vec![release("b", 2)];
    let fourth = sync(&target, &next, &third.kinds)
        .await
        .expect("sync of a smaller render");
    assert_eq!(fourth.applied, vec!["HelmRelease platform-mesh-system/b"]);
    let mut pruned = fourth.pruned.clone();
    pruned.sort();
    assert_eq!(
        pruned,
        vec![
            "ConfigMap platform-mesh-system/settings",
            "HelmRelease platform-mesh-system/a"
        ]
    );
    assert!(hr.get_opt("a").await.unwrap().is_none());
    assert_eq!(
        hr.get("b").await.unwrap().data["spec"]["values"]["replicas"],
        2
    );

    // Objects of another owner are never pruned.
    let other = Target {
        owner: "someone-else",
        ..target
    };
    let kept = sync(&other, &[], &fourth.kinds).await.expect("other owner");
    assert!(kept.pruned.is_empty());
    assert!(hr.get_opt("b").await.unwrap().is_some());

    // A kind the cluster does not serve is a clear error.
    let unknown = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "x"}});
    let e = sync(&target, &[unknown], &[]).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("does not serve argoproj.io/v1alpha1 Application"),
        "{e}"
    );
    ts.stop().await;
}

/// An object rendered from a version of the live one (it carries that `resourceVersion`) is
/// applied only to that version: unchanged, no write; changed in between by another writer, the
/// apply fails with a conflict and the other writer's value stays. The version is no part of
/// what was rendered, so it does not make an unchanged object look changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_rendered_from_a_version_does_not_overwrite_a_later_write() {
    let (ts, client) = release_server().await;
    let target = Target {
        client: &client,
        owner: "0d7e6a52-uid",
        default_namespace: "platform-mesh-system",
        annotations: &[],
        policy: Policy::DEPLOYMENT,
    };
    sync(&target, &[release("a", 1)], &[])
        .await
        .expect("first sync");
    let hr: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "platform-mesh-system", &helm_releases());
    let read = hr.get("a").await.expect("a");
    let mut rendered = release("a", 1);
    rendered["metadata"]["resourceVersion"] = json!(read.metadata.resource_version);
    let again = sync(&target, std::slice::from_ref(&rendered), &[])
        .await
        .expect("unchanged");
    assert!(again.applied.is_empty(), "{again:?}");

    // Another writer changes the object after it was read.
    hr.patch(
        "a",
        &PatchParams::apply("another").force(),
        &Patch::Apply(
            json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": "a", "namespace": "platform-mesh-system"},
            "spec": {"values": {"image": {"tag": "v2"}}}}),
        ),
    )
    .await
    .expect("the other writer");
    rendered["spec"]["values"]["image"]["tag"] = json!("v1");
    let e = sync(&target, &[rendered], &[])
        .await
        .expect_err("a stale version is refused");
    assert!(
        e.to_string().contains("Conflict") || e.to_string().contains("409"),
        "{e}"
    );
    let now = hr.get("a").await.expect("a");
    assert_eq!(now.data["spec"]["values"]["image"]["tag"], "v2");
    ts.stop().await;
}
