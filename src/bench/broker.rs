//! The broker section of `platform-mesh bench`: one server with a platform workspace exporting
//! the Certificate API, `consumers` workspaces bound to it and two provider workspaces accepting
//! every Certificate; the broker runs as its own process (`platform-mesh broker
//! --kcp-kubeconfig`). Objects are created at a fixed rate spread over the consumers; latency is
//! from the create request to the copy's ADDED event on a provider's watch.
//!
//! Baseline, same run, same watches: the same number of objects created at the same rate
//! straight into the provider workspaces, i.e. what a broker that added nothing would show.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use futures::StreamExt;
use https_client::ClientConfig;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use serde_json::json;

use crate::bench::report::{rows, Row};
use crate::bench::{ms, percentile, rss_of, BenchOptions, ChildServer};

const KIND: &str = "Certificate.v1alpha1.example.platform-mesh.io";

fn certificates() -> ApiResource {
    ApiResource {
        group: "example.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        api_version: "example.platform-mesh.io/v1alpha1".into(),
        kind: "Certificate".into(),
        plural: "certificates".into(),
    }
}

fn certificate_spec() -> serde_json::Value {
    json!({"group": "example.platform-mesh.io", "scope": "Namespaced",
        "names": {"kind": "Certificate", "listKind": "CertificateList", "plural": "certificates", "singular": "certificate"},
        "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"fqdn": {"type": "string"}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]})
}

/// The broker process, killed when dropped.
struct BrokerProcess(Child);

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Watch tasks, aborted when dropped.
struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for w in &self.0 {
            w.abort();
        }
    }
}

/// When each object name first showed up on the providers' watches.
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches Certificates in `workspace`, recording first arrivals.
fn watch(
    root: &kube::Config,
    workspace: &str,
    arrivals: Arrivals,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut config = root.clone();
    config.cluster_url = format!(
        "{}/clusters/{workspace}",
        controllers::kcp::base_address(&root.cluster_url.to_string())
    )
    .parse()?;
    let client = kube::Client::try_from(config)?;
    let api: Api<DynamicObject> = Api::all_with(client, &certificates());
    Ok(tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(Event::Apply(o) | Event::InitApply(o)) = event {
                let name = o.metadata.name.unwrap_or_default();
                arrivals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(name)
                    .or_insert_with(Instant::now);
            }
        }
    }))
}

