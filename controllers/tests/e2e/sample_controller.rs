//! The sample controller: it copies a Widget's `spec` (an exported, bound resource type)
//! into the annotation `example.platform-mesh.io/spec-copy` on the same Widget. Run through the
//! kcp APIExport provider (+ PathAware) across 50 bound workspaces, and through the kubeconfig
//! provider across three separate servers.
//!
//! The exactly-once assertion ([`Log::assert_exactly_once`]): the reconciler records the
//! `resourceVersion` of the cached object each reconcile starts from. For every object:
//! - no `(cluster, object, resourceVersion)` is reconciled more than once;
//! - every resourceVersion written by the test (create / spec change) and every resourceVersion
//!   produced by the controller's own annotation write (its echo) is reconciled;
//! - so the reconciles of an object are exactly `test changes + controller writes`, and the
//!   controller writes once per spec change (the echo reconcile finds the annotation current and
//!   writes nothing: the write is a no-op the second time).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use super::{eventually, TestServer};
use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
use controllers::cluster_providers::KubeconfigProvider;
use controllers::runtime::{
    Action, ClusterContext, ClusterName, Controller, Manager, ManagerOptions, ReconcileError,
    Reconciler, Request, ResourceKind,
};

/// Where the controller copies the spec.
pub(crate) const COPY_ANNOTATION: &str = "example.platform-mesh.io/spec-copy";
const EXPORT: &str = "widgets.example.platform-mesh.io";

pub(crate) fn widgets() -> ApiResource {
    ApiResource {
        group: "example.platform-mesh.io".into(),
        version: "v1".into(),
        api_version: "example.platform-mesh.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widget_kind() -> ResourceKind {
    ResourceKind::dynamic(widgets(), true)
}

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

/// Creates the Widget APIResourceSchema and its APIExport in workspace `path`.
pub(crate) async fn export_widgets(ts: &TestServer, path: &str) {
    let client = ts.client(path).await;
    create(
        client.clone(),
        &kcp("APIResourceSchema", "apiresourceschemas"),
        serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": {"name": "v1.widgets.example.platform-mesh.io"},
            "spec": {"group": "example.platform-mesh.io",
                "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"color": {"type": "string"}}},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}]}
        }),
    )
    .await;
    create(
        client,
        &kcp("APIExport", "apiexports"),
        serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
            "metadata": {"name": EXPORT},
            "spec": {"latestResourceSchemas": ["v1.widgets.example.platform-mesh.io"]}}),
    )
    .await;
}

/// Binds the Widget export of `export_path` in workspace `path`.
pub(crate) async fn bind_widgets(ts: &TestServer, path: &str, export_path: &str) {
    create(
        ts.client(path).await,
        &kcp("APIBinding", "apibindings"),
        serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "widgets"},
            "spec": {"reference": {"export": {"path": export_path, "name": EXPORT}}}}),
    )
    .await;
}

/// Creates Widget `default/<name>`; returns its resourceVersion.
pub(crate) async fn create_widget(client: &kube::Client, name: &str, color: &str) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &widgets());
    let w: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"color": color}}))
    .expect("widget");
    let created = api
        .create(&PostParams::default(), &w)
        .await
        .expect("create widget");
    created.metadata.resource_version.expect("rv")
}

/// Changes a Widget's color; returns the new resourceVersion.
pub(crate) async fn set_color(client: &kube::Client, name: &str, color: &str) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &widgets());
    let patch = serde_json::json!({"spec": {"color": color}});
    let got = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch widget");
    got.metadata.resource_version.expect("rv")
}

/// The copy annotation of Widget `default/<name>`.
pub(crate) async fn copy_of(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &widgets());
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading Widget {name}: {e}"))?
        .metadata
        .annotations?
        .get(COPY_ANNOTATION)
        .cloned()
}

/// The annotation value the controller writes for `color`.
pub(crate) fn copy_for(color: &str) -> String {
    serde_json::to_string(&serde_json::json!({"color": color})).expect("json")
}

/// `(cluster, namespace/name)`.
pub(crate) type ObjectKey = (String, String);

