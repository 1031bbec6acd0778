//! A store that reports every write it commits, so in-memory indexes derived from stored objects
//! (the RBAC policies of each workspace) are invalidated before the write is acknowledged and a
//! client's next request sees its own change. Writes of other replicas reach those indexes
//! through a watch instead.

use std::sync::Arc;

use futures::stream::BoxStream;

use super::{Encoder, Event, KeyValue, ListOptions, ListPage, Result, Revision, Store};

/// Called with the key and revision of every committed create, update and delete.
pub type WriteObserver = Arc<dyn Fn(&str, Revision) + Send + Sync>;

/// `inner`, with every committed write reported to an observer.
pub struct ObservedStore {
    inner: Arc<dyn Store>,
    observer: WriteObserver,
}

impl ObservedStore {
    /// Wraps `inner`; `observer` runs after each successful write, before it returns.
    pub fn new(inner: Arc<dyn Store>, observer: WriteObserver) -> Self {
        ObservedStore { inner, observer }
    }
}

#[async_trait::async_trait]
impl Store for ObservedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get(key).await
    }

    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get_cached(key).await
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
        self.inner.list(opts).await
    }

    async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue> {
        let kv = self.inner.create(key, encode).await?;
        (self.observer)(key, kv.mod_revision);
        Ok(kv)
    }

    async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue> {
        let kv = self.inner.update(key, expected, encode).await?;
        (self.observer)(key, kv.mod_revision);
        Ok(kv)
    }

    async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event> {
        let event = self.inner.delete(key, expected, encode).await?;
        (self.observer)(key, event.revision);
        Ok(event)
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        self.inner.watch(prefix, after).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    fn current_revision(&self) -> Revision {
        self.inner.current_revision()
    }

    async fn latest_revision(&self) -> Result<Revision> {
        self.inner.latest_revision().await
    }

    fn revision_is_local(&self) -> bool {
        self.inner.revision_is_local()
    }

    fn compacted_revision(&self) -> Revision {
        self.inner.compacted_revision()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::storage::MemoryStore;

    #[tokio::test]
    async fn every_committed_write_is_reported_and_failed_ones_are_not() {
        let seen: Arc<Mutex<Vec<(String, Revision)>>> = Arc::default();
        let record = seen.clone();
        let store = ObservedStore::new(
            Arc::new(MemoryStore::new()),
            Arc::new(move |k: &str, r| record.lock().unwrap().push((k.to_string(), r))),
        );
        let enc = |s: &'static str| -> Encoder { Box::new(move |_| s.as_bytes().to_vec()) };
        let a = store.create("/a", enc("1")).await.unwrap();
        assert!(store.create("/a", enc("2")).await.is_err());
        let b = store.update("/a", a.mod_revision, enc("3")).await.unwrap();
        assert!(store.update("/a", a.mod_revision, enc("4")).await.is_err());
        let d = store.delete("/a", b.mod_revision, enc("5")).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                ("/a".to_string(), a.mod_revision),
                ("/a".to_string(), b.mod_revision),
                ("/a".to_string(), d.revision),
            ]
        );
    }
}
