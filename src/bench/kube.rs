//! `bench --only kube`: platform-mesh beside what users would run instead, in one run on one
//! machine: the real kube-apiserver (the release pinned in `tests/peers/go`, built by
//! `scripts/peers`) on its etcd, `serve` on redb, and `serve` on that same etcd (its own prefix).
//! Each gets the same load, one after the other: GET of a 1 KiB object, LIST of `list_objects`,
//! creates with `writers` clients, and a watch fan-out (1,000 watchers of one namespace, each
//! from the resourceVersion of a list as informers start, while writes go on at a fixed rate;
//! each write carries its send time and every watcher records the delay until the event reached
//! it).

use std::time::{Duration, Instant};

use anyhow::anyhow;
use http::Method;
use https_client::ClientConfig;
use serde_json::json;

use crate::bench::report::KUBE_WATCHERS as WATCHERS;
use crate::bench::report::{kube_labels, rows, Row, KUBE_FANOUT_RATE as FANOUT_RATE};
use crate::bench::scale::{follow_watch, micros_ms, now_micros};
use crate::bench::{closed_loop, load_objects, ms, object_1k, percentile, rss_of, BenchOptions};
use crate::bench::{ChildServer, Load};
use crate::peers::{KubeApiserver, KUBERNETES_VERSION};

/// Watches per HTTP/2 connection (below every server's stream limit).
const PER_CONNECTION: usize = 100;

/// What one server did.
struct Figures {
    get: Load,
    list_p50: Duration,
    list_p99: Duration,
    creates: Load,
    /// Delays (µs) of every delivered event, sorted.
    fanout: Vec<u32>,
    fanout_expected: usize,
    rss_mib: f64,
}

pub async fn kube(opts: &BenchOptions, tmp: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    std::fs::create_dir_all(tmp)?;
    let peer = KubeApiserver::start(&tmp.join("kube"))?;
    let kube = measure(&peer.client()?, peer.pid(), opts).await?;
    let redb = ChildServer::start(&["serve", "--no-controllers"], &tmp.join("kube-redb"))?;
    let on_redb = measure(&redb.client()?, redb.child_id(), opts).await?;
    drop(redb);
    let on_etcd_server = ChildServer::start(
        &[
            "serve",
            "--no-controllers",
            "--etcd-servers",
            &peer.etcd_url,
            "--etcd-prefix",
            "/platform-mesh-bench",
        ],
        &tmp.join("kube-etcd"),
    )?;
    let on_etcd = measure(&on_etcd_server.client()?, on_etcd_server.child_id(), opts).await?;
    drop(on_etcd_server);
    drop(peer);

    let k = format!("kube-apiserver {KUBERNETES_VERSION} (same machine, its etcd)");
    // A closed-loop load on each server: ours, then kube-apiserver's with our ratios to it.
    let throughput = |load: fn(&Figures) -> &Load, unit: &str, kube_name: &str| {
        let (redb, etcd, theirs) = (load(&on_redb), load(&on_etcd), load(&kube));
        let ratio = |l: &Load| format!("{:.2}x", l.per_second() / theirs.per_second());
        (
            format!(
                "redb {:.0}{unit} (p99 {}); etcd {:.0}{unit} (p99 {})",
                redb.per_second(),
                ms(redb.p99),
                etcd.per_second(),
                ms(etcd.p99),
            ),
            format!(
                "{kube_name}: {:.0}{unit} (p99 {}); redb/kube {}, etcd/kube {}",
                theirs.per_second(),
                ms(theirs.p99),
                ratio(redb),
                ratio(etcd),
            ),
        )
    };
    let fanout = |f: &Figures| {
        format!(
            "{} of {} events, delay p50 {}, p99 {}, max {}",
            f.fanout.len(),
            f.fanout_expected,
            micros_ms(&f.fanout, 0.5),
            micros_ms(&f.fanout, 0.99),
            micros_ms(&f.fanout, 1.0)
        )
    };
    let errors = [&kube, &on_redb, &on_etcd]
        .iter()
        .map(|f| f.get.errors + f.creates.errors)
        .sum::<usize>();
    let errors = if errors > 0 {
        format!("; {errors} errors in all")
    } else {
        String::new()
    };
    rows(
        kube_labels(opts),
        vec![
            throughput(|f| &f.get, " req/s", &k),
            (
                format!(
                    "redb median {} (p99 {}); etcd median {} (p99 {})",
                    ms(on_redb.list_p50),
                    ms(on_redb.list_p99),
                    ms(on_etcd.list_p50),
                    ms(on_etcd.list_p99),
                ),
                format!(
                    "kube-apiserver: median {} (p99 {})",
                    ms(kube.list_p50),
                    ms(kube.list_p99),
                ),
            ),
            throughput(|f| &f.creates, "/s", "kube-apiserver"),
            (
                format!("redb {}; etcd {}", fanout(&on_redb), fanout(&on_etcd)),
                format!("kube-apiserver: {}", fanout(&kube)),
            ),
            (
                format!(
                    "redb {:.0} MiB; etcd {:.0} MiB{errors}",
                    on_redb.rss_mib, on_etcd.rss_mib
                ),
                format!(
                    "kube-apiserver: {:.0} MiB (etcd not counted for either)",
                    kube.rss_mib
                ),
            ),
        ],
    )
}

