//! The storage conformance suite: the same tests, run against every backend.
//!
//! Each test is a generic async fn taking a [`Factory`]; the `conformance!` macro instantiates
//! all of them as `#[tokio::test]`s for one backend.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};

use super::{
    Encoder, Event, EventType, KeyValue, ListOptions, ListPage, MemoryStore, RedbOptions,
    RedbStore, Result, Revision, StorageError, Store,
};

/// A store under test, plus whatever must outlive it (the redb temp dir, the etcd process).
pub(super) struct Fixture {
    pub store: Arc<dyn Store>,
    pub _guard: Option<Box<dyn std::any::Any + Send>>,
}

/// Opens a fresh store with no keys whose event broadcast (if it has one) has the given
/// capacity. Its revision need not start at 0 (etcd starts at 1): tests count from
/// `current_revision()`.
pub(super) type Factory = fn(usize) -> BoxFuture<'static, Fixture>;

pub(super) const CAPACITY: usize = 4096;

pub(super) fn memory_store(capacity: usize) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        Fixture {
            store: Arc::new(MemoryStore::with_event_capacity(capacity)),
            _guard: None,
        }
    })
}

pub(super) fn redb_store(capacity: usize) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = RedbOptions {
            event_capacity: capacity,
            ..RedbOptions::default()
        };
        let store = RedbStore::open_with(&dir.path().join("store.redb"), options).expect("open");
        Fixture {
            store: Arc::new(store),
            _guard: Some(Box::new(dir)),
        }
    })
}

/// A fresh etcd process per test, so revisions are the test's own; keys under a prefix.
#[cfg(feature = "etcd")]
pub(super) fn etcd_store(_capacity: usize) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let etcd = super::etcd::testing::EtcdProcess::start()
            .await
            .expect("start etcd");
        let store = etcd.store("/conformance").await.expect("connect to etcd");
        Fixture {
            store: Arc::new(store),
            _guard: Some(Box::new(etcd)),
        }
    })
}

macro_rules! conformance {
    ($factory:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test($factory).await;
            }
        )*
    };
}

macro_rules! all_tests {
    ($factory:path) => {
        conformance!($factory;
            create_get,
            create_existing_fails,
            update_cas,
            delete_cas_and_event,
            delete_with_changed_final_state,
            revisions_increase_by_one,
            encoder_gets_commit_revision,
            list_prefix_isolation,
            list_pagination,
            list_past_revision,
            list_revision_bounds,
            compaction,
            watch_replays_from_zero,
            watch_from_revision,
            watch_compacted_fails,
            watch_prefix_filter,
            watch_live_under_concurrent_writes,
            watch_lagging_catches_up,
            concurrent_creates,
        );
    };
}

/// Tests of the live-broadcast fallback of the embedded backends (etcd streams every event to
/// every watch, so a watch there cannot lag behind a compaction).
macro_rules! broadcast_tests {
    ($factory:path) => {
        conformance!($factory; watch_lagging_into_compacted_range);
    };
}

mod memory {
    all_tests!(super::memory_store);
    broadcast_tests!(super::memory_store);
}

mod redb {
    all_tests!(super::redb_store);
    broadcast_tests!(super::redb_store);
}

#[cfg(feature = "etcd")]
mod etcd {
    all_tests!(super::etcd_store);
}

/// An encoder producing fixed bytes.
pub(super) fn bytes(s: &str) -> Encoder {
    let s = s.to_string();
    Box::new(move |_| s.clone().into_bytes())
}

/// An encoder embedding the commit revision: `<tag>@<rev>`.
pub(super) fn tagged(tag: &str) -> Encoder {
    let tag = tag.to_string();
    Box::new(move |rev| format!("{tag}@{rev}").into_bytes())
}

pub(super) fn opts(prefix: &str) -> ListOptions<'_> {
    ListOptions {
        prefix,
        ..ListOptions::default()
    }
}

fn keys(page: &ListPage) -> Vec<&str> {
    page.items.iter().map(|kv| &*kv.key).collect()
}

/// The next event of a watch, failing the test after a timeout.
pub(super) async fn next(stream: &mut BoxStream<'static, Result<Event>>) -> Result<Event> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch event timed out")
        .expect("watch ended")
}

pub(super) async fn take(stream: &mut BoxStream<'static, Result<Event>>, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(stream).await.expect("watch error"));
    }
    out
}

