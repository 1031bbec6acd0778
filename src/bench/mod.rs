//! `platform-mesh bench`: measures the server against a bare hyper+rustls server that returns a
//! fixed 1 KiB JSON, in the same run, on this machine. Both servers run as child processes; this
//! process is the load generator. Prints a report; asserts nothing (figures go in the README).

mod attacks;
mod attacks_jwks;
mod broker;
mod claims;
mod engage;
mod kcp;
#[cfg(feature = "etcd")]
mod kube;
mod report;
#[cfg(feature = "etcd")]
mod scale;
mod views;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use http::Method;
use https_client::ClientConfig;
use serde_json::json;

use crate::bench::report::{check_readme, measured_args, render, rows, write_readme, Row, Stamp};

/// Knobs of one benchmark run (the arguments of `platform-mesh bench`).
#[derive(Clone, Debug, clap::Args)]
pub struct BenchOptions {
    /// Seconds per load measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Concurrent connections for the GET measurement.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Objects in the LIST measurement.
    #[arg(long, default_value_t = 10_000)]
    pub list_objects: usize,
    /// Objects loaded before reading the RSS.
    #[arg(long, default_value_t = 100_000)]
    pub rss_objects: usize,
    /// Concurrent writers for the durable-create and loading measurements.
    #[arg(long, default_value_t = 64)]
    pub writers: usize,
    /// Workspaces created and then deleted as one tree.
    #[arg(long, default_value_t = 10_000)]
    pub workspaces: usize,
    /// Open-loop webhook review rates, reviews/s over 200 connections.
    #[arg(long, value_delimiter = ',', default_values_t = [2_000u64, 5_000, 10_000])]
    pub review_rates: Vec<u64>,
    /// `--max-requests-inflight` of the overloaded server (ten times as many clients drive it).
    #[arg(long, default_value_t = 100)]
    pub overload_inflight: usize,
    /// RSS ceiling (MiB) the overloaded server must stay under.
    #[arg(long, default_value_t = 256)]
    pub overload_rss_ceiling_mib: u64,
    /// Objects the broker section creates in consumer workspaces.
    #[arg(long, default_value_t = 10_000)]
    pub broker_objects: usize,
    /// Consumer workspaces of the broker section.
    #[arg(long, default_value_t = 100)]
    pub broker_consumers: usize,
    /// Objects per second the broker section creates.
    #[arg(long, default_value_t = 500)]
    pub broker_rate: u64,
    /// Watches of the etcd section's fan-out measurement.
    #[arg(long, default_value_t = 10_000)]
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub watchers: usize,
    /// Workspaces the watchers are spread over (each write reaches watchers / workspaces).
    #[arg(long, default_value_t = 100)]
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub watch_workspaces: usize,
    /// Writes per second during the fan-out measurement.
    #[arg(long, default_value_t = 1_000)]
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub watch_rate: u64,
    /// MiB of ConfigMaps the attacks section lists ten times without reading.
    #[arg(long, default_value_t = 170)]
    pub attack_list_mib: usize,
    /// Roles the attacks section creates in one workspace before loading it.
    #[arg(long, default_value_t = 3_000)]
    pub attack_roles: usize,
    /// ProviderMetadata of the views section, each offering 3 APIExports.
    #[arg(long, default_value_t = 1_000)]
    pub view_providers: usize,
    /// APIBindings of the workspace whose contentconfigurations the views section lists.
    #[arg(long, default_value_t = 100)]
    pub view_bindings: usize,
    /// Workspaces the kcp section creates under one parent, on kcp and on this server.
    #[arg(long, default_value_t = 1_000)]
    pub kcp_workspaces: usize,
    /// Workspaces of those the kcp section binds an export in and lists through its
    /// virtual workspace.
    #[arg(long, default_value_t = 1_000)]
    pub kcp_bound: usize,
    /// ConfigMaps the claims section labels and relabels in one workspace.
    #[arg(long, default_value_t = 10_000)]
    pub claim_objects: usize,
    /// Workspaces the claims section creates with and without an initializer.
    #[arg(long, default_value_t = 1_000)]
    pub claim_workspaces: usize,
    /// Workspaces the engage section binds and the controller runtime engages.
    #[arg(long, default_value_t = 100_000)]
    pub engage_clusters: usize,
    /// Objects in each of them.
    #[arg(long, default_value_t = 2)]
    pub engage_objects: usize,
    /// Patches per second the engage section writes once the runtime has synced.
    #[arg(long, default_value_t = 1_000)]
    pub engage_rate: usize,
    /// Seconds it writes them.
    #[arg(long, default_value_t = 5)]
    pub engage_write_seconds: usize,
    /// Run only these attacks of the attacks section (comma-separated; all when empty).
    #[arg(long = "attack", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(crate::bench::attacks::KINDS))]
    pub attacks: Vec<String>,
    /// Run only these sections (comma-separated): serving, admission, workspaces, overload,
    /// broker, etcd (needs `--features etcd`), attacks, views, claims; and, only when named, kube
    /// (needs `--features etcd`), kcp (beside the Go peers of `scripts/peers`) and engage (the
    /// controllers crate's `engage_bench` example, built beside this binary).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SECTIONS))]
    pub only: Vec<String>,
    /// Replace the README's tables of the sections that ran (between their `<!-- bench NAME -->`
    /// markers) with this run's.
    #[arg(long, value_name = "README")]
    pub write_readme: Option<PathBuf>,
}

