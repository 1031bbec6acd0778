//! End-to-end test of the APIExport provider through a real endpoint slice and the APIExport
//! virtual workspace; runs with `cargo test -p controllers --test e2e`.
//!
//! What it needs from the server: the endpoint slice kcp creates for an APIExport (served),
//! list/watch with `fieldSelector=metadata.name=`, the virtual workspace at
//! `/services/apiexport/<cluster>/<export>/clusters/{*,<name>}/...` serving APIBindings with
//! `kcp.io/cluster` (in progress), and, for path resolution, `kcp.io/path` on APIBindings (kcp's
//! path-annotation admission) or the LogicalCluster `cluster` readable through the workspace.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use tokio_util::sync::CancellationToken;

use crate::{eventually, TestServer};
use controllers::cluster_providers::kcp::{
    api_binding_kind, ApiExportOptions, ApiExportProvider, PathAware,
};
use controllers::runtime::{
    Action, ClusterContext, ClusterName, Controller, Manager, ManagerOptions, Reconciler, Request,
};

fn kcp(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "apis.kcp.io".into(),
        version: "v1alpha1".into(),
        api_version: "apis.kcp.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create(client: kube::Client, ar: &ApiResource, body: serde_json::Value) {
    let api: Api<DynamicObject> = Api::all_with(client, ar);
    let obj: DynamicObject = serde_json::from_value(body).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
}

/// Records the APIBindings it is asked about (the virtual workspace always serves them).
struct RecordBindings {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Reconciler for RecordBindings {
    type Error = kube::Error;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, kube::Error> {
        // A write-path read through <url>/clusters/<name>.
        let api = ctx.cluster().dynamic_api(&api_binding_kind().api, None);
        if api.get_opt(&req.name).await?.is_some() {
            self.seen.lock().expect("lock").push(req.to_string());
        }
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn clusters_binding_an_export_are_engaged_through_its_endpoint_slice() {
    let ts = TestServer::start().await;
    ts.workspace("provider").await;
    let c1 = ts.workspace("c1").await;
    let c2 = ts.workspace("c2").await;
    create(
        ts.client("root:provider").await,
        &kcp("APIExport", "apiexports"),
        serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
            "metadata": {"name": "example.io"}, "spec": {}}),
    )
    .await;
    let bindings = kcp("APIBinding", "apibindings");
    for ws in ["root:c1", "root:c2"] {
        create(ts.client(ws).await, &bindings, serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "example.io"},
            "spec": {"reference": {"export": {"path": "root:provider", "name": "example.io"}}}})).await;
    }

    // The home config points at the workspace holding the slice; the slice's URLs are used verbatim.
    let home = kube::Config::from_custom_kubeconfig(
        ts.kubeconfig_for("root:provider"),
        &Default::default(),
    )
    .await
    .expect("home config");
    let provider = Arc::new(PathAware::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice("example.io"),
    )));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(
            Controller::new("bindings", RecordBindings { seen: seen.clone() })
                .for_kind(api_binding_kind()),
        )
        .expect("controller");
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop, p) = (manager.clone(), stop.clone(), provider.clone());
        async move { m.run(p, async move { stop.cancelled().await }).await }
    });

    let (n1, n2) = (
        ClusterName::from(c1.as_str()),
        ClusterName::from(c2.as_str()),
    );
    eventually(Duration::from_secs(20), "both consumers engaged", || {
        let e = manager.engaged_clusters();
        let ok = e.contains(&n1) && e.contains(&n2);
        async move { ok }
    })
    .await;
    let want = format!("{c1}|example.io");
    eventually(
        Duration::from_secs(10),
        "binding reconciled through the virtual workspace",
        || {
            let ok = seen.lock().expect("lock").contains(&want);
            async move { ok }
        },
    )
    .await;
    assert_eq!(
        manager.caches().running(),
        1,
        "one wildcard cache at <url>/clusters/*"
    );
    assert_eq!(
        provider.inner().connection_pools(),
        1,
        "one connection pool for the endpoint, shared by the wildcard watch and both clusters"
    );
    assert_eq!(
        manager.cluster("root:c2").map(|c| c.name().clone()),
        Some(n2.clone())
    );

    let api: Api<DynamicObject> = Api::all_with(ts.client("root:c2").await, &bindings);
    api.delete("example.io", &DeleteParams::default())
        .await
        .expect("delete binding");
    eventually(Duration::from_secs(10), "c2 disengaged", || {
        let gone = !manager.engaged_clusters().contains(&n2);
        async move { gone }
    })
    .await;

    stop.cancel();
    run.await.expect("join").expect("manager");
    ts.stop().await;
}

#[tokio::test]
async fn engaging_many_clusters_builds_one_connection_pool_per_endpoint() {
    const N: usize = 12;
    let ts = TestServer::start().await;
    ts.workspace("provider").await;
    create(
        ts.client("root:provider").await,
        &kcp("APIExport", "apiexports"),
        serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
            "metadata": {"name": "example.io"}, "spec": {}}),
    )
    .await;
    let bindings = kcp("APIBinding", "apibindings");
    let mut names = Vec::new();
    for i in 0..N {
        let name = ts.workspace(&format!("c{i}")).await;
        create(ts.client(&format!("root:c{i}")).await, &bindings, serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "example.io"},
            "spec": {"reference": {"export": {"path": "root:provider", "name": "example.io"}}}})).await;
        names.push(format!("{name}|example.io"));
    }
    let home = kube::Config::from_custom_kubeconfig(
        ts.kubeconfig_for("root:provider"),
        &Default::default(),
    )
    .await
    .expect("home config");
    let provider = Arc::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice("example.io"),
    ));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(
            Controller::new("bindings", RecordBindings { seen: seen.clone() })
                .for_kind(api_binding_kind())
                .workers(4),
        )
        .expect("controller");
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop, p) = (manager.clone(), stop.clone(), provider.clone());
        async move { m.run(p, async move { stop.cancelled().await }).await }
    });
    // Every cluster's binding is read back through its own `/clusters/<name>` handle.
    eventually(
        Duration::from_secs(20),
        "every binding read through its cluster's client",
        || {
            let seen = seen.lock().expect("lock");
            let ok = names.iter().all(|n| seen.contains(n));
            async move { ok }
        },
    )
    .await;
    assert_eq!(manager.engaged_clusters().len(), N);
    assert_eq!(
        provider.connection_pools(),
        1,
        "{N} engaged clusters share the endpoint's one connection pool"
    );
    stop.cancel();
    run.await.expect("join").expect("manager");
    ts.stop().await;
}
