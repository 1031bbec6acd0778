//! Engagement benchmark (not a test). Starts `platform-mesh serve --in-memory` as a child
//! process, creates N workspaces bound to one Widget APIExport with `--objects` Widgets each, and
//! then runs, each in a child process of its own so every RSS is that process's alone:
//!
//! - the baseline: one bare kube-rs watcher of `<vw>/clusters/*` widgets into a map (no runtime);
//! - the runtime: the kcp ApiExportProvider (+PathAware) engaging every bound workspace through
//!   the APIExport virtual workspace, one controller over Widgets, reporting time to the first
//!   full sync (every object reconciled once) and, while this process writes at
//!   `--writes-per-second`, the p99 from a write (timestamp in an annotation) to the start of its
//!   reconcile.
//!
//! ```sh
//! cargo build --release --bin platform-mesh
//! cargo run --release -p controllers --example engage_bench -- --clusters 10000 --objects 10 --writes-per-second 1000
//! ```
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use controllers::cluster_providers::kcp::{
    endpoint_urls, ApiExportOptions, ApiExportProvider, PathAware,
};
use controllers::runtime::client::{cluster_prefix, pooled_client, scoped_client};
use controllers::runtime::{
    Action, CacheError, ClusterContext, Controller, Manager, ManagerOptions, Reconciler, Request,
    ResourceKind,
};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// The allocator of the `platform-mesh` binary, so the runtime's figures are those its
/// controller processes would show.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WRITTEN_AT: &str = "bench.platform-mesh.io/written-at-ns";
const EXPORT: &str = "widgets.example.platform-mesh.io";

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

