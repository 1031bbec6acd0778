//! Several `platform-mesh serve` replicas on one etcd: any replica serves any request, and a
//! watch on one replica sees the writes made through the others, in order.

#![cfg(feature = "etcd")]

mod common;

use std::time::Duration;

use apiserver::storage::etcd::testing::EtcdProcess;
use common::Server;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

/// Retries `check` for up to 30 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).expect("cm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_etcd_serve_the_same_objects() {
    let etcd = EtcdProcess::start().await.expect("etcd");
    let endpoint = etcd.endpoint();
    let flags = ["--etcd-servers", endpoint.as_str()];
    let a = Server::start_with(&flags);
    let b = Server::start_replica(&a, &flags);
    let (ka, kb) = (a.kube().await, b.kube().await);

    // A CRD created through A is served by B, and objects flow both ways.
    let crds: Api<DynamicObject> = Api::all_with(
        ka.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .expect("crd");
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create CRD on A");
    let widget = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let widgets_b: Api<DynamicObject> = Api::namespaced_with(kb.clone(), "default", &widget);
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .expect("widget");
    eventually("B serves the CRD created on A", || {
        let (api, w) = (widgets_b.clone(), w.clone());
        async move { api.create(&PostParams::default(), &w).await.is_ok() }
    })
    .await;
    let widgets_a: Api<DynamicObject> = Api::namespaced_with(ka.clone(), "default", &widget);
    let got = widgets_a.get("w1").await.expect("A reads B's widget");
    assert_eq!(got.data["spec"]["size"], 3);

    // A workspace created through A is reachable by path through B.
    let workspaces: Api<DynamicObject> = Api::all_with(
        ka.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("tenancy.kcp.io", "v1alpha1", "Workspace"),
            "workspaces",
        ),
    );
    let ws: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": "team"}
    }))
    .expect("workspace");
    workspaces
        .create(&PostParams::default(), &ws)
        .await
        .expect("create workspace on A");
    let mut team_b = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&b.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    team_b.cluster_url = format!("{}/clusters/root:team", b.url())
        .parse()
        .expect("url");
    let team_b = kube::Client::try_from(team_b).expect("client");
    let in_team: Api<ConfigMap> = Api::namespaced(team_b, "default");
    eventually("B serves the workspace created on A", || {
        let api = in_team.clone();
        async move {
            api.create(&PostParams::default(), &configmap("hello"))
                .await
                .is_ok()
        }
    })
    .await;

    // A watch on B sees every write, made through either replica, once and in order.
    let on_a: Api<ConfigMap> = Api::namespaced(ka.clone(), "default");
    let on_b: Api<ConfigMap> = Api::namespaced(kb.clone(), "default");
    let start = on_b
        .list(&Default::default())
        .await
        .expect("list on B")
        .metadata
        .resource_version
        .expect("list resourceVersion");
    let mut watch = on_b
        .watch(&WatchParams::default().timeout(120), &start)
        .await
        .expect("watch on B")
        .boxed();
    let mut acknowledged = Vec::new();
    for i in 0..60 {
        let api = if i % 2 == 0 { &on_a } else { &on_b };
        let cm = api
            .create(&PostParams::default(), &configmap(&format!("cm-{i:02}")))
            .await
            .expect("create configmap");
        let rv: u64 = cm
            .metadata
            .resource_version
            .expect("rv")
            .parse()
            .expect("numeric rv");
        acknowledged.push((rv, format!("cm-{i:02}")));
        // Read-your-writes through the other replica.
        let other = if i % 2 == 0 { &on_b } else { &on_a };
        other
            .get(&format!("cm-{i:02}"))
            .await
            .expect("the other replica reads the write at once");
    }
    let mut seen = Vec::new();
    while seen.len() < acknowledged.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), watch.try_next())
            .await
            .expect("watch event in time")
            .expect("watch error")
            .expect("watch ended");
        match event {
            WatchEvent::Added(cm) => seen.push((
                cm.metadata
                    .resource_version
                    .expect("rv")
                    .parse::<u64>()
                    .expect("numeric"),
                cm.metadata.name.expect("name"),
            )),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(seen, acknowledged);
}

/// An etcd that serves only HTTPS and verifies its clients: the server reaches it with
/// `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile`; without the CA it refuses to start
/// and names the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reaches_an_etcd_that_verifies_clients() {
    let etcd = EtcdProcess::start_tls().await.expect("etcd with TLS");
    let endpoint = etcd.endpoint();
    let pki = etcd.pki_dir().expect("pki");
    let path = |f: &str| pki.join(f).display().to_string();
    let (ca, cert, key) = (path("ca.crt"), path("admin.crt"), path("admin.key"));
    let flags = [
        "--no-controllers",
        "--etcd-servers",
        endpoint.as_str(),
        "--etcd-cafile",
        ca.as_str(),
        "--etcd-certfile",
        cert.as_str(),
        "--etcd-keyfile",
        key.as_str(),
    ];
    let server = Server::start_with(&flags);
    let cms: Api<ConfigMap> = Api::namespaced(server.kube().await, "default");
    cms.create(&PostParams::default(), &configmap("over-tls"))
        .await
        .expect("create through an etcd reached over TLS");
    assert_eq!(
        cms.get("over-tls").await.expect("get").data.expect("data")["k"],
        "v"
    );

    let data = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_platform-mesh"))
        .args(["serve", "--listen", "127.0.0.1:0", "--no-controllers"])
        .arg("--data-dir")
        .arg(data.path())
        .args(["--etcd-servers", endpoint.as_str()])
        .output()
        .expect("run platform-mesh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without the CA: {stderr}");
    assert!(stderr.contains("--etcd-cafile"), "{stderr}");
}
