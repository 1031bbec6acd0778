//! Fault tests of the etcd backend against a real etcd: etcd killed with SIGKILL and restarted
//! while writers and watchers run. Afterwards no acknowledged write is lost and every watch either
//! continued without a gap or duplicate, or ended with `Compacted`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::testing::EtcdProcess;
use crate::storage::{EventType, ListOptions, Revision, StorageError, Store};

fn value(i: usize) -> crate::storage::Encoder {
    Box::new(move |rev| format!("{{\"i\":{i},\"rv\":\"{rev}\"}}").into_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_during_writes_and_watches_loses_nothing_acknowledged() {
    let mut etcd = EtcdProcess::start().await.expect("etcd");
    let store = Arc::new(etcd.store("/faults").await.expect("store"));
    let start = store.current_revision();
    let mut watch = store.watch("/k/", start).await.expect("watch");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            // key → revision of every acknowledged create; failed writes have unknown outcome.
            let mut acked = BTreeMap::new();
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                let key = format!("/k/{i:05}");
                match tokio::time::timeout(Duration::from_secs(2), store.create(&key, value(i)))
                    .await
                {
                    Ok(Ok(kv)) => {
                        assert_eq!(
                            kv.value,
                            format!("{{\"i\":{i},\"rv\":\"{}\"}}", kv.mod_revision)
                        );
                        acked.insert(key, kv.mod_revision);
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
                i += 1;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..2 {
        etcd.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        etcd.restart().await.expect("restart etcd");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Release);
    let acked = writer.await.expect("writer");
    assert!(
        acked.len() > 20,
        "too few writes got through: {}",
        acked.len()
    );

    // Durability: every acknowledged write is there, at its revision.
    let page = store
        .list(ListOptions {
            prefix: "/k/",
            ..Default::default()
        })
        .await
        .expect("list after the faults");
    let stored: BTreeMap<String, Revision> = page
        .items
        .iter()
        .map(|kv| (kv.key.to_string(), kv.mod_revision))
        .collect();
    for (key, rev) in &acked {
        assert_eq!(stored.get(key), Some(rev), "acknowledged write {key} lost");
    }

    // The watch lived through both restarts: every stored create exactly once, in order.
    let mut seen = BTreeMap::new();
    let mut last = start;
    while seen.len() < stored.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .expect("watch stalled after the restarts")
            .expect("watch ended");
        match event {
            Ok(e) => {
                assert!(
                    e.revision > last,
                    "out of order or duplicate: {} after {last}",
                    e.revision
                );
                assert_eq!(e.kind, EventType::Create);
                last = e.revision;
                seen.insert(e.key.to_string(), e.revision);
            }
            Err(StorageError::Compacted { .. }) => panic!("nothing compacted, yet the watch ended"),
            Err(e) => panic!("watch failed: {e}"),
        }
    }
    assert_eq!(seen, stored);
}
