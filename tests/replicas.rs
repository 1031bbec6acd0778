//! Several `platform-mesh serve` replicas on one etcd: any replica serves any request, and a
//! watch on one replica sees the writes made through the others, in order.

#![cfg(feature = "etcd")]

mod common;

use std::collections::BTreeSet;
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

/// A client of `server` (admin) at workspace `path`.
async fn at(server: &Server, path: &str) -> kube::Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    config.cluster_url = format!("{}/clusters/{path}", server.url())
        .parse()
        .expect("url");
    kube::Client::try_from(config).expect("client")
}

/// Waits until `client`'s workspace serves requests (it was just created).
async fn served(what: &str, client: &kube::Client) {
    eventually(&format!("{what} is served"), || {
        let client = client.clone();
        async move {
            Api::<ConfigMap>::namespaced(client, "default")
                .list(&Default::default())
                .await
                .is_ok()
        }
    })
    .await;
}

fn manifest(yaml: &str) -> DynamicObject {
    serde_saphyr::from_str(yaml).expect("manifest")
}

fn kcp(kind: &str, plural: &str) -> ApiResource {
    let group = if kind == "Workspace" {
        "tenancy.kcp.io"
    } else {
        "apis.kcp.io"
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1alpha1", kind), plural)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_made_through_one_replica_is_served_by_the_other_and_so_is_its_removal() {
    let etcd = EtcdProcess::start().await.expect("etcd");
    let endpoint = etcd.endpoint();
    let flags = ["--etcd-servers", endpoint.as_str(), "--no-controllers"];
    let a = Server::start_with(&flags);
    let b = Server::start_replica(&a, &flags);
    // Through A: the provider's export (root:providers:widgets) and a consumer that binds it.
    let create = |client: kube::Client, r: ApiResource, obj: DynamicObject| async move {
        Api::<DynamicObject>::all_with(client, &r)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating a {}: {e}", r.kind));
    };
    let workspace = |name: &str, ty: &str| {
        manifest(&format!(
            "apiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata: {{name: {name}}}\nspec: {{type: {{name: {ty}, path: root}}}}\n"
        ))
    };
    create(
        at(&a, "root:providers").await,
        kcp("Workspace", "workspaces"),
        workspace("widgets", "provider"),
    )
    .await;
    create(
        at(&a, "root").await,
        kcp("Workspace", "workspaces"),
        workspace("shop", "universal"),
    )
    .await;
    let provider = at(&a, "root:providers:widgets").await;
    served("the provider workspace", &provider).await;
    create(
        provider.clone(),
        kcp("APIResourceSchema", "apiresourceschemas"),
        manifest(include_str!("../examples/workspaces/widget-schema.yaml")),
    )
    .await;
    create(
        provider,
        kcp("APIExport", "apiexports"),
        manifest(include_str!("../examples/workspaces/widget-export.yaml")),
    )
    .await;
    let shop_a = at(&a, "root:shop").await;
    served("the consumer workspace", &shop_a).await;
    create(
        shop_a.clone(),
        kcp("APIBinding", "apibindings"),
        manifest(include_str!("../examples/workspaces/widget-binding.yaml")),
    )
    .await;

    // Through B, the bound kind is served in the consumer workspace.
    let widget = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.platform-mesh.io", "v1", "Widget"),
        "widgets",
    );
    let widgets_b: Api<DynamicObject> =
        Api::namespaced_with(at(&b, "root:shop").await, "default", &widget);
    let first = manifest(include_str!("../examples/workspaces/widget.yaml"));
    eventually("B serves the kind bound through A", || {
        let (api, w) = (widgets_b.clone(), first.clone());
        async move { api.create(&PostParams::default(), &w).await.is_ok() }
    })
    .await;

    // The binding deleted through A: B stops serving the kind (404, as for any unserved kind).
    Api::<DynamicObject>::all_with(shop_a, &kcp("APIBinding", "apibindings"))
        .delete("widgets", &Default::default())
        .await
        .expect("delete the binding on A");
    eventually("B stops serving the unbound kind", || {
        let api = widgets_b.clone();
        async move {
            matches!(api.list(&Default::default()).await, Err(kube::Error::Api(e)) if e.code == 404)
        }
    })
    .await;
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

const LEASE: &str = "platform-mesh-controllers";
/// The workspace controllers' own Lease (upstream's account-operator has its own too).
const WORKSPACES_LEASE: &str = "platform-mesh-controllers-workspaces";

/// The Lease's holder (empty once released) and transitions, once it exists.
async fn lease_holder(client: &kube::Client) -> Option<(String, i32)> {
    holder_of(client, LEASE).await
}

/// The holder and transitions of Lease `name`, once it exists.
async fn holder_of(client: &kube::Client, name: &str) -> Option<(String, i32)> {
    let spec = lease_spec_named(client, name).await?;
    Some((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    ))
}

/// The controllers' Lease, `None` while there is none; any answer but NotFound fails the test.
async fn lease_spec(
    client: &kube::Client,
) -> Option<k8s_openapi::api::coordination::v1::LeaseSpec> {
    lease_spec_named(client, LEASE).await
}

/// Lease `name`, `None` while there is none; any answer but NotFound fails the test.
async fn lease_spec_named(
    client: &kube::Client,
    name: &str,
) -> Option<k8s_openapi::api::coordination::v1::LeaseSpec> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading Lease {name}: {e}"))?
        .spec
}

