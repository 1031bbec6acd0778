//! The durable [`Store`], on a single redb file (`<data-dir>/store.redb`).
//!
//! - Writes go through one writer thread that batches concurrent requests into a single write
//!   transaction committed with fsync (group commit, see [`writer`]). A write's future resolves
//!   only after its commit returned, so every acknowledged write survives a crash.
//! - Reads use redb read transactions (MVCC snapshots) and never wait for the writer (see
//!   [`read`]). The live versions, the replaced versions and the event log live in separate
//!   tables (see [`codec`]); each live object is stored once.
//! - The current and compacted revisions are stored in the same transaction as the data, so
//!   after a crash and reopen the revision counter continues above the last committed revision.
//!
//! An empty store has current revision 0; the first write gets revision 1.
//!
//! # Measuring write throughput
//!
//! Group commit only pays off with concurrent writers: `platform-mesh bench` measures durable
//! creates per second through the whole server with 64 concurrent clients (release build);
//! [`RedbStore::commits`] gives the number of transactions, hence the average batch size.

mod codec;
mod read;
#[cfg(test)]
mod tests;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use futures::stream::BoxStream;
use redb::{Builder, Database, ReadableTable};
use tokio::sync::{broadcast, oneshot};

use self::codec::{
    backend, CURRENT, FORMAT_VERSION, HISTORY, LOG, META, META_COMPACTED, META_FORMAT,
    META_REVISION,
};
use self::writer::{Op, Writer};
use super::watch::{self, DEFAULT_EVENT_CAPACITY};
use super::{
    Encoder, Event, KeyValue, ListOptions, ListPage, Result, Revision, StorageError, Store,
};

/// Tuning knobs of [`RedbStore`].
#[derive(Clone, Debug)]
pub struct RedbOptions {
    /// Size of redb's page cache in bytes.
    pub cache_size: usize,
    /// Capacity of the live event broadcast; lagging watchers catch up from the log.
    pub event_capacity: usize,
    /// The most write requests committed in one transaction.
    pub max_batch: usize,
    /// redb quick-repair: every commit also saves the allocator state (and commits in two
    /// phases), so reopening after a crash is almost instant instead of a full walk of the file.
    /// Costs some write throughput.
    pub quick_repair: bool,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            cache_size: 32 * 1024 * 1024,
            event_capacity: DEFAULT_EVENT_CAPACITY,
            max_batch: 1024,
            quick_repair: true,
        }
    }
}

/// The durable redb-backed store. Dropping it stops the writer thread (after its current batch)
/// and closes the file; open watch streams then end.
pub struct RedbStore {
    db: Arc<Database>,
    requests: Option<mpsc::Sender<Op>>,
    events: broadcast::Sender<Event>,
    revision: Arc<AtomicU64>,
    compacted: Arc<AtomicU64>,
    commits: Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
}

impl RedbStore {
    /// Opens (or creates, with its parent directories) the store file at `path` with default
    /// options.
    pub fn open(path: &Path) -> Result<RedbStore> {
        Self::open_with(path, RedbOptions::default())
    }

