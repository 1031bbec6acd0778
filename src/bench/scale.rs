//! The scale-out benchmark (`bench --only etcd`), on a real etcd started for the run:
//!
//! 1. Creates/s through `serve --etcd-servers` beside raw etcd puts/s of the same 1 KiB payload
//!    with the same concurrency, straight from this process (the ceiling the server can reach).
//! 2. Watch fan-out: `watchers` watches of ConfigMaps spread over `workspaces` workspaces (so
//!    each write reaches `watchers / workspaces` of them), over HTTP/2, while `rate` writes/s go
//!    round-robin to the workspaces; each write carries its send time, and every watcher records
//!    the delay until the event reached it. Beside it, the same writes seen by one raw etcd watch.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use apiserver::storage::etcd::testing::EtcdProcess;
use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use serde_json::json;

use crate::bench::broker::{post, wait_ready};
use crate::bench::report::{etcd_labels, rows, Row};
use crate::bench::{closed_loop, ms, object_1k, rss_of, BenchOptions, ChildServer};

/// Microseconds since the epoch, as written into each object.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How the raw etcd baseline writes each key.
#[derive(Clone, Copy)]
enum RawWrite {
    /// A plain put.
    Put,
    /// A put only if the key does not exist yet: the transaction every create of an API server
    /// on etcd needs (kube-apiserver's too).
    CreateTxn,
}

/// Raw etcd writes of a 1 KiB object for `seconds` with `concurrency` clients; writes/s.
async fn raw_writes(
    endpoint: &str,
    concurrency: usize,
    seconds: u64,
    how: RawWrite,
) -> anyhow::Result<f64> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let client = etcd_client::Client::connect([endpoint], None).await?;
    let payload = serde_json::to_vec(&object_1k("raw"))?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let mut kv = client.kv_client();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while Instant::now() < deadline {
                let key = format!("/raw/{c}/{n}");
                match how {
                    RawWrite::Put => {
                        kv.put(key, payload.clone(), None).await?;
                    }
                    RawWrite::CreateTxn => {
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key.clone(), payload.clone(), None)])
                            .or_else([TxnOp::get(key, None)]);
                        kv.txn(txn).await?;
                    }
                }
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// CPU time spent by etcd, the server and this process (the benchmark's clients) over one
/// measurement.
struct CpuMeter {
    etcd: Option<u32>,
    server: Option<u32>,
    before: [f64; 3],
    started: Instant,
}

impl CpuMeter {
    fn now(etcd: Option<u32>, server: Option<u32>) -> [f64; 3] {
        let of = |pid: Option<u32>| pid.map_or(0.0, apiserver::meta::metrics::cpu_seconds);
        [of(etcd), of(server), of(Some(std::process::id()))]
    }

    fn start(etcd: Option<u32>, server: Option<u32>) -> Self {
        CpuMeter {
            etcd,
            server,
            before: Self::now(etcd, server),
            started: Instant::now(),
        }
    }

    /// The CPU microseconds per operation at `per_second` operations per second since `start`.
    fn per_op(&self, per_second: f64) -> String {
        let after = Self::now(self.etcd, self.server);
        let ops = (per_second * self.started.elapsed().as_secs_f64()).max(1.0);
        let us = |i: usize| (after[i] - self.before[i]) * 1e6 / ops;
        let mut parts = vec![format!("etcd {:.0}", us(0))];
        if self.server.is_some() {
            parts.push(format!("server {:.0}", us(1)));
        }
        parts.push(format!("clients {:.0}", us(2)));
        parts.join(", ")
    }

    /// The cores each process kept busy since `start`, and the machine's share they add up to.
    fn cores(&self) -> String {
        let after = Self::now(self.etcd, self.server);
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        let cores: Vec<f64> = (0..3)
            .map(|i| (after[i] - self.before[i]) / seconds)
            .collect();
        let machine = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        format!(
            "server {:.2}, etcd {:.2}, clients {:.2} cores ({:.0}% of the machine's {machine:.0})",
            cores[1],
            cores[0],
            cores[2],
            cores.iter().sum::<f64>() * 100.0 / machine
        )
    }
}

