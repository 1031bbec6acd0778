//! Sharded engagement with two replicas: clusters split between them by consistent hashing,
//! never engaged by both, and all taken over by the survivor when one replica stops.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{eventually, TestServer};
use crate::providers::FixedClusters;
use crate::runtime::sharding::{owner_of, Sharded, ShardingConfig};
use crate::runtime::{Cluster, ClusterEvent, ClusterProvider, ClusterSink};

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

fn set(names: Vec<crate::runtime::ClusterName>) -> BTreeSet<String> {
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
