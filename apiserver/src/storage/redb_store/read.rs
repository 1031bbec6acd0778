//! The read side of the redb backend: every read runs in one redb read transaction (an MVCC
//! snapshot) and never waits for the writer thread.

use std::ops::Bound;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use redb::{
    AccessGuard, Database, Range, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
};

use super::codec::{
    backend, decode_current, decode_history, decode_log, CURRENT, HISTORY, LOG, META,
    META_COMPACTED, META_REVISION,
};
use crate::storage::watch::{EventLog, LogChunk};
use crate::storage::{
    check_revision, start_bound, Event, EventType, KeyValue, ListPage, Result, Revision,
    StorageError,
};

type CurrentTable = ReadOnlyTable<&'static str, &'static [u8]>;
type HistoryTable = ReadOnlyTable<(&'static str, u64), &'static [u8]>;
type CurrentEntry<'a> = (
    AccessGuard<'a, &'static str>,
    AccessGuard<'a, &'static [u8]>,
);
type HistoryEntry<'a> = (
    AccessGuard<'a, (&'static str, u64)>,
    AccessGuard<'a, &'static [u8]>,
);

/// Reads a meta counter; a missing one is 0.
pub(super) fn meta_get(meta: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<u64> {
    Ok(meta.get(name).map_err(backend)?.map_or(0, |v| v.value()))
}

/// Reads the (current, compacted) revisions of a snapshot.
fn snapshot_revisions(txn: &ReadTransaction) -> Result<(Revision, Revision)> {
    let meta = txn.open_table(META).map_err(backend)?;
    Ok((
        meta_get(&meta, META_REVISION)?,
        meta_get(&meta, META_COMPACTED)?,
    ))
}

fn current_kv(key: &str, raw: &[u8]) -> Result<KeyValue> {
    let (create_revision, mod_revision, value) = decode_current(raw)?;
    Ok(KeyValue {
        key: Arc::from(key),
        value: Bytes::copy_from_slice(value),
        create_revision,
        mod_revision,
    })
}

/// The latest state of one key.
pub(super) fn get(db: &Database, key: &str) -> Result<Option<KeyValue>> {
    let txn = db.begin_read().map_err(backend)?;
    let table = txn.open_table(CURRENT).map_err(backend)?;
    let raw = table.get(key).map_err(backend)?;
    raw.map(|raw| current_kv(key, raw.value())).transpose()
}

/// An owned copy of `ListOptions`, to move into a blocking task.
pub(super) struct ListRequest {
    pub prefix: String,
    pub start_after: Option<String>,
    pub limit: usize,
    pub revision: Option<Revision>,
}

/// A consistent page of keys, at the latest revision or a past one.
pub(super) fn list(db: &Database, req: &ListRequest) -> Result<ListPage> {
    let txn = db.begin_read().map_err(backend)?;
    let (current, compacted) = snapshot_revisions(&txn)?;
    let start = start_bound(&req.prefix, req.start_after.as_deref());
    let limit = if req.limit == 0 {
        usize::MAX
    } else {
        req.limit
    };
    let mut page = ListPage {
        items: Vec::new(),
        revision: current,
        more: false,
    };
    let table = txn.open_table(CURRENT).map_err(backend)?;
    match req.revision {
        None => {
            let range = table
                .range::<&str>((start, Bound::Unbounded))
                .map_err(backend)?;
            for entry in range {
                let (key, raw) = entry.map_err(backend)?;
                let key = key.value();
                if !key.starts_with(req.prefix.as_str()) {
                    break;
                }
                if page.items.len() == limit {
                    page.more = true;
                    break;
                }
                page.items.push(current_kv(key, raw.value())?);
            }
        }
        Some(at) => {
            check_revision(at, compacted, current)?;
            page.revision = at;
            let history = txn.open_table(HISTORY).map_err(backend)?;
            list_at(&table, &history, &req.prefix, start, at, limit, &mut page)?;
        }
    }
    Ok(page)
}

fn next_current<'a>(
    range: &mut Range<'a, &'static str, &'static [u8]>,
    prefix: &str,
) -> Result<Option<CurrentEntry<'a>>> {
    let Some(entry) = range.next() else {
        return Ok(None);
    };
    let (key, value) = entry.map_err(backend)?;
    Ok(key.value().starts_with(prefix).then_some((key, value)))
}

fn next_history<'a>(
    range: &mut Range<'a, (&'static str, u64), &'static [u8]>,
    prefix: &str,
) -> Result<Option<HistoryEntry<'a>>> {
    let Some(entry) = range.next() else {
        return Ok(None);
    };
    let (key, value) = entry.map_err(backend)?;
    Ok(key.value().0.starts_with(prefix).then_some((key, value)))
}

/// The version of one key visible in a past snapshot.
enum Visible<'a> {
    Current(AccessGuard<'a, &'static [u8]>),
    History(Revision, AccessGuard<'a, &'static [u8]>),
}

