//! Controllers over kubeconfig clusters: ConfigMaps reconciled in two logical clusters from
//! kubeconfig files, and clusters engaged from Secrets in a home cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use super::{create_config_map, eventually, TestServer};
use controllers::cluster_providers::KubeconfigProvider;
use controllers::runtime::{
    Action, ClusterContext, ClusterEvent, ClusterProvider, ClusterSink, Controller, Manager,
    ManagerOptions, Reconciler, Request,
};

const STAMP: &str = "e2e.platform-mesh.io/reconciled-in";

/// Stamps each ConfigMap with its cluster and keeps a child Secret owned by it.
struct StampConfigMaps {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Reconciler for StampConfigMaps {
    type Error = kube::Error;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, kube::Error> {
        self.seen.lock().unwrap().push(req.to_string());
        let ns = req.namespace.as_deref().unwrap_or("default");
        let cached: Option<ConfigMap> = ctx
            .get_cached(Some(ns), &req.name)
            .await
            .map_err(|e| kube::Error::Service(e.to_string().into()))?;
        let Some(cm) = cached else {
            return Ok(Action::await_change());
        };
        let secrets: Api<Secret> = ctx.namespaced(ns);
        let child = format!("{}-child", req.name);
        if secrets.get_opt(&child).await?.is_none() {
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(child.clone()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: req.name.clone(),
                        uid: cm.metadata.uid.clone().unwrap_or_default(),
                        controller: Some(true),
                        ..OwnerReference::default()
                    }]),
                    ..Default::default()
                },
                ..Default::default()
            };
            secrets.create(&PostParams::default(), &secret).await?;
        }
        let stamped = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STAMP))
            .is_some_and(|v| v == ctx.cluster_name().as_str());
        if !stamped {
            let cms: Api<ConfigMap> = ctx.namespaced(ns);
            let patch = serde_json::json!({"metadata": {"annotations": {STAMP: ctx.cluster_name().as_str()}}});
            cms.patch(&req.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(Action::await_change())
    }
}

async fn stamp_of(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading ConfigMap {name}: {e}"))?
        .metadata
        .annotations?
        .get(STAMP)
        .cloned()
}

async fn secret_exists(client: &kube::Client, name: &str) -> bool {
    let api: Api<Secret> = Api::namespaced(client.clone(), "default");
    matches!(api.get_opt(name).await, Ok(Some(_)))
}

#[tokio::test]
async fn config_maps_are_reconciled_in_two_logical_clusters_from_kubeconfig_files() {
    let ts = TestServer::start().await;
    ts.workspace("a").await;
    ts.workspace("b").await;
    let (a, b) = (ts.client("root:a").await, ts.client("root:b").await);
    let dir = tempfile::tempdir().unwrap();
    ts.write_kubeconfig(dir.path(), "a.kubeconfig", "root:a");
    ts.write_kubeconfig(dir.path(), "b.kubeconfig", "root:b");

    let seen = Arc::new(Mutex::new(Vec::new()));
    let manager = Manager::new(ManagerOptions::default());
    manager
        .add(
            Controller::new("stamp", StampConfigMaps { seen: seen.clone() })
                .for_::<ConfigMap>()
                .owns::<Secret>()
                .workers(2),
        )
        .unwrap();
    let provider =
        Arc::new(KubeconfigProvider::new().with_directory(dir.path(), Duration::from_millis(50)));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop) = (manager.clone(), stop.clone());
        async move { m.run(provider, async move { stop.cancelled().await }).await }
    });

    create_config_map(&a, "cm-a", &[]).await;
    create_config_map(&b, "cm-b", &[]).await;
    eventually(
        Duration::from_secs(15),
        "both stamped in their own cluster",
        || async {
            stamp_of(&a, "cm-a").await.as_deref() == Some("a")
                && stamp_of(&b, "cm-b").await.as_deref() == Some("b")
        },
    )
    .await;
    eventually(Duration::from_secs(10), "children created", || async {
        secret_exists(&a, "cm-a-child").await && secret_exists(&b, "cm-b-child").await
    })
    .await;
    {
        let seen = seen.lock().unwrap();
        assert!(
            seen.iter()
                .all(|r| r != "a|default/cm-b" && r != "b|default/cm-a"),
            "{seen:?}"
        );
    }
    assert_eq!(manager.engaged_clusters(), vec!["a".into(), "b".into()]);
    // One cache per watched type per cluster (ConfigMap, Secret), shared by watches and reads.
    assert_eq!(manager.caches().running(), 4);

    // Deleting an owned child requeues its owner, which recreates it.
    let secrets: Api<Secret> = Api::namespaced(a.clone(), "default");
    secrets
        .delete("cm-a-child", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "child recreated through the owner",
        || async { secret_exists(&a, "cm-a-child").await },
    )
    .await;

    // Removing a kubeconfig disengages its cluster and stops its caches.
    std::fs::remove_file(dir.path().join("b.kubeconfig")).unwrap();
    eventually(Duration::from_secs(10), "b disengaged", || async {
        manager.engaged_clusters() == vec!["a".into()] && manager.caches().running() == 2
    })
    .await;
    assert_eq!(manager.metrics().engaged_clusters(), 1);
    create_config_map(&b, "cm-b-late", &[]).await;
    // A ConfigMap of the engaged cluster, written after it: once it is stamped, the controller
    // has had its chance at the first.
    create_config_map(&a, "cm-a-late", &[]).await;
    eventually(
        Duration::from_secs(10),
        "a's later ConfigMap stamped",
        || async { stamp_of(&a, "cm-a-late").await.is_some() },
    )
    .await;
    assert!(
        stamp_of(&b, "cm-b-late").await.is_none(),
        "a disengaged cluster is not reconciled"
    );

    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(manager.engaged_clusters().is_empty());
    ts.stop().await;
}