/// `VmRSS` and `VmHWM` (peak) of a process in MB (10^6 bytes, the unit of the target).
fn rss_of(pid: &str) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kib| kib * 1024.0 / 1e6)
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn num(name: &str, default: usize) -> usize {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The admin's config, addressing the server's base (the kubeconfig names root's workspace;
/// requests here name their cluster themselves).
async fn admin_config(kubeconfig: &Path) -> kube::Config {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.cluster_url = controllers::kcp::base_address(&config.cluster_url.to_string())
        .parse()
        .expect("the server's base address");
    config
}

#[tokio::main]
async fn main() {
    match arg("--child").as_deref() {
        Some("engage") => engage_child().await,
        Some("bare") => bare_child().await,
        _ => orchestrate().await,
    }
}

// ---------------------------------------------------------------------------------------------
// Child: the runtime.

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
    type Error = CacheError;

    async fn reconcile(&self, req: Request, ctx: ClusterContext) -> Result<Action, CacheError> {
        let at = now_ns();
        let cache = ctx.cache(&ResourceKind::dynamic(widgets(), true)).await?;
        let obj = cache.get(ctx.cluster_name(), req.namespace.as_deref(), &req.name);
        let mut s = self.stats.lock().unwrap();
        if s.first_full_sync.is_none()
            && s.synced.insert((req.cluster.to_string(), req.name.clone()))
            && s.synced.len() == self.total
        {
            s.first_full_sync = Some(self.started.elapsed());
            s.synced = HashSet::new();
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

/// Engages every bound workspace; prints `SYNCED <seconds> <rss> <peak>`, waits for
/// `WRITES <n>` on stdin, prints `RESULT <measured> <p50 µs> <p99 µs> <max µs> <rss> <peak>`.
async fn engage_child() {
    let kubeconfig = PathBuf::from(arg("--kubeconfig").expect("--kubeconfig"));
    let total = num("--clusters", 100) * num("--objects", 10);
    let mut home = admin_config(&kubeconfig).await;
    let root = home.cluster_url.to_string();
    home.cluster_url = format!("{}/clusters/root:provider", root.trim_end_matches('/'))
        .parse()
        .expect("url");
    let provider = Arc::new(PathAware::new(ApiExportProvider::new(
        home,
        ApiExportOptions::for_slice(EXPORT),
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
                    total,
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
    let (rss, peak) = rss_of("self");
    println!(
        "SYNCED {} {rss} {peak} {} {}",
        sync.as_secs_f64(),
        manager.engaged_clusters().len(),
        provider.inner().connection_pools()
    );

    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut writes = 0usize;
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(n) = line.strip_prefix("WRITES ") {
            writes = n.trim().parse().unwrap_or(0);
            break;
        }
    }
    let wait = Instant::now();
    while stats.lock().unwrap().latencies.len() < writes && wait.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (rss, peak) = rss_of("self");
    let mut lat = stats.lock().unwrap().latencies.clone();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
            .as_micros()
    };
    println!(
        "RESULT {} {} {} {} {rss} {peak}",
        lat.len(),
        pct(0.5),
        pct(0.99),
        lat.last().copied().unwrap_or_default().as_micros()
    );
    stop.cancel();
    let _ = run.await;
}

// ---------------------------------------------------------------------------------------------
// Child: the baseline, a bare list+watch of every widget through the virtual workspace into a
// plain map, no runtime.

/// Prints `READY <seconds> <objects> <rss> <peak>` once the initial list is in a map.
async fn bare_child() {
    let kubeconfig = PathBuf::from(arg("--kubeconfig").expect("--kubeconfig"));
    let config = admin_config(&kubeconfig).await;
    let root = config.cluster_url.to_string();
    let root = root.trim_end_matches('/');
    let started = Instant::now();
    let home = pooled_client(&config, &format!("{root}/clusters/root:provider")).expect("client");
    let slices: Api<DynamicObject> = Api::all_with(
        home,
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
        ),
    );
    let slice = slices.get(EXPORT).await.expect("endpoint slice");
    let url = endpoint_urls(&serde_json::to_value(&slice).expect("json"))
        .into_iter()
        .next()
        .expect("an endpoint URL");
    let wildcard = pooled_client(&config, &format!("{url}/clusters/*")).expect("client");
    let api: Api<DynamicObject> = Api::all_with(wildcard, &widgets());
    // Objects by (cluster, namespace, name): what a hand-written wildcard informer keeps.
    let mut objects: HashMap<(String, String, String), DynamicObject> = HashMap::new();
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event.expect("watch") {
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let key = (
                    o.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("kcp.io/cluster"))
                        .cloned()
                        .unwrap_or_default(),
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default(),
                );
                objects.insert(key, o);
            }
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    let took = started.elapsed();
    let (rss, peak) = rss_of("self");
    println!(
        "READY {} {} {rss} {peak}",
        took.as_secs_f64(),
        objects.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The orchestrator: server, population, children, writes, report.

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

impl Proc {
    fn pid(&self) -> String {
        self.0.id().map(|p| p.to_string()).unwrap_or_default()
    }
}

fn server_binary() -> PathBuf {
    if let Some(p) = arg("--server-bin") {
        return PathBuf::from(p);
    }
    // target/<profile>/examples/engage_bench -> target/<profile>/platform-mesh
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("platform-mesh"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release --bin platform-mesh` first (or pass --server-bin)",
        bin.display()
    );
    bin
}

async fn start_server(data_dir: &Path) -> (Proc, String) {
    let mut child = Command::new(server_binary())
        .args(["serve", "--in-memory", "--listen", "127.0.0.1:0"])
        .args(["--max-requests-inflight", "100000"])
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start platform-mesh serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let address = loop {
        let line = lines
            .next_line()
            .await
            .expect("server stderr")
            .expect("server exited before listening");
        if let Some(rest) = line.strip_prefix("platform-mesh is serving on https://") {
            break rest.trim().to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (Proc(child), address)
}

fn spawn_child(mode: &str, kubeconfig: &Path, extra: &[String]) -> Proc {
    let exe = std::env::current_exe().expect("current exe");
    // For profiling only (its RSS is then the profiler's): ENGAGE_BENCH_WRAP="valgrind --tool=massif".
    let wrap = std::env::var("ENGAGE_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut command = match wrap.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(wrap).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let child = command
        .args(["--child", mode, "--kubeconfig"])
        .arg(kubeconfig)
        .args(extra)
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn child");
    Proc(child)
}

/// The next line of a child's stdout that starts with `tag`, split into fields after it.
async fn read_tagged(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    tag: &str,
) -> Vec<f64> {
    loop {
        let line = lines
            .next_line()
            .await
            .expect("child stdout")
            .unwrap_or_else(|| panic!("child exited before {tag}"));
        if let Some(rest) = line.strip_prefix(tag) {
            return rest
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(f64::NAN))
                .collect();
        }
    }
}

async fn create(client: kube::Client, r: ApiResource, body: serde_json::Value) {
    let api: Api<DynamicObject> = match body["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client, ns, &r),
        None => Api::all_with(client, &r),
    };
    let obj: DynamicObject = serde_json::from_value(body).expect("object");
    let mut delay = Duration::from_millis(20);
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => return,
            Err(e) if delay < Duration::from_secs(10) => {
                // The binding's API may take a moment to be served in a fresh workspace.
                let _ = e;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => panic!("create {}: {e}", r.kind),
        }
    }
}

/// Creates workspace `root:<name>` and waits until it is ready.
async fn workspace(root: kube::Client, name: String) {
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
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn orchestrate() {
    let clusters = num("--clusters", 100);
    let objects = num("--objects", 10);
    let rate = num("--writes-per-second", 1000).max(1);
    let write_secs = num("--write-seconds", 5);
    let concurrency = num("--concurrency", 128);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    let (server, address) = start_server(&data_dir).await;
    let kubeconfig = data_dir.join("admin.kubeconfig");
    let config = admin_config(&kubeconfig).await;
    // One connection pool for all setup traffic; each workspace is a path prefix over it.
    let shared = pooled_client(&config, &format!("https://{address}")).expect("client");
    let at = |path: &str| scoped_client(&shared, &cluster_prefix(path));

    let t0 = Instant::now();
    workspace(at("root"), "provider".into()).await;
    create(at("root:provider"), ar("apis.kcp.io", "v1alpha1", "APIResourceSchema", "apiresourceschemas"), serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
        "metadata": {"name": "v1.widgets.example.platform-mesh.io"},
        "spec": {"group": "example.platform-mesh.io",
            "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]}})).await;
    create(
        at("root:provider"),
        ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
        serde_json::json!({
        "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
        "metadata": {"name": EXPORT},
        "spec": {"latestResourceSchemas": ["v1.widgets.example.platform-mesh.io"]}}),
    )
    .await;
    let done = std::sync::atomic::AtomicUsize::new(0);
    let paths: Vec<String> = futures::stream::iter(0..clusters)
        .map(|i| {
            let (at, done) = (&at, &done);
            async move {
                let name = format!("bench-{i}");
                workspace(at("root"), name.clone()).await;
                let path = format!("root:{name}");
                create(at(&path), ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"), serde_json::json!({
                    "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding", "metadata": {"name": "widgets"},
                    "spec": {"reference": {"export": {"path": "root:provider", "name": EXPORT}}}})).await;
                futures::future::join_all((0..objects).map(|o| create(at(&path), widgets(), serde_json::json!({
                    "apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
                    "metadata": {"name": format!("w{o}"), "namespace": "default"}, "spec": {"n": o}})))).await;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n % 1000 == 0 {
                    eprintln!("  populated {n}/{clusters} workspaces ({:?})", t0.elapsed());
                }
                path
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let populate = t0.elapsed();
    let (server_rss_populated, _) = rss_of(&server.pid());

    // Baseline: a bare list+watch of the same objects, no runtime.
    let bare = spawn_child("bare", &kubeconfig, &[]);
    let mut bare = bare;
    let mut bare_lines = BufReader::new(bare.0.stdout.take().expect("stdout")).lines();
    let b = read_tagged(&mut bare_lines, "READY ").await;
    let _ = bare.0.wait().await;
    drop(bare);

    // The runtime.
    let mut engage = spawn_child(
        "engage",
        &kubeconfig,
        &[
            "--clusters".into(),
            clusters.to_string(),
            "--objects".into(),
            objects.to_string(),
        ],
    );
    let mut lines = BufReader::new(engage.0.stdout.take().expect("stdout")).lines();
    let mut stdin = engage.0.stdin.take().expect("stdin");
    let synced = read_tagged(&mut lines, "SYNCED ").await;

    // Writes at the given rate, round-robin over workspaces and objects.
    let clients: Vec<kube::Client> = paths.iter().map(|p| at(p)).collect();
    let total_writes = rate * write_secs;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writes = Vec::with_capacity(total_writes);
    let write_start = Instant::now();
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
    let achieved = ok as f64 / write_start.elapsed().as_secs_f64();
    stdin
        .write_all(format!("WRITES {ok}\n").as_bytes())
        .await
        .expect("tell child");
    let r = read_tagged(&mut lines, "RESULT ").await;
    let (server_rss, server_peak) = rss_of(&server.pid());
    let _ = engage.0.wait().await;

    let ms = |us: f64| us / 1000.0;
    println!("engage_bench: clusters={clusters} objects/cluster={objects} writes/s={rate} for {write_secs}s, cores={cores}");
    println!("  populate (setup through the server, not a target): {populate:.1?}");
    println!(
        "  server (child process) RSS:  {server_rss_populated:.1} MB after populating, {server_rss:.1} MB at the end (peak {server_peak:.1})"
    );
    println!(
        "  baseline, bare kube-rs watcher of <vw>/clusters/* widgets into a map (child process): {} objects in {:.2} s, RSS {:.1} MB (peak {:.1})",
        b[1], b[0], b[2], b[3]
    );
    println!(
        "  runtime (child process): engaged clusters {} over {} connection pool(s)",
        synced[3], synced[4]
    );
    println!(
        "    first full sync:          {:>8.2} s      target < 120 s",
        synced[0]
    );
    println!(
        "    RSS after full sync:      {:>8.1} MB    (peak {:.1} MB)",
        synced[1], synced[2]
    );
    println!(
        "    RSS after writes:         {:>8.1} MB    target < 1 GiB (peak {:.1} MB)",
        r[4], r[5]
    );
    println!(
        "    writes ok / measured:     {ok} / {} ({achieved:.0} writes/s achieved)",
        r[0]
    );
    println!(
        "    write->reconcile p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms    target p99 < 100 ms",
        ms(r[1]),
        ms(r[2]),
        ms(r[3])
    );
    // The same figures for `platform-mesh bench --only engage`, which runs this and builds the
    // README's table from them.
    let figures = serde_json::json!({
        "populate_s": populate.as_secs_f64(),
        "server_rss_populated_mb": server_rss_populated,
        "server_rss_mb": server_rss,
        "baseline_s": b[0],
        "baseline_objects": b[1],
        "baseline_rss_mb": b[2],
        "baseline_peak_mb": b[3],
        "engaged": synced[3],
        "pools": synced[4],
        "first_sync_s": synced[0],
        "synced_rss_mb": synced[1],
        "rss_mb": r[4],
        "peak_mb": r[5],
        "writes_ok": ok,
        "measured": r[0],
        "achieved_per_s": achieved,
        "p50_ms": ms(r[1]),
        "p99_ms": ms(r[2]),
        "max_ms": ms(r[3]),
    });
    println!("FIGURES {figures}");
    drop(server);
}
