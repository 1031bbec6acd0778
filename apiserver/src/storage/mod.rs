//! The MVCC key-value store behind every resource: one global, monotonic revision (the
//! `resourceVersion`), compare-and-swap writes, snapshot lists and watches from a revision.
//!
//! Keys are `/<group>/<resource>/<logical-cluster>/<namespace>/<name>` (namespace omitted for
//! cluster-scoped resources), so a wildcard list or watch over all clusters is a prefix scan.
//!
//! Revisions: one global counter; every committed write gets a higher one. The embedded backends
//! start at 0 and step by exactly 1; etcd starts at 1 and steps by 1 only while nothing else
//! writes to it. Revisions are never reused, also across restarts of a durable backend.
//!
//! Backends: [`MemoryStore`] (tests), [`RedbStore`] (durable, embedded, the default) and, with
//! the `etcd` feature, `EtcdStore`. All pass the same conformance suite (`conformance.rs`).
//! [`CachedStore`] puts a watch cache in front of any of them.

use std::ops::Bound;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

pub mod cache;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
pub mod observed;
pub mod redb_store;
mod watch;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod differential;

pub use cache::{CacheOptions, CachedStore, Footprint};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};
pub use memory::MemoryStore;
pub use observed::{ObservedStore, WriteObserver};
pub use redb_store::{RedbOptions, RedbStore};

/// A store revision. Every committed write gets the next one; it is the object's `resourceVersion`.
pub type Revision = u64;

/// Builds the stored bytes of an object once the store knows the revision it will commit at,
/// so the object can carry its own `resourceVersion` without a second encode on every read.
///
/// An encoder must be deterministic: called twice with the same revision it returns the same
/// bytes, and the revision may only appear in its output as its decimal text. Backends that learn
/// the commit revision only after the write (etcd) call it with two sentinel revisions to find
/// where the revision goes, and splice the real one in on every read.
pub type Encoder = Box<dyn FnMut(Revision) -> Vec<u8> + Send>;

/// The bytes a store keeps of an encoder's output: the same allocation when it is exactly as
/// long as its contents, else a copy that is. A store and its watch cache hold these bytes for
/// the object's life, and a buffer grown by doubling can be up to twice as large as what it
/// holds (a 1.3 KiB object in a 2 KiB buffer cost 60 MiB per 100,000 objects).
pub(crate) fn kept(bytes: Vec<u8>) -> Bytes {
    if bytes.capacity() == bytes.len() {
        Bytes::from(bytes)
    } else {
        Bytes::copy_from_slice(&bytes)
    }
}

/// One stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The full key.
    pub key: Arc<str>,
    /// The stored bytes, as produced by the write's [`Encoder`].
    pub value: Bytes,
    /// Revision at which the key was (last) created.
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
}

/// What happened to a key at one revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// The key did not exist before this revision.
    Create,
    /// The key existed and was replaced.
    Update,
    /// The key was removed.
    Delete,
}

/// A committed change, as delivered to watchers (and replayed from history).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventType,
    /// The key it happened to.
    pub key: Arc<str>,
    /// For create/update the new value; for delete the final state given by the delete's encoder.
    pub value: Bytes,
    /// The previous value (none for create). Watchers with selectors need it to turn a change that
    /// stops matching into a DELETED event.
    pub prev_value: Option<Bytes>,
    /// The revision the change was committed at.
    pub revision: Revision,
    /// Work derived from this event once and shared by every watcher that receives it.
    pub memo: Memo,
}

/// What the serving layer derives from an event (its encoded watch frames, the decoded
/// objects), computed by the first watcher that needs it and shared by every clone of the event.
/// Ignored by equality: two events are equal when the changes they describe are.
#[derive(Clone, Default)]
pub struct Memo(Arc<MemoSlots>);

/// How many encoded frames an event can remember.
pub const MEMO_FRAMES: usize = 4;

#[derive(Default)]
struct MemoSlots {
    frames: [OnceLock<Bytes>; MEMO_FRAMES],
    value: OnceLock<Option<Arc<serde_json::Value>>>,
    prev: OnceLock<Option<Arc<serde_json::Value>>>,
}

impl Memo {
    /// Whether the event's object or previous object has been decoded.
    pub fn decoded(&self) -> bool {
        self.0.value.get().is_some_and(Option::is_some)
            || self.0.prev.get().is_some_and(Option::is_some)
    }