/// A child server process that is killed when dropped.
pub(crate) struct ChildServer {
    child: Child,
    /// The child leads its own process group.
    grouped: bool,
    address: SocketAddr,
    data_dir: PathBuf,
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // Under a profiler (see `PLATFORM_MESH_BENCH_WRAP`) the server is the wrapper's child;
        // the wrapper leads a process group of its own, which goes as a whole.
        if self.grouped {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildServer {
    pub(crate) fn start(args: &[&str], data_dir: &Path) -> anyhow::Result<ChildServer> {
        let exe = std::env::current_exe()?;
        // `PLATFORM_MESH_BENCH_WRAP="perf record -e cpu-clock -g --"` (words split on spaces)
        // runs each server under a profiler; its RSS figures are then the wrapper's.
        let wrap = std::env::var("PLATFORM_MESH_BENCH_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        if !wrap.is_empty() {
            // Its own process group, which the drop kills with the server in it.
            command.process_group(0);
        }
        let mut child = command
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            // The log users get: no RUST_LOG, no -v (the benchmark's own RUST_LOG is not
            // passed on), read and dropped by the thread below.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        // The address line is read on a thread of its own (which then drains the rest), so a
        // server that neither listens nor exits fails the benchmark after a minute.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr).lines();
            for line in lines.by_ref() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("platform-mesh is serving on https://") {
                    let _ = tx.send(rest.trim().to_string());
                    break;
                }
            }
            for _ in lines {}
        });
        let address = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => address.parse()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.wait();
                return Err(anyhow!("the server {args:?} exited before listening"));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(anyhow!("the server {args:?} did not listen within 60 s"));
            }
        };
        Ok(ChildServer {
            child,
            grouped: !wrap.is_empty(),
            address,
            data_dir: data_dir.to_path_buf(),
        })
    }

    /// A client that trusts the server's CA and presents no certificate (for bearer tokens).
    pub(crate) fn anonymous_client(&self) -> anyhow::Result<ClientConfig> {
        let ca = std::fs::read_to_string(self.data_dir.join("pki").join("ca.crt"))
            .context("reading ca.crt")?;
        Ok(ClientConfig::new(self.address, &ca, None)?)
    }

    pub(crate) fn client(&self) -> anyhow::Result<ClientConfig> {
        let pki = self.data_dir.join("pki");
        let read =
            |f: &str| std::fs::read_to_string(pki.join(f)).with_context(|| format!("reading {f}"));
        Ok(ClientConfig::new(
            self.address,
            &read("ca.crt")?,
            Some((&read("admin.crt")?, &read("admin.key")?)),
        )?)
    }

    fn rss_bytes(&self) -> u64 {
        rss_of(self.child.id())
    }

    pub(crate) fn child_id(&self) -> u32 {
        self.child.id()
    }
}