/// Asserts that nothing more arrives on a watch for a short while.
pub(super) async fn assert_quiet(stream: &mut BoxStream<'static, Result<Event>>) {
    let extra = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    assert!(extra.is_err(), "unexpected event: {extra:?}");
}

async fn create_get(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let base = s.current_revision();
    assert_eq!(s.get("/a").await, Ok(None));
    let kv = s.create("/a", bytes("one")).await.unwrap();
    assert_eq!(&*kv.key, "/a");
    assert_eq!(kv.value, "one");
    assert_eq!((kv.create_revision, kv.mod_revision), (base + 1, base + 1));
    assert_eq!(s.get("/a").await, Ok(Some(kv)));
    assert_eq!(s.current_revision(), base + 1);
}

async fn create_existing_fails(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let created = s.create("/a", bytes("one")).await.unwrap();
    let err = s.create("/a", bytes("two")).await.unwrap_err();
    assert_eq!(err, StorageError::AlreadyExists("/a".into()));
    assert_eq!(s.get("/a").await.unwrap().unwrap().value, "one");
    assert_eq!(s.current_revision(), created.mod_revision);
}

async fn update_cas(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let created = s.create("/a", bytes("one")).await.unwrap();
    let err = s.update("/a", 99, bytes("x")).await.unwrap_err();
    assert_eq!(
        err,
        StorageError::Conflict {
            key: "/a".into(),
            expected: 99,
            actual: created.mod_revision
        }
    );
    let updated = s
        .update("/a", created.mod_revision, bytes("two"))
        .await
        .unwrap();
    assert_eq!(updated.value, "two");
    assert_eq!(updated.create_revision, created.create_revision);
    assert_eq!(updated.mod_revision, created.mod_revision + 1);
    assert_eq!(s.get("/a").await, Ok(Some(updated.clone())));
    // The old revision no longer matches.
    let err = s.update("/a", created.mod_revision, bytes("x")).await;
    assert!(
        matches!(err, Err(StorageError::Conflict { actual, .. }) if actual == updated.mod_revision)
    );
    let err = s.update("/missing", 1, bytes("x")).await.unwrap_err();
    assert_eq!(err, StorageError::NotFound("/missing".into()));
}

async fn delete_cas_and_event(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let kv = s.create("/a", tagged("one")).await.unwrap();
    let err = s.delete("/a", kv.mod_revision + 5, bytes("gone")).await;
    assert!(matches!(err, Err(StorageError::Conflict { actual, .. }) if actual == kv.mod_revision));
    // The final state is the stored state at the delete's revision.
    let event = s
        .delete("/a", kv.mod_revision, tagged("one"))
        .await
        .unwrap();
    let rev = kv.mod_revision + 1;
    assert_eq!(event.kind, EventType::Delete);
    assert_eq!(&*event.key, "/a");
    assert_eq!(event.revision, rev);
    assert_eq!(event.value, format!("one@{rev}"));
    assert_eq!(event.prev_value, Some(kv.value.clone()));
    assert_eq!(s.get("/a").await, Ok(None));
    let err = s.delete("/a", rev, bytes("x")).await.unwrap_err();
    assert_eq!(err, StorageError::NotFound("/a".into()));
    // Re-creating starts a new lifetime.
    let again = s.create("/a", bytes("two")).await.unwrap();
    assert_eq!(again.create_revision, rev + 1);
    // The watch sees the same delete event.
    let mut w = s.watch("/a", 0).await.unwrap();
    let events = take(&mut w, 3).await;
    assert_eq!(events[1], event);
    assert_eq!(events[2].kind, EventType::Create);
    assert_eq!(events[2].prev_value, None);
}

/// A delete whose final state differs from the stored one (the last finalizer removed): the
/// returned event and every watcher carry that final state. A backend may commit it as an update
/// followed by the delete.
async fn delete_with_changed_final_state(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let kv = s.create("/a", tagged("one")).await.unwrap();
    let mut w = s.watch("/a", kv.mod_revision).await.unwrap();
    let event = s
        .delete("/a", kv.mod_revision, tagged("final"))
        .await
        .unwrap();
    assert_eq!(event.kind, EventType::Delete);
    assert_eq!(event.revision, s.current_revision());
    assert!(event.revision > kv.mod_revision);
    assert_eq!(event.value, format!("final@{}", event.revision));
    assert_eq!(s.get("/a").await, Ok(None));
    let mut seen = next(&mut w).await.unwrap();
    if seen.kind == EventType::Update {
        assert_eq!(seen.value, format!("final@{}", seen.revision));
        seen = next(&mut w).await.unwrap();
    }
    assert_eq!(seen.kind, EventType::Delete);
    assert_eq!((seen.revision, &seen.value), (event.revision, &event.value));
    assert_quiet(&mut w).await;
}

