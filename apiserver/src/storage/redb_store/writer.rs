//! The single writer thread of the redb backend, which implements group commit.
//!
//! Writers send [`Op`]s over a channel and await a oneshot reply. The thread blocks for the first
//! request, drains whatever else is queued (up to the batch limit), applies the whole batch in
//! one redb write transaction, each successful write at the next consecutive revision (a failed
//! compare-and-swap fails only its own request), commits once with `Durability::Immediate`
//! (fsync), and only then publishes the events in revision order and answers the requests. While
//! one batch is being fsynced the next one queues up, so throughput grows with concurrency.
//!
//! Compaction runs on the same thread, in chunks of bounded size between write batches, so it
//! never holds up writers for long.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use bytes::Bytes;
use redb::{Database, Durability, ReadableTable, Table};
use tokio::sync::{broadcast, oneshot};

use super::codec::{
    backend, decode_current, decode_log, encode_current, encode_history, encode_log, CURRENT,
    HISTORY, LOG, META, META_COMPACTED, META_REVISION, TAG_DELETED, TAG_VALUE,
};
use crate::storage::{kept, Encoder, Event, EventType, KeyValue, Result, Revision, StorageError};

/// How many log entries one compaction transaction removes at most.
const COMPACT_CHUNK: u64 = 4096;

/// A request to the writer thread.
pub(super) enum Op {
    Create {
        key: String,
        encode: Encoder,
        reply: oneshot::Sender<Result<KeyValue>>,
    },
    Update {
        key: String,
        expected: Revision,
        encode: Encoder,
        reply: oneshot::Sender<Result<KeyValue>>,
    },
    Delete {
        key: String,
        expected: Revision,
        encode: Encoder,
        reply: oneshot::Sender<Result<Event>>,
    },
    Compact {
        revision: Revision,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// Where the answer of one write of a batch goes.
enum Reply {
    KeyValue(oneshot::Sender<Result<KeyValue>>),
    Event(oneshot::Sender<Result<Event>>),
}

impl Reply {
    /// Answers with the outcome of the write: the event and the key's create revision.
    fn send(self, outcome: Result<(Event, Revision)>) {
        // A caller that gave up waiting is not an error: the write stands.
        match self {
            Reply::KeyValue(tx) => {
                let _ = tx.send(outcome.map(|(event, create_revision)| KeyValue {
                    key: event.key,
                    value: event.value,
                    create_revision,
                    mod_revision: event.revision,
                }));
            }
            Reply::Event(tx) => {
                let _ = tx.send(outcome.map(|(event, _)| event));
            }
        }
    }
}

/// The tables a write batch modifies.
struct Tables<'t> {
    current: Table<'t, &'static str, &'static [u8]>,
    history: Table<'t, (&'static str, u64), &'static [u8]>,
    log: Table<'t, u64, &'static [u8]>,
}

/// The writer thread's state.
pub(super) struct Writer {
    pub db: Arc<Database>,
    pub requests: Receiver<Op>,
    pub events: broadcast::Sender<Event>,
    /// Shared with the store handle: the latest committed revision.
    pub revision: Arc<AtomicU64>,
    /// Shared with the store handle: the compacted revision.
    pub compacted: Arc<AtomicU64>,
    /// Shared with the store handle: how many write batches were committed.
    pub commits: Arc<AtomicU64>,
    pub max_batch: usize,
    /// Whether commits use redb quick-repair.
    pub quick_repair: bool,
    /// Compactions waiting to reach their target revision.
    pub compactions: Vec<(Revision, oneshot::Sender<Result<()>>)>,
}

