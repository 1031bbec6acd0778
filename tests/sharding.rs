//! The workspace controllers sharded over three `platform-mesh serve` replicas on one etcd
//! (`--shard-replicas 3`): the replicas split 300 organisations' Accounts between them, a killed
//! replica's share is taken over once its fences expire, and no workspace is ever reconciled by
//! two replicas at once, which the test reads off every replica's log of reconcile starts and
//! ends.

#![cfg(feature = "etcd")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use apiserver::storage::etcd::testing::EtcdProcess;
use common::Server;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

/// Organisations (each an Account in root:orgs, then one Account in its own workspace).
const ORGS: usize = 300;
/// The Leases' timing (`--leader-elect-*`): short, so that the take-over is quick to watch.
const LEASE: Duration = Duration::from_secs(6);
const RENEW: Duration = Duration::from_secs(4);
const PROBE: Duration = Duration::from_secs(1);

const ACCOUNTS: &str = "apis/core.platform-mesh.io/v1alpha1/accounts";

async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
        .expect("request");
    match client.request::<Value>(request).await {
        Ok(v) => (200, v),
        Err(kube::Error::Api(s)) => (s.code, json!({"message": s.message})),
        Err(e) => (0, json!({"message": e.to_string()})),
    }
}

fn account(name: &str, ty: &str) -> Value {
    json!({"apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
        "metadata": {"name": name}, "spec": {"type": ty, "displayName": name}})
}