async fn revisions_increase_by_one(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let mut last = s.current_revision();
    let mut expect_next = |rev: Revision| {
        assert_eq!(rev, last + 1);
        last = rev;
    };
    let a = s.create("/a", bytes("1")).await.unwrap();
    expect_next(a.mod_revision);
    let b = s.create("/b", bytes("b")).await.unwrap();
    expect_next(b.mod_revision);
    assert!(s.create("/a", bytes("1")).await.is_err());
    assert!(s.update("/a", 0, bytes("1")).await.is_err());
    let a = s.update("/a", a.mod_revision, bytes("2")).await.unwrap();
    expect_next(a.mod_revision);
    let d = s.delete("/b", b.mod_revision, bytes("b")).await.unwrap();
    expect_next(d.revision);
    assert_eq!(s.current_revision(), d.revision);
    assert_eq!(s.list(opts("/")).await.unwrap().revision, d.revision);
}

async fn encoder_gets_commit_revision(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    s.create("/other", bytes("x")).await.unwrap();
    let kv = s.create("/a", tagged("v")).await.unwrap();
    assert_eq!(kv.value, format!("v@{}", kv.mod_revision));
    let kv = s.update("/a", kv.mod_revision, tagged("w")).await.unwrap();
    assert_eq!(kv.value, format!("w@{}", kv.mod_revision));
    assert_eq!(s.get("/a").await.unwrap().unwrap().value, kv.value);
}

async fn list_prefix_isolation(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    for key in [
        "/g/r/c10/x",
        "/g/r/c1/b",
        "/g/r/c1/a",
        "/g/r/c2/x",
        "/g/r/c1",
        "/g/s/c1/a",
    ] {
        s.create(key, bytes(key)).await.unwrap();
    }
    let page = s.list(opts("/g/r/c1/")).await.unwrap();
    assert_eq!(keys(&page), ["/g/r/c1/a", "/g/r/c1/b"]);
    assert!(!page.more);
    let at = s.current_revision();
    let page = s
        .list(ListOptions {
            revision: Some(at),
            ..opts("/g/r/c1/")
        })
        .await
        .unwrap();
    assert_eq!(keys(&page), ["/g/r/c1/a", "/g/r/c1/b"]);
    assert_eq!(s.list(opts("/g/r/")).await.unwrap().items.len(), 5);
    assert_eq!(s.list(opts("")).await.unwrap().items.len(), 6);
    assert!(s.list(opts("/nothing/")).await.unwrap().items.is_empty());
}

async fn list_pagination(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let mut expected = Vec::new();
    for i in 0..25 {
        let key = format!("/p/r/c/{i:03}");
        s.create(&key, bytes(&key)).await.unwrap();
        expected.push(key);
        s.create(&format!("/q/{i}"), bytes("other")).await.unwrap();
    }
    let all = s.list(opts("/p/")).await.unwrap();
    assert_eq!(keys(&all), expected);
    assert!(!all.more);
    let exact = s
        .list(ListOptions {
            limit: 25,
            ..opts("/p/")
        })
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 25);
    assert!(
        !exact.more,
        "a page that ends exactly at the last key has no more"
    );

    for snapshot in [false, true] {
        let mut seen = Vec::new();
        let mut start_after: Option<String> = None;
        let mut revision = None;
        loop {
            let page = s
                .list(ListOptions {
                    prefix: "/p/",
                    start_after: start_after.as_deref(),
                    limit: 7,
                    revision,
                })
                .await
                .unwrap();
            assert!(page.items.len() <= 7);
            seen.extend(page.items.iter().map(|kv| kv.key.to_string()));
            if snapshot {
                revision = Some(page.revision);
                // Writes between pages must not show up in a snapshot walk.
                s.create(&format!("/p/r/c/{:03}x", seen.len()), bytes("late"))
                    .await
                    .unwrap();
            }
            if !page.more {
                break;
            }
            start_after = page.items.last().map(|kv| kv.key.to_string());
        }
        assert_eq!(seen, expected, "snapshot walk: {snapshot}");
    }
}

