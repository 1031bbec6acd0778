//! Cross-backend tests beyond the per-backend conformance suite: a differential run of random
//! operations against both backends, and the periodic compactor.

use std::time::Duration;

use futures::StreamExt;

use super::conformance::{
    assert_quiet, bytes, memory_store, opts, redb_store, tagged, take, CAPACITY,
};
use super::{KeyValue, ListOptions, Result, Revision, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactor_keeps_the_last_revisions() {
    let fx = redb_store(CAPACITY).await;
    let s = fx.store.clone();
    for i in 0..10 {
        s.create(&format!("/k/{i}"), bytes("v")).await.unwrap();
    }
    let task = super::spawn_compactor(s.clone(), 3, Duration::from_millis(10));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.compacted_revision() != 7 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "compactor did not run"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    assert_eq!(s.list(opts("/k/")).await.unwrap().items.len(), 10);
}

/// A small deterministic PRNG (xorshift), so the differential test needs no extra dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Pages through a whole list with the given page size, at a fixed revision.
async fn list_all(
    s: &dyn Store,
    prefix: &str,
    at: Revision,
    limit: usize,
) -> Result<Vec<KeyValue>> {
    let mut items = Vec::new();
    let mut start_after: Option<String> = None;
    loop {
        let page = s
            .list(ListOptions {
                prefix,
                start_after: start_after.as_deref(),
                limit,
                revision: Some(at),
            })
            .await?;
        assert_eq!(page.revision, at);
        items.extend(page.items);
        if !page.more {
            return Ok(items);
        }
        start_after = items.last().map(|kv| kv.key.to_string());
    }
}

/// The same random writes and compactions applied to both backends give the same answers to
/// every past list (paginated or not) and every watch replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_memory_vs_redb() {
    let memory = memory_store(CAPACITY).await;
    let redb = redb_store(CAPACITY).await;
    let stores = [&memory.store, &redb.store];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let prefixes = ["/d/a/", "/d/ab/", "/d/b/", "/d/", ""];
    for step in 0..600u64 {
        let key = format!("{}{}", prefixes[rng.below(3) as usize], rng.below(8));
        let current = stores[0].get(&key).await.unwrap();
        let tag = format!("{key}#{step}");
        let mut outcomes = Vec::new();
        for s in stores {
            let outcome = match (&current, rng.0 % 3) {
                (None, _) => s.create(&key, tagged(&tag)).await.map(|kv| kv.mod_revision),
                (Some(kv), 0) => s
                    .delete(&key, kv.mod_revision, tagged(&tag))
                    .await
                    .map(|e| e.revision),
                (Some(kv), 1) => s
                    .update(&key, kv.mod_revision + 1, tagged(&tag))
                    .await
                    .map(|kv| kv.mod_revision),
                (Some(kv), _) => s
                    .update(&key, kv.mod_revision, tagged(&tag))
                    .await
                    .map(|kv| kv.mod_revision),
            };
            outcomes.push(outcome);
        }
        assert_eq!(outcomes[0], outcomes[1], "step {step}");
        if rng.below(50) == 0 {
            let (low, high) = (stores[0].compacted_revision(), stores[0].current_revision());
            let target = low + rng.below(high - low + 1);
            for s in stores {
                s.compact(target).await.unwrap();
            }
        }
    }
    let (low, high) = (stores[0].compacted_revision(), stores[0].current_revision());
    assert_eq!(
        (low, high),
        (stores[1].compacted_revision(), stores[1].current_revision())
    );
    assert!(low > 0, "the run should have compacted");
    for at in low..=high {
        for prefix in prefixes {
            let limit = 1 + rng.below(5) as usize;
            let full = list_all(&**stores[0], prefix, at, 0).await.unwrap();
            assert_eq!(
                list_all(&**stores[1], prefix, at, 0).await.unwrap(),
                full,
                "{prefix}@{at}"
            );
            assert_eq!(
                list_all(&**stores[1], prefix, at, limit).await.unwrap(),
                full,
                "{prefix}@{at}/{limit}"
            );
        }
    }
    for prefix in prefixes {
        for after in [low, low + (high - low) / 2, high] {
            // Count the replayed events of one backend, then compare both replays in full.
            let mut n = 0;
            let mut probe = stores[0].watch(prefix, after).await.unwrap();
            while let Ok(Some(event)) =
                tokio::time::timeout(Duration::from_millis(50), probe.next()).await
            {
                event.unwrap();
                n += 1;
            }
            let mut a = stores[0].watch(prefix, after).await.unwrap();
            let mut b = stores[1].watch(prefix, after).await.unwrap();
            assert_eq!(
                take(&mut a, n).await,
                take(&mut b, n).await,
                "{prefix} after {after}"
            );
            assert_quiet(&mut b).await;
        }
    }
    for at in [low.saturating_sub(1), high + 1] {
        if at == low {
            continue;
        }
        let a = stores[0]
            .list(ListOptions {
                prefix: "",
                revision: Some(at),
                ..Default::default()
            })
            .await;
        let b = stores[1]
            .list(ListOptions {
                prefix: "",
                revision: Some(at),
                ..Default::default()
            })
            .await;
        assert!(a.is_err());
        assert_eq!(a.unwrap_err(), b.unwrap_err());
    }
}
