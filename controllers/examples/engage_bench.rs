//! Engagement benchmark (not a test): starts the server in-process, creates N workspaces bound
//! to one Widget APIExport with `--objects` Widgets each, engages them all through the kcp
//! ApiExportProvider (+PathAware) in this process and prints RSS, time to the first full sync and
//! the p99 from a write (timestamp recorded by the writer in an annotation) to the start of its
//! reconcile at `--writes-per-second`.
//!
//! `cargo run --release -p controllers --example engage_bench -- --clusters 1000 --objects 10 --writes-per-second 1000`
//!
//! RSS is of the whole process, server included; the server's share (RSS after populating, before
//! engaging) is printed separately.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apiserver::server::{start, ServeOptions, StoreKind};
use controllers::providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
use controllers::runtime::{
    Action, ClusterContext, Controller, Manager, ManagerOptions, Reconciler, Request, ResourceKind,
};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;

const WRITTEN_AT: &str = "bench.platform-mesh.io/written-at-ns";

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn widgets() -> ApiResource {
    ar("example.platform-mesh.io", "v1", "Widget", "widgets")
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

#[derive(Default)]
struct Stats {
    synced: HashSet<(String, String)>,
    first_full_sync: Option<Duration>,
    latencies: Vec<Duration>,
    measured: HashSet<String>,
}

struct Measure {
    stats: Arc<Mutex<Stats>>,
    total: usize,
    started: Instant,
}

impl Reconciler for Measure {
    type Error = String;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, String> {
        let at = now_ns();
        let cache = ctx
            .cache(&ResourceKind::dynamic(widgets(), true))
            .await
            .map_err(|e| e.to_string())?;
        let obj = cache.get(ctx.cluster_name(), req.namespace.as_deref(), &req.name);
        let mut s = self.stats.lock().unwrap();
        if s.first_full_sync.is_none()
            && s.synced.insert((req.cluster.to_string(), req.name.clone()))
            && s.synced.len() == self.total
        {
            s.first_full_sync = Some(self.started.elapsed());
        }
        if let Some(obj) = obj {
            let written = obj
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(WRITTEN_AT))
                .and_then(|v| v.parse::<u128>().ok());
            let rv = obj.metadata.resource_version.clone().unwrap_or_default();
            if let Some(w) = written {
                if s.measured
                    .insert(format!("{}|{}|{rv}", req.cluster, req.name))
                {
                    s.latencies
                        .push(Duration::from_nanos(at.saturating_sub(w) as u64));
                }
            }
        }
        Ok(Action::await_change())
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let clusters = arg("--clusters", 100);
    let objects = arg("--objects", 10);
    let rate = arg("--writes-per-second", 1000).max(1);
    let write_secs = arg("--write-seconds", 5);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ServeOptions::new(
        "127.0.0.1:0".parse().expect("addr"),
        dir.path().join("data"),
    );
    opts.store = StoreKind::Memory;
    let server = start(opts).await.expect("server");
    let kc = Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let base = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    let root_url = format!("https://{}", server.address);
    let client_at = |path: &str| {
        let mut c = base.clone();
        c.cluster_url = format!("{root_url}/clusters/{path}").parse().expect("url");
        kube::Client::try_from(c).expect("client")
    };
    let create = |client: kube::Client, r: ApiResource, body: serde_json::Value| async move {
        let api: Api<DynamicObject> = if body["metadata"]["namespace"].is_string() {
            Api::namespaced_with(client, "default", &r)
        } else {
            Api::all_with(client, &r)
        };
        let obj: DynamicObject = serde_json::from_value(body).expect("object");
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create");
    };
    let workspace = |name: String| {
        let root = client_at("root");
        async move {
            let api: Api<DynamicObject> = Api::all_with(
                root,
                &ar("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces"),
            );
            let obj: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name}, "spec": {"type": {"name": "universal"}}}))
            .expect("ws");
            api.create(&PostParams::default(), &obj)
                .await
                .expect("create ws");
            loop {
                let got = api.get(&name).await.expect("get ws");
                if got.data["status"]["phase"] == "Ready" {
                    return got.data["spec"]["cluster"]
                        .as_str()
                        .expect("cluster")
                        .to_string();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };

    let t0 = Instant::now();
    workspace("provider".into()).await;
    let provider_client = client_at("root:provider");
    create(provider_client.clone(), ar("apis.kcp.io", "v1alpha1", "APIResourceSchema", "apiresourceschemas"), serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
        "metadata": {"name": "v1.widgets.example.platform-mesh.io"},
        "spec": {"group": "example.platform-mesh.io",
            "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]}})).await;
    create(
        provider_client,
        ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
        serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
        "metadata": {"name": "widgets.example.platform-mesh.io"},
        "spec": {"latestResourceSchemas": ["v1.widgets.example.platform-mesh.io"]}}),
    )
    .await;
    let paths: Vec<String> = futures::stream::iter(0..clusters)
        .map(|i| {
            let (workspace, create, client_at) = (&workspace, &create, &client_at);
            async move {
                let name = format!("bench-{i}");
                workspace(name.clone()).await;
                let path = format!("root:{name}");
                let c = client_at(&path);
                create(c.clone(), ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"), serde_json::json!({
                    "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "widgets"},
                    "spec": {"reference": {"export": {"path": "root:provider", "name": "widgets.example.platform-mesh.io"}}}})).await;
                for o in 0..objects {
                    create(c.clone(), widgets(), serde_json::json!({
                        "apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
                        "metadata": {"name": format!("w{o}"), "namespace": "default"}, "spec": {"n": o}})).await;
                }
                path
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let populate = t0.elapsed();
    let server_rss = rss_mb();

    let mut home = base.clone();
    home.cluster_url = format!("{root_url}/clusters/root:provider")
        .parse()
        .expect("url");
    let provider = Arc::new(PathAware::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice("widgets.example.platform-mesh.io"),
    )));
    let stats = Arc::new(Mutex::new(Stats::default()));
    let manager = Manager::new(ManagerOptions::default());
    let started = Instant::now();
    manager
        .add(
            Controller::new(
                "measure",
                Measure {
                    stats: stats.clone(),
                    total: clusters * objects,
                    started,
                },
            )
            .for_kind(ResourceKind::dynamic(widgets(), true))
            .workers(8),
        )
        .expect("controller");
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (m, stop, p) = (manager.clone(), stop.clone(), provider.clone());
        async move { m.run(p, async move { stop.cancelled().await }).await }
    });
    let sync = loop {
        if let Some(d) = stats.lock().unwrap().first_full_sync {
            break d;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no full sync in 10 min"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let synced_rss = rss_mb();

    // Writes at the given rate, round-robin over workspaces and objects.
    let clients: Vec<kube::Client> = paths.iter().map(|p| client_at(p)).collect();
    let total_writes = rate * write_secs;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writes = Vec::with_capacity(total_writes);
    for i in 0..total_writes {
        tick.tick().await;
        let api: Api<DynamicObject> =
            Api::namespaced_with(clients[i % clients.len()].clone(), "default", &widgets());
        let name = format!("w{}", (i / clients.len()) % objects.max(1));
        writes.push(tokio::spawn(async move {
            let patch = serde_json::json!({"metadata": {"annotations": {WRITTEN_AT: now_ns().to_string()}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok()
        }));
    }
    let ok = futures::future::join_all(writes)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(true)))
        .count();
    let wait = Instant::now();
    while stats.lock().unwrap().latencies.len() < ok && wait.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let final_rss = rss_mb();
    let mut lat = stats.lock().unwrap().latencies.clone();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };

    println!("engage_bench: clusters={clusters} objects/cluster={objects} writes/s={rate} for {write_secs}s, cores={cores}");
    println!("  populate (server-side setup, not a target): {populate:?}");
    println!(
        "  engaged clusters:                 {}",
        manager.engaged_clusters().len()
    );
    println!("  RSS server only (before engaging): {server_rss:.1} MB");
    println!(
        "  RSS after first full sync:         {synced_rss:.1} MB (runtime share {:.1} MB)",
        synced_rss - server_rss
    );
    println!("  RSS after writes:                  {final_rss:.1} MB   target at 10,000 clusters: < 200 MB");
    println!("  first full sync:                   {sync:?}   target at 10,000 clusters: < 60 s");
    println!("  writes ok / measured:              {ok} / {}", lat.len());
    println!(
        "  write->reconcile p50 {:?} p99 {:?} max {:?}   target p99: < 100 ms",
        pct(0.5),
        pct(0.99),
        lat.last().copied().unwrap_or_default()
    );
    stop.cancel();
    let _ = run.await;
    let _ = server.shutdown().await;
}
