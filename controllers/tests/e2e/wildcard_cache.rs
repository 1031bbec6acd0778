//! The kcp APIExport provider's engagement and shared caches against this server's wildcard
//! endpoint (`/clusters/*`): clusters with a Ready APIBinding are engaged, one wildcard cache
//! per type serves all of them, and workspace paths resolve to cluster names.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use tokio_util::sync::CancellationToken;

use super::{create_config_map, eventually, TestServer};
use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
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
    let obj: DynamicObject = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
}

fn binding(export_path: &str, export: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
        "metadata": {"name": export},
        "spec": {"reference": {"export": {"path": export_path, "name": export}}}})
}

/// Records every request and reads its object from the shared cache.
struct Record {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Reconciler for Record {
    type Error = controllers::runtime::CacheError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, Self::Error> {
        let cm: Option<ConfigMap> = ctx.get_cached(req.namespace.as_deref(), &req.name).await?;
        if cm.is_some() {
            self.seen.lock().unwrap().push(req.to_string());
        }
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn bound_clusters_share_one_wildcard_cache_and_resolve_by_path() {
    let ts = TestServer::start().await;
    ts.workspace("provider").await;
    let c1 = ts.workspace("c1").await;
    let c2 = ts.workspace("c2").await;
    let c3 = ts.workspace("c3").await;
    create(
        ts.client("root:provider").await,
        &kcp("APIExport", "apiexports"),
        serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
            "metadata": {"name": "example.io"}, "spec": {}}),
    )
    .await;
    let bindings = kcp("APIBinding", "apibindings");
    create(
        ts.client("root:c1").await,
        &bindings,
        binding("root:provider", "example.io"),
    )
    .await;
    create(
        ts.client("root:c2").await,
        &bindings,
        binding("root:provider", "example.io"),
    )
    .await;
    // c3 cannot bind an export that does not exist (kcp refuses it; so does this server): it
    // stays without a binding.
    let refused = Api::<DynamicObject>::all_with(ts.client("root:c3").await, &bindings)
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding("root:provider", "missing.io")).expect("binding"),
        )
        .await;
    assert!(
        matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{refused:?}"
    );

    let seen = Arc::new(Mutex::new(Vec::new()));
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(
            Controller::new("record", Record { seen: seen.clone() })
                .for_::<ConfigMap>()
                .workers(2),
        )
        .unwrap();
    let provider = Arc::new(PathAware::new(ApiExportProvider::new(
        ts.root_config().await,
        ApiExportOptions::for_urls(vec![ts.root_url()]),
    )));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop, p) = (manager.clone(), stop.clone(), provider.clone());
        async move { m.run(p, async move { stop.cancelled().await }).await }
    });

    let (n1, n2, n3) = (
        ClusterName::from(c1.as_str()),
        ClusterName::from(c2.as_str()),
        ClusterName::from(c3.as_str()),
    );
    eventually(Duration::from_secs(15), "bound clusters engaged", || {
        let engaged = manager.engaged_clusters();
        let ok = engaged.contains(&n1) && engaged.contains(&n2);
        async move { ok }
    })
    .await;
    assert!(
        !manager.engaged_clusters().contains(&n3),
        "a workspace without a binding engages nothing"
    );
    // Writes go to <url>/clusters/<name>; the path resolves to the name.
    let by_path = manager.cluster("root:c1").expect("path resolves");
    assert_eq!(by_path.name(), &n1);
    assert_eq!(provider.paths_of(&c1), vec!["root:c1".to_string()]);

    create_config_map(&ts.client("root:c1").await, "x", &[]).await;
    create_config_map(&ts.client("root:c2").await, "y", &[]).await;
    create_config_map(&ts.client("root:c3").await, "z", &[]).await;
    // Written after z: once it is reconciled, the controller has had its chance at z.
    create_config_map(&ts.client("root:c1").await, "after-z", &[]).await;
    let (want1, want2) = (format!("{c1}|default/x"), format!("{c2}|default/y"));
    let after = format!("{c1}|default/after-z");
    eventually(
        Duration::from_secs(10),
        "objects of bound clusters reconciled",
        || {
            let s = seen.lock().unwrap().clone();
            let ok = s.contains(&want1) && s.contains(&want2) && s.contains(&after);
            async move { ok }
        },
    )
    .await;
    assert!(
        !seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.starts_with(&format!("{c3}|"))),
        "unbound cluster reconciled"
    );
    // One wildcard cache serves the ConfigMaps of every engaged cluster, watches and reads alike.
    assert_eq!(manager.caches().running(), 1);

    // The last binding of a cluster going away disengages it.
    let api: Api<DynamicObject> = Api::all_with(ts.client("root:c2").await, &bindings);
    api.delete("example.io", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "c2 disengaged", || {
        let gone = !manager.engaged_clusters().contains(&n2);
        async move { gone }
    })
    .await;
    assert!(manager.cluster("root:c2").is_none());
    assert!(manager.engaged_clusters().contains(&n1));

    stop.cancel();
    run.await.unwrap().unwrap();
    ts.stop().await;
}

/// A metadata-only kind's cache holds the objects' metadata and none of their content, beside
/// a full cache of the same kind in the same cluster, and follows changes as the full one does.
#[tokio::test]
async fn a_metadata_only_cache_keeps_metadata_and_no_content() {
    use controllers::runtime::{CacheRegistry, Cluster, ResourceKind};
    let ts = TestServer::start().await;
    let client = ts.client("root").await;
    create_config_map(&client, "first", &[("app", "a")]).await;
    let cluster = Cluster::new("root", client.clone());
    let caches = CacheRegistry::default();
    let full = caches.get_or_start(&cluster, &ResourceKind::of::<ConfigMap>());
    let meta = caches.get_or_start(
        &cluster,
        &ResourceKind::of::<ConfigMap>().with_metadata_only(),
    );
    assert!(!Arc::ptr_eq(&full, &meta), "one cache per form");
    assert!(full.wait_synced(Duration::from_secs(10)).await);
    assert!(meta.wait_synced(Duration::from_secs(10)).await);
    create_config_map(&client, "second", &[]).await;
    let name: ClusterName = "root".into();
    eventually(
        Duration::from_secs(10),
        "both caches see the new object",
        || {
            let n = (
                full.list(&name, Some("default")),
                meta.list(&name, Some("default")),
            );
            let both = [&n.0, &n.1].iter().all(|l| {
                l.iter()
                    .any(|o| o.metadata.name.as_deref() == Some("second"))
            });
            async move { both }
        },
    )
    .await;
    let first = |objects: Vec<Arc<DynamicObject>>| {
        objects
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some("first"))
            .expect("first")
    };
    let (f, m) = (
        first(full.list(&name, Some("default"))),
        first(meta.list(&name, Some("default"))),
    );
    assert_eq!(f.data["data"]["k"], "v");
    assert!(
        m.data.get("data").is_none(),
        "content in a metadata-only cache: {:?}",
        m.data
    );
    assert_eq!(m.metadata.labels, f.metadata.labels);
    assert_eq!(m.metadata.resource_version, f.metadata.resource_version);
    assert_eq!(m.types.as_ref().map(|t| t.kind.as_str()), Some("ConfigMap"));
}
