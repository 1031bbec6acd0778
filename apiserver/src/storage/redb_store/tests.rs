//! redb-only tests: durability across reopen and `kill -9`, group commit, corrupt data.
//! Throughput is a benchmark, not a test: `platform-mesh bench` measures durable creates.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use futures::StreamExt;
use redb::Database;

use super::codec::{CURRENT, HISTORY, LOG};
use super::RedbStore;
use crate::storage::conformance::{bytes, next, tagged};
use crate::storage::{EventType, ListOptions, Revision, StorageError, Store};

fn kib(rev: Revision) -> Vec<u8> {
    let mut value = format!("{rev:020}").into_bytes();
    value.resize(1024, b'.');
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_data_and_revision() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open(&path).unwrap();
    let a = store.create("/r/a", bytes("a1")).await.unwrap();
    let b = store.create("/r/b", bytes("b1")).await.unwrap();
    store
        .update("/r/a", a.mod_revision, bytes("a2"))
        .await
        .unwrap();
    store
        .delete("/r/b", b.mod_revision, bytes("b-final"))
        .await
        .unwrap();
    store.create("/r/c", bytes("c1")).await.unwrap();
    store.compact(2).await.unwrap();
    let before = store
        .list(ListOptions {
            prefix: "/r/",
            ..Default::default()
        })
        .await
        .unwrap();
    drop(store);

    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.current_revision(), 5);
    assert_eq!(store.compacted_revision(), 2);
    let after = store
        .list(ListOptions {
            prefix: "/r/",
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(after.items, before.items);
    assert_eq!(after.revision, 5);
    let past = store
        .list(ListOptions {
            prefix: "/r/",
            revision: Some(3),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(past.items.len(), 2);
    // The history survives: replay after the compacted revision.
    let mut w = store.watch("/r/", 2).await.unwrap();
    let kinds: Vec<_> = [next(&mut w).await, next(&mut w).await, next(&mut w).await]
        .into_iter()
        .map(|e| e.map(|e| (e.revision, e.kind)))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        kinds,
        [
            (3, EventType::Update),
            (4, EventType::Delete),
            (5, EventType::Create)
        ]
    );
    // The counter continues.
    let d = store.create("/r/d", tagged("d")).await.unwrap();
    assert_eq!(d.mod_revision, 6);
    assert_eq!(d.value, "d@6");
    assert_eq!(next(&mut w).await.unwrap().revision, 6);
    drop(w);
    drop(store);
    assert_eq!(RedbStore::open(&path).unwrap().current_revision(), 6);
}

/// Group commit: 64 concurrent writers share transactions. Not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_batches_concurrent_writes() {
    const WRITERS: usize = 64;
    const PER_WRITER: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("store.redb")).unwrap());
    let tasks: Vec<_> = (0..WRITERS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let kv = store
                        .create(&format!("/gc/{t}/{i}"), Box::new(kib))
                        .await
                        .unwrap();
                    assert_eq!(kv.value, kib(kv.mod_revision));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let writes = (WRITERS * PER_WRITER) as u64;
    assert_eq!(store.current_revision(), writes);
    assert!(
        store.commits() < writes,
        "{} commits for {writes} writes",
        store.commits()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoder_panic_fails_only_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("store.redb")).unwrap();
    let err = store
        .create("/p/a", Box::new(|_| panic!("encoder bug")))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Backend(_)));
    let kv = store.create("/p/b", bytes("ok")).await.unwrap();
    assert_eq!(kv.mod_revision, 1);
    assert_eq!(store.get("/p/a").await, Ok(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_data_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open(&path).unwrap();
    store.create("/c/a", bytes("a")).await.unwrap();
    drop(store);
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            txn.open_table(CURRENT)
                .unwrap()
                .insert("/c/bad", &[1u8, 2, 3][..])
                .unwrap();
            txn.open_table(HISTORY)
                .unwrap()
                .insert(("/c/a", 1), &[7u8][..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let store = RedbStore::open(&path).unwrap();
    assert!(matches!(
        store.get("/c/bad").await,
        Err(StorageError::Backend(_))
    ));
    let list = store
        .list(ListOptions {
            prefix: "/c/",
            ..Default::default()
        })
        .await;
    assert!(matches!(list, Err(StorageError::Backend(_))));
    let past = store.list(ListOptions {
        prefix: "/c/",
        revision: Some(1),
        ..Default::default()
    });
    assert!(matches!(past.await, Err(StorageError::Backend(_))));
    let mut w = store.watch("/c/", 0).await.unwrap();
    assert!(matches!(next(&mut w).await, Err(StorageError::Backend(_))));
    assert!(w.next().await.is_none());
    // Writes to the corrupt key fail alone; others proceed.
    assert!(matches!(
        store.update("/c/bad", 1, bytes("x")).await,
        Err(StorageError::Backend(_))
    ));
    assert_eq!(
        store.create("/c/b", bytes("b")).await.unwrap().mod_revision,
        2
    );
    drop(w);
    drop(store);

    // A log beyond the recorded revision means the file is inconsistent: refuse to open.
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(LOG)
            .unwrap()
            .insert(99, &[0u8, b'x'][..])
            .unwrap();
        txn.commit().unwrap();
    }
    assert!(matches!(
        RedbStore::open(&path),
        Err(StorageError::Backend(_))
    ));
}

const CRASH_DIR_ENV: &str = "PLATFORM_MESH_STORAGE_CRASH_DIR";

/// Helper for [`kill_9_keeps_acknowledged_writes`]: when run as its child process, writes
/// forever from 16 tasks and prints every acknowledged write. Otherwise does nothing.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CRASH_DIR_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let store =
            Arc::new(RedbStore::open(&std::path::Path::new(&dir).join("store.redb")).unwrap());
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let key = format!("/crash/{t}/{i}");
                        let kv = store.create(&key, Box::new(kib)).await.unwrap();
                        println!("acked {} {key}", kv.mod_revision);
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_keeps_acknowledged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "storage::redb_store::tests::crash_child",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(CRASH_DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let mut parts = line.split(' ');
        if parts.next() != Some("acked") {
            continue;
        }
        let rev: Revision = parts.next().unwrap().parse().unwrap();
        acked.push((rev, parts.next().unwrap().to_string()));
        if acked.len() == 300 {
            break;
        }
    }
    // SIGKILL, in the middle of writing.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(acked.len(), 300, "child stopped early");

    let store = RedbStore::open(&dir.path().join("store.redb")).unwrap();
    let current = store.current_revision();
    let max_acked = acked.iter().map(|(rev, _)| *rev).max().unwrap();
    assert!(
        current >= max_acked,
        "lost acknowledged writes: {current} < {max_acked}"
    );
    for (rev, key) in &acked {
        let kv = store
            .get(key)
            .await
            .unwrap()
            .expect("acknowledged write lost");
        assert_eq!(kv.mod_revision, *rev);
        assert_eq!(kv.value, kib(*rev));
    }
    // Nothing half-written: exactly one complete object and one event per revision.
    let all = store
        .list(ListOptions {
            prefix: "/crash/",
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.items.len() as u64, current);
    assert!(all.items.iter().all(|kv| kv.value == kib(kv.mod_revision)));
    let mut w = store.watch("/crash/", 0).await.unwrap();
    for rev in 1..=current {
        assert_eq!(next(&mut w).await.unwrap().revision, rev);
    }
    // The counter continues above the last committed revision.
    assert_eq!(
        store
            .create("/after", bytes("x"))
            .await
            .unwrap()
            .mod_revision,
        current + 1
    );
}

/// Compaction really removes replaced versions, deletions and log entries from the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_shrinks_history_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open(&path).unwrap();
    let mut a = store.create("/k/a", bytes("a")).await.unwrap();
    for _ in 0..10 {
        a = store
            .update("/k/a", a.mod_revision, bytes("a"))
            .await
            .unwrap();
    }
    let b = store.create("/k/b", bytes("b")).await.unwrap();
    store
        .delete("/k/b", b.mod_revision, bytes("b"))
        .await
        .unwrap();
    let c = store.create("/k/c", bytes("c")).await.unwrap();
    store
        .update("/k/c", c.mod_revision, bytes("c2"))
        .await
        .unwrap();
    let counts = |path: &std::path::Path| {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        let db = Database::create(path).unwrap();
        let txn = db.begin_read().unwrap();
        let history = txn.open_table(HISTORY).unwrap().len().unwrap();
        let log = txn.open_table(LOG).unwrap().len().unwrap();
        (history, log)
    };
    // Compact up to c's create: only c's replaced version (needed at revision 15) remains.
    store.compact(c.mod_revision).await.unwrap();
    drop(store);
    assert_eq!(counts(&path), (1, 1));
    let store = RedbStore::open(&path).unwrap();
    store.compact(store.current_revision()).await.unwrap();
    let latest = store
        .list(ListOptions {
            prefix: "/k/",
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(latest.items.len(), 2);
    drop(store);
    assert_eq!(counts(&path), (0, 0));
}
