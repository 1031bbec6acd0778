//! `bench --only kcp`: the tenancy figures of this server beside the real kcp (the release of
//! `tests/peers/kcp`, one root shard with its embedded etcd), in one run on one machine, through
//! the same client: workspaces created per second under one parent and as a tree, the memory an
//! empty workspace costs, how long deleting the tree takes, and an APIExport virtual-workspace
//! LIST across many bound workspaces.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde_json::{json, Value};

use crate::bench::report::{rows, Row};
use crate::bench::{rss_of, BenchOptions, ChildServer};
use crate::peers::Kcp;

/// What one server did.
struct Figures {
    flat_per_second: f64,
    flat_ready_seconds: f64,
    tree_per_second: f64,
    rss_per_workspace: f64,
    delete_seconds: f64,
    vw_list_ms: Vec<f64>,
    vw_items: usize,
}

/// The server under test: a client at its base address and the process to read the RSS of.
struct Target {
    client: kube::Client,
    pid: u32,
}

async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(u16, Value)> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())?;
    match client.request::<Value>(request).await {
        Ok(v) => Ok((200, v)),
        Err(kube::Error::Api(s)) => Ok((s.code, json!({"message": s.message}))),
        Err(e) => Err(e.into()),
    }
}

fn workspace(name: &str, ty: Option<&Value>) -> Value {
    let mut ws = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}});
    if let Some(ty) = ty {
        ws["spec"] = json!({"type": ty});
    }
    ws
}

fn workspaces(path: &str) -> String {
    format!("/clusters/{path}/apis/tenancy.kcp.io/v1alpha1/workspaces")
}