    /// Bytes of the frames made so far.
    pub fn frame_bytes(&self) -> usize {
        self.0
            .frames
            .iter()
            .filter_map(|f| f.get())
            .map(Bytes::len)
            .sum()
    }

    /// The frame in `slot`, made by `make` the first time. Slots past [`MEMO_FRAMES`] are not
    /// remembered.
    pub fn frame<E>(
        &self,
        slot: usize,
        make: impl FnOnce() -> Result<Bytes, E>,
    ) -> Result<Bytes, E> {
        let Some(cell) = self.0.frames.get(slot) else {
            return make();
        };
        if let Some(done) = cell.get() {
            return Ok(done.clone());
        }
        let made = make()?;
        Ok(cell.get_or_init(|| made).clone())
    }

    /// The event's value decoded as JSON (`None` if it is not JSON).
    pub fn value(&self, bytes: &Bytes) -> Option<Arc<serde_json::Value>> {
        self.0
            .value
            .get_or_init(|| serde_json::from_slice(bytes).ok().map(Arc::new))
            .clone()
    }

    /// The event's previous value decoded as JSON.
    pub fn prev(&self, bytes: &Bytes) -> Option<Arc<serde_json::Value>> {
        self.0
            .prev
            .get_or_init(|| serde_json::from_slice(bytes).ok().map(Arc::new))
            .clone()
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Memo) -> bool {
        true
    }
}

impl Eq for Memo {}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// A page of a list.
#[derive(Clone, Debug, Default)]
pub struct ListPage {
    /// The items, in key order.
    pub items: Vec<KeyValue>,
    /// The snapshot revision the page was read at: the requested revision, or the store's
    /// current revision for a latest read.
    pub revision: Revision,
    /// Whether more keys follow the last returned one.
    pub more: bool,
}

/// What a list asks for.
#[derive(Clone, Debug, Default)]
pub struct ListOptions<'a> {
    /// Only keys starting with this prefix.
    pub prefix: &'a str,
    /// Only keys strictly greater than this one (continue token).
    pub start_after: Option<&'a str>,
    /// At most this many items; 0 means no limit.
    pub limit: usize,
    /// Read at this past revision; `None` reads the latest state. Fails with `Compacted` below
    /// the compacted revision and with `FutureRevision` above the current one.
    pub revision: Option<Revision>,
}

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// A create found the key present.
    #[error("key {0} already exists")]
    AlreadyExists(String),
    /// An update or delete found the key absent.
    #[error("key {0} not found")]
    NotFound(String),
    /// Compare-and-swap failed: the key's current mod revision differs from the expected one.
    #[error("key {key} was modified: expected revision {expected}, found {actual}")]
    Conflict {
        /// The key that was written.
        key: String,
        /// The mod revision the write expected.
        expected: Revision,
        /// The key's current mod revision.
        actual: Revision,
    },
    /// The requested revision has been compacted away.
    #[error("too old resource version: {requested} ({compacted})")]
    Compacted {
        /// The revision asked for.
        requested: Revision,
        /// The store's compaction revision: history before it is gone.
        compacted: Revision,
    },
    /// The requested revision is newer than anything committed.
    #[error("too large resource version: {requested}, current: {current}")]
    FutureRevision {
        /// The revision asked for.
        requested: Revision,
        /// The newest committed revision.
        current: Revision,
    },
    /// A watcher fell too far behind the events it was sent and was cut off.
    #[error("watch cut off: the client fell further behind the events sent to it than the server allows; watch again from resourceVersion {last}")]
    TooSlow {
        /// The revision of the last event delivered; a new watch resumes after it.
        last: Revision,
    },
    /// An I/O failure, corrupt data, or a closed store.
    #[error("storage backend failure: {0}")]
    Backend(String),
}