impl Writer {
    /// Runs until every sender of the request channel is gone.
    pub fn run(mut self) {
        loop {
            let first = if self.compactions.is_empty() {
                match self.requests.recv() {
                    Ok(op) => op,
                    Err(_) => return,
                }
            } else {
                match self.requests.try_recv() {
                    Ok(op) => op,
                    Err(TryRecvError::Empty) => {
                        self.compact_step();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            let mut batch = Vec::with_capacity(self.max_batch.min(64));
            self.push(first, &mut batch);
            while batch.len() < self.max_batch {
                match self.requests.try_recv() {
                    Ok(op) => self.push(op, &mut batch),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit_batch(batch);
            }
            if !self.compactions.is_empty() {
                self.compact_step();
            }
        }
    }

    /// Queues a write into the batch, or registers a compaction.
    fn push(&mut self, op: Op, batch: &mut Vec<Op>) {
        match op {
            Op::Compact { revision, reply } => {
                let current = self.revision.load(Ordering::Acquire);
                if revision > current {
                    let _ = reply.send(Err(StorageError::FutureRevision {
                        requested: revision,
                        current,
                    }));
                } else if revision <= self.compacted.load(Ordering::Acquire) {
                    let _ = reply.send(Ok(()));
                } else {
                    self.compactions.push((revision, reply));
                }
            }
            write => batch.push(write),
        }
    }

    /// Applies a batch of writes in one transaction, commits it durably, publishes and answers.
    fn commit_batch(&mut self, batch: Vec<Op>) {
        let mut replies = Vec::with_capacity(batch.len());
        let mut outcomes = Vec::with_capacity(batch.len());
        let start = self.revision.load(Ordering::Acquire);
        let applied = self.apply(start, batch, &mut replies, &mut outcomes);
        let committed = match applied {
            Ok(revision) => revision,
            Err(err) => {
                tracing::error!(error = %err, "storage write batch failed");
                for reply in replies {
                    reply.send(Err(err.clone()));
                }
                return;
            }
        };
        self.revision.store(committed, Ordering::Release);
        if committed != start {
            self.commits.fetch_add(1, Ordering::Relaxed);
        }
        for (event, _) in outcomes.iter().flatten() {
            // No receivers is fine.
            let _ = self.events.send(event.clone());
        }
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            reply.send(outcome);
        }
    }

    /// Runs the batch in one write transaction and commits it. Returns the new revision; an
    /// error means nothing of the batch was committed.
    fn apply(
        &self,
        start: Revision,
        batch: Vec<Op>,
        replies: &mut Vec<Reply>,
        outcomes: &mut Vec<Result<(Event, Revision)>>,
    ) -> Result<Revision> {
        let mut txn = self.db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        txn.set_quick_repair(self.quick_repair);
        let mut revision = start;
        {
            let mut tables = Tables {
                current: txn.open_table(CURRENT).map_err(backend)?,
                history: txn.open_table(HISTORY).map_err(backend)?,
                log: txn.open_table(LOG).map_err(backend)?,
            };
            for op in batch {
                let (kind, key, expected, encode, reply) = match op {
                    Op::Create { key, encode, reply } => {
                        (EventType::Create, key, 0, encode, Reply::KeyValue(reply))
                    }
                    Op::Update {
                        key,
                        expected,
                        encode,
                        reply,
                    } => (
                        EventType::Update,
                        key,
                        expected,
                        encode,
                        Reply::KeyValue(reply),
                    ),
                    Op::Delete {
                        key,
                        expected,
                        encode,
                        reply,
                    } => (
                        EventType::Delete,
                        key,
                        expected,
                        encode,
                        Reply::Event(reply),
                    ),
                    Op::Compact { .. } => continue,
                };
                replies.push(reply);
                let outcome = write_one(&mut tables, revision + 1, kind, &key, expected, encode)?;
                if outcome.is_ok() {
                    revision += 1;
                }
                outcomes.push(outcome);
            }
        }
        if revision == start {
            // Every request failed its check: nothing to commit.
            txn.abort().map_err(backend)?;
            return Ok(start);
        }
        {
            let mut meta = txn.open_table(META).map_err(backend)?;
            meta.insert(META_REVISION, revision).map_err(backend)?;
        }
        txn.commit().map_err(backend)?;
        Ok(revision)
    }

    /// Runs one chunk of the pending compactions and answers those that are complete.
    fn compact_step(&mut self) {
        let Some(target) = self.compactions.iter().map(|(rev, _)| *rev).max() else {
            return;
        };
        let from = self.compacted.load(Ordering::Acquire);
        let to = target.min(from.saturating_add(COMPACT_CHUNK));
        match compact_range(&self.db, from, to, self.quick_repair) {
            Ok(()) => {
                self.compacted.store(to, Ordering::Release);
                let (done, pending) = std::mem::take(&mut self.compactions)
                    .into_iter()
                    .partition(|(rev, _)| *rev <= to);
                self.compactions = pending;
                for (_, reply) in done {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(err) => {
                tracing::error!(error = %err, "storage compaction failed");
                for (_, reply) in self.compactions.drain(..) {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Applies one write at `revision` inside the batch's transaction. The outer error is a backend
/// failure that aborts the whole batch; the inner one fails only this request.
fn write_one(
    t: &mut Tables<'_>,
    revision: Revision,
    kind: EventType,
    key: &str,
    expected: Revision,
    mut encode: Encoder,
) -> Result<Result<(Event, Revision)>> {
    let existing = match t.current.get(key).map_err(backend)? {
        Some(guard) => match decode_current(guard.value()) {
            Ok((create, modified, value)) => {
                Some((create, modified, Bytes::copy_from_slice(value)))
            }
            Err(err) => return Ok(Err(err)),
        },
        None => None,
    };
    let create_revision = match (kind, &existing) {
        (EventType::Create, Some(_)) => {
            return Ok(Err(StorageError::AlreadyExists(key.to_string())));
        }
        (EventType::Create, None) => revision,
        (_, None) => return Ok(Err(StorageError::NotFound(key.to_string()))),
        (_, Some((_, modified, _))) if *modified != expected => {
            return Ok(Err(StorageError::Conflict {
                key: key.to_string(),
                expected,
                actual: *modified,
            }));
        }
        (_, Some((create, _, _))) => *create,
    };
    // The encoder is caller code: a panic fails this request, not the writer thread.
    let value = match catch_unwind(AssertUnwindSafe(|| encode(revision))) {
        Ok(bytes) => kept(bytes),
        Err(_) => {
            return Ok(Err(StorageError::Backend(format!(
                "encoder for {key} panicked"
            ))));
        }
    };
    // The replaced version moves to history; the live version is only in `current`.
    if let Some((_, modified, old)) = &existing {
        let entry = encode_history(TAG_VALUE, create_revision, old);
        t.history
            .insert((key, *modified), entry.as_slice())
            .map_err(backend)?;
    }
    if kind == EventType::Delete {
        t.current.remove(key).map_err(backend)?;
        let entry = encode_history(TAG_DELETED, create_revision, &value);
        t.history
            .insert((key, revision), entry.as_slice())
            .map_err(backend)?;
    } else {
        let entry = encode_current(create_revision, revision, &value);
        t.current.insert(key, entry.as_slice()).map_err(backend)?;
    }
    t.log
        .insert(revision, encode_log(kind, key).as_slice())
        .map_err(backend)?;
    let event = Event {
        kind,
        key: Arc::from(key),
        value,
        prev_value: existing.map(|(_, _, value)| value),
        revision,
        memo: Default::default(),
    };
    Ok(Ok((event, create_revision)))
}

/// Forgets the log entries in `from+1 ..= to` and every history version they superseded (and
/// deletions), keeping the newest version at or below `to` of every key that was live then
/// (in `current`, or in history if a later write replaced it).
fn compact_range(db: &Database, from: Revision, to: Revision, quick_repair: bool) -> Result<()> {
    let mut txn = db.begin_write().map_err(backend)?;
    txn.set_durability(Durability::Immediate).map_err(backend)?;
    txn.set_quick_repair(quick_repair);
    {
        let mut log = txn.open_table(LOG).map_err(backend)?;
        let mut history = txn.open_table(HISTORY).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        let mut entries = Vec::new();
        for entry in log.range(from.saturating_add(1)..=to).map_err(backend)? {
            let (rev, raw) = entry.map_err(backend)?;
            let rev = rev.value();
            match decode_log(raw.value()) {
                Ok((kind, key)) => entries.push((rev, Some((kind, key.to_string())))),
                Err(err) => {
                    tracing::warn!(revision = rev, error = %err, "dropping corrupt log entry");
                    entries.push((rev, None));
                }
            }
        }
        for (rev, decoded) in entries {
            if let Some((kind, key)) = decoded {
                let key = key.as_str();
                let mut older = Vec::new();
                for entry in history.range((key, 0)..(key, rev)).map_err(backend)? {
                    let (k, _) = entry.map_err(backend)?;
                    older.push(k.value().1);
                }
                for old in older {
                    history.remove((key, old)).map_err(backend)?;
                }
                if kind == EventType::Delete {
                    history.remove((key, rev)).map_err(backend)?;
                }
            }
            log.remove(rev).map_err(backend)?;
        }
        meta.insert(META_COMPACTED, to).map_err(backend)?;
    }
    txn.commit().map_err(backend)
}
