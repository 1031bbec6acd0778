//! The virtual workspaces' benchmark: a marketplace LIST for an organisation when 1,000 providers
//! offer 3 exports each, a contentconfigurations LIST for an organisation with 100 bindings, and
//! how soon a watch of the marketplace delivers a new entry after its export is created. Each LIST
//! is printed beside a plain LIST of the objects it is computed from, in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use https_client::{ClientConfig, Connection};
use serde_json::{json, Value};

use crate::bench::report::{rows, Row};
use crate::bench::{ms, BenchOptions, ChildServer};

const EXPORTS_PER_PROVIDER: usize = 3;
const LISTS: usize = 200;
const WARM_UP: usize = 5;
const WATCHED: usize = 10;

const SYSTEM: &str = "root:platform-mesh-system";
const PROVIDER: &str = "root:providers:market";
const SHOPPER: &str = "root:orgs:shopper";
const BINDER: &str = "root:orgs:binder";

fn yaml(text: &str) -> anyhow::Result<Value> {
    Ok(serde_saphyr::from_str(text)?)
}

async fn create(conn: &mut Connection, path: &str, obj: &Value) -> anyhow::Result<Value> {
    let r = conn.post_json(path, obj).await?;
    if r.status != 201 {
        return Err(anyhow!(
            "create at {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        ));
    }
    Ok(r.json())
}

fn collection(ws: &str, group_version: &str, plural: &str) -> String {
    format!("/clusters/{ws}/apis/{group_version}/{plural}")
}

async fn workspace(
    conn: &mut Connection,
    parent: &str,
    name: &str,
    ty: &str,
) -> anyhow::Result<()> {
    let path = collection(parent, "tenancy.kcp.io/v1alpha1", "workspaces");
    create(
        conn,
        &path,
        &json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name}, "spec": {"type": {"name": ty}}}),
    )
    .await?;
    for _ in 0..500 {
        if conn.get(&format!("{path}/{name}")).await?.json()["status"]["phase"] == "Ready" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(anyhow!("workspace {parent}:{name} never became Ready"))
}

async fn bind(
    conn: &mut Connection,
    ws: &str,
    name: &str,
    path: &str,
    export: &str,
) -> anyhow::Result<()> {
    let b = create(
        conn,
        &collection(ws, "apis.kcp.io/v1alpha1", "apibindings"),
        &json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
                "metadata": {"name": name},
                "spec": {"reference": {"export": {"path": path, "name": export}}}}),
    )
    .await?;
    if b["status"]["phase"] != "Bound" {
        return Err(anyhow!("{ws} could not bind {export}: {b}"));
    }
    Ok(())
}

fn export(name: &str, provider: &str) -> Value {
    json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
           "metadata": {"name": name, "labels": {"ui.platform-mesh.io/content-for": provider}},
           "spec": {"latestResourceSchemas": ["v1.widgets.example.platform-mesh.io"]}})
}