    /// Opens (or creates, with its parent directories) the store file at `path`.
    pub fn open_with(path: &Path, options: RedbOptions) -> Result<RedbStore> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(backend)?;
        }
        let db = Builder::new()
            .set_cache_size(options.cache_size)
            .create(path)
            .map_err(backend)?;
        let (revision, compacted) = init(&db, options.quick_repair)?;
        let db = Arc::new(db);
        let (events, _) = broadcast::channel(options.event_capacity.max(1));
        let (requests, receiver) = mpsc::channel();
        let revision = Arc::new(AtomicU64::new(revision));
        let compacted = Arc::new(AtomicU64::new(compacted));
        let commits = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            db: db.clone(),
            requests: receiver,
            events: events.clone(),
            revision: revision.clone(),
            compacted: compacted.clone(),
            commits: commits.clone(),
            max_batch: options.max_batch.max(1),
            quick_repair: options.quick_repair,
            compactions: Vec::new(),
        };
        let writer = std::thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || writer.run())
            .map_err(backend)?;
        Ok(RedbStore {
            db,
            requests: Some(requests),
            events,
            revision,
            compacted,
            commits,
            writer: Some(writer),
        })
    }

    /// How many write transactions (each a batch of one or more writes) this handle committed
    /// since it was opened. Writes divided by commits is the average group-commit batch size.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Sends a request to the writer thread and waits for its answer.
    async fn submit<T>(&self, op: Op, reply: oneshot::Receiver<Result<T>>) -> Result<T> {
        let closed = || StorageError::Backend("write not committed: store closed".into());
        self.requests
            .as_ref()
            .ok_or_else(closed)?
            .send(op)
            .map_err(|_| closed())?;
        reply.await.map_err(|_| closed())?
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        // Closing the channel stops the writer after the requests already queued.
        drop(self.requests.take());
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!("redb writer thread panicked");
            }
        }
    }
}

/// Creates the tables if needed and returns the persisted (revision, compacted revision).
fn init(db: &Database, quick_repair: bool) -> Result<(Revision, Revision)> {
    let mut txn = db.begin_write().map_err(backend)?;
    txn.set_quick_repair(quick_repair);
    let (revision, compacted) = {
        txn.open_table(CURRENT).map_err(backend)?;
        txn.open_table(HISTORY).map_err(backend)?;
        let log = txn.open_table(LOG).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        let format = read::meta_get(&meta, META_FORMAT)?;
        match format {
            0 => {
                meta.insert(META_FORMAT, FORMAT_VERSION).map_err(backend)?;
            }
            FORMAT_VERSION => {}
            other => {
                return Err(StorageError::Backend(format!(
                    "unsupported store format {other} (expected {FORMAT_VERSION})"
                )));
            }
        }
        let last_logged = match log.last().map_err(backend)? {
            Some((rev, _)) => rev.value(),
            None => 0,
        };
        let revision = read::meta_get(&meta, META_REVISION)?;
        if last_logged > revision {
            return Err(StorageError::Backend(format!(
                "store is inconsistent: log reaches revision {last_logged}, meta says {revision}"
            )));
        }
        (revision, read::meta_get(&meta, META_COMPACTED)?)
    };
    txn.commit().map_err(backend)?;
    Ok((revision, compacted))
}

#[async_trait::async_trait]
impl Store for RedbStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        // A point lookup is short enough to run inline.
        read::get(&self.db, key)
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
        let req = read::ListRequest {
            prefix: opts.prefix.to_string(),
            start_after: opts.start_after.map(str::to_string),
            limit: opts.limit,
            revision: opts.revision,
        };
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || read::list(&db, &req))
            .await
            .map_err(backend)?
    }

    async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue> {
        let (reply, rx) = oneshot::channel();
        let key = key.to_string();
        self.submit(Op::Create { key, encode, reply }, rx).await
    }

    async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue> {
        let (reply, rx) = oneshot::channel();
        let key = key.to_string();
        let op = Op::Update {
            key,
            expected,
            encode,
            reply,
        };
        self.submit(op, rx).await
    }

    async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event> {
        let (reply, rx) = oneshot::channel();
        let key = key.to_string();
        let op = Op::Delete {
            key,
            expected,
            encode,
            reply,
        };
        self.submit(op, rx).await
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        // Subscribe first: every event committed after the log reads is then in `rx`.
        let rx = self.events.subscribe();
        let compacted = self.compacted.load(Ordering::Acquire);
        if after < compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted,
            });
        }
        let log = Arc::new(read::LogReader {
            db: Arc::downgrade(&self.db),
        });
        Ok(watch::watch_stream(log, rx, prefix, after))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.submit(Op::Compact { revision, reply }, rx).await
    }

    fn current_revision(&self) -> Revision {
        self.revision.load(Ordering::Acquire)
    }

    fn compacted_revision(&self) -> Revision {
        self.compacted.load(Ordering::Acquire)
    }
}
