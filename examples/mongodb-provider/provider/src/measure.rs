//! `measure`: how long a consumer waits for its database. In the workspace a kubeconfig's
//! current context names, it creates `count` MongoDBCommunity objects at once, watches them, and
//! takes for each the time from its create's answer to the first event showing it `Running`;
//! then it prints the median and the 99th percentile and deletes the objects, waiting until the
//! provider has let them go. Whichever provider controller runs (Rust or Go) is what is
//! measured; the operator stand-in's 200 ms of deploying is part of every figure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::model::api_resource;

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A request to the consumer's workspace failed.
    #[error("{what}: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// The client error.
        source: kube::Error,
    },
    /// Not every object was Running in time.
    #[error("{running} of {count} objects Running after {} s", .waited.as_secs())]
    TimedOut {
        /// How many were.
        running: usize,
        /// How many were created.
        count: usize,
        /// How long it waited.
        waited: Duration,
    },
}

/// The `p`-th percentile (0..=100) of sorted `values`, nearest rank.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// Creates `count` objects in namespace `default`, measures each until Running, prints the
/// figures, and removes them.
pub async fn run(client: kube::Client, count: usize) -> Result<(), MeasureError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &api_resource());
    let name = |i: usize| format!("measure-{i:04}");
    let mut events = watcher(
        api.clone(),
        watcher::Config::default().labels("mongodb.platform-mesh.io/measure=true"),
    )
    .boxed();
    // The watch is running before the first create.
    let mut created: HashMap<String, Instant> = HashMap::new();
    let mut waits: HashMap<String, Duration> = HashMap::new();
    let init = tokio::time::timeout(Duration::from_secs(30), events.next()).await;
    if !matches!(init, Ok(Some(Ok(_)))) {
        return Err(MeasureError::TimedOut {
            running: 0,
            count,
            waited: Duration::from_secs(30),
        });
    }
    for i in 0..count {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "mongodbcommunity.mongodb.com/v1", "kind": "MongoDBCommunity",
            "metadata": {"name": name(i), "labels": {"mongodb.platform-mesh.io/measure": "true"}},
            "spec": {"members": 3, "type": "ReplicaSet", "version": "6.0.5"},
        }))
        .expect("a valid object");
        api.create(&PostParams::default(), &obj)
            .await
            .map_err(|source| MeasureError::Request {
                what: format!("creating {}", name(i)),
                source,
            })?;
        created.insert(name(i), Instant::now());
    }
    let limit = Duration::from_secs(60) + Duration::from_millis(100) * count as u32;
    let started = Instant::now();
    while waits.len() < count {
        let left = limit.saturating_sub(started.elapsed());
        let Ok(Some(event)) = tokio::time::timeout(left, events.next()).await else {
            return Err(MeasureError::TimedOut {
                running: waits.len(),
                count,
                waited: limit,
            });
        };
        let objects = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
            _ => continue,
        };
        for o in objects {
            let n = o.metadata.name.clone().unwrap_or_default();
            if o.data["status"]["phase"] == "Running" && !waits.contains_key(&n) {
                if let Some(at) = created.get(&n) {
                    waits.insert(n, at.elapsed());
                }
            }
        }
    }
    let mut sorted: Vec<Duration> = waits.into_values().collect();
    sorted.sort();
    println!(
        "{count} objects created at once: create to Running p50 {} ms, p99 {} ms",
        percentile(&sorted, 50).as_millis(),
        percentile(&sorted, 99).as_millis()
    );
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("mongodb.platform-mesh.io/measure=true"),
    )
    .await
    .map_err(|source| MeasureError::Request {
        what: "deleting the measured objects".into(),
        source,
    })?;
    let started = Instant::now();
    loop {
        let left = api
            .list(&ListParams::default().labels("mongodb.platform-mesh.io/measure=true"))
            .await
            .map_err(|source| MeasureError::Request {
                what: "listing the measured objects".into(),
                source,
            })?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(MeasureError::TimedOut {
                running: left,
                count,
                waited: limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let ms =
            |v: &[u64]| -> Vec<Duration> { v.iter().map(|m| Duration::from_millis(*m)).collect() };
        let values = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&values, 50), Duration::from_millis(50));
        assert_eq!(percentile(&values, 99), Duration::from_millis(99));
        assert_eq!(percentile(&ms(&[7]), 99), Duration::from_millis(7));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
