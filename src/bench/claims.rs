//! `bench --only claims`: what permission claims and workspace initializers cost.
//!
//! - Relabelling: a consumer workspace holds N ConfigMaps (half labelled `team=a`); the baseline
//!   is writing them. A binding then accepts an export's claim on configmaps with `matchAll`
//!   (every object gains the claim label), and changes it to select `team=a` (half lose it); each
//!   is timed from the binding write until the binding says `PermissionClaimsApplied`.
//! - Workspace creation with one initializer beside the same creation without: W workspaces of a
//!   plain type, then W of a type with `initializer: true` finished by an initializer that lists
//!   its initializing virtual workspace and removes its name from each; both timed until every
//!   workspace is Ready.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde_json::{json, Value};

use crate::bench::report::{rows, Row};
use crate::bench::{BenchOptions, ChildServer};

async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> anyhow::Result<Value> {
    let request = http::Request::builder()
        .method(method.clone())
        .uri(path)
        .header("content-type", content_type)
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())?;
    client
        .request::<Value>(request)
        .await
        .with_context(|| format!("{method} {path}"))
}

async fn post(client: &kube::Client, path: &str, body: Value) -> anyhow::Result<Value> {
    send(
        client,
        http::Method::POST,
        path,
        Some(body),
        "application/json",
    )
    .await
}

async fn get(client: &kube::Client, path: &str) -> anyhow::Result<Value> {
    send(client, http::Method::GET, path, None, "application/json").await
}

const WORKSPACES: &str = "apis/tenancy.kcp.io/v1alpha1/workspaces";

async fn workspace(
    client: &kube::Client,
    parent: &str,
    name: &str,
    ty: Value,
) -> anyhow::Result<()> {
    post(
        client,
        &format!("/clusters/{parent}/{WORKSPACES}"),
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"type": ty}}),
    )
    .await
    .map(|_| ())
}