async fn list_past_revision(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let a = s.create("/l/a", bytes("a1")).await.unwrap();
    let b = s.create("/l/b", bytes("b1")).await.unwrap();
    s.create("/l/c", bytes("c1")).await.unwrap();
    let at = s.current_revision();
    let before: Vec<KeyValue> = s.list(opts("/l/")).await.unwrap().items;
    s.update("/l/a", a.mod_revision, bytes("a2")).await.unwrap();
    s.delete("/l/b", b.mod_revision, bytes("b1")).await.unwrap();
    s.create("/l/d", bytes("d1")).await.unwrap();
    s.create("/l/0", bytes("01")).await.unwrap();

    let past = s
        .list(ListOptions {
            revision: Some(at),
            ..opts("/l/")
        })
        .await
        .unwrap();
    assert_eq!(past.revision, at);
    assert_eq!(past.items, before);
    let latest = s.list(opts("/l/")).await.unwrap();
    assert_eq!(keys(&latest), ["/l/0", "/l/a", "/l/c", "/l/d"]);
    assert_eq!(latest.items[1].value, "a2");
    assert_eq!(latest.revision, s.current_revision());
    // Paginating a past snapshot.
    let page = s
        .list(ListOptions {
            revision: Some(at),
            limit: 1,
            start_after: Some("/l/a"),
            ..opts("/l/")
        })
        .await
        .unwrap();
    assert_eq!(keys(&page), ["/l/b"]);
    assert!(page.more);
    // Each intermediate snapshot.
    let at_delete = at + 2;
    let page = s
        .list(ListOptions {
            revision: Some(at_delete),
            ..opts("/l/")
        })
        .await
        .unwrap();
    assert_eq!(keys(&page), ["/l/a", "/l/c"]);
    assert_eq!(page.items[0].value, "a2");
}

async fn list_revision_bounds(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let b = s.current_revision();
    let empty = s.list(opts("/")).await.unwrap();
    assert!(empty.items.is_empty());
    assert_eq!(empty.revision, b);
    for i in 0..5 {
        s.create(&format!("/k/{i}"), bytes("v")).await.unwrap();
    }
    let err = s
        .list(ListOptions {
            revision: Some(b + 6),
            ..opts("/")
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::FutureRevision {
            requested: b + 6,
            current: b + 5
        }
    );
    s.compact(b + 3).await.unwrap();
    let err = s
        .list(ListOptions {
            revision: Some(b + 2),
            ..opts("/")
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::Compacted {
            requested: b + 2,
            compacted: b + 3
        }
    );
    let at_compacted = s
        .list(ListOptions {
            revision: Some(b + 3),
            ..opts("/")
        })
        .await
        .unwrap();
    assert_eq!(keys(&at_compacted), ["/k/0", "/k/1", "/k/2"]);
}

async fn compaction(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let r = s.current_revision();
    let a = s.create("/c/a", bytes("a1")).await.unwrap(); // r+1
    let b = s.create("/c/b", bytes("b1")).await.unwrap(); // r+2
    s.update("/c/a", a.mod_revision, bytes("a2")).await.unwrap(); // r+3
    s.delete("/c/b", b.mod_revision, bytes("b1")).await.unwrap(); // r+4
    s.create("/c/c", bytes("c1")).await.unwrap(); // r+5
    let latest = s.list(opts("/c/")).await.unwrap().items;

    s.compact(r + 3).await.unwrap();
    assert_eq!(s.compacted_revision(), r + 3);
    s.compact(r + 1).await.unwrap();
    assert_eq!(
        s.compacted_revision(),
        r + 3,
        "compacting backwards is a no-op"
    );
    let err = s.compact(r + 100).await.unwrap_err();
    assert_eq!(
        err,
        StorageError::FutureRevision {
            requested: r + 100,
            current: r + 5
        }
    );

    assert_eq!(s.list(opts("/c/")).await.unwrap().items, latest);
    let at = |rev| ListOptions {
        revision: Some(rev),
        ..opts("/c/")
    };
    let page = s.list(at(r + 3)).await.unwrap();
    assert_eq!(keys(&page), ["/c/a", "/c/b"]);
    assert_eq!(
        (page.items[0].value.clone(), page.items[1].value.clone()),
        ("a2".into(), "b1".into())
    );
    assert_eq!(keys(&s.list(at(r + 4)).await.unwrap()), ["/c/a"]);

    let mut w = s.watch("/c/", r + 3).await.unwrap();
    let events = take(&mut w, 2).await;
    assert_eq!(events[0].kind, EventType::Delete);
    assert_eq!(events[0].prev_value.as_deref(), Some(&b"b1"[..]));
    assert_eq!(events[0].value, "b1");
    assert_eq!(
        (events[1].revision, events[1].kind),
        (r + 5, EventType::Create)
    );
    drop(w);

    // Compacting everything keeps the latest state, which can still be updated and watched.
    s.compact(r + 5).await.unwrap();
    assert_eq!(s.list(opts("/c/")).await.unwrap().items, latest);
    assert_eq!(keys(&s.list(at(r + 5)).await.unwrap()), ["/c/a", "/c/c"]);
    let mut w = s.watch("/c/", r + 5).await.unwrap();
    let a = s.get("/c/a").await.unwrap().unwrap();
    s.update("/c/a", a.mod_revision, bytes("a3")).await.unwrap();
    let event = next(&mut w).await.unwrap();
    assert_eq!((event.revision, event.kind), (r + 6, EventType::Update));
    assert_eq!(event.prev_value.as_deref(), Some(&b"a2"[..]));
}

async fn watch_replays_from_zero(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let r = s.current_revision();
    let a = s.create("/w/a", bytes("a1")).await.unwrap();
    s.create("/x/a", bytes("x")).await.unwrap();
    s.create("/w/b", bytes("b1")).await.unwrap();
    s.update("/w/a", a.mod_revision, bytes("a2")).await.unwrap();
    let mut w = s.watch("/w/", 0).await.unwrap();
    let events = take(&mut w, 3).await;
    let summary: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.kind,
                &*e.key,
                e.revision,
                e.value.clone(),
                e.prev_value.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (EventType::Create, "/w/a", r + 1, "a1".into(), None),
            (EventType::Create, "/w/b", r + 3, "b1".into(), None),
            (
                EventType::Update,
                "/w/a",
                r + 4,
                "a2".into(),
                Some("a1".into())
            ),
        ]
    );
    assert_quiet(&mut w).await;
    // Then live events.
    s.create("/w/c", bytes("c1")).await.unwrap();
    assert_eq!(next(&mut w).await.unwrap().revision, r + 5);
}