fn kubeconfig_secret(name: &str, labels: &[(&str, &str)], kubeconfig: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

async fn next_event(rx: &mut tokio::sync::mpsc::Receiver<ClusterEvent>) -> ClusterEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event in time")
        .expect("provider running")
}

#[tokio::test]
async fn secrets_holding_kubeconfigs_engage_and_disengage_clusters() {
    let ts = TestServer::start().await;
    ts.workspace("a").await;
    ts.workspace("b").await;
    create_config_map(&ts.client("root:a").await, "in-a", &[]).await;
    create_config_map(&ts.client("root:b").await, "in-b", &[]).await;
    let home = ts.client("root").await;
    let secrets: Api<Secret> = Api::namespaced(home.clone(), "default");
    let label = [("platform-mesh.io/kubeconfig", "true")];

    let provider = Arc::new(KubeconfigProvider::new().with_secrets(
        home,
        "default",
        "platform-mesh.io/kubeconfig=true",
    ));
    let (sink, mut rx) = ClusterSink::channel(8);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (p, stop) = (provider.clone(), stop.clone());
        async move { p.run(sink, stop).await }
    });

    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("remote", &label, &ts.kubeconfig_text("root:a")),
        )
        .await
        .unwrap();
    let ClusterEvent::Engage(first) = next_event(&mut rx).await else {
        panic!("expected engage")
    };
    assert_eq!(first.name().as_str(), "remote");
    let cms: Api<ConfigMap> = first.namespaced("default");
    assert!(
        cms.get_opt("in-a").await.unwrap().is_some(),
        "the client reaches root:a"
    );

    // An unlabelled Secret is not a cluster.
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("ignored", &[], &ts.kubeconfig_text("root:a")),
        )
        .await
        .unwrap();

    // A changed kubeconfig re-engages the cluster with a client for the new target.
    let patch = serde_json::json!({"data": {"kubeconfig": ByteString(ts.kubeconfig_text("root:b").into_bytes())}});
    secrets
        .patch("remote", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let ClusterEvent::Engage(second) = next_event(&mut rx).await else {
        panic!("expected re-engage")
    };
    assert_eq!(second.name().as_str(), "remote");
    assert_ne!(second.instance(), first.instance());
    let cms: Api<ConfigMap> = second.namespaced("default");
    assert!(
        cms.get_opt("in-b").await.unwrap().is_some(),
        "the new client reaches root:b"
    );
    assert!(provider.get("remote").is_some());

    secrets
        .delete("remote", &DeleteParams::default())
        .await
        .unwrap();
    match next_event(&mut rx).await {
        ClusterEvent::Disengage(name, ack) => {
            assert_eq!(name.as_str(), "remote");
            ack.done();
        }
        other => panic!("expected disengage, got {other:?}"),
    }
    assert!(provider.get("remote").is_none());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), rx.recv())
            .await
            .is_err(),
        "nothing for the unlabelled secret"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
    ts.stop().await;
}
