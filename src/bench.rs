//! `platform-mesh bench`: measures the server against a bare hyper+rustls server that returns a
//! fixed 1 KiB JSON, in the same run, on this machine. Both servers run as child processes; this
//! process is the load generator. Prints a report; asserts nothing (figures go in the README).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use apiserver::client::ClientConfig;
use http::Method;
use serde_json::json;

/// Knobs of one benchmark run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub seconds: u64,
    pub connections: usize,
    pub list_objects: usize,
    pub rss_objects: usize,
    pub writers: usize,
    /// Workspaces created (and then deleted as one tree).
    pub workspaces: usize,
}

/// A child server process that is killed when dropped.
struct ChildServer {
    child: Child,
    address: SocketAddr,
    data_dir: PathBuf,
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildServer {
    fn start(args: &[&str], data_dir: &Path) -> anyhow::Result<ChildServer> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let mut lines = BufReader::new(stderr).lines();
        let address = loop {
            let line = lines
                .next()
                .ok_or_else(|| anyhow!("server exited before listening"))??;
            if let Some(rest) = line.strip_prefix("platform-mesh is serving on https://") {
                break rest.trim().parse()?;
            }
        };
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Ok(ChildServer {
            child,
            address,
            data_dir: data_dir.to_path_buf(),
        })
    }

    fn client(&self) -> anyhow::Result<ClientConfig> {
        let pki = self.data_dir.join("pki");
        let read =
            |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("reading {f}"));
        ClientConfig::new(
            self.address,
            &read("ca.crt")?,
            Some((&read("admin.crt")?, &read("admin.key")?)),
        )
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

/// Throughput and latency of a closed-loop load.
struct Load {
    requests: usize,
    errors: usize,
    seconds: f64,
    p50: Duration,
    p99: Duration,
}

impl Load {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `connections` loops sending the request built by `make(i)` for `seconds`.
async fn closed_loop<F>(
    client: &ClientConfig,
    connections: usize,
    seconds: u64,
    expect: u16,
    make: F,
) -> anyhow::Result<Load>
where
    F: Fn(usize, usize) -> (Method, String, Option<serde_json::Value>) + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = client.clone();
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut latencies = Vec::new();
            let mut errors = 0usize;
            let mut i = 0;
            while Instant::now() < deadline {
                let (method, path, body) = make(c, i);
                let (ct, bytes) = match body {
                    Some(b) => (Some("application/json"), serde_json::to_vec(&b)?),
                    None => (None, Vec::new()),
                };
                let t = Instant::now();
                let r = conn.send(method, &path, ct, bytes).await?;
                latencies.push(t.elapsed());
                if r.status.as_u16() != expect {
                    errors += 1;
                }
                i += 1;
            }
            anyhow::Ok((latencies, errors))
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await??;
        all.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort();
    Ok(Load {
        requests: all.len(),
        errors,
        seconds,
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
    })
}

/// A ConfigMap whose JSON is about 1 KiB.
fn object_1k(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"payload": "x".repeat(914)}})
}