/// `leader_election_master_status` of a replica, from its `/metrics`.
async fn leading(client: &kube::Client) -> Option<u8> {
    let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(request).await.ok()?;
    let line = format!("leader_election_master_status{{name=\"{LEASE}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// Creates the organisation `name` and waits until the account controller made it Ready.
async fn organisation_gets_ready(client: &kube::Client, name: &str) {
    let accounts = "/clusters/root:orgs/apis/core.platform-mesh.io/v1alpha1/accounts";
    let body = json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
        "metadata": {"name": name}, "spec": {"type": "org", "displayName": name}});
    let request = http::Request::post(accounts)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client
        .request_text(request)
        .await
        .expect("create the Account");
    eventually(&format!("Account {name} becomes Ready"), || async {
        let request = http::Request::get(format!("{accounts}/{name}"))
            .body(Vec::new())
            .expect("request");
        let Ok(account) = client.request::<serde_json::Value>(request).await else {
            return false;
        };
        account["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
    .await;
}

/// Replicas on one etcd elect one of them to run the controllers: the other waits while the
/// leader renews its Lease, and takes over once a killed leader's Lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_runs_the_controllers_and_another_takes_over_when_it_dies() {
    let etcd = EtcdProcess::start().await.expect("etcd");
    let endpoint = etcd.endpoint();
    let flags = [
        "--etcd-servers",
        endpoint.as_str(),
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "500ms",
    ];
    let mut a = Server::start_with(&flags);
    let ka = a.kube().await;
    eventually("A, alone, leads", || async {
        lease_holder(&ka)
            .await
            .is_some_and(|(holder, _)| !holder.is_empty())
            && leading(&ka).await == Some(1)
    })
    .await;
    let (first, transitions) = lease_holder(&ka).await.expect("lease");
    assert_eq!(transitions, 0);
    // The workspace controllers campaign for a Lease of their own; alone, A holds it too.
    eventually("A, alone, leads the workspace controllers", || async {
        holder_of(&ka, WORKSPACES_LEASE)
            .await
            .is_some_and(|(holder, _)| holder == first)
    })
    .await;

    let b = Server::start_replica(&a, &flags);
    let kb = b.kube().await;
    // B keeps campaigning but A keeps renewing: watch A renew across two lease durations (12
    // renewals, one per 500 ms retry period; the evidence that B had time to take over), then
    // look.
    let mut renewals = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while renewals.len() < 12 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A renewed only {} times",
            renewals.len()
        );
        if let Some(t) = lease_spec(&kb).await.and_then(|s| s.renew_time) {
            renewals.insert(t.0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lease_holder(&kb).await, Some((first.clone(), 0)));
    assert_eq!(
        leading(&kb).await,
        Some(0),
        "B must not lead while A renews"
    );
    assert_eq!(leading(&ka).await, Some(1));
    // Written through B, reconciled by A's controllers.
    organisation_gets_ready(&kb, "acme").await;

    // A dies without giving the lease up: B takes over once it expires.
    a.kill();
    eventually("B takes over", || async {
        leading(&kb).await == Some(1)
            && lease_holder(&kb)
                .await
                .is_some_and(|(holder, _)| holder != first)
    })
    .await;
    assert_eq!(lease_holder(&kb).await.map(|(_, t)| t), Some(1));
    eventually("B takes the workspace controllers' Lease over", || async {
        holder_of(&kb, WORKSPACES_LEASE)
            .await
            .is_some_and(|(holder, _)| !holder.is_empty() && holder != first)
    })
    .await;
    organisation_gets_ready(&kb, "bravo").await;

    // A leader stopped by SIGTERM gives the Lease up before it exits, so the next one need not
    // wait for it to expire.
    let (second, _) = lease_holder(&kb).await.expect("lease");
    let mut b = b;
    let c = Server::start_replica(&b, &flags);
    let kc = c.kube().await;
    b.terminate();
    let after_exit = lease_holder(&kc).await.expect("lease");
    assert_ne!(after_exit.0, second, "B exited still holding the Lease");
    eventually("C takes over", || async { leading(&kc).await == Some(1) }).await;
    organisation_gets_ready(&kc, "charlie").await;
}