async fn watch_from_revision(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let r = s.current_revision();
    for i in 0..5 {
        s.create(&format!("/w/{i}"), bytes("v")).await.unwrap();
    }
    let mut w = s.watch("/w/", r + 3).await.unwrap();
    let revs: Vec<_> = take(&mut w, 2).await.iter().map(|e| e.revision).collect();
    assert_eq!(revs, [r + 4, r + 5]);
    assert_quiet(&mut w).await;
    // Watching from the current revision yields only later events.
    let mut w = s.watch("/w/", r + 5).await.unwrap();
    assert_quiet(&mut w).await;
    s.create("/w/9", bytes("v")).await.unwrap();
    assert_eq!(next(&mut w).await.unwrap().revision, r + 6);
}

async fn watch_compacted_fails(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let r = s.current_revision();
    for i in 0..5 {
        s.create(&format!("/w/{i}"), bytes("v")).await.unwrap();
    }
    s.compact(r + 4).await.unwrap();
    for after in [0, r + 3] {
        match s.watch("/w/", after).await {
            Err(err) => assert_eq!(
                err,
                StorageError::Compacted {
                    requested: after,
                    compacted: r + 4
                }
            ),
            Ok(_) => panic!("watch from compacted revision {after} succeeded"),
        }
    }
    let mut w = s.watch("/w/", r + 4).await.unwrap();
    assert_eq!(next(&mut w).await.unwrap().revision, r + 5);
}

async fn watch_prefix_filter(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = &fx.store;
    let mut w = s.watch("/g/r/c1/", 0).await.unwrap();
    let mut all = s.watch("", 0).await.unwrap();
    for key in [
        "/g/r/c10/a",
        "/g/r/c1/a",
        "/g/r/c2/a",
        "/g/r/c1",
        "/g/r/c1/b",
    ] {
        s.create(key, bytes("v")).await.unwrap();
    }
    let got: Vec<_> = take(&mut w, 2).await.into_iter().map(|e| e.key).collect();
    assert_eq!(got, [Arc::from("/g/r/c1/a"), Arc::from("/g/r/c1/b")]);
    assert_quiet(&mut w).await;
    assert_eq!(take(&mut all, 5).await.len(), 5);
}