pub(crate) async fn post(
    conn: &mut https_client::Connection,
    path: &str,
    body: serde_json::Value,
) -> anyhow::Result<()> {
    let r = conn.post_json(path, &body).await?;
    if r.status.as_u16() != 201 && r.status.as_u16() != 409 {
        return Err(anyhow!(
            "POST {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        ));
    }
    Ok(())
}

pub(crate) async fn wait_ready(
    conn: &mut https_client::Connection,
    path: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let r = conn.get(path).await?;
        if r.status.as_u16() == 200 && ready(&r.json()) {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(anyhow!("{path} not ready after 120 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one timed run measured.
struct Run {
    seconds: f64,
    delivered: usize,
    p50: Duration,
    p99: Duration,
    late: usize,
}

/// Creates `n` Certificates at `rate`/s; object `i` goes to `path_of(i)` named `name_of(i)`,
/// and is expected on the providers as `arrival_of(i)`.
async fn timed(
    client: &ClientConfig,
    n: usize,
    rate: u64,
    arrivals: &Arrivals,
    target: impl Fn(usize) -> (String, String, String) + Send + Sync + 'static,
) -> anyhow::Result<Run> {
    let target = Arc::new(target);
    let connections = 32usize;
    let interval = Duration::from_secs_f64(connections as f64 / rate.max(1) as f64);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = client.clone();
        let target = target.clone();
        let offset = interval.mul_f64(c as f64 / connections as f64);
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut sent = Vec::new();
            let mut late = 0usize;
            let mut k = 0u32;
            let mut i = c;
            while i < n {
                let due = start + offset + interval * k;
                tokio::time::sleep_until(due).await;
                if due.elapsed() > Duration::from_millis(5) {
                    late += 1;
                }
                let (path, name, expected) = target(i);
                let t = Instant::now();
                post(&mut conn, &path, json!({"apiVersion": "example.platform-mesh.io/v1alpha1", "kind": "Certificate",
                    "metadata": {"name": name, "namespace": "default"}, "spec": {"fqdn": format!("{name}.bench.corp")}}))
                    .await?;
                sent.push((expected, t));
                i += connections;
                k += 1;
            }
            anyhow::Ok((sent, late))
        }));
    }
    let mut sent = Vec::new();
    let mut late = 0;
    for t in tasks {
        let (s, l) = t.await??;
        sent.extend(s);
        late += l;
    }
    let first = sent
        .iter()
        .map(|(_, t)| *t)
        .min()
        .unwrap_or_else(Instant::now);
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let got = {
            let a = arrivals.lock().unwrap_or_else(|p| p.into_inner());
            sent.iter().filter(|(name, _)| a.contains_key(name)).count()
        };
        if got == sent.len() || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = arrivals.lock().unwrap_or_else(|p| p.into_inner());
    let mut latencies: Vec<Duration> = sent
        .iter()
        .filter_map(|(name, t)| a.get(name).map(|at| at.saturating_duration_since(*t)))
        .collect();
    let last = sent
        .iter()
        .filter_map(|(name, _)| a.get(name))
        .max()
        .copied()
        .unwrap_or(first);
    latencies.sort();
    Ok(Run {
        seconds: last.saturating_duration_since(first).as_secs_f64(),
        delivered: latencies.len(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        late,
    })
}

/// Runs the broker measurement; returns report rows.
pub async fn broker(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
    let (n, consumers, rate) = (
        opts.broker_objects,
        opts.broker_consumers.max(1),
        opts.broker_rate,
    );
    let dir = tmp.join("broker");
    let server = ChildServer::start(&["serve", "--no-controllers"], &dir)?;
    let client = server.client()?;
    let mut conn = client.connect().await?;
    let ws = |name: &str| json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}});
    let workspaces = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
    let mut names: Vec<String> = vec!["platform".into(), "provider-a".into(), "provider-b".into()];
    names.extend((0..consumers).map(|i| format!("consumer-{i:03}")));
    for name in &names {
        post(&mut conn, workspaces, ws(name)).await?;
    }
    let mut ids = HashMap::new();
    for name in &names {
        let path = format!("{workspaces}/{name}");
        wait_ready(&mut conn, &path, |w| w["status"]["phase"] == "Ready").await?;
        let w = conn.get(&path).await?.json();
        ids.insert(
            name.clone(),
            w["spec"]["cluster"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let kcp =
        |ws: &str, plural: &str| format!("/clusters/root:{ws}/apis/apis.kcp.io/v1alpha1/{plural}");
    // An APIResourceSchema holds the structural schema itself, not under openAPIV3Schema.
    let mut schema_spec = certificate_spec();
    let structural = schema_spec["versions"][0]["schema"]["openAPIV3Schema"].take();
    schema_spec["versions"][0]["schema"] = structural;
    post(&mut conn, &kcp("platform", "apiresourceschemas"), json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
        "metadata": {"name": "v1alpha1.certificates.example.platform-mesh.io"}, "spec": schema_spec})).await?;
    post(&mut conn, &kcp("platform", "apiexports"), json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
        "metadata": {"name": "certificates"}, "spec": {"latestResourceSchemas": ["v1alpha1.certificates.example.platform-mesh.io"]}})).await?;
    for p in ["provider-a", "provider-b"] {
        let mut crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "certificates.example.platform-mesh.io"}, "spec": certificate_spec()});
        crd["spec"]["names"]["listKind"] = json!("CertificateList");
        post(
            &mut conn,
            &format!("/clusters/root:{p}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
            crd,
        )
        .await?;
        wait_ready(
            &mut conn,
            &format!("/clusters/root:{p}/apis/example.platform-mesh.io/v1alpha1/certificates"),
            |_| true,
        )
        .await?;
        post(&mut conn, &format!("/clusters/root:{p}/apis/broker.platform-mesh.io/v1alpha1/namespaces/default/acceptapis"),
            json!({"apiVersion": "broker.platform-mesh.io/v1alpha1", "kind": "AcceptAPI", "metadata": {"name": "certificates"},
                "spec": {"gvr": {"group": "example.platform-mesh.io", "version": "v1alpha1", "resource": "certificates"}}})).await?;
    }
    for i in 0..consumers {
        let c = format!("consumer-{i:03}");
        post(&mut conn, &kcp(&c, "apibindings"), json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "certificates"}, "spec": {"reference": {"export": {"path": "root:platform", "name": "certificates"}}}})).await?;
    }
    for i in 0..consumers {
        wait_ready(&mut conn, &format!("/clusters/root:consumer-{i:03}/apis/example.platform-mesh.io/v1alpha1/namespaces/default/certificates"), |_| true).await?;
    }

    let kubeconfig = dir.join("admin.kubeconfig");
    let kc = Kubeconfig::read_from(&kubeconfig).context("admin kubeconfig")?;
    let root = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let arrivals: Arrivals = Arc::default();
    let mut watches = Vec::new();
    for p in ["provider-a", "provider-b"] {
        watches.push(watch(&root, &format!("root:{p}"), arrivals.clone())?);
    }
    // The watches end with this function, before the server goes.
    let _watches = Watches(watches);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Baseline: the same load straight into the provider workspaces.
    eprintln!("broker bench: {} workspaces ready; baseline", names.len());
    let base = timed(&client, n, rate, &arrivals, |i| {
        let p = if i % 2 == 0 { "provider-a" } else { "provider-b" };
        let name = format!("direct-{i:05}");
        (format!("/clusters/root:{p}/apis/example.platform-mesh.io/v1alpha1/namespaces/default/certificates"), name.clone(), name)
    })
    .await?;

    let exe = std::env::current_exe()?;
    let broker = BrokerProcess(
        Command::new(exe)
            .args(["broker", "--kcp-kubeconfig"])
            .arg(&kubeconfig)
            .args([
                "--brokered-export",
                "certificates",
                "--watch-kind",
                KIND,
                "--workers",
                "16",
            ])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    // Warm up: one object per consumer, so every consumer is engaged before the clock starts.
    let consumer_ids: Vec<String> = (0..consumers)
        .map(|i| ids[&format!("consumer-{i:03}")].clone())
        .collect();
    let warm = timed(&client, consumers, 200, &arrivals, {
        let ids = consumer_ids.clone();
        move |i| {
            let name = format!("warm-{i:03}");
            let remote = controllers::broker::provider_name(&format!("consumer#{}", ids[i]), &name);
            (format!("/clusters/root:consumer-{i:03}/apis/example.platform-mesh.io/v1alpha1/namespaces/default/certificates"), name, remote)
        }
    })
    .await?;
    if warm.delivered < consumers {
        return Err(anyhow!(
            "the broker delivered {} of {consumers} warm-up objects",
            warm.delivered
        ));
    }
    let rss_idle = rss_of(broker.0.id());
    eprintln!("broker bench: warm-up delivered; brokering {n} objects");
    let ids = consumer_ids.clone();
    let brokered = timed(&client, n, rate, &arrivals, move |i| {
        let c = i % consumers;
        let name = format!("cert-{i:05}");
        let remote = controllers::broker::provider_name(&format!("consumer#{}", ids[c]), &name);
        (format!("/clusters/root:consumer-{c:03}/apis/example.platform-mesh.io/v1alpha1/namespaces/default/certificates"), name, remote)
    })
    .await?;
    let rss = rss_of(broker.0.id());
    let per_provider = {
        let mut conn = client.connect().await?;
        let mut counts = Vec::new();
        for p in ["provider-a", "provider-b"] {
            let l = conn.get(&format!("/clusters/root:{p}/apis/example.platform-mesh.io/v1alpha1/namespaces/default/certificates")).await?;
            let brokered = l.json()["items"].as_array().map_or(0, |a| {
                a.iter()
                    .filter(|o| {
                        o["metadata"]["annotations"][controllers::broker::CONSUMER_NAME]
                            .as_str()
                            .is_some_and(|n| n.starts_with("cert-"))
                    })
                    .count()
            });
            counts.push(brokered.to_string());
        }
        counts.join(" / ")
    };
    drop(broker);
    let per_s = |r: &Run| r.delivered as f64 / r.seconds.max(1e-9);
    rows(
        labels(opts),
        vec![
            (
                format!(
                    "{:.0} objects/s delivered ({} of {n}; {} on each provider; {} sends late)",
                    per_s(&brokered),
                    brokered.delivered,
                    per_provider,
                    brokered.late
                ),
                format!("direct creates, no broker: {:.0} objects/s", per_s(&base)),
            ),
            (
                format!("{} / {}", ms(brokered.p50), ms(brokered.p99)),
                format!(
                    "direct create → watch event: {} / {}; target p99 < 200 ms",
                    ms(base.p50),
                    ms(base.p99)
                ),
            ),
            (
                format!(
                    "{:.0} MiB ({:.0} MiB after warm-up)",
                    rss as f64 / 1048576.0,
                    rss_idle as f64 / 1048576.0
                ),
                "—".to_string(),
            ),
        ],
    )
}

/// The rows of the broker section.
pub(crate) fn labels(opts: &BenchOptions) -> Vec<String> {
    let (n, consumers, rate) = (
        opts.broker_objects,
        opts.broker_consumers.max(1),
        opts.broker_rate,
    );
    vec![
        format!(
            "broker: {n} objects from {consumers} consumer workspaces to 2 providers, offered {rate}/s"
        ),
        "broker: consumer create → provider copy, p50 / p99".to_string(),
        format!("broker RSS after {n} objects"),
    ]
}