/// Waits until every workspace under `parent` whose name starts with `prefix` (`n` of them) is
/// Ready.
async fn all_ready(
    client: &kube::Client,
    parent: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let list = get(client, &format!("/clusters/{parent}/{WORKSPACES}")).await?;
        let ready = list["items"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|w| {
                    w["status"]["phase"] == "Ready"
                        && w["metadata"]["name"]
                            .as_str()
                            .is_some_and(|s| s.starts_with(prefix))
                })
                .count()
        });
        if ready >= n {
            return Ok(());
        }
        let limit = patience(n);
        if started.elapsed() > limit {
            return Err(anyhow!(
                "{ready} of {n} workspaces under {parent} Ready after {} s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a wait for `n` objects or workspaces may take before the section fails: a minute,
/// and 50 ms more for each (so that a stall in a small run fails well within a test's time).
fn patience(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(50).saturating_mul(n as u32)
}

async fn applied(
    client: &kube::Client,
    path: &str,
    since: Instant,
    n: usize,
) -> anyhow::Result<f64> {
    loop {
        let b = get(client, path).await?;
        let done = b["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "PermissionClaimsApplied" && c["status"] == "True")
        });
        if done {
            return Ok(since.elapsed().as_secs_f64());
        }
        let limit = patience(n);
        if since.elapsed() > limit {
            return Err(anyhow!(
                "claims on {n} objects not applied after {} s: {}",
                limit.as_secs(),
                b["status"]
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Counts the ConfigMaps the benchmark wrote (`cm-*`; the namespace's own kube-root-ca.crt is
/// claimed too) in `cluster_path` carrying any claim label.
async fn labelled(client: &kube::Client, cluster_path: &str) -> anyhow::Result<usize> {
    let list = get(
        client,
        &format!("/clusters/{cluster_path}/api/v1/namespaces/default/configmaps"),
    )
    .await?;
    Ok(list["items"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("cm-"))
            })
            .filter(|o| {
                o["metadata"]["labels"].as_object().is_some_and(|l| {
                    l.keys()
                        .any(|k| k.starts_with("claimed.internal.apis.kcp.io/"))
                })
            })
            .count()
    }))
}

async fn relabel(
    client: &kube::Client,
    n: usize,
    writers: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    workspace(
        client,
        "root:providers",
        "claimer",
        json!({"name": "provider"}),
    )
    .await?;
    workspace(
        client,
        "root:orgs",
        "consumer",
        json!({"name": "organization"}),
    )
    .await?;
    all_ready(client, "root:providers", "claimer", 1).await?;
    all_ready(client, "root:orgs", "consumer", 1).await?;
    post(
        client,
        "/clusters/root:providers:claimer/apis/apis.kcp.io/v1alpha2/apiexports",
        json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": "claimer"},
            "spec": {"permissionClaims": [{"group": "", "resource": "configmaps", "verbs": ["get", "list", "watch"]}]}}),
    )
    .await?;
    // Baseline: writing the objects.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers.max(1) {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < n {
                let team = if i % 2 == 0 { "a" } else { "b" };
                post(
                    &client,
                    "/clusters/root:orgs:consumer/api/v1/namespaces/default/configmaps",
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": format!("cm-{i:06}"), "labels": {"team": team}},
                        "data": {"k": "v"}}),
                )
                .await?;
                i += writers.max(1);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let binding = "/clusters/root:orgs:consumer/apis/apis.kcp.io/v1alpha2/apibindings/claimer";
    let claim = |selector: Value| {
        json!([{"group": "", "resource": "configmaps", "verbs": ["get", "list", "watch"],
            "selector": selector, "state": "Accepted"}])
    };
    let started = Instant::now();
    post(
        client,
        "/clusters/root:orgs:consumer/apis/apis.kcp.io/v1alpha2/apibindings",
        json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding", "metadata": {"name": "claimer"},
            "spec": {"reference": {"export": {"path": "root:providers:claimer", "name": "claimer"}},
                     "permissionClaims": claim(json!({"matchAll": true}))}}),
    )
    .await?;
    let accept_seconds = applied(client, binding, started, n).await?;
    let after_accept = labelled(client, "root:orgs:consumer").await?;
    let started = Instant::now();
    send(
        client,
        http::Method::PATCH,
        binding,
        Some(json!({"spec": {"permissionClaims": claim(json!({"matchLabels": {"team": "a"}}))}})),
        "application/merge-patch+json",
    )
    .await?;
    let narrow_seconds = applied(client, binding, started, n).await?;
    let after_narrow = labelled(client, "root:orgs:consumer").await?;
    if after_accept != n || after_narrow != n.div_ceil(2) {
        return Err(anyhow!(
            "labelled {after_accept} then {after_narrow} of {n} ConfigMaps, expected {n} then {}",
            n.div_ceil(2)
        ));
    }
    let dash = || "–".to_string();
    Ok(vec![
        (
            format!(
                "{:.0} objects/s ({write_seconds:.1} s)",
                n as f64 / write_seconds
            ),
            dash(),
        ),
        (
            format!(
                "{:.0} objects/s ({accept_seconds:.2} s)",
                n as f64 / accept_seconds
            ),
            dash(),
        ),
        (
            format!(
                "{:.0} objects/s ({narrow_seconds:.2} s)",
                n as f64 / narrow_seconds
            ),
            dash(),
        ),
    ])
}

/// An initializer: removes `id` from every LogicalCluster its virtual workspace offers, until
/// `stop`.
async fn run_initializer(
    client: kube::Client,
    vw_path: String,
    id: String,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<usize> {
    let mut done = 0;
    while !stop.is_cancelled() {
        let list = get(
            &client,
            &format!("{vw_path}/clusters/*/apis/core.kcp.io/v1alpha1/logicalclusters"),
        )
        .await?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let mut tasks = Vec::new();
        for lc in items {
            let Some(cluster) = lc["metadata"]["annotations"]["kcp.io/cluster"].as_str() else {
                continue;
            };
            let left: Vec<Value> = lc["status"]["initializers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|i| i.as_str() != Some(id.as_str()))
                .cloned()
                .collect();
            let path = format!(
                "{vw_path}/clusters/{cluster}/apis/core.kcp.io/v1alpha1/logicalclusters/cluster/status"
            );
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                send(
                    &client,
                    http::Method::PATCH,
                    &path,
                    Some(json!({"status": {"initializers": left}})),
                    "application/merge-patch+json",
                )
                .await
            }));
        }
        for t in tasks {
            t.await??;
            done += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(done)
}

/// `ws-00000`, `ws-00001`, ...
fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("ws-{i:05}")).collect()
}