/// Throughput and latency of a closed-loop load.
pub(crate) struct Load {
    requests: usize,
    pub(crate) errors: usize,
    seconds: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl Load {
    pub(crate) fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `connections` loops sending the request built by `make(i)` for `seconds`.
pub(crate) async fn closed_loop<F>(
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
pub(crate) fn object_1k(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"payload": "x".repeat(914)}})
}

/// Creates `n` objects through the API with `writers` connections.
pub(crate) async fn load_objects(
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

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The parts of the benchmark, selectable with `--only`, in the order they run.
pub const SECTIONS: &[&str] = &[
    "serving",
    "admission",
    "workspaces",
    "overload",
    "broker",
    "etcd",
    "attacks",
    "views",
    "kube",
    "kcp",
    "claims",
    "engage",
];

/// The sections that run only when `--only` names them.
const NAMED_ONLY: &[&str] = &["kube", "kcp", "engage"];

/// Runs the sections asked for and prints their tables (and writes them into the README when
/// asked to).
pub async fn run(opts: BenchOptions) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("platform-mesh-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // The arguments after the subcommand (global flags may come before it).
    let args: Vec<String> = std::env::args()
        .skip(1)
        .skip_while(|a| a != "bench")
        .skip(1)
        .collect();
    let stamp = Stamp::now(measured_args(&args));
    println!(
        "platform-mesh bench: {} cores, {} s per load, {} connections",
        stamp.cores, opts.seconds, opts.connections
    );
    // The kube, kcp and engage sections run only when named: they need the Go peers of
    // `scripts/peers` (and kube the etcd backend), or the example binary.
    let wanted = |s: &str| {
        opts.only.iter().any(|o| o == s) || (opts.only.is_empty() && !NAMED_ONLY.contains(&s))
    };
    if let Some(readme) = &opts.write_readme {
        let sections: Vec<&str> = SECTIONS.iter().copied().filter(|s| wanted(s)).collect();
        check_readme(readme, &sections)?;
    }
    // Progress on stderr (the report is stdout): each section as it starts.
    let started = Instant::now();
    let mut tables: Vec<(&str, Vec<Row>)> = Vec::new();
    for &section in SECTIONS {
        if !wanted(section) {
            continue;
        }
        eprintln!(
            "bench: {section} (after {:.0} s)",
            started.elapsed().as_secs_f64()
        );
        let rows = match section {
            "serving" => serving(&opts, &tmp).await?,
            "admission" => admission(&opts, &tmp).await?,
            "claims" => crate::bench::claims::claims(&opts, &tmp).await?,
            "workspaces" => workspaces(&opts, &tmp).await?,
            "overload" => overload(&opts, &tmp).await?,
            "broker" => crate::bench::broker::broker(&opts, &tmp).await?,
            #[cfg(feature = "etcd")]
            "etcd" => crate::bench::scale::scale(&opts, &tmp).await?,
            #[cfg(not(feature = "etcd"))]
            "etcd" if opts.only.is_empty() => {
                println!("(etcd section skipped: built without --features etcd)");
                continue;
            }
            #[cfg(feature = "etcd")]
            "kube" => crate::bench::kube::kube(&opts, &tmp).await?,
            #[cfg(not(feature = "etcd"))]
            "etcd" | "kube" => {
                anyhow::bail!("the {section} section needs a binary built with --features etcd")
            }
            "attacks" => crate::bench::attacks::attacks(&opts, &tmp).await?,
            "views" => crate::bench::views::views(&opts, &tmp).await?,
            "kcp" => crate::bench::kcp::kcp(&opts, &tmp).await?,
            "engage" => crate::bench::engage::engage(&opts).await?,
            other => anyhow::bail!("no bench section {other}"),
        };
        tables.push((section, rows));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    for (section, rows) in &tables {
        println!("\n{}", render(section, &stamp, rows));
    }
    if let Some(readme) = &opts.write_readme {
        write_readme(readme, &stamp, &opts, &tables)
            .with_context(|| format!("writing the tables into {}", readme.display()))?;
        println!("\nwrote {} tables into {}", tables.len(), readme.display());
    }
    Ok(())
}

/// The rows of the workspaces section.
pub(crate) fn workspace_labels(opts: &BenchOptions) -> Vec<String> {
    vec![
        format!(
            "workspaces created, {} under one parent, {} clients",
            opts.workspaces, opts.writers
        ),
        "RSS per empty workspace".to_string(),
        format!("delete the {}-workspace tree", opts.workspaces),
    ]
}

/// Workspaces created under one parent until Ready, the RSS they add, and the tree's deletion.
async fn workspaces(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
    let t = workspace_tree(&tmp.join("workspaces"), opts.workspaces, opts.writers).await?;
    rows(
        workspace_labels(opts),
        vec![
            (
                format!(
                    "{:.0} workspaces/s ({:.1} s; all Ready after {:.1} s)",
                    t.created_per_second, t.create_seconds, t.ready_seconds
                ),
                "target 1,000/s (kcp: `--only kcp`)".to_string(),
            ),
            (
                format!(
                    "{:.1} KiB ({:.0} MiB before, {:.0} MiB after)",
                    t.rss_per_workspace / 1024.0,
                    t.rss_before as f64 / 1048576.0,
                    t.rss_after as f64 / 1048576.0
                ),
                "target 16 KiB (kcp: `--only kcp`)".to_string(),
            ),
            (
                format!("{:.1} s", t.delete_seconds),
                "target < 10 s (kcp: `--only kcp`)".to_string(),
            ),
        ],
    )
}

/// GET, LIST, durable creates and RSS.
async fn serving(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
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
    // The same LIST asked gzipped (as client-go asks): bytes on the wire, time to the last
    // byte, and the client's time to unpack.
    let mut gzip_times = Vec::new();
    let mut unpack_times = Vec::new();
    let mut gzip_bytes = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let r = conn
            .send_with_headers(
                Method::GET,
                "/api/v1/namespaces/default/configmaps",
                &[("accept-encoding", "gzip")],
                Vec::new(),
            )
            .await?;
        gzip_times.push(t.elapsed());
        if r.status != 200 || r.headers.get("content-encoding").is_none() {
            return Err(anyhow!("gzipped list: {} {:?}", r.status, r.headers));
        }
        gzip_bytes = r.body.len();
        let t = Instant::now();
        let mut plain = Vec::with_capacity(list_bytes);
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut plain)?;
        unpack_times.push(t.elapsed());
        if plain.len() != list_bytes {
            return Err(anyhow!(
                "gzipped list unpacks to {} bytes, plain is {list_bytes}",
                plain.len()
            ));
        }
    }
    gzip_times.sort();
    unpack_times.sort();
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
    let split = memory_split(&server).await;
    drop(server);

    let ratio = get_load.per_second() / bare_load.per_second();
    let errors = if get_load.errors + bare_load.errors + creates.errors > 0 {
        format!(
            "; errors: get {}, bare {}, creates {}",
            get_load.errors, bare_load.errors, creates.errors
        )
    } else {
        String::new()
    };
    rows(
        serving_labels(opts),
        vec![
            (
                format!(
                    "{:.0} req/s, p50 {}, p99 {}{errors}",
                    get_load.per_second(),
                    ms(get_load.p50),
                    ms(get_load.p99),
                ),
                format!(
                    "bare hyper+rustls: {:.0} req/s, p99 {}; ratio {:.0}% (target >= 90%, p99 within 1.5x)",
                    bare_load.per_second(),
                    ms(bare_load.p99),
                    ratio * 100.0
                ),
            ),
            (
                format!(
                    "median {}, p99 {} ({:.1} MiB JSON)",
                    ms(percentile(&list_times, 0.5)),
                    ms(percentile(&list_times, 0.99)),
                    list_bytes as f64 / 1048576.0,
                ),
                "target < 100 ms".to_string(),
            ),
            (
                format!(
                    "{:.2} MiB on the wire ({:.0}% of {:.1} MiB); median {} to the last byte, p99 {}; client unpacks in {}",
                    gzip_bytes as f64 / 1048576.0,
                    gzip_bytes as f64 * 100.0 / list_bytes.max(1) as f64,
                    list_bytes as f64 / 1048576.0,
                    ms(percentile(&gzip_times, 0.5)),
                    ms(percentile(&gzip_times, 0.99)),
                    ms(percentile(&unpack_times, 0.5)),
                ),
                format!(
                    "plain, same run: median {} (on loopback, where bytes cost nothing)",
                    ms(percentile(&list_times, 0.5))
                ),
            ),
            (
                format!("{:.0} creates/s, p99 {}", creates.per_second(), ms(creates.p99)),
                "target >= 3,000/s".to_string(),
            ),
            (
                format!(
                    "{:.0} MiB (idle {:.0} MiB; load took {:.1} s){split}",
                    rss as f64 / 1048576.0,
                    idle_rss as f64 / 1048576.0,
                    load_secs,
                ),
                format!(
                    "raw JSON {:.0} MiB; ratio {:.2}x (target <= 1.5x)",
                    raw as f64 / 1048576.0,
                    rss as f64 / raw as f64
                ),
            ),
        ],
    )
}