/// Reads one watch response line by line, recording the delay of every event carrying `sent`,
/// until `expect` of them arrived or `until` passed (then the missing ones show as undelivered).
pub(crate) async fn follow_watch(
    mut sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: String,
    expect: usize,
    until: Instant,
) -> anyhow::Result<Vec<u32>> {
    sender.ready().await?;
    let req = http::Request::builder()
        .method(Method::GET)
        .uri(format!("https://localhost{path}"))
        .body(Full::new(Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    if !resp.status().is_success() {
        return Err(anyhow!("watch {path}: {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut delays = Vec::new();
    let mut pending = Vec::new();
    while delays.len() < expect {
        let left = until.saturating_duration_since(Instant::now());
        let frame = match tokio::time::timeout(left, body.frame()).await {
            Err(_) | Ok(None) => return Ok(delays),
            Ok(Some(frame)) => frame?,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = now_micros();
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(sent) = sent_of(&line) {
                delays.push(now.saturating_sub(sent).min(u32::MAX as u64) as u32);
            }
        }
    }
    Ok(delays)
}

/// The `"sent":"<micros>"` a benchmark object carries.
fn sent_of(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"sent\":\"";
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Delays (µs) of the writes as one raw etcd watch on the server's prefix sees them, until
/// `expect` of them arrived or `until` passed.
async fn raw_watch(endpoint: String, expect: usize, until: Instant) -> anyhow::Result<Vec<u32>> {
    let mut client = etcd_client::Client::connect([endpoint], None).await?;
    let mut stream = client
        .watch(
            "/platform-mesh/",
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await?;
    let mut delays = Vec::new();
    while delays.len() < expect {
        let left = until.saturating_duration_since(Instant::now());
        let msg = match tokio::time::timeout(left, stream.message()).await {
            Err(_) | Ok(Ok(None)) => return Ok(delays),
            Ok(msg) => msg?,
        };
        let Some(resp) = msg else { return Ok(delays) };
        let now = now_micros();
        for ev in resp.events() {
            if let Some(sent) = ev.kv().and_then(|kv| sent_of(kv.value())) {
                delays.push(now.saturating_sub(sent).min(u32::MAX as u64) as u32);
            }
        }
    }
    Ok(delays)
}

pub(crate) fn micros_ms(sorted: &[u32], p: f64) -> String {
    if sorted.is_empty() {
        return "n/a".into();
    }
    let i = (((sorted.len() - 1) as f64) * p).round() as usize;
    ms(Duration::from_micros(
        sorted[i.min(sorted.len() - 1)] as u64,
    ))
}

/// Runs the scale-out measurements; returns report rows.
pub async fn scale(opts: &BenchOptions, tmp: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let mut figures = Vec::new();
    let concurrency = opts.connections;

    // 1. Creates through the server vs raw puts, each on a fresh etcd; with the CPU time each
    //    process spends per write, which shows where the two cores go.
    let etcd = EtcdProcess::start().await?;
    let meter = CpuMeter::start(etcd.pid(), None);
    let raw = raw_writes(&etcd.endpoint(), concurrency, opts.seconds, RawWrite::Put).await?;
    let raw_cpu = meter.per_op(raw);
    drop(etcd);
    let etcd = EtcdProcess::start().await?;
    let meter = CpuMeter::start(etcd.pid(), None);
    let raw_txn = raw_writes(
        &etcd.endpoint(),
        concurrency,
        opts.seconds,
        RawWrite::CreateTxn,
    )
    .await?;
    let txn_cpu = meter.per_op(raw_txn);
    drop(etcd);
    let etcd = EtcdProcess::start().await?;
    let endpoint = etcd.endpoint();
    let server = ChildServer::start(
        &["serve", "--no-controllers", "--etcd-servers", &endpoint],
        &tmp.join("etcd-creates"),
    )?;
    let meter = CpuMeter::start(etcd.pid(), Some(server.child_id()));
    let creates = closed_loop(&server.client()?, concurrency, opts.seconds, 201, |c, i| {
        (
            Method::POST,
            "/api/v1/namespaces/default/configmaps".into(),
            Some(object_1k(&format!("c{c}-{i}"))),
        )
    })
    .await?;
    let create_cpu = meter.per_op(creates.per_second());
    figures.push((
        format!(
            "{:.0}/s (p50 {}, p99 {}; {} errors) = {:.0}% of raw create transactions, {:.0}% of raw puts",
            creates.per_second(),
            ms(creates.p50),
            ms(creates.p99),
            creates.errors,
            100.0 * creates.per_second() / raw_txn.max(1.0),
            100.0 * creates.per_second() / raw.max(1.0),
        ),
        format!(
            "raw create-if-absent transactions, same payload and concurrency: {raw_txn:.0}/s; target ≥ 90%. Raw puts: {raw:.0}/s (transactions {:.0}% of puts)",
            100.0 * raw_txn / raw.max(1.0),
        ),
    ));
    figures.push((
        create_cpu.to_string(),
        format!("per raw put: {raw_cpu}; per raw create transaction: {txn_cpu}"),
    ));
    drop(server);
    drop(etcd);

    // 2. Watch fan-out.
    let (watchers, spaces, rate) = (opts.watchers, opts.watch_workspaces.max(1), opts.watch_rate);
    let etcd = EtcdProcess::start().await?;
    let endpoint = etcd.endpoint();
    let dir = tmp.join("etcd-fanout");
    let server = ChildServer::start(
        &["serve", "--no-controllers", "--etcd-servers", &endpoint],
        &dir,
    )?;
    let client = server.client()?;
    let mut conn = client.connect().await?;
    let workspaces = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";
    let names: Vec<String> = (0..spaces).map(|i| format!("fan-{i:03}")).collect();
    for name in &names {
        post(
            &mut conn,
            workspaces,
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}}),
        )
        .await?;
    }
    for name in &names {
        wait_ready(&mut conn, &format!("{workspaces}/{name}"), |w| {
            w["status"]["phase"] == "Ready"
        })
        .await?;
    }
    let rss_idle = rss_of(server.child_id());
    let per_connection = 100;
    let connections = watchers.div_ceil(per_connection);
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(client.connect_h2().await.context("HTTP/2 connection")?);
    }
    let seconds = opts.seconds.max(10);
    let until = Instant::now() + Duration::from_secs(seconds + 20);
    // Writes go round-robin to the workspaces: workspace `i` gets every `spaces`-th of them.
    let total = rate as usize * seconds as usize;
    let writes_to = |i: usize| total / spaces + usize::from(i < total % spaces);
    let mut tasks = Vec::new();
    for w in 0..watchers {
        let ws = &names[w % spaces];
        let path = format!(
            "/clusters/root:{ws}/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true"
        );
        tasks.push(tokio::spawn(follow_watch(
            senders[w / per_connection].clone(),
            path,
            writes_to(w % spaces),
            until,
        )));
    }
    let raw_task = tokio::spawn(raw_watch(endpoint.clone(), total, until));
    // Let every watch get established (a list of each workspace answers only after them).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_watching = rss_of(server.child_id());

    // Open loop: `rate` creates per second from 16 connections.
    let writers = 16;
    let started = Instant::now();
    let meter = CpuMeter::start(etcd.pid(), Some(server.child_id()));
    let mut writes = Vec::new();
    let names = Arc::new(names);
    for wr in 0..writers {
        let client = client.clone();
        let names = names.clone();
        writes.push(tokio::spawn(async move {
            let mut conn = client.connect().await?;
            let mut late = 0usize;
            let mut i = wr;
            while i < total {
                let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    tokio::time::sleep(wait).await;
                } else if Instant::now() - due > Duration::from_millis(100) {
                    late += 1;
                }
                let ws = &names[i % names.len()];
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("m-{i:07}")},
                    "data": {"sent": now_micros().to_string(), "payload": "x".repeat(800)}});
                let r = conn
                    .post_json(
                        &format!("/clusters/root:{ws}/api/v1/namespaces/default/configmaps"),
                        &body,
                    )
                    .await?;
                if r.status.as_u16() != 201 {
                    return Err(anyhow!(
                        "create: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ));
                }
                i += writers;
            }
            anyhow::Ok(late)
        }));
    }
    let mut rss_peak = rss_watching;
    let sampler = {
        let pid = server.child_id();
        tokio::spawn(async move {
            let mut peak = 0;
            while Instant::now() < started + Duration::from_secs(seconds + 2) {
                peak = peak.max(rss_of(pid));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            peak
        })
    };
    let mut late = 0;
    for w in writes {
        late += w.await??;
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let busy = meter.cores();
    rss_peak = rss_peak.max(sampler.await?);
    let mut delays: Vec<u32> = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await? {
            Ok(d) => delays.extend(d),
            Err(_) => failed += 1,
        }
    }
    delays.sort_unstable();
    let mut raw_delays = raw_task.await??;
    raw_delays.sort_unstable();
    let per_write = watchers / spaces;
    let expected = total * per_write;
    figures.push((
        format!(
            "delivered {} of {expected} events ({:.0}/s); delay p50 {}, p99 {}, max {}; server RSS {:.0} MiB idle, {:.0} MiB watching, peak {:.0} MiB; {failed} watches failed, {late} writes late; CPU while writing: {busy}",
            delays.len(),
            delays.len() as f64 / write_seconds,
            micros_ms(&delays, 0.50),
            micros_ms(&delays, 0.99),
            micros_ms(&delays, 1.0),
            rss_idle as f64 / 1048576.0,
            rss_watching as f64 / 1048576.0,
            rss_peak as f64 / 1048576.0,
        ),
        format!(
            "one raw etcd watch of the same writes: p50 {}, p99 {}; target p99 < 50 ms, RSS < 512 MiB",
            micros_ms(&raw_delays, 0.50),
            micros_ms(&raw_delays, 0.99),
        ),
    ));
    drop(server);
    drop(etcd);
    rows(etcd_labels(opts), figures)
}