/// Watches opened before and during concurrent writes each see exactly the acknowledged writes
/// under their prefix, in revision order.
async fn watch_live_under_concurrent_writes(f: Factory) {
    const WRITERS: usize = 8;
    const PER_WRITER: usize = 40;
    let fx = f(CAPACITY).await;
    let s = fx.store.clone();
    s.create("/w/seed", bytes("v")).await.unwrap();
    let start = s.current_revision();
    let mut before = s.watch("/w/", start).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..WRITERS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..PER_WRITER {
                let key = format!("/w/{t}/{i}");
                let created = s.create(&key, bytes("v")).await.unwrap();
                let updated = s
                    .update(&key, created.mod_revision, bytes("v2"))
                    .await
                    .unwrap();
                revs.push((created.mod_revision, key.clone()));
                revs.push((updated.mod_revision, key));
                s.create(&format!("/x/{t}/{i}"), bytes("noise"))
                    .await
                    .unwrap();
            }
            revs
        }));
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut during = s.watch("/w/", start).await.unwrap();
    let mut acked = BTreeMap::new();
    for task in tasks {
        acked.extend(task.await.unwrap());
    }
    let n = WRITERS * PER_WRITER * 2;
    for w in [&mut before, &mut during] {
        let events = take(w, n).await;
        let got: BTreeMap<_, _> = events
            .iter()
            .map(|e| (e.revision, e.key.to_string()))
            .collect();
        assert!(events.windows(2).all(|p| p[0].revision < p[1].revision));
        assert_eq!(got, acked);
        assert_quiet(w).await;
    }
}

async fn watch_lagging_catches_up(f: Factory) {
    let fx = f(4).await;
    let s = &fx.store;
    let r = s.current_revision();
    let mut w = s.watch("/w/", 0).await.unwrap();
    s.create("/w/first", bytes("v")).await.unwrap();
    assert_eq!(next(&mut w).await.unwrap().revision, r + 1);
    // Far more events than the broadcast holds, while the watcher is not polled.
    for i in 0..200 {
        s.create(&format!("/w/{i:03}"), tagged("v")).await.unwrap();
        s.create(&format!("/x/{i:03}"), bytes("noise"))
            .await
            .unwrap();
    }
    let events = take(&mut w, 200).await;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(&*e.key, format!("/w/{i:03}"));
        assert_eq!(e.value, format!("v@{}", e.revision));
    }
    assert!(events
        .windows(2)
        .all(|p| p[1].revision == p[0].revision + 2));
    assert_quiet(&mut w).await;
    s.create("/w/last", bytes("v")).await.unwrap();
    assert_eq!(&*next(&mut w).await.unwrap().key, "/w/last");
}

async fn watch_lagging_into_compacted_range(f: Factory) {
    let fx = f(4).await;
    let s = &fx.store;
    let r = s.current_revision();
    let mut w = s.watch("/w/", 0).await.unwrap();
    s.create("/w/first", bytes("v")).await.unwrap();
    assert_eq!(next(&mut w).await.unwrap().revision, r + 1);
    for i in 0..50 {
        s.create(&format!("/w/{i}"), bytes("v")).await.unwrap();
    }
    s.compact(s.current_revision()).await.unwrap();
    let err = next(&mut w).await.unwrap_err();
    assert!(
        matches!(err, StorageError::Compacted { requested, .. } if requested == r + 1),
        "{err:?}"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .unwrap();
    assert!(end.is_none(), "the watch must end after a compacted error");
}

async fn concurrent_creates(f: Factory) {
    let fx = f(CAPACITY).await;
    let s = fx.store.clone();
    s.create("/seed", bytes("v")).await.unwrap();
    let start = s.current_revision();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.create(&format!("/cc/{i}"), tagged("v")).await })
        })
        .collect();
    let mut revs = BTreeSet::new();
    for task in tasks {
        let kv = task.await.unwrap().unwrap();
        assert_eq!(kv.value, format!("v@{}", kv.mod_revision));
        assert!(revs.insert(kv.mod_revision), "duplicate revision");
    }
    assert_eq!(revs, (start + 1..=start + 64).collect());
    assert_eq!(s.current_revision(), start + 64);
    assert_eq!(s.list(opts("/cc/")).await.unwrap().items.len(), 64);
}