/// Creates `n` objects through the API with `writers` connections.
async fn load_objects(
    client: &ClientConfig,
    n: usize,
    writers: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = client.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut i = w;
            while i < n {
                let r = conn
                    .post_json(
                        "/api/v1/namespaces/default/configmaps",
                        &object_1k(&format!("{prefix}-{i:06}")),
                    )
                    .await?;
                if r.status != 201 {
                    return Err(anyhow!(
                        "create failed: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ));
                }
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

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Runs every measurement and prints the report.
pub async fn run(opts: BenchOptions) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("platform-mesh-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "platform-mesh bench: {cores} cores, {} s per load, {} connections",
        opts.seconds, opts.connections
    );

    // Baseline: bare hyper + rustls, fixed 1 KiB JSON.
    let bare = ChildServer::start(&["bench-bare-server"], &tmp.join("bare"))?;
    let bare_load = closed_loop(
        &bare.client()?,
        opts.connections,
        opts.seconds,
        200,
        |_, _| (Method::GET, "/".to_string(), None),
    )
    .await?;
    drop(bare);

    // GET of one 1 KiB object (memory store, so the figure is the serving path).
    let server = ChildServer::start(&["serve", "--in-memory"], &tmp.join("get"))?;
    let client = server.client()?;
    load_objects(&client, 1, 1, "get").await?;
    let get_load = closed_loop(&client, opts.connections, opts.seconds, 200, |_, _| {
        (
            Method::GET,
            "/api/v1/namespaces/default/configmaps/get-000000".to_string(),
            None,
        )
    })
    .await?;

    // LIST of 10,000 1 KiB objects.
    load_objects(&client, opts.list_objects, opts.writers, "list").await?;
    let mut conn = client.connect().await?;
    let mut list_times = Vec::new();
    let mut list_bytes = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let r = conn.get("/api/v1/namespaces/default/configmaps").await?;
        list_times.push(t.elapsed());
        list_bytes = r.body.len();
        if r.status != 200 {
            return Err(anyhow!("list failed: {}", r.status));
        }
    }
    list_times.sort();
    drop(server);

    // Durable creates with 64 concurrent clients (redb, fsync on commit).
    let server = ChildServer::start(&["serve"], &tmp.join("durable"))?;
    let creates = closed_loop(
        &server.client()?,
        opts.writers,
        opts.seconds,
        201,
        |c, i| {
            (
                Method::POST,
                "/api/v1/namespaces/default/configmaps".to_string(),
                Some(object_1k(&format!("c{c:03}-{i:07}"))),
            )
        },
    )
    .await?;
    drop(server);

    // RSS after loading 100,000 1 KiB objects (durable store, as a user runs it).
    let server = ChildServer::start(&["serve"], &tmp.join("rss"))?;
    let idle_rss = server.rss_bytes();
    let t = Instant::now();
    load_objects(&server.client()?, opts.rss_objects, opts.writers, "rss").await?;
    let load_secs = t.elapsed().as_secs_f64();
    let raw = serde_json::to_vec(&object_1k(&format!("rss-{:06}", 0)))?.len() * opts.rss_objects;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = server.rss_bytes();
    drop(server);

    // Admission: validation throughput in-process, webhook latency under 200 concurrent reviews.
    let validation = validation_throughput(Duration::from_secs(opts.seconds.min(3)));
    let bare = ChildServer::start(&["bench-bare-server"], &tmp.join("bare2"))?;
    let bare_200 = closed_loop(&bare.client()?, 200, opts.seconds, 200, |_, _| {
        (Method::GET, "/".to_string(), None)
    })
    .await?;
    drop(bare);
    let server = ChildServer::start(&["serve", "--in-memory"], &tmp.join("webhook"))?;
    let review = admission_review(&typical_accept_api());
    let reviews = closed_loop(&server.client()?, 200, opts.seconds, 200, move |c, i| {
        let mut r = review.clone();
        r["request"]["uid"] = json!(format!("{c}-{i}"));
        (
            Method::POST,
            "/admission/validate?timeout=10s".to_string(),
            Some(r),
        )
    })
    .await?;
    drop(server);

    let tenancy = workspace_tree(&tmp.join("workspaces"), opts.workspaces, opts.writers).await?;
    let _ = std::fs::remove_dir_all(&tmp);

    let ratio = get_load.per_second() / bare_load.per_second();
    println!();
    println!("| measurement | platform-mesh | baseline / target |");
    println!("|---|---|---|");
    println!(
        "| GET 1 KiB object, {} connections | {:.0} req/s, p50 {}, p99 {} | bare hyper+rustls: {:.0} req/s, p99 {}; ratio {:.0}% (target >= 50%) |",
        opts.connections,
        get_load.per_second(),
        ms(get_load.p50),
        ms(get_load.p99),
        bare_load.per_second(),
        ms(bare_load.p99),
        ratio * 100.0
    );
    println!(
        "| LIST {} x 1 KiB ({:.1} MiB JSON) | median {}, p99 {} | target < 100 ms |",
        opts.list_objects,
        list_bytes as f64 / 1048576.0,
        ms(percentile(&list_times, 0.5)),
        ms(percentile(&list_times, 0.99))
    );
    println!(
        "| durable creates, {} clients | {:.0} creates/s, p99 {} | target >= 3,000/s |",
        opts.writers,
        creates.per_second(),
        ms(creates.p99)
    );
    println!(
        "| RSS after {} x 1 KiB objects | {:.0} MiB (idle {:.0} MiB; load took {:.1} s) | raw JSON {:.0} MiB; ratio {:.2}x (target <= 3x) |",
        opts.rss_objects,
        rss as f64 / 1048576.0,
        idle_rss as f64 / 1048576.0,
        load_secs,
        raw as f64 / 1048576.0,
        rss as f64 / raw as f64
    );
    for (what, per_sec, baseline) in &validation {
        println!(
            "| validation of a typical {what} (in-process) | {per_sec:.0} objects/s | JSON decode+encode of the same object: {baseline:.0}/s |"
        );
    }
    println!(
        "| webhook review, 200 concurrent | p50 {}, p99 {}, {:.0} reviews/s | bare server, 200 concurrent: p50 {}, p99 {}; target p99 < 2 ms |",
        ms(reviews.p50),
        ms(reviews.p99),
        reviews.per_second(),
        ms(bare_200.p50),
        ms(bare_200.p99)
    );
    println!(
        "| workspaces created, {} under one parent, {} clients | {:.0} workspaces/s ({:.1} s; all Ready after {:.1} s) | kcp: 8 workspaces/s; target 1,000/s |",
        opts.workspaces, opts.writers, tenancy.created_per_second, tenancy.create_seconds, tenancy.ready_seconds
    );
    println!(
        "| RSS per empty workspace | {:.1} KiB ({:.0} MiB before, {:.0} MiB after) | kcp: 9.8 MiB; target 16 KiB |",
        tenancy.rss_per_workspace / 1024.0,
        tenancy.rss_before as f64 / 1048576.0,
        tenancy.rss_after as f64 / 1048576.0
    );
    println!(
        "| delete the {}-workspace tree | {:.1} s | kcp: about 1 hour for 10,000; target < 10 s |",
        opts.workspaces, tenancy.delete_seconds
    );
    if get_load.errors + bare_load.errors + creates.errors + reviews.errors > 0 {
        println!(
            "errors: get {}, bare {}, creates {}",
            get_load.errors, bare_load.errors, creates.errors
        );
    }
    Ok(())
}

/// Figures of the workspace measurements.
struct TenancyFigures {
    created_per_second: f64,
    create_seconds: f64,
    ready_seconds: f64,
    rss_before: u64,
    rss_after: u64,
    rss_per_workspace: f64,
    delete_seconds: f64,
}

/// Creates `n` workspaces below `root:orgs:bulk` with `writers` clients, waits until all are
/// Ready, reads the RSS, then deletes `bulk` and times until it is gone.
async fn workspace_tree(dir: &Path, n: usize, writers: usize) -> anyhow::Result<TenancyFigures> {
    let server = ChildServer::start(&["serve"], dir)?;
    let client = server.client()?;
    let mut conn = client.connect().await?;
    let ws = |name: &str| json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}});
    let r = conn
        .post_json(
            "/clusters/root:orgs/apis/tenancy.kcp.io/v1alpha1/workspaces",
            &ws("bulk"),
        )
        .await?;
    if r.status != 201 {
        return Err(anyhow!(
            "creating bulk: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = server.rss_bytes();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut i = w;
            while i < n {
                let r = conn
                    .post_json("/clusters/root:orgs:bulk/apis/tenancy.kcp.io/v1alpha1/workspaces", &json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": format!("ws-{i:06}")}}))
                    .await?;
                if r.status != 201 {
                    return Err(anyhow!("create workspace: {} {}", r.status, String::from_utf8_lossy(&r.body)));
                }
                i += writers;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let create_seconds = started.elapsed().as_secs_f64();
    // Wait until every workspace is Ready.
    let ready_seconds = loop {
        let list = conn
            .get("/clusters/root:orgs:bulk/apis/tenancy.kcp.io/v1alpha1/workspaces")
            .await?;
        let ready = list.json()["items"].as_array().map_or(0, |a| {
            a.iter().filter(|w| w["status"]["phase"] == "Ready").count()
        });
        if ready >= n || started.elapsed() > Duration::from_secs(600) {
            break started.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = server.rss_bytes();
    let started = Instant::now();
    let r = conn
        .send(
            Method::DELETE,
            "/clusters/root:orgs/apis/tenancy.kcp.io/v1alpha1/workspaces/bulk",
            None,
            Vec::new(),
        )
        .await?;
    if !r.status.is_success() {
        return Err(anyhow!("delete bulk: {}", r.status));
    }
    loop {
        let r = conn
            .get("/clusters/root:orgs/apis/tenancy.kcp.io/v1alpha1/workspaces/bulk")
            .await?;
        if r.status == 404 || started.elapsed() > Duration::from_secs(1200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delete_seconds = started.elapsed().as_secs_f64();
    Ok(TenancyFigures {
        created_per_second: n as f64 / create_seconds,
        create_seconds,
        ready_seconds,
        rss_before,
        rss_after,
        rss_per_workspace: rss_after.saturating_sub(rss_before) as f64 / n.max(1) as f64,
        delete_seconds,
    })
}

/// A PlatformMesh as the upstream e2e setup writes it.
fn typical_platform_mesh() -> serde_json::Value {
    json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1",
        "kind": "PlatformMesh",
        "metadata": {"name": "platform-mesh", "namespace": "platform-mesh-system"},
        "spec": {
            "exposure": {"port": 8443, "baseDomain": "portal.localhost", "protocol": "https"},
            "ocm": {"repo": {"name": "platform-mesh"}, "component": {"name": "platform-mesh"}, "referencePath": []},
            "featureToggles": [{"name": "feature-enable-getting-started"}, {"name": "feature-accounts-in-accounts"}],
            "kcp": {"providerConnections": [{"endpointSliceName": "core.platform-mesh.io", "path": "root:platform-mesh-system", "secret": "platform-mesh-operator-kubeconfig"}]},
        },
    })
}

/// An AcceptAPI as a certificate provider declares it.
fn typical_accept_api() -> serde_json::Value {
    json!({
        "apiVersion": "broker.platform-mesh.io/v1alpha1",
        "kind": "AcceptAPI",
        "metadata": {"name": "certificates.example.platform-mesh.io", "namespace": "default"},
        "spec": {
            "gvr": {"group": "example.platform-mesh.io", "version": "v1alpha1", "resource": "certificates"},
            "filters": [{"key": "fqdn", "suffix": "internal.corp"}],
        },
    })
}

fn admission_review(obj: &serde_json::Value) -> serde_json::Value {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0", "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "operation": "CREATE", "name": obj["metadata"]["name"], "object": obj}})
}

/// Objects admitted per second (metadata, schema, CEL, type rules), beside a plain JSON decode
/// and encode of the same object as the baseline.
fn validation_throughput(each: Duration) -> Vec<(&'static str, f64, f64)> {
    let registry = apiserver::registry::Registry::builtin();
    let mut out = Vec::new();
    for (what, obj) in [
        ("PlatformMesh", typical_platform_mesh()),
        ("AcceptAPI", typical_accept_api()),
    ] {
        let Some(resource) = registry
            .resources()
            .iter()
            .find(|r| r.ty.kind == what)
            .cloned()
        else {
            continue;
        };
        let rate = |f: &mut dyn FnMut()| {
            let started = Instant::now();
            let mut n = 0u64;
            while started.elapsed() < each {
                for _ in 0..100 {
                    f();
                }
                n += 100;
            }
            n as f64 / started.elapsed().as_secs_f64()
        };
        let bytes = serde_json::to_vec(&obj).unwrap_or_default();
        let admitted = rate(&mut || {
            let mut o = obj.clone();
            let outcome = apiserver::admission::admit(
                &resource,
                &mut o,
                None,
                apiserver::schema::FieldValidation::Warn,
            );
            std::hint::black_box(outcome);
        });
        let baseline = rate(&mut || {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            std::hint::black_box(serde_json::to_vec(&v).unwrap_or_default());
        });
        out.push((what, admitted, baseline));
    }
    out
}

/// The baseline server: TLS like ours (same certificates, ring, h1+h2), fixed 1 KiB JSON body.
pub async fn bare_server(listen: SocketAddr, data_dir: &Path) -> anyhow::Result<()> {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = certs::load_or_create(&data_dir.join("pki"), &["127.0.0.1".to_string()])?;
    let tls = apiserver::server::tls_config(&apiserver::server::TlsMaterial {
        cert_chain_pem: pki.serving_cert_pem().to_string(),
        key_pem: pki.serving_key_pem().to_string(),
        client_ca_pem: pki.ca_cert_pem().to_string(),
    })?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!(
        "platform-mesh is serving on https://{}",
        listener.local_addr()?
    );
    let body = bytes::Bytes::from(serde_json::to_vec(&object_1k("baseline"))?);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let body = body.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |_req| {
                let body = body.clone();
                async move {
                    let mut r = http::Response::new(Full::new(body));
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