/// What the sample controller did.
#[derive(Default, Debug)]
pub(crate) struct Log {
    /// Reconciles per object and resourceVersion the reconcile started from.
    pub reconciles: HashMap<ObjectKey, BTreeMap<String, usize>>,
    /// resourceVersions produced by the controller's own writes.
    pub writes: HashMap<ObjectKey, Vec<String>>,
    /// Reconciles per cluster (objects found or not).
    pub per_cluster: HashMap<String, usize>,
    /// Reconciles running now: a reconcile that has written but not yet logged its write
    /// must not let the test call an object settled.
    pub in_flight: usize,
    /// Reconciles that found no object in the cache (the object was deleted).
    pub missing: HashMap<ObjectKey, usize>,
}

/// Counts one running reconcile in [`Log::in_flight`] until dropped.
struct InFlight(Arc<Mutex<Log>>);

impl InFlight {
    fn enter(log: &Arc<Mutex<Log>>) -> Self {
        log.lock().unwrap().in_flight += 1;
        Self(log.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut l) = self.0.lock() {
            l.in_flight -= 1;
        }
    }
}

impl Log {
    fn reconciled(&self, key: &ObjectKey, rv: &str) -> bool {
        self.reconciles.get(key).is_some_and(|m| m.contains_key(rv))
    }

    /// Whether every given resourceVersion and every controller write of `key` was reconciled
    /// and no reconcile is still running.
    pub fn settled(&self, key: &ObjectKey, test_rvs: &[String]) -> bool {
        self.in_flight == 0
            && test_rvs.iter().all(|rv| self.reconciled(key, rv))
            && self
                .writes
                .get(key)
                .is_none_or(|ws| ws.iter().all(|rv| self.reconciled(key, rv)))
    }

    /// The module's exactly-once assertion for one object changed by the test at `test_rvs`.
    pub fn assert_exactly_once(&self, key: &ObjectKey, test_rvs: &[String]) {
        let seen = self.reconciles.get(key).cloned().unwrap_or_default();
        for (rv, n) in &seen {
            assert_eq!(
                *n, 1,
                "{key:?} reconciled {n} times at resourceVersion {rv}"
            );
        }
        let writes = self.writes.get(key).cloned().unwrap_or_default();
        assert_eq!(
            writes.len(),
            test_rvs.len(),
            "{key:?}: one controller write per spec change, none for its echo: {writes:?}"
        );
        let expected: BTreeSet<&String> = test_rvs.iter().chain(writes.iter()).collect();
        let got: BTreeSet<&String> = seen.keys().collect();
        assert_eq!(
            got, expected,
            "{key:?}: reconciled exactly the test's changes and the controller's write echoes"
        );
    }
}

/// Copies `spec` of a Widget into [`COPY_ANNOTATION`], reading it from the shared cache.
pub(crate) struct CopySpec {
    pub log: Arc<Mutex<Log>>,
}

/// The sample reconciler's error: a message, retried with backoff.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CopyError(String);

impl ReconcileError for CopyError {}

impl From<String> for CopyError {
    fn from(message: String) -> Self {
        CopyError(message)
    }
}

impl Reconciler for CopySpec {
    type Error = CopyError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, CopyError> {
        let _running = InFlight::enter(&self.log);
        let cluster = ctx.cluster_name().to_string();
        *self
            .log
            .lock()
            .unwrap()
            .per_cluster
            .entry(cluster.clone())
            .or_default() += 1;
        let cache = ctx.cache(&widget_kind()).await.map_err(|e| e.to_string())?;
        let key = (
            cluster,
            format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name),
        );
        let Some(obj) = cache.get(ctx.cluster_name(), req.namespace.as_deref(), &req.name) else {
            *self.log.lock().unwrap().missing.entry(key).or_default() += 1;
            return Ok(Action::await_change());
        };
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        *self
            .log
            .lock()
            .unwrap()
            .reconciles
            .entry(key.clone())
            .or_default()
            .entry(rv)
            .or_default() += 1;
        let want = serde_json::to_string(&obj.data["spec"]).map_err(|e| e.to_string())?;
        let have = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(COPY_ANNOTATION));
        if have != Some(&want) {
            let api = ctx
                .cluster()
                .dynamic_api(&widgets(), req.namespace.as_deref());
            let patch = serde_json::json!({"metadata": {"annotations": {COPY_ANNOTATION: want}}});
            let written = api
                .patch(&req.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| e.to_string())?;
            self.log
                .lock()
                .unwrap()
                .writes
                .entry(key)
                .or_default()
                .push(written.metadata.resource_version.unwrap_or_default());
        }
        Ok(Action::await_change())
    }
}

