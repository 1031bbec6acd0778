//! Sharded engagement with two replicas: clusters split between them by consistent hashing,
//! never engaged by both, and all taken over by the survivor when one replica stops.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{eventually, TestServer};
use controllers::cluster_providers::FixedClusters;
use controllers::runtime::sharding::{owner_of, Sharded, ShardingConfig};
use controllers::runtime::{Cluster, ClusterEvent, ClusterProvider, ClusterSink};

fn config(identity: &str) -> ShardingConfig {
    ShardingConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        probe_period: Duration::from_millis(100),
        ..ShardingConfig::new("default", identity, "e2e")
    }
}

struct Replica {
    provider: Arc<Sharded<FixedClusters>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn replica(ts: &TestServer, identity: &str, clusters: &[String]) -> Replica {
    let mut fixed = Vec::new();
    for c in clusters {
        fixed.push(Cluster::new(c.as_str(), ts.client("root").await));
    }
    let provider = Arc::new(Sharded::new(
        FixedClusters::new(fixed),
        ts.client("root").await,
        config(identity),
    ));
    let (sink, mut events) = ClusterSink::channel(16);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (p, stop) = (provider.clone(), stop.clone());
        async move {
            let consumer = tokio::spawn(async move {
                // Stands in for the manager: acknowledge disengagement at once.
                while let Some(e) = events.recv().await {
                    if let ClusterEvent::Disengage(_, ack) = e {
                        ack.done();
                    }
                }
            });
            p.run(sink, stop).await.expect("sharded provider");
            consumer.abort();
        }
    });
    Replica {
        provider,
        stop,
        task,
    }
}

fn set(names: Vec<controllers::runtime::ClusterName>) -> BTreeSet<String> {
    names.into_iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn two_replicas_split_clusters_and_the_survivor_takes_over() {
    let ts = TestServer::start().await;
    let clusters: Vec<String> = (0..12).map(|i| format!("root:cluster-{i}")).collect();
    let r1 = replica(&ts, "replica-1", &clusters).await;
    let r2 = replica(&ts, "replica-2", &clusters).await;

    let peers = vec!["replica-1".to_string(), "replica-2".to_string()];
    let expect_1: BTreeSet<String> = clusters
        .iter()
        .filter(|c| owner_of(c, &peers) == Some("replica-1"))
        .cloned()
        .collect();
    let expect_2: BTreeSet<String> = clusters
        .iter()
        .filter(|c| owner_of(c, &peers) == Some("replica-2"))
        .cloned()
        .collect();
    assert!(!expect_1.is_empty() && !expect_2.is_empty());

    let mut overlap_seen = false;
    eventually(Duration::from_secs(15), "clusters split by hashing", || {
        let (a, b) = (set(r1.provider.engaged()), set(r2.provider.engaged()));
        overlap_seen |= !a.is_disjoint(&b);
        let done = a == expect_1 && b == expect_2;
        async move { done }
    })
    .await;

    // Replica 1 stops: it frees its fences, replica 2 takes everything, never overlapping.
    r1.stop.cancel();
    let all: BTreeSet<String> = clusters.iter().cloned().collect();
    eventually(Duration::from_secs(15), "survivor engages all", || {
        let (a, b) = (set(r1.provider.engaged()), set(r2.provider.engaged()));
        overlap_seen |= !a.is_disjoint(&b);
        let done = b == all;
        async move { done }
    })
    .await;
    assert!(
        !overlap_seen,
        "a cluster was engaged by both replicas at once"
    );
    r1.task.await.unwrap();
    assert!(r1.provider.engaged().is_empty());
    assert!(r2.provider.get("root:cluster-0").is_some());
    r2.stop.cancel();
    r2.task.await.unwrap();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_cover_every_cluster_once_and_a_crashed_ones_clusters_are_taken_over() {
    let ts = TestServer::start().await;
    let clusters: Vec<String> = (0..18).map(|i| format!("root:cluster-{i}")).collect();
    let ids = ["replica-1", "replica-2", "replica-3"];
    let mut replicas = Vec::new();
    for id in ids {
        replicas.push(replica(&ts, id, &clusters).await);
    }
    let all: BTreeSet<String> = clusters.iter().cloned().collect();
    let peers: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let expect = |peers: &[String], id: &str| -> BTreeSet<String> {
        clusters
            .iter()
            .filter(|c| owner_of(c, peers) == Some(id))
            .cloned()
            .collect()
    };
    let expected: Vec<BTreeSet<String>> = ids.iter().map(|id| expect(&peers, id)).collect();
    assert!(
        expected.iter().all(|e| !e.is_empty()),
        "every replica owns some of the 18 clusters"
    );

    // Every cluster engaged by exactly one replica: the three shares are disjoint and cover all.
    let mut overlap_seen = false;
    let disjoint = |sets: &[BTreeSet<String>]| {
        sets.iter()
            .enumerate()
            .all(|(i, a)| sets[i + 1..].iter().all(|b| a.is_disjoint(b)))
    };
    eventually(Duration::from_secs(15), "clusters split three ways", || {
        let sets: Vec<_> = replicas.iter().map(|r| set(r.provider.engaged())).collect();
        overlap_seen |= !disjoint(&sets);
        let done = sets == expected;
        async move { done }
    })
    .await;
    let union: BTreeSet<String> = expected.iter().flatten().cloned().collect();
    assert_eq!(union, all, "the three shares cover every cluster");

    // Replica 2 crashes (its task is aborted: no fence is released, its leases just expire).
    let dead = replicas.remove(1);
    dead.task.abort();
    let survivors = vec!["replica-1".to_string(), "replica-3".to_string()];
    let expected_after: Vec<BTreeSet<String>> =
        survivors.iter().map(|id| expect(&survivors, id)).collect();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let sets: Vec<_> = replicas.iter().map(|r| set(r.provider.engaged())).collect();
        overlap_seen |= !disjoint(&sets);
        if sets == expected_after {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the crashed replica's clusters not taken over: engaged {sets:?}, expected {expected_after:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let union: BTreeSet<String> = expected_after.iter().flatten().cloned().collect();
    assert_eq!(union, all, "the survivors cover every cluster");
    assert!(
        !overlap_seen,
        "a cluster was engaged by two replicas at once"
    );
    for r in replicas {
        r.stop.cancel();
        r.task.await.unwrap();
    }
    ts.stop().await;
}