/// Creates `(workspace, account, type)` Accounts, 16 at a time (retrying while the workspace
/// is not there yet).
async fn create_accounts(client: &kube::Client, accounts: Vec<(String, String, &'static str)>) {
    futures::stream::iter(accounts)
        .for_each_concurrent(16, |(ws, name, ty)| async move {
            let path = format!("/clusters/{ws}/{ACCOUNTS}");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            loop {
                let (code, body) =
                    send(client, http::Method::POST, &path, Some(account(&name, ty))).await;
                if code == 200 || code == 409 {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "creating Account {name} in {ws}: {code} {body}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
}

fn ready(account: &Value) -> bool {
    account["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Waits until `expected` Accounts across all workspaces whose names `wanted` accepts are
/// Ready (read from one wildcard list).
async fn all_ready(
    client: &kube::Client,
    what: &str,
    wanted: impl Fn(&str) -> bool,
    expected: usize,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    // Progress is printed every 10 s while waiting.
    let mut next_report = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (code, list) = send(
            client,
            http::Method::GET,
            &format!("/clusters/*/{ACCOUNTS}"),
            None,
        )
        .await;
        let done = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| ready(a) && a["metadata"]["name"].as_str().is_some_and(&wanted))
            .count();
        if code == 200 && done >= expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {done} of {expected} Accounts Ready after {within:?} (list: {code} {})",
            list["message"]
        );
        if tokio::time::Instant::now() >= next_report {
            eprintln!("{what}: {done} of {expected} Ready");
            next_report += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates an Account `name` (type `account`) in every organisation's workspace and waits
/// until all of them are Ready.
async fn account_in_every_organisation(client: &kube::Client, orgs: &[String], name: &str) {
    create_accounts(
        client,
        orgs.iter()
            .map(|o| (format!("root:orgs:{o}"), name.to_string(), "account"))
            .collect(),
    )
    .await;
    all_ready(
        client,
        &format!("Accounts {name}"),
        |n| n == name,
        orgs.len(),
        Duration::from_secs(300),
    )
    .await;
}

/// One line of a replica's JSON log.
struct Line {
    at: Timestamp,
    message: String,
    cluster: String,
}

fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .expect("read a replica's log")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            Some(Line {
                at: v["timestamp"].as_str()?.parse().ok()?,
                message: v["fields"]["message"].as_str()?.to_string(),
                cluster: v["fields"]["cluster"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
        })
        .collect()
}

/// The clusters a replica holds at the end of its log: fences acquired and not handed off.
fn held(lines: &[Line]) -> BTreeSet<String> {
    let mut held = BTreeSet::new();
    for l in lines {
        match l.message.as_str() {
            "fence acquired; engaging" => {
                held.insert(l.cluster.clone());
            }
            "cluster handed off" | "cluster not idle in time; its fence is left to expire" => {
                held.remove(&l.cluster);
            }
            _ => {}
        }
    }
    held
}

/// Each cluster's reconcile intervals in one replica's log; one still running when the log ends
/// lasts until `end` (the replica's death, or the end of the test).
fn reconciles(lines: &[Line], end: Timestamp) -> BTreeMap<String, Vec<(Timestamp, Timestamp)>> {
    let mut open: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    let mut done: BTreeMap<String, Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
    for l in lines {
        match l.message.as_str() {
            "reconcile started" => open.entry(l.cluster.clone()).or_default().push(l.at),
            "reconcile ended" => {
                let start = open
                    .get_mut(&l.cluster)
                    .and_then(Vec::pop)
                    .unwrap_or_else(|| {
                        panic!("a reconcile of {} ended that did not start", l.cluster)
                    });
                done.entry(l.cluster.clone())
                    .or_default()
                    .push((start, l.at));
            }
            _ => {}
        }
    }
    for (cluster, starts) in open {
        for start in starts {
            done.entry(cluster.clone()).or_default().push((start, end));
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_workspaces_and_take_over_a_killed_ones_share() {
    let etcd = EtcdProcess::start().await.expect("etcd");
    let endpoint = etcd.endpoint();
    let (lease, renew, probe) = (
        format!("{}s", LEASE.as_secs()),
        format!("{}s", RENEW.as_secs()),
        format!("{}s", PROBE.as_secs()),
    );
    let flags = [
        "--etcd-servers",
        endpoint.as_str(),
        "--shard-replicas",
        "3",
        "--leader-elect-lease-duration",
        lease.as_str(),
        "--leader-elect-renew-deadline",
        renew.as_str(),
        "--leader-elect-retry-period",
        probe.as_str(),
        "--log-format",
        "json",
    ];
    // The replicas' logs, kept where PM_TEST_LOGS says (to read after a failure).
    let logs = tempfile::tempdir().expect("tempdir");
    let dir = std::env::var_os("PM_TEST_LOGS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| logs.path().to_path_buf());
    std::fs::create_dir_all(&dir).expect("the log directory");
    let log = |i: usize| dir.join(format!("replica-{i}.log"));
    let filter = "warn,mc_runtime::controller=debug,mc_runtime::sharding=info";
    let a = Server::start_logged(None, &flags, filter, &log(0));
    let mut replicas = vec![a];
    for i in 1..3 {
        let r = Server::start_logged(Some(&replicas[0]), &flags, filter, &log(i));
        replicas.push(r);
    }
    let client = replicas[0].kube().await;

    // 300 organisations, then an Account in each organisation's workspace.
    let orgs: Vec<String> = (0..ORGS).map(|i| format!("org-{i:03}")).collect();
    let started = std::time::Instant::now();
    create_accounts(
        &client,
        orgs.iter()
            .map(|o| ("root:orgs".to_string(), o.clone(), "org"))
            .collect(),
    )
    .await;
    all_ready(
        &client,
        "organisations",
        |n| n.starts_with("org-"),
        ORGS,
        Duration::from_secs(300),
    )
    .await;
    account_in_every_organisation(&client, &orgs, "team").await;
    eprintln!(
        "{} Accounts Ready after {:.1} s",
        2 * ORGS,
        started.elapsed().as_secs_f64()
    );

    // Every replica holds a share.
    let shares: Vec<BTreeSet<String>> = (0..3).map(|i| held(&read_log(&log(i)))).collect();
    for (i, share) in shares.iter().enumerate() {
        assert!(
            share.len() >= ORGS / 10,
            "replica {i} holds {} workspaces of {}: {shares:?}",
            share.len(),
            shares.iter().map(BTreeSet::len).sum::<usize>()
        );
    }
    eprintln!(
        "shares: {:?}",
        shares.iter().map(BTreeSet::len).collect::<Vec<_>>()
    );

    // Replica 1 dies without giving anything up.
    let victim = 1;
    let lost = shares[victim].clone();
    let killed_at = Timestamp::now();
    replicas[victim].kill();
    let killed = tokio::time::Instant::now();
    // Each of its workspaces is taken by a survivor once the fence expires.
    let bound = LEASE + 3 * PROBE + Duration::from_secs(3);
    let give_up = killed + bound + Duration::from_secs(30);
    let taken_at = loop {
        let mut taken: BTreeMap<String, Timestamp> = BTreeMap::new();
        for i in [0, 2] {
            for l in read_log(&log(i)) {
                if l.message == "fence acquired; engaging"
                    && l.at > killed_at
                    && lost.contains(&l.cluster)
                {
                    taken.entry(l.cluster).or_insert(l.at);
                }
            }
        }
        if taken.len() == lost.len() {
            break taken.into_values().max().unwrap_or(killed_at);
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{} of {} workspaces taken over {:?} after the kill",
            taken.len(),
            lost.len(),
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = taken_at.duration_since(killed_at);
    let took = Duration::try_from(took).expect("a take-over after the kill");
    eprintln!(
        "the killed replica's {} workspaces taken over {:.1} s after the kill (lease {:?}, probe {:?})",
        lost.len(),
        took.as_secs_f64(),
        LEASE,
        PROBE
    );
    assert!(
        took <= bound,
        "take-over took {took:?}; a fence expires one lease duration ({LEASE:?}) after its last renewal was seen, and a survivor looks every {PROBE:?}"
    );

    // The survivors reconcile there: a new Account in every organisation becomes Ready.
    let survivor = replicas[0].kube().await;
    account_in_every_organisation(&survivor, &orgs, "after").await;

    // No workspace was ever reconciled by two replicas at once.
    let end = Timestamp::now();
    let per_replica: Vec<BTreeMap<String, Vec<(Timestamp, Timestamp)>>> = (0..3)
        .map(|i| {
            reconciles(
                &read_log(&log(i)),
                if i == victim { killed_at } else { end },
            )
        })
        .collect();
    let total: usize = per_replica
        .iter()
        .flat_map(|r| r.values())
        .map(Vec::len)
        .sum();
    assert!(total >= 4 * ORGS, "only {total} reconciles logged");
    let mut clusters: BTreeSet<&String> = BTreeSet::new();
    for r in &per_replica {
        clusters.extend(r.keys());
    }
    for cluster in clusters {
        let mut all: Vec<(Timestamp, Timestamp, usize)> = Vec::new();
        for (i, r) in per_replica.iter().enumerate() {
            for (s, e) in r.get(cluster).into_iter().flatten() {
                all.push((*s, *e, i));
            }
        }
        for (k, (s1, e1, i)) in all.iter().enumerate() {
            for (s2, e2, j) in &all[k + 1..] {
                assert!(
                    i == j || e1 <= s2 || e2 <= s1,
                    "{cluster} reconciled by replicas {i} ({s1} to {e1}) and {j} ({s2} to {e2}) at once"
                );
            }
        }
    }
    eprintln!(
        "{total} reconciles over 3 replicas, none at once with another replica's in one workspace"
    );
}