async fn initialized(
    client: &kube::Client,
    n: usize,
    writers: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    workspace(client, "root", "plain", json!({"name": "universal"})).await?;
    workspace(client, "root", "gated", json!({"name": "universal"})).await?;
    all_ready(client, "root", "plain", 1).await?;
    all_ready(client, "root", "gated", 1).await?;
    let wt = post(
        client,
        "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspacetypes",
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
            "metadata": {"name": "bench-gated"}, "spec": {"initializer": true}}),
    )
    .await?;
    let url = wt["status"]["virtualWorkspaces"][0]["url"]
        .as_str()
        .ok_or_else(|| anyhow!("no initializing virtual workspace URL"))?;
    let vw_path = url
        .find("/services/")
        .map(|i| url[i..].to_string())
        .ok_or_else(|| anyhow!("unexpected URL {url}"))?;
    // Without an initializer.
    let started = Instant::now();
    crate::bench::kcp::create_all(
        client,
        "root:plain",
        names(n),
        writers,
        Some(json!({"name": "universal"})),
    )
    .await?;
    all_ready(client, "root:plain", "ws-", n).await?;
    let plain = started.elapsed().as_secs_f64();
    // With one.
    let stop = tokio_util::sync::CancellationToken::new();
    let initializer = tokio::spawn(run_initializer(
        client.clone(),
        vw_path,
        "root:bench-gated".to_string(),
        stop.clone(),
    ));
    let started = Instant::now();
    crate::bench::kcp::create_all(
        client,
        "root:gated",
        names(n),
        writers,
        Some(json!({"name": "bench-gated", "path": "root"})),
    )
    .await?;
    all_ready(client, "root:gated", "ws-", n).await?;
    let gated = started.elapsed().as_secs_f64();
    stop.cancel();
    let finished = initializer.await??;
    if finished < n {
        return Err(anyhow!(
            "the initializer finished {finished} of {n} workspaces"
        ));
    }
    Ok(vec![
        (
            format!("{:.0} workspaces/s ({plain:.1} s)", n as f64 / plain),
            "–".to_string(),
        ),
        (
            format!("{:.0} workspaces/s ({gated:.1} s)", n as f64 / gated),
            "–".to_string(),
        ),
    ])
}

/// The rows of the claims section.
pub(crate) fn labels(opts: &BenchOptions) -> Vec<String> {
    let (n, w, writers) = (opts.claim_objects, opts.claim_workspaces, opts.writers);
    vec![
        format!("write {n} ConfigMaps into a workspace ({writers} clients; baseline)"),
        format!("accept a claim on them (`matchAll`): all {n} labelled, until PermissionClaimsApplied"),
        format!(
            "the binding's selector narrowed to `team=a`: {} unlabelled, until PermissionClaimsApplied",
            n - n.div_ceil(2)
        ),
        format!("{w} workspaces created until Ready, no initializer ({writers} clients; baseline)"),
        format!("{w} workspaces created until Ready, one initializer finishing each through its virtual workspace"),
    ]
}

/// The `claims` section.
pub async fn claims(opts: &BenchOptions, tmp: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    std::fs::create_dir_all(tmp)?;
    let server = ChildServer::start(&["serve", "--no-controllers"], &tmp.join("claims"))?;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(tmp.join("claims").join("admin.kubeconfig"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.cluster_url = controllers::kcp::base_address(&config.cluster_url.to_string()).parse()?;
    let client = kube::Client::try_from(config)?;
    let mut figures = relabel(&client, opts.claim_objects, opts.writers)
        .await
        .context("relabelling")?;
    figures.extend(
        initialized(&client, opts.claim_workspaces, opts.writers)
            .await
            .context("initializers")?,
    );
    drop(server);
    rows(labels(opts), figures)
}