/// The result of a storage operation.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// The storage interface. Every backend (memory, redb, later etcd) passes the same conformance suite.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The latest state of one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;
    /// The state of one key as a cache in front of the store last saw it: possibly a little
    /// behind, like an informer's lister (kube-apiserver's admission reads namespaces so). For
    /// checks that tolerate staleness; a key the cache does not hold is read from the store.
    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        self.get(key).await
    }
    /// A consistent page of keys under a prefix, in key order.
    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage>;
    /// Creates a key; fails with `AlreadyExists` if it is present.
    async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue>;
    /// Replaces a key only if its mod revision is `expected`.
    async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue>;
    /// Deletes a key only if its mod revision is `expected`. The encoder gives the final state
    /// that watchers see in the delete event (the object with the deletion revision).
    async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event>;
    /// Events under `prefix` with revision > `after`, then live events, in revision order.
    /// Fails with `Compacted` if `after` is older than the compacted revision.
    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>>;
    /// Forgets history at and below `revision` (the latest state of every key is kept, and so is
    /// the snapshot at `revision` itself). Afterwards lists at and watches after revisions below
    /// `revision` fail with `Compacted`. A revision at or below the compacted one is a no-op; one
    /// above the current revision fails with `FutureRevision`.
    async fn compact(&self, revision: Revision) -> Result<()>;
    /// The latest committed revision this store knows of (on etcd: the latest it has seen).
    fn current_revision(&self) -> Revision;
    /// The latest committed revision, asked of the backend itself (on etcd: a read), so that it
    /// includes every write any replica acknowledged before the call.
    async fn latest_revision(&self) -> Result<Revision> {
        Ok(self.current_revision())
    }
    /// Whether [`Store::latest_revision`] is known in this process, without a round trip: then a
    /// consistent read from a cache in front of the store (wait for the cache to reach that
    /// revision, read memory) costs less than a read of the store itself.
    fn revision_is_local(&self) -> bool {
        true
    }
    /// The oldest revision a watch or a past list may still start from.
    fn compacted_revision(&self) -> Revision;
}

/// Every key under `prefix` at one (the latest) revision, read page by page, with that
/// revision: for the server's own sweeps and indexes, never for a client's list.
pub async fn list_all(store: &dyn Store, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
    let mut out = Vec::new();
    let mut start: Option<String> = None;
    let mut revision = None;
    loop {
        let page = store
            .list(ListOptions {
                prefix,
                start_after: start.as_deref(),
                limit: LIST_ALL_PAGE,
                revision,
            })
            .await?;
        revision = Some(page.revision);
        let more = page.more;
        start = page.items.last().map(|kv| kv.key.to_string());
        out.extend(page.items);
        if !more || start.is_none() {
            return Ok((out, page.revision));
        }
    }
}

/// The logical cluster segment of a storage key (`/<group>/<resource>/<cluster>/...`): the
/// cluster an object was written to, which no client can choose for another workspace.
pub fn key_cluster(key: &str) -> Option<&str> {
    key.split('/').nth(3).filter(|c| !c.is_empty())
}

/// Page size of [`list_all`].
const LIST_ALL_PAGE: usize = 500;

/// Periodically compacts `store` to `current - keep`, every `every`, so that history and the
/// event log stay bounded. The server uses e.g. `keep = 10_000`, `every = 60 s`. Failures are
/// logged and retried at the next tick. Abort the returned handle to stop.
pub fn spawn_compactor(
    store: Arc<dyn Store>,
    keep: u64,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let target = store.current_revision().saturating_sub(keep);
            if target <= store.compacted_revision() {
                continue;
            }
            match store.compact(target).await {
                Ok(()) => tracing::debug!(revision = target, "compacted storage history"),
                Err(err) => {
                    tracing::warn!(revision = target, error = %err, "storage compaction failed")
                }
            }
        }
    })
}

/// The first key a list may return.
pub(crate) fn start_bound<'a>(prefix: &'a str, start_after: Option<&'a str>) -> Bound<&'a str> {
    match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    }
}

/// Validates a past revision a list or watch wants to read at.
pub(crate) fn check_revision(at: Revision, compacted: Revision, current: Revision) -> Result<()> {
    if at < compacted {
        return Err(StorageError::Compacted {
            requested: at,
            compacted,
        });
    }
    if at > current {
        return Err(StorageError::FutureRevision {
            requested: at,
            current,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_bytes_are_no_larger_than_their_contents() {
        let mut grown = Vec::with_capacity(2048);
        grown.extend_from_slice(&[7u8; 1300]);
        let ptr = grown.as_ptr();
        let bytes = kept(grown);
        assert_eq!(&bytes[..], &[7u8; 1300][..]);
        assert_ne!(bytes.as_ptr(), ptr, "a grown buffer is copied");
        let exact = vec![9u8; 1300];
        let ptr = exact.as_ptr();
        assert_eq!(
            kept(exact).as_ptr(),
            ptr,
            "an exact buffer is kept as it is"
        );
    }
}