/// What the server's watch cache holds, from its metrics: `; watch cache: …` (empty if the
/// metrics cannot be read).
async fn memory_split(server: &ChildServer) -> String {
    let reply = async {
        let mut conn = server.client()?.connect().await?;
        anyhow::Ok(conn.get("/metrics").await?)
    };
    let text = match reply.await {
        Ok(reply) if reply.status == 200 => String::from_utf8_lossy(&reply.body).to_string(),
        _ => return String::new(),
    };
    let sample = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mib = |part: &str| {
        sample(&format!(
            "platform_mesh_watch_cache_bytes{{part=\"{part}\"}}"
        )) / 1048576.0
    };
    format!(
        "; of it the watch cache's data: objects {:.0} MiB ({:.0} objects), event window {:.0} MiB more ({:.0} events, {:.0} of them decoded), its encoded frames {:.0} MiB; the store's (redb) page cache at most 32 MiB",
        mib("objects"),
        sample("platform_mesh_watch_cache_objects"),
        mib("window"),
        sample("platform_mesh_watch_cache_window_events"),
        sample("platform_mesh_watch_cache_decoded_events"),
        mib("frames"),
    )
}

/// The rows of the serving section.
pub(crate) fn serving_labels(opts: &BenchOptions) -> Vec<String> {
    vec![
        format!("GET 1 KiB object, {} connections", opts.connections),
        format!("LIST {} x 1 KiB", opts.list_objects),
        format!(
            "LIST {} x 1 KiB gzipped (`Accept-Encoding: gzip`)",
            opts.list_objects
        ),
        format!("durable creates, {} clients", opts.writers),
        format!("RSS after {} x 1 KiB objects", opts.rss_objects),
    ]
}