/// Lists the snapshot at `at`: for every key, its live version if that was written at or below
/// `at`, else its newest replaced version at or below `at` (unless that is a deletion). Merges
/// the key-ordered `current` and `history` scans.
fn list_at(
    current: &CurrentTable,
    history: &HistoryTable,
    prefix: &str,
    start: Bound<&str>,
    at: Revision,
    limit: usize,
    page: &mut ListPage,
) -> Result<()> {
    let history_start = match start {
        Bound::Excluded(after) => Bound::Excluded((after, u64::MAX)),
        Bound::Included(from) => Bound::Included((from, 0)),
        Bound::Unbounded => Bound::Unbounded,
    };
    let mut live = current
        .range::<&str>((start, Bound::Unbounded))
        .map_err(backend)?;
    let mut old = history
        .range::<(&str, u64)>((history_start, Bound::Unbounded))
        .map_err(backend)?;
    let mut live_head = next_current(&mut live, prefix)?;
    let mut old_head = next_history(&mut old, prefix)?;
    loop {
        let key = match (&live_head, &old_head) {
            (None, None) => return Ok(()),
            (Some((k, _)), None) => k.value().to_string(),
            (None, Some((k, _))) => k.value().0.to_string(),
            (Some((a, _)), Some((b, _))) => a.value().min(b.value().0).to_string(),
        };
        let mut visible = None;
        if let Some((k, v)) = live_head.take() {
            if k.value() == key {
                let (_, modified, _) = decode_current(v.value())?;
                if modified <= at {
                    visible = Some(Visible::Current(v));
                }
                live_head = next_current(&mut live, prefix)?;
            } else {
                live_head = Some((k, v));
            }
        }
        // Replaced versions of the key, oldest first: the last one at or below `at` wins.
        while let Some((k, v)) = old_head.take() {
            let (old_key, rev) = k.value();
            if old_key != key {
                old_head = Some((k, v));
                break;
            }
            if rev <= at && !matches!(visible, Some(Visible::Current(_))) {
                visible = Some(Visible::History(rev, v));
            }
            old_head = next_history(&mut old, prefix)?;
        }
        let item = match visible {
            None => continue,
            Some(Visible::Current(raw)) => current_kv(&key, raw.value())?,
            Some(Visible::History(rev, raw)) => {
                let (deleted, create_revision, value) = decode_history(raw.value())?;
                if deleted {
                    continue;
                }
                KeyValue {
                    key: Arc::from(key.as_str()),
                    value: Bytes::copy_from_slice(value),
                    create_revision,
                    mod_revision: rev,
                }
            }
        };
        if page.items.len() == limit {
            page.more = true;
            return Ok(());
        }
        page.items.push(item);
    }
}

/// Reads the event log for watchers. Holds the database weakly so that lingering watch streams
/// do not keep a dropped store's file open.
pub(super) struct LogReader {
    pub db: Weak<Database>,
}

#[async_trait::async_trait]
impl EventLog for LogReader {
    async fn read_log(&self, prefix: &str, after: Revision, limit: usize) -> Result<LogChunk> {
        let db = self
            .db
            .upgrade()
            .ok_or_else(|| StorageError::Backend("store closed".into()))?;
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || read_log(&db, &prefix, after, limit))
            .await
            .map_err(backend)?
    }
}

/// Replays committed events after `after` from the log, with their values from `history`
/// (replaced versions and deletions) or `current` (versions still live).
fn read_log(db: &Database, prefix: &str, after: Revision, limit: usize) -> Result<LogChunk> {
    let txn = db.begin_read().map_err(backend)?;
    let (_, compacted) = snapshot_revisions(&txn)?;
    if after < compacted {
        return Err(StorageError::Compacted {
            requested: after,
            compacted,
        });
    }
    let log = txn.open_table(LOG).map_err(backend)?;
    let current = txn.open_table(CURRENT).map_err(backend)?;
    let history = txn.open_table(HISTORY).map_err(backend)?;
    let mut chunk = LogChunk {
        events: Vec::new(),
        scanned_to: after,
        complete: true,
    };
    let entries = log
        .range::<u64>((Bound::Excluded(after), Bound::Unbounded))
        .map_err(backend)?;
    for (scanned, entry) in entries.enumerate() {
        if scanned == limit {
            chunk.complete = false;
            break;
        }
        let (rev, raw) = entry.map_err(backend)?;
        let revision = rev.value();
        chunk.scanned_to = revision;
        let (kind, key) = decode_log(raw.value())?;
        if !key.starts_with(prefix) {
            continue;
        }
        let missing = || StorageError::Backend(format!("version {key}@{revision} missing"));
        let value = match history.get((key, revision)).map_err(backend)? {
            Some(raw) => Bytes::copy_from_slice(decode_history(raw.value())?.2),
            None => {
                let raw = current.get(key).map_err(backend)?.ok_or_else(missing)?;
                let (_, modified, value) = decode_current(raw.value())?;
                if modified != revision {
                    return Err(missing());
                }
                Bytes::copy_from_slice(value)
            }
        };
        let prev_value = if kind == EventType::Create {
            None
        } else {
            let mut older = history.range((key, 0)..(key, revision)).map_err(backend)?;
            let (_, prev) = older.next_back().ok_or_else(missing)?.map_err(backend)?;
            Some(Bytes::copy_from_slice(decode_history(prev.value())?.2))
        };
        chunk.events.push(Event {
            kind,
            key: Arc::from(key),
            value,
            prev_value,
            revision,
            memo: Default::default(),
        });
    }
    Ok(chunk)
}
