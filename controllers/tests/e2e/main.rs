//! End-to-end tests of the runtime and providers against the project's own API server, run
//! in-process on 127.0.0.1 with an in-memory store and client-certificate auth.

mod accounts;
mod apiexport_against_server;
mod broker;
mod deploy;
mod events;
mod kubeconfig_clusters;
mod leader_election;
mod lifecycle;
mod managed_providers;
mod platformmesh;
mod providers;
mod sample_controller;
mod sharded;
mod wait;
mod watch_resume;
mod wildcard_cache;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::server::{start, RunningServer, ServeOptions, StoreKind};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A running server and the directory holding its data.
pub(crate) struct TestServer {
    pub server: RunningServer,
    /// Kept so the data directory lives as long as the server.
    pub _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = ServeOptions::new(
            "127.0.0.1:0".parse().expect("addr"),
            dir.path().join("data"),
        );
        opts.store = StoreKind::Memory;
        let server = start(opts).await.expect("server starts");
        TestServer { server, _dir: dir }
    }

    /// The admin kubeconfig's base context alone (the server's address, no workspace), as the
    /// current one. The file also has a `root` context, current there.
    fn base_kubeconfig(&self) -> Kubeconfig {
        let mut kc = Kubeconfig::read_from(&self.server.kubeconfig).expect("admin kubeconfig");
        kc.clusters.truncate(1);
        let base = kc.clusters[0].name.clone();
        kc.contexts
            .retain(|c| c.context.as_ref().is_some_and(|c| c.cluster == base));
        kc.current_context = Some(kc.contexts[0].name.clone());
        kc
    }

    /// The admin kubeconfig with one context, its server URL ending in `/clusters/<cluster>`.
    pub fn kubeconfig_for(&self, cluster: &str) -> Kubeconfig {
        let mut kc = self.base_kubeconfig();
        for named in kc.clusters.iter_mut() {
            if let Some(c) = named.cluster.as_mut() {
                let base = c.server.clone().unwrap_or_default();
                c.server = Some(format!("{}/clusters/{cluster}", base.trim_end_matches('/')));
            }
        }
        kc
    }

    /// That kubeconfig as text (JSON, which is YAML).
    pub fn kubeconfig_text(&self, cluster: &str) -> String {
        serde_json::to_string(&self.kubeconfig_for(cluster)).expect("kubeconfig serializes")
    }

    /// Writes that kubeconfig to `dir/<file>`.
    pub fn write_kubeconfig(&self, dir: &Path, file: &str, cluster: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, self.kubeconfig_text(cluster)).expect("write kubeconfig");
        path
    }

    /// The admin config at the server root (no cluster prefix).
    pub async fn root_config(&self) -> kube::Config {
        kube::Config::from_custom_kubeconfig(self.base_kubeconfig(), &KubeConfigOptions::default())
            .await
            .expect("config")
    }

    /// A client for one logical cluster.
    pub async fn client(&self, cluster: &str) -> kube::Client {
        let config = kube::Config::from_custom_kubeconfig(
            self.kubeconfig_for(cluster),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    /// Creates workspace `root:<name>`, waits until it is Ready, returns its logical-cluster name.
    pub async fn workspace(&self, name: &str) -> String {
        let root = self.client("root").await;
        let ws = ApiResource {
            group: "tenancy.kcp.io".into(),
            version: "v1alpha1".into(),
            api_version: "tenancy.kcp.io/v1alpha1".into(),
            kind: "Workspace".into(),
            plural: "workspaces".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(root, &ws);
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"type": {"name": "universal"}}
        }))
        .expect("workspace");
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create workspace");
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = api.get(name).await.expect("get workspace");
            if got.data["status"]["phase"] == "Ready" {
                return got.data["spec"]["cluster"]
                    .as_str()
                    .expect("cluster name")
                    .to_string();
            }
            assert!(
                tokio::time::Instant::now() < until,
                "workspace {name} not ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn root_url(&self) -> String {
        format!("https://{}", self.server.address)
    }

    pub async fn stop(self) {
        let _ = self.server.shutdown().await;
    }
}

/// Creates a ConfigMap in `default`.
pub(crate) async fn create_config_map(
    client: &kube::Client,
    name: &str,
    labels: &[(&str, &str)],
) -> ConfigMap {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
        "data": {"k": "v"}
    }))
    .expect("configmap");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create configmap")
}

/// Polls `check` every 20 ms until it holds or `timeout` passes.
pub(crate) async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