/// Validation throughput in-process; webhook review latency with 200 connections, closed loop
/// (each connection sends its next review as soon as the last is answered) and open loop (reviews
/// arrive at a fixed rate, as a kube-apiserver sends them), each beside the bare server.
async fn admission(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
    let mut figures = Vec::new();
    for (_, per_sec, baseline) in validation_throughput(Duration::from_secs(opts.seconds.min(3))) {
        figures.push((
            format!("{per_sec:.0} objects/s"),
            format!("JSON decode+encode of the same object: {baseline:.0}/s"),
        ));
    }
    let bare = ChildServer::start(&["bench-bare-server"], &tmp.join("bare2"))?;
    let bare_client = bare.client()?;
    let bare_closed = closed_loop(
        &bare_client,
        REVIEW_CONNECTIONS,
        opts.seconds,
        200,
        |_, _| (Method::GET, "/".to_string(), None),
    )
    .await?;
    let mut bare_open = Vec::new();
    for &rate in &opts.review_rates {
        bare_open.push(
            open_loop(
                &bare_client,
                REVIEW_CONNECTIONS,
                rate,
                opts.seconds,
                200,
                |_, _| (Method::GET, "/".to_string(), Vec::new()),
            )
            .await?,
        );
    }
    drop(bare);

    let server = ChildServer::start(&["serve", "--in-memory"], &tmp.join("webhook"))?;
    let client = server.client()?;
    // The review is serialized once; only its uid changes between requests.
    let template = serde_json::to_string(&admission_review(&typical_accept_api()))?;
    let review = move |c: usize, i: usize| {
        template
            .replacen("\"uid\":\"0\"", &format!("\"uid\":\"{c}-{i}\""), 1)
            .into_bytes()
    };
    let path = "/admission/validate?timeout=10s";
    let r = review.clone();
    let closed = closed_loop(
        &client,
        REVIEW_CONNECTIONS,
        opts.seconds,
        200,
        move |c, i| {
            let body = serde_json::from_slice(&r(c, i)).unwrap_or_default();
            (Method::POST, path.to_string(), Some(body))
        },
    )
    .await?;
    let closed = (
        format!(
            "p50 {}, p99 {}, {:.0} reviews/s",
            ms(closed.p50),
            ms(closed.p99),
            closed.per_second()
        ),
        format!(
            "bare server, same load: p50 {}, p99 {}, {:.0} req/s",
            ms(bare_closed.p50),
            ms(bare_closed.p99),
            bare_closed.per_second()
        ),
    );
    for (&rate, bare) in opts.review_rates.iter().zip(&bare_open) {
        let r = review.clone();
        let open = open_loop(
            &client,
            REVIEW_CONNECTIONS,
            rate,
            opts.seconds,
            200,
            move |c, i| (Method::POST, path.to_string(), r(c, i)),
        )
        .await?;
        figures.push((
            format!(
                "p50 {}, p99 {} ({} late, {} errors)",
                ms(open.p50),
                ms(open.p99),
                open.late,
                open.errors
            ),
            format!(
                "bare server, same load: p50 {}, p99 {}; target p99 < 2 ms",
                ms(bare.p50),
                ms(bare.p99)
            ),
        ));
    }
    figures.push(closed);
    rows(admission_labels(opts), figures)
}