pub(crate) fn copy_controller(log: &Arc<Mutex<Log>>) -> Controller<CopySpec> {
    Controller::new("copy-spec", CopySpec { log: log.clone() })
        .for_kind(widget_kind())
        .workers(4)
}

const WORKSPACES: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_controller_reconciles_fifty_bound_workspaces_through_the_apiexport_provider() {
    let ts = TestServer::start().await;
    ts.workspace("provider").await;
    export_widgets(&ts, "root:provider").await;

    // 50 consumers, created, bound and populated concurrently.
    let consumers: Vec<(String, String, String)> =
        futures::future::join_all((0..WORKSPACES).map(|i| {
            let ts = &ts;
            async move {
                let path = format!("root:c{i}");
                let cluster = ts.workspace(&format!("c{i}")).await;
                bind_widgets(ts, &path, "root:provider").await;
                let rv = create_widget(&ts.client(&path).await, "w", "red").await;
                (path, cluster, rv)
            }
        }))
        .await;

    let home = kube::Config::from_custom_kubeconfig(
        ts.kubeconfig_for("root:provider"),
        &Default::default(),
    )
    .await
    .expect("home config");
    let provider = Arc::new(PathAware::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice(EXPORT),
    )));
    let log = Arc::new(Mutex::new(Log::default()));
    let manager = Manager::new(ManagerOptions::default());
    manager.add(copy_controller(&log)).expect("controller");
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop, p) = (manager.clone(), stop.clone(), provider.clone());
        async move { m.run(p, async move { stop.cancelled().await }).await }
    });

    // Every workspace's Widget is reconciled, and the echo of the controller's write too.
    let mut changes: HashMap<ObjectKey, Vec<String>> = consumers
        .iter()
        .map(|(_, c, rv)| ((c.clone(), "default/w".to_string()), vec![rv.clone()]))
        .collect();
    eventually(Duration::from_secs(40), "all 50 workspaces settled", || {
        let l = log.lock().unwrap();
        let ok = changes.iter().all(|(k, rvs)| l.settled(k, rvs));
        async move { ok }
    })
    .await;
    assert_eq!(manager.engaged_clusters().len(), WORKSPACES);
    assert_eq!(manager.caches().running(), 1, "one wildcard Widget cache");
    for (path, _, _) in consumers.iter().take(3) {
        assert_eq!(
            copy_of(&ts.client(path).await, "w").await,
            Some(copy_for("red"))
        );
        // PathAware: the path resolves to the engaged cluster.
        assert!(manager.cluster(path).is_some(), "{path} resolves");
    }

    // A spec change in one workspace is copied again.
    let (p1, c1, _) = &consumers[1];
    let rv = set_color(&ts.client(p1).await, "w", "blue").await;
    let k1 = (c1.clone(), "default/w".to_string());
    changes.get_mut(&k1).expect("key").push(rv);
    eventually(Duration::from_secs(10), "spec change copied", || {
        let ok = log.lock().unwrap().settled(&k1, &changes[&k1]);
        async move { ok }
    })
    .await;
    assert_eq!(
        copy_of(&ts.client(p1).await, "w").await,
        Some(copy_for("blue"))
    );

    // A workspace bound later is picked up.
    let late = ts.workspace("late").await;
    bind_widgets(&ts, "root:late", "root:provider").await;
    let rv = create_widget(&ts.client("root:late").await, "w", "green").await;
    let kl = (late.clone(), "default/w".to_string());
    changes.insert(kl.clone(), vec![rv]);
    eventually(Duration::from_secs(15), "late workspace reconciled", || {
        let ok = log.lock().unwrap().settled(&kl, &changes[&kl]);
        async move { ok }
    })
    .await;
    assert!(manager
        .engaged_clusters()
        .contains(&ClusterName::from(late.as_str())));

    // Unbinding one workspace disengages it: no further reconciles there.
    let (p0, c0, _) = &consumers[0];
    let n0 = ClusterName::from(c0.as_str());
    let bindings: Api<DynamicObject> =
        Api::all_with(ts.client(p0).await, &kcp("APIBinding", "apibindings"));
    bindings
        .delete("widgets", &DeleteParams::default())
        .await
        .expect("unbind");
    eventually(Duration::from_secs(10), "c0 disengaged", || {
        let gone = !manager.engaged_clusters().contains(&n0);
        async move { gone }
    })
    .await;
    let before = log.lock().unwrap().per_cluster.get(c0).copied();
    // Writes in the unbound workspace (if its Widgets are still reachable) and in a bound one.
    let _ = Api::<DynamicObject>::namespaced_with(ts.client(p0).await, "default", &widgets())
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"color": "green"}})),
        )
        .await;
    let (p2, c2, _) = &consumers[2];
    let rv = set_color(&ts.client(p2).await, "w", "green").await;
    let k2 = (c2.clone(), "default/w".to_string());
    changes.get_mut(&k2).expect("key").push(rv);
    eventually(
        Duration::from_secs(10),
        "bound workspace still reconciled",
        || {
            let ok = log.lock().unwrap().settled(&k2, &changes[&k2]);
            async move { ok }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        log.lock().unwrap().per_cluster.get(c0).copied(),
        before,
        "no reconcile of an unbound workspace after its disengagement"
    );
    assert_eq!(manager.engaged_clusters().len(), WORKSPACES); // 50 - c0 + late

    // Exactly once per change (see the module docs).
    {
        let l = log.lock().unwrap();
        for (k, rvs) in &changes {
            if k.0 != *c0 {
                l.assert_exactly_once(k, rvs);
            }
        }
        l.assert_exactly_once(
            &(c0.clone(), "default/w".into()),
            &changes[&(c0.clone(), "default/w".to_string())],
        );
    }

    stop.cancel();
    run.await.expect("join").expect("manager");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_controller_reconciles_three_separate_servers_through_kubeconfig_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut servers = Vec::new();
    for i in 0..3 {
        let ts = TestServer::start().await;
        ts.workspace("provider").await;
        export_widgets(&ts, "root:provider").await;
        ts.workspace("app").await;
        bind_widgets(&ts, "root:app", "root:provider").await;
        let rv = create_widget(&ts.client("root:app").await, "w", "red").await;
        ts.write_kubeconfig(dir.path(), &format!("s{i}.kubeconfig"), "root:app");
        servers.push((ts, rv));
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let manager = Manager::new(ManagerOptions::default());
    manager.add(copy_controller(&log)).expect("controller");
    let provider =
        Arc::new(KubeconfigProvider::new().with_directory(dir.path(), Duration::from_millis(50)));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop) = (manager.clone(), stop.clone());
        async move { m.run(provider, async move { stop.cancelled().await }).await }
    });

    let mut changes: HashMap<ObjectKey, Vec<String>> = servers
        .iter()
        .enumerate()
        .map(|(i, (_, rv))| ((format!("s{i}"), "default/w".to_string()), vec![rv.clone()]))
        .collect();
    eventually(Duration::from_secs(20), "every server settled", || {
        let l = log.lock().unwrap();
        let ok = changes.iter().all(|(k, rvs)| l.settled(k, rvs));
        async move { ok }
    })
    .await;
    assert_eq!(
        manager.engaged_clusters(),
        vec!["s0".into(), "s1".into(), "s2".into()]
    );
    for (ts, _) in &servers {
        assert_eq!(
            copy_of(&ts.client("root:app").await, "w").await,
            Some(copy_for("red"))
        );
    }
    // A change on the second server is copied there, and only there.
    let client = servers[1].0.client("root:app").await;
    let rv = set_color(&client, "w", "blue").await;
    let k1 = ("s1".to_string(), "default/w".to_string());
    changes.get_mut(&k1).expect("key").push(rv);
    eventually(Duration::from_secs(10), "change copied on s1", || {
        let ok = log.lock().unwrap().settled(&k1, &changes[&k1]);
        async move { ok }
    })
    .await;
    assert_eq!(copy_of(&client, "w").await, Some(copy_for("blue")));
    {
        let l = log.lock().unwrap();
        for (k, rvs) in &changes {
            l.assert_exactly_once(k, rvs);
        }
    }
    stop.cancel();
    run.await.expect("join").expect("manager");
    for (ts, _) in servers {
        ts.stop().await;
    }
}