/// Creates `names` under `parent` with `writers` concurrent clients, of type `ty` (the
/// parent's default child type when `None`).
pub(crate) async fn create_all(
    client: &kube::Client,
    parent: &str,
    names: Vec<String>,
    writers: usize,
    ty: Option<Value>,
) -> anyhow::Result<()> {
    let names = std::sync::Arc::new(names);
    let mut tasks = Vec::new();
    for w in 0..writers.max(1) {
        let (client, names, parent, ty) = (
            client.clone(),
            names.clone(),
            parent.to_string(),
            ty.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < names.len() {
                let (code, body) = send(
                    &client,
                    http::Method::POST,
                    &workspaces(&parent),
                    Some(workspace(&names[i], ty.as_ref())),
                )
                .await?;
                if code != 200 {
                    return Err(anyhow!("creating {parent}:{}: {code} {body}", names[i]));
                }
                i += writers.max(1);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Waits until `n` workspaces under `parent` named `prefix...` are Ready; the seconds it took
/// from `since`.
async fn ready(
    client: &kube::Client,
    parent: &str,
    prefix: &str,
    n: usize,
    since: Instant,
) -> anyhow::Result<f64> {
    loop {
        let (_, list) = send(client, http::Method::GET, &workspaces(parent), None).await?;
        let ready = list["items"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|w| {
                    w["status"]["phase"] == "Ready"
                        && w["metadata"]["name"]
                            .as_str()
                            .is_some_and(|name| name.starts_with(prefix))
                })
                .count()
        });
        if ready >= n {
            return Ok(since.elapsed().as_secs_f64());
        }
        if since.elapsed() > Duration::from_secs(1800) {
            return Err(anyhow!(
                "{ready} of {n} workspaces under {parent} Ready after 30 min"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn measure(t: &Target, n: usize, bound: usize, writers: usize) -> anyhow::Result<Figures> {
    let c = &t.client;
    // Flat: n workspaces under one parent.
    let (code, body) = send(
        c,
        http::Method::POST,
        &workspaces("root"),
        Some(workspace("bulk", None)),
    )
    .await?;
    if code != 200 {
        return Err(anyhow!("creating root:bulk: {code} {body}"));
    }
    ready(c, "root", "bulk", 1, Instant::now()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_of(t.pid);
    let started = Instant::now();
    create_all(
        c,
        "root:bulk",
        (0..n).map(|i| format!("ws-{i:05}")).collect(),
        writers,
        None,
    )
    .await?;
    let flat_seconds = started.elapsed().as_secs_f64();
    let flat_ready_seconds = ready(c, "root:bulk", "ws-", n, started).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = rss_of(t.pid);
    // A tree: 10 levels of `branch` below root:bulk:ws-00000, each with 10 leaves.
    let started = Instant::now();
    let mut parent = "root:bulk:ws-00000".to_string();
    let mut created = 0;
    for _ in 0..10 {
        let mut names: Vec<String> = (0..10).map(|i| format!("leaf-{i}")).collect();
        names.push("branch".into());
        create_all(c, &parent, names, writers, None).await?;
        created += 11;
        ready(c, &parent, "", 11, Instant::now()).await?;
        parent = format!("{parent}:branch");
    }
    let tree_per_second = created as f64 / started.elapsed().as_secs_f64();
    // An export bound in `bound` workspaces, listed across all of them through its virtual
    // workspace.
    let (vw_list_ms, vw_items) = virtual_workspace_list(c, bound, writers).await?;
    // Delete the whole flat tree.
    let started = Instant::now();
    let (code, body) = send(
        c,
        http::Method::DELETE,
        &format!("{}/bulk", workspaces("root")),
        None,
    )
    .await?;
    if code != 200 {
        return Err(anyhow!("deleting root:bulk: {code} {body}"));
    }
    loop {
        let (code, _) = send(
            c,
            http::Method::GET,
            &format!("{}/bulk", workspaces("root")),
            None,
        )
        .await?;
        if code == 404 {
            break;
        }
        if started.elapsed() > Duration::from_secs(3600) {
            return Err(anyhow!("root:bulk still there after an hour"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Figures {
        flat_per_second: n as f64 / flat_seconds,
        flat_ready_seconds,
        tree_per_second,
        rss_per_workspace: rss_after.saturating_sub(rss_before) as f64 / n.max(1) as f64,
        delete_seconds: started.elapsed().as_secs_f64(),
        vw_list_ms,
        vw_items,
    })
}

/// Publishes a Widget export in `root:vwprovider`, binds it in the first `bound` workspaces of
/// `root:bulk`, puts one Widget in each, and times LISTs of the export's virtual workspace
/// across all of them (sorted milliseconds, and the items a list returned).
async fn virtual_workspace_list(
    c: &kube::Client,
    bound: usize,
    writers: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let provider = "root:vwprovider";
    create_all(c, "root", vec!["vwprovider".into()], 1, None).await?;
    ready(c, "root", "vwprovider", 1, Instant::now()).await?;
    let kcp =
        |path: &str, plural: &str| format!("/clusters/{path}/apis/apis.kcp.io/v1alpha1/{plural}");
    let schema: Value =
        serde_saphyr::from_str(include_str!("../../examples/workspaces/widget-schema.yaml"))?;
    let export: Value =
        serde_saphyr::from_str(include_str!("../../examples/workspaces/widget-export.yaml"))?;
    for (plural, body) in [("apiresourceschemas", schema), ("apiexports", export)] {
        let (code, b) = send(c, http::Method::POST, &kcp(provider, plural), Some(body)).await?;
        if code != 200 {
            return Err(anyhow!("creating the {plural} in {provider}: {code} {b}"));
        }
    }
    let export_name = "widgets.example.platform-mesh.io";
    let names: Vec<String> = (0..bound).map(|i| format!("root:bulk:ws-{i:05}")).collect();
    let names = std::sync::Arc::new(names);
    let mut tasks = Vec::new();
    for w in 0..writers.max(1) {
        let (c, names) = (c.clone(), names.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < names.len() {
                let ws = &names[i];
                let binding = json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
                    "metadata": {"name": "widgets"},
                    "spec": {"reference": {"export": {"path": provider, "name": export_name}}}});
                // kcp answers "no permission to bind" (403) also while its informers have not
                // caught up with the export's workspace: its one error for every refusal hides
                // whether that workspace exists. Loaded with 1,000 workspaces it lags that long
                // after the provider's workspace is Ready; kcp's own e2e tests create bindings in
                // an eventually-loop, and so does this.
                create_retrying(
                    &c,
                    &kcp(ws, "apibindings"),
                    &binding,
                    Duration::from_secs(300),
                    |code| code == 403,
                )
                .await
                .with_context(|| format!("binding in {ws}"))?;
                let widgets = format!(
                    "/clusters/{ws}/apis/example.platform-mesh.io/v1/namespaces/default/widgets"
                );
                let widget = json!({"apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
                    "metadata": {"name": "w"}, "spec": {"color": "red"}});
                // Served once the binding is bound.
                create_retrying(&c, &widgets, &widget, Duration::from_secs(120), |_| true)
                    .await
                    .with_context(|| format!("a Widget in {ws}"))?;
                i += writers.max(1);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let (_, lc) = send(
        c,
        http::Method::GET,
        &format!("/clusters/{provider}/apis/core.kcp.io/v1alpha1/logicalclusters/cluster"),
        None,
    )
    .await?;
    let cluster = lc["metadata"]["annotations"]["kcp.io/cluster"]
        .as_str()
        .context("the provider's logical cluster")?
        .to_string();
    let path = format!("/services/apiexport/{cluster}/{export_name}/clusters/*/apis/example.platform-mesh.io/v1/widgets");
    let mut times = Vec::new();
    let mut items = 0;
    for _ in 0..20 {
        let started = Instant::now();
        let (code, list) = send(c, http::Method::GET, &path, None).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        if code != 200 {
            return Err(anyhow!("the virtual workspace LIST: {code} {list}"));
        }
        items = list["items"].as_array().map_or(0, Vec::len);
    }
    times.sort_by(f64::total_cmp);
    Ok((times, items))
}

/// POSTs `body` to `path` until it is created, trying again every 250 ms while `retry` accepts
/// the refusal's code, for at most `within`.
async fn create_retrying(
    c: &kube::Client,
    path: &str,
    body: &Value,
    within: Duration,
    retry: impl Fn(u16) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let (code, b) = send(c, http::Method::POST, path, Some(body.clone())).await?;
        if code == 200 {
            return Ok(());
        }
        if !retry(code) || Instant::now() > deadline {
            return Err(anyhow!("{code} {b}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn median(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

pub async fn kcp(opts: &BenchOptions, tmp: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    std::fs::create_dir_all(tmp)?;
    let n = opts.kcp_workspaces;
    let bound = n.min(opts.kcp_bound);
    let writers = opts.writers;
    // Durable (redb), as kcp is on its embedded etcd.
    let server = ChildServer::start(&["serve", "--no-controllers"], &tmp.join("kcp-serve"))?;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(tmp.join("kcp-serve").join("admin.kubeconfig"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    // Requests here name their cluster themselves (the kubeconfig's server is root's, as kcp's).
    config.cluster_url = controllers::kcp::base_address(&config.cluster_url.to_string()).parse()?;
    let ours = measure(
        &Target {
            client: kube::Client::try_from(config)?,
            pid: server.child_id(),
        },
        n,
        bound,
        writers,
    )
    .await
    .context("platform-mesh")?;
    drop(server);
    let peer = Kcp::start_ready(&tmp.join("kcp")).await?;
    let mut config = peer.config("base").await?;
    // Requests here name their cluster themselves.
    config.cluster_url = controllers::kcp::base_address(&config.cluster_url.to_string()).parse()?;
    let theirs = measure(
        &Target {
            client: kube::Client::try_from(config)?,
            pid: peer.pid(),
        },
        n,
        bound,
        writers,
    )
    .await
    .context("kcp")?;
    let median_max = |f: &Figures| {
        format!(
            "median {:.1} ms, max {:.1} ms ({} items)",
            median(&f.vw_list_ms),
            f.vw_list_ms.last().copied().unwrap_or_default(),
            f.vw_items
        )
    };
    let both = |f: &dyn Fn(&Figures) -> String| (f(&ours), f(&theirs));
    rows(
        labels(opts),
        vec![
            both(&|f| {
                format!(
                    "{:.0} workspaces/s (all Ready after {:.1} s)",
                    f.flat_per_second, f.flat_ready_seconds
                )
            }),
            both(&|f| format!("{:.0} workspaces/s", f.tree_per_second)),
            both(&|f| format!("{:.1} KiB", f.rss_per_workspace / 1024.0)),
            both(&|f| format!("{:.1} s", f.delete_seconds)),
            both(&median_max),
        ],
    )
}

/// The rows of the kcp section.
pub(crate) fn labels(opts: &BenchOptions) -> Vec<String> {
    let n = opts.kcp_workspaces;
    let bound = n.min(opts.kcp_bound);
    vec![
        format!(
            "workspaces created, {n} under one parent, {} clients",
            opts.writers
        ),
        "workspaces created as a tree, 10 levels of 11, each level Ready before the next"
            .to_string(),
        "RSS per empty workspace".to_string(),
        format!("delete the tree ({} workspaces)", n + 111),
        format!("APIExport virtual-workspace LIST across {bound} bound workspaces, 20 lists"),
    ]
}