/// Connections of the webhook measurements.
const REVIEW_CONNECTIONS: usize = 200;

/// The rows of the admission section.
pub(crate) fn admission_labels(opts: &BenchOptions) -> Vec<String> {
    let mut labels: Vec<String> = VALIDATED
        .iter()
        .map(|what| format!("validation of a typical {what} (in-process)"))
        .collect();
    for rate in &opts.review_rates {
        labels.push(format!(
            "webhook review, {REVIEW_CONNECTIONS} connections, open loop {rate} reviews/s"
        ));
    }
    labels.push(format!(
        "webhook review, {REVIEW_CONNECTIONS} connections, closed loop (saturation)"
    ));
    labels
}

/// The kinds whose validation is measured in-process.
const VALIDATED: [&str; 2] = ["PlatformMesh", "AcceptAPI"];

/// Latency of an open-loop load.
struct OpenLoad {
    p50: Duration,
    p99: Duration,
    errors: usize,
    /// Requests sent more than 5 ms after their scheduled time (the connection was still busy
    /// or the generator could not keep up): a large count means the figures understate latency.
    late: usize,
}

/// Sends `rate` requests per second in all, spread over `connections` connections on a fixed
/// schedule, for `seconds`; latency is measured from the send of each request.
async fn open_loop<F>(
    client: &ClientConfig,
    connections: usize,
    rate: u64,
    seconds: u64,
    expect: u16,
    make: F,
) -> anyhow::Result<OpenLoad>
where
    F: Fn(usize, usize) -> (Method, String, Vec<u8>) + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let interval = Duration::from_secs_f64(connections as f64 / rate.max(1) as f64);
    let mut conns = Vec::new();
    for _ in 0..connections {
        conns.push(client.connect().await?);
    }
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let make = make.clone();
        // Connections start evenly staggered over one interval.
        let offset = interval.mul_f64(c as f64 / connections as f64);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let (mut errors, mut late) = (0usize, 0usize);
            let mut i = 0;
            loop {
                let due = start + offset + interval * i as u32;
                if due >= deadline {
                    break;
                }
                tokio::time::sleep_until(due).await;
                if due.elapsed() > Duration::from_millis(5) {
                    late += 1;
                }
                let (method, path, body) = make(c, i);
                let ct = (!body.is_empty()).then_some("application/json");
                let t = Instant::now();
                let r = conn.send(method, &path, ct, body).await?;
                latencies.push(t.elapsed());
                if r.status.as_u16() != expect {
                    errors += 1;
                }
                i += 1;
            }
            anyhow::Ok((latencies, errors, late))
        }));
    }
    let (mut all, mut errors, mut late) = (Vec::new(), 0, 0);
    for t in tasks {
        let (l, e, d) = t.await??;
        all.extend(l);
        errors += e;
        late += d;
    }
    all.sort();
    Ok(OpenLoad {
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        errors,
        late,
    })
}