/// The same load against one server.
async fn measure(client: &ClientConfig, pid: u32, opts: &BenchOptions) -> anyhow::Result<Figures> {
    load_objects(client, 1, 1, "get").await?;
    let get = closed_loop(client, opts.connections, opts.seconds, 200, |_, _| {
        (
            Method::GET,
            "/api/v1/namespaces/default/configmaps/get-000000".to_string(),
            None,
        )
    })
    .await?;

    load_objects(client, opts.list_objects, opts.writers, "list").await?;
    let mut conn = client.connect().await?;
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let r = conn.get("/api/v1/namespaces/default/configmaps").await?;
        times.push(t.elapsed());
        if r.status != 200 {
            return Err(anyhow!("list failed: {}", r.status));
        }
    }
    times.sort();

    let creates = closed_loop(client, opts.writers, opts.seconds, 201, |c, i| {
        (
            Method::POST,
            "/api/v1/namespaces/default/configmaps".to_string(),
            Some(object_1k(&format!("c{c:03}-{i:07}"))),
        )
    })
    .await?;

    let (fanout, fanout_expected) = fan_out(client, opts.seconds.max(10)).await?;
    let mut fanout = fanout;
    fanout.sort_unstable();
    Ok(Figures {
        get,
        list_p50: percentile(&times, 0.5),
        list_p99: percentile(&times, 0.99),
        creates,
        fanout,
        fanout_expected,
        rss_mib: rss_of(pid) as f64 / 1048576.0,
    })
}

/// `WATCHERS` watches of the labelled ConfigMaps of `default` while `FANOUT_RATE` creates per
/// second go on for `seconds`; returns the delays of every delivered event and how many were due.
async fn fan_out(client: &ClientConfig, seconds: u64) -> anyhow::Result<(Vec<u32>, usize)> {
    let mut senders = Vec::new();
    for _ in 0..WATCHERS.div_ceil(PER_CONNECTION) {
        senders.push(client.connect_h2().await?);
    }
    // As informers do: watch from the resourceVersion of a list.
    let mut conn = client.connect().await?;
    let listed = conn
        .get("/api/v1/namespaces/default/configmaps?labelSelector=bench%3Dfanout")
        .await?
        .json();
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("list without resourceVersion: {listed}"))?
        .to_string();
    let until = Instant::now() + Duration::from_secs(seconds + 15);
    let total = (FANOUT_RATE * seconds) as usize;
    let path = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=bench%3Dfanout&resourceVersion={rv}"
    );
    let mut tasks = Vec::new();
    for w in 0..WATCHERS {
        tasks.push(tokio::spawn(follow_watch(
            senders[w / PER_CONNECTION].clone(),
            path.to_string(),
            total,
            until,
        )));
    }
    // Let every watch be established before the first write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / FANOUT_RATE as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("fan-{i:06}"), "labels": {"bench": "fanout"}},
            "data": {"sent": now_micros().to_string()}});
        let r = conn
            .post_json("/api/v1/namespaces/default/configmaps", &obj)
            .await?;
        if r.status != 201 {
            return Err(anyhow!("fan-out write failed: {}", r.status));
        }
    }
    let mut delays = Vec::new();
    for t in tasks {
        // A watch that failed delivers nothing: it shows as missing events.
        if let Ok(Ok(d)) = t.await {
            delays.extend(d);
        }
    }
    Ok((delays, total * WATCHERS))
}