/// Creates `n` objects made by `make` at `path`, over `writers` connections.
async fn create_many(
    client: &ClientConfig,
    writers: usize,
    n: usize,
    path: String,
    make: fn(usize) -> Value,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for w in 0..writers.min(n).max(1) {
        let client = client.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut i = w;
            while i < n {
                create(&mut conn, &path, &make(i)).await?;
                i += writers;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Median and p99 of `LISTS` GETs of `path` after `WARM_UP` untimed ones (the server's memory
/// grows to its working size in those), and the number of items of the last answer. Before each GET a ConfigMap elsewhere changes, as on a busy server: every GET
/// is at a new revision, so a view is computed for each, never served from the views just
/// computed (what the server remembers of each unchanged source object is reused).
async fn list_times(
    conn: &mut Connection,
    path: &str,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let mut times = Vec::new();
    let mut last = Bytes::new();
    for _ in 0..WARM_UP {
        conn.get(path).await?;
    }
    for i in 0..LISTS {
        let other = conn
            .post_json(
                "/clusters/root/api/v1/namespaces/default/configmaps",
                &json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"generateName": "busy-"}, "data": {"i": i.to_string()}}),
            )
            .await?;
        if other.status != 201 {
            return Err(anyhow!("a write elsewhere: {}", other.status));
        }
        let t = Instant::now();
        let r = conn.get(path).await?;
        times.push(t.elapsed());
        if r.status != 200 {
            return Err(anyhow!("list {path}: {}", r.status));
        }
        last = r.body;
    }
    // Decoded once, after the timed GETs, so the client's own work stays out of the figures.
    let items = serde_json::from_slice::<Value>(&last)?["items"]
        .as_array()
        .map_or(0, Vec::len);
    times.sort();
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    Ok((times[times.len() / 2], p99, items))
}

/// Sets up the workspaces and measures; returns the report's rows.
pub(crate) async fn views(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
    let (providers, bindings) = (opts.view_providers, opts.view_bindings);
    let server = ChildServer::start(&["serve", "--in-memory"], &tmp.join("views"))?;
    let client = server.client()?;
    let mut conn = client.connect().await?;

    // The core export, as manifests/kcp makes it.
    for schema in [
        include_str!("../../manifests/kcp/01-platform-mesh-system/10-apiresourceschema-contentconfigurations.ui.platform-mesh.io.yaml"),
        include_str!("../../manifests/kcp/01-platform-mesh-system/10-apiresourceschema-providermetadatas.ui.platform-mesh.io.yaml"),
    ] {
        create(
            &mut conn,
            &collection(SYSTEM, "apis.kcp.io/v1alpha1", "apiresourceschemas"),
            &yaml(schema)?,
        )
        .await?;
    }
    create(
        &mut conn,
        &collection(SYSTEM, "apis.kcp.io/v1alpha1", "apiexports"),
        &yaml(include_str!("../../examples/marketplace/core-export.yaml"))?,
    )
    .await?;
    workspace(&mut conn, "root:providers", "market", "provider").await?;
    workspace(&mut conn, "root:orgs", "shopper", "organization").await?;
    workspace(&mut conn, "root:orgs", "binder", "organization").await?;
    for ws in [SYSTEM, PROVIDER, SHOPPER, BINDER] {
        bind(&mut conn, ws, "core", SYSTEM, "core.platform-mesh.io").await?;
    }
    create(
        &mut conn,
        &collection(PROVIDER, "apis.kcp.io/v1alpha1", "apiresourceschemas"),
        &yaml(include_str!("../../examples/workspaces/widget-schema.yaml"))?,
    )
    .await?;

    // 1,000 providers with 3 exports each, and content for the first 100 exports.
    let t = Instant::now();
    create_many(
        &client,
        opts.writers,
        providers,
        collection(PROVIDER, "ui.platform-mesh.io/v1alpha1", "providermetadatas"),
        |i| {
            json!({"apiVersion": "ui.platform-mesh.io/v1alpha1", "kind": "ProviderMetadata",
                   "metadata": {"name": format!("p{i:04}")},
                   "spec": {"displayName": format!("Provider {i}"), "description": "A provider of widgets."}})
        },
    )
    .await?;
    create_many(
        &client,
        opts.writers,
        providers * EXPORTS_PER_PROVIDER,
        collection(PROVIDER, "apis.kcp.io/v1alpha1", "apiexports"),
        |i| {
            export(
                &format!("x{i:05}.example.io"),
                &format!("p{:04}", i / EXPORTS_PER_PROVIDER),
            )
        },
    )
    .await?;
    let content_path = collection(
        PROVIDER,
        "ui.platform-mesh.io/v1alpha1",
        "contentconfigurations",
    );
    create_many(&client, opts.writers, bindings, content_path.clone(), |i| {
        json!({"apiVersion": "ui.platform-mesh.io/v1alpha1", "kind": "ContentConfiguration",
               "metadata": {"name": format!("for-x{i:05}"), "labels": {
                   "ui.platform-mesh.io/content-for": format!("x{i:05}.example.io"),
                   "ui.platform-mesh.io/entity": "main"}},
               "spec": {"inlineConfiguration": {"contentType": "json", "content": "{}"}}})
    })
    .await?;
    for i in 0..bindings {
        let r = conn
            .send(
                Method::PATCH,
                &format!("{content_path}/for-x{i:05}/status"),
                Some("application/merge-patch+json"),
                serde_json::to_vec(&json!({"status": {"configurationResult": "{\"nodes\":[]}"}}))?,
            )
            .await?;
        if r.status != 200 {
            return Err(anyhow!("status of for-x{i:05}: {}", r.status));
        }
        bind(
            &mut conn,
            BINDER,
            &format!("b{i:03}"),
            PROVIDER,
            &format!("x{i:05}.example.io"),
        )
        .await?;
    }
    println!("(views: set up in {:.1} s)", t.elapsed().as_secs_f64());
    // The work the setup started in the background (endpoint slices, bindings) settles first.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let market = format!(
        "/services/marketplace/clusters/{SHOPPER}/apis/marketplace.platform-mesh.io/v1alpha1/marketplaceentries"
    );
    let (m50, m99, entries) = list_times(&mut conn, &market).await?;
    let (x50, x99, exports) = list_times(
        &mut conn,
        &collection(PROVIDER, "apis.kcp.io/v1alpha1", "apiexports"),
    )
    .await?;
    let content = format!(
        "/services/contentconfigurations/clusters/{BINDER}/apis/ui.platform-mesh.io/v1alpha1/contentconfigurations"
    );
    let (c50, c99, contents) = list_times(&mut conn, &content).await?;
    let (p50, p99, plain) = list_times(&mut conn, &content_path).await?;
    if entries != providers * EXPORTS_PER_PROVIDER || contents != bindings {
        return Err(anyhow!(
            "the views hold {entries} entries and {contents} contents, not {} and {bindings}",
            providers * EXPORTS_PER_PROVIDER
        ));
    }

    // A watch of the marketplace, started where a LIST left off as an informer does, sees each
    // new export's entry.
    let listed = conn.get(&market).await?.json();
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("the marketplace list has no resourceVersion"))?
        .to_string();
    let mut h2 = client.connect_h2().await?;
    let request = http::Request::get(format!(
        "https://localhost{market}?watch=true&resourceVersion={rv}"
    ))
    .header("accept", "application/json")
    .body(Full::new(Bytes::new()))?;
    let response = h2.send_request(request).await?;
    if response.status() != 200 {
        return Err(anyhow!("watch: {}", response.status()));
    }
    let mut body = response.into_body();
    let mut delays = Vec::new();
    for i in 0..WATCHED {
        let name = format!("new{i:02}.example.io");
        let t = Instant::now();
        create(
            &mut conn,
            &collection(PROVIDER, "apis.kcp.io/v1alpha1", "apiexports"),
            &export(&name, "p0000"),
        )
        .await?;
        let wanted = format!("\"name\":\"{name}-p0000\"");
        let mut line = Vec::new();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .context("no watch event within 10 s")?
                .ok_or_else(|| anyhow!("the watch ended"))??;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            line.extend_from_slice(&data);
            // Events are one JSON object per line: look at each complete one once.
            let mut found = false;
            while let Some(end) = line.iter().position(|b| *b == b'\n') {
                let event: Vec<u8> = line.drain(..=end).collect();
                found |= String::from_utf8_lossy(&event).contains(&wanted);
            }
            if found {
                delays.push(t.elapsed());
                break;
            }
        }
    }
    delays.sort();
    drop(server);

    rows(
        labels(opts),
        vec![
            (
                format!("median {}, p99 {}", ms(m50), ms(m99)),
                format!(
                    "plain LIST of the {exports} exports: median {}, p99 {}; target p99 < 50 ms",
                    ms(x50),
                    ms(x99)
                ),
            ),
            (
                format!("median {}, p99 {}", ms(c50), ms(c99)),
                format!(
                    "plain LIST of the {plain} ContentConfigurations: median {}, p99 {}; target p99 < 20 ms",
                    ms(p50),
                    ms(p99)
                ),
            ),
            (
                format!(
                    "median {}, max {}",
                    ms(delays[delays.len() / 2]),
                    ms(delays[delays.len() - 1])
                ),
                "target < 100 ms".to_string(),
            ),
        ],
    )
}

/// The rows of the views section.
pub(crate) fn labels(opts: &BenchOptions) -> Vec<String> {
    let (providers, bindings) = (opts.view_providers, opts.view_bindings);
    vec![
        format!(
            "marketplace LIST, {providers} providers x {EXPORTS_PER_PROVIDER} exports ({} entries)",
            providers * EXPORTS_PER_PROVIDER
        ),
        format!("contentconfigurations LIST, {bindings} bindings ({bindings} items)"),
        format!("marketplace watch: new export to its entry, {WATCHED} exports"),
    ]
}