/// Overload: a server limited to `--max-requests-inflight` is driven by ten times as many
/// closed-loop clients as the limit, each creating 1 KiB objects in the durable store (a write
/// waits for its group commit, so requests pile up inside the server). It must answer 429 to the
/// excess, keep its RSS under the ceiling, and serve normally again once the load drops.
async fn overload(opts: &BenchOptions, tmp: &Path) -> anyhow::Result<Vec<Row>> {
    let limit = opts.overload_inflight;
    let server = ChildServer::start(
        &["serve", "--max-requests-inflight", &limit.to_string()],
        &tmp.join("overload"),
    )?;
    let client = server.client()?;
    let create = |phase: char| {
        move |c: usize, i: usize| {
            (
                Method::POST,
                "/api/v1/namespaces/default/configmaps".to_string(),
                Some(object_1k(&format!("{phase}{c:04}-{i:07}"))),
            )
        }
    };
    let idle_rss = server.rss_bytes();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        let pid = server.child.id();
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_of(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let normal = statuses(&client, limit, opts.seconds, create('a')).await?;
    let normal_peak = peak.swap(0, std::sync::atomic::Ordering::Relaxed);
    let over = statuses(&client, limit * 10, opts.seconds, create('b')).await?;
    let over_peak = peak.swap(0, std::sync::atomic::Ordering::Relaxed);
    let after = statuses(&client, limit, opts.seconds, create('c')).await?;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.await;
    let ceiling = opts.overload_rss_ceiling_mib * 1048576;
    let verdict = if over_peak <= ceiling {
        "under"
    } else {
        "OVER"
    };
    rows(
        overload_labels(opts),
        vec![
            (
                format!(
                    "{:.0} ok/s, {:.0} 429/s, peak RSS {:.0} MiB ({verdict} the {} MiB ceiling)",
                    over.ok_per_second(),
                    over.throttled_per_second(),
                    over_peak as f64 / 1048576.0,
                    opts.overload_rss_ceiling_mib,
                ),
                format!(
                    "{limit} clients: {:.0} ok/s, p99 {}, peak RSS {:.0} MiB (idle {:.0} MiB)",
                    normal.ok_per_second(),
                    ms(normal.p99_ok),
                    normal_peak as f64 / 1048576.0,
                    idle_rss as f64 / 1048576.0,
                ),
            ),
            (
                format!(
                    "{:.0} ok/s, {} 429s, {} other errors, p99 {}",
                    after.ok_per_second(),
                    after.throttled,
                    after.other,
                    ms(after.p99_ok),
                ),
                format!(
                    "before: {:.0} ok/s, p99 {}",
                    normal.ok_per_second(),
                    ms(normal.p99_ok),
                ),
            ),
        ],
    )
}

/// The rows of the overload section.
pub(crate) fn overload_labels(opts: &BenchOptions) -> Vec<String> {
    let limit = opts.overload_inflight;
    vec![
        format!(
            "overload: {} clients creating 1 KiB objects (redb), --max-requests-inflight {limit}",
            limit * 10
        ),
        format!("after the overload, {limit} clients"),
    ]
}

/// Answers by status of a closed-loop load.
struct Statuses {
    ok: usize,
    throttled: usize,
    other: usize,
    seconds: f64,
    p99_ok: Duration,
}

impl Statuses {
    fn ok_per_second(&self) -> f64 {
        self.ok as f64 / self.seconds
    }
    fn throttled_per_second(&self) -> f64 {
        self.throttled as f64 / self.seconds
    }
}

/// A closed loop that counts successes (2xx), 429 (after which the client waits 10 ms, far less than the
/// Retry-After a polite client honours, to keep the pressure on) and anything else.
async fn statuses<F>(
    client: &ClientConfig,
    connections: usize,
    seconds: u64,
    make: F,
) -> anyhow::Result<Statuses>
where
    F: Fn(usize, usize) -> (Method, String, Option<serde_json::Value>)
        + Send
        + Sync
        + Copy
        + 'static,
{
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let (mut ok, mut throttled, mut other) = (Vec::new(), 0usize, 0usize);
            let mut i = 0;
            while Instant::now() < deadline {
                let (method, path, body) = make(c, i);
                let (ct, bytes) = match body {
                    Some(b) => (Some("application/json"), serde_json::to_vec(&b)?),
                    None => (None, Vec::new()),
                };
                let t = Instant::now();
                let r = conn.send(method, &path, ct, bytes).await?;
                match r.status.as_u16() {
                    200..=299 => ok.push(t.elapsed()),
                    429 => {
                        throttled += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    _ => other += 1,
                }
                i += 1;
            }
            anyhow::Ok((ok, throttled, other))
        }));
    }
    let (mut ok, mut throttled, mut other) = (Vec::new(), 0, 0);
    for t in tasks {
        let (o, th, ot) = t.await??;
        ok.extend(o);
        throttled += th;
        other += ot;
    }
    ok.sort();
    Ok(Statuses {
        ok: ok.len(),
        throttled,
        other,
        seconds: started.elapsed().as_secs_f64(),
        p99_ok: percentile(&ok, 0.99),
    })
}

pub(crate) fn rss_of(pid: u32) -> u64 {
    apiserver::meta::metrics::resident_memory_bytes(pid)
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
        if ready >= n {
            break started.elapsed().as_secs_f64();
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(anyhow!("{ready} of {n} workspaces Ready after 10 min"));
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
        if r.status == 404 {
            break;
        }
        if started.elapsed() > Duration::from_secs(1200) {
            return Err(anyhow!("root:orgs:bulk still there after 20 min"));
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
    let mut strategies = apiserver::registry::StrategiesBuilder::default();
    apiserver::admission::rules::register(&mut strategies);
    let strategies = strategies.build();
    let mut out = Vec::new();
    for (what, obj) in VALIDATED
        .into_iter()
        .zip([typical_platform_mesh(), typical_accept_api()])
    {
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
            let outcome = apiserver::registry::validate_object(
                &resource,
                strategies.of(&resource).as_ref(),
                &mut o,
                None,
                apiserver::meta::schema::FieldValidation::Warn,
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
        requestheader_ca_pem: None,
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
