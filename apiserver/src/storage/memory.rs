//! A fully in-memory [`Store`] with the same semantics as the durable backend, for tests.
//!
//! All state sits behind one mutex held only for short, non-async critical sections. Every
//! version of every key and every event is retained until compacted.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::sync::broadcast;

use super::watch::{self, EventLog, LogChunk, DEFAULT_EVENT_CAPACITY};
use super::{
    check_revision, kept, start_bound, Encoder, Event, EventType, KeyValue, ListOptions, ListPage,
    Result, Revision, StorageError, Store,
};

/// One version of a key; `value: None` is a deletion.
#[derive(Clone, Debug)]
struct Version {
    revision: Revision,
    create_revision: Revision,
    value: Option<Bytes>,
}

#[derive(Default)]
struct State {
    /// The latest committed revision; 0 for an empty store.
    revision: Revision,
    compacted: Revision,
    current: BTreeMap<Arc<str>, KeyValue>,
    /// Every retained version of every key, in revision order.
    history: BTreeMap<Arc<str>, Vec<Version>>,
    /// Events with revisions `compacted + 1 ..= revision`, in order.
    log: VecDeque<Event>,
}

struct Shared {
    state: Mutex<State>,
    events: broadcast::Sender<Event>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-written (all mutations
        // happen after the fallible parts), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An in-memory store. Cheap to clone; clones share the same data.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store (current revision 0; the first write gets revision 1).
    pub fn new() -> Self {
        Self::with_event_capacity(DEFAULT_EVENT_CAPACITY)
    }

    /// An empty store whose live event broadcast holds `capacity` events before watchers lag
    /// (lagging watchers catch up from the retained history).
    pub fn with_event_capacity(capacity: usize) -> Self {
        let (events, _) = broadcast::channel(capacity.max(1));
        MemoryStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                events,
            }),
        }
    }

    /// Applies one write under the lock: `check` validates the current state of the key and
    /// returns its create revision (`None` for a create); then the encoder runs at the next
    /// revision and the change is recorded and published.
    fn write(
        &self,
        key: &str,
        kind: EventType,
        check: impl FnOnce(Option<&KeyValue>) -> Result<()>,
        mut encode: Encoder,
    ) -> Result<Event> {
        let mut st = self.shared.lock();
        let existing = st.current.get(key);
        check(existing)?;
        let prev = existing.cloned();
        let revision = st.revision + 1;
        let value = kept(encode(revision));
        let key: Arc<str> = prev
            .as_ref()
            .map_or_else(|| Arc::from(key), |kv| kv.key.clone());
        let create_revision = prev.as_ref().map_or(revision, |kv| kv.create_revision);
        if kind == EventType::Delete {
            st.current.remove(&*key);
        } else {
            st.current.insert(
                key.clone(),
                KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision,
                    mod_revision: revision,
                },
            );
        }
        st.history.entry(key.clone()).or_default().push(Version {
            revision,
            create_revision,
            value: (kind != EventType::Delete).then(|| value.clone()),
        });
        let event = Event {
            kind,
            key,
            value,
            prev_value: prev.map(|kv| kv.value),
            revision,
            memo: Default::default(),
        };
        st.log.push_back(event.clone());
        st.revision = revision;
        // Published under the lock so the broadcast is in revision order. No receivers is fine.
        let _ = self.shared.events.send(event.clone());
        Ok(event)
    }

    fn list_sync(&self, opts: &ListOptions<'_>) -> Result<ListPage> {
        let st = self.shared.lock();
        let start = start_bound(opts.prefix, opts.start_after);
        let limit = if opts.limit == 0 {
            usize::MAX
        } else {
            opts.limit
        };
        let mut items = Vec::new();
        let mut more = false;
        match opts.revision {
            None => {
                for (key, kv) in st.current.range::<str, _>((start, Bound::Unbounded)) {
                    if !key.starts_with(opts.prefix) {
                        break;
                    }
                    if items.len() == limit {
                        more = true;
                        break;
                    }
                    items.push(kv.clone());
                }
                Ok(ListPage {
                    items,
                    revision: st.revision,
                    more,
                })
            }
            Some(at) => {
                check_revision(at, st.compacted, st.revision)?;
                for (key, versions) in st.history.range::<str, _>((start, Bound::Unbounded)) {
                    if !key.starts_with(opts.prefix) {
                        break;
                    }
                    let idx = versions.partition_point(|v| v.revision <= at);
                    let Some(version) = idx.checked_sub(1).map(|i| &versions[i]) else {
                        continue;
                    };
                    let Some(value) = &version.value else {
                        continue;
                    };
                    if items.len() == limit {
                        more = true;
                        break;
                    }
                    items.push(KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision: version.create_revision,
                        mod_revision: version.revision,
                    });
                }
                Ok(ListPage {
                    items,
                    revision: at,
                    more,
                })
            }
        }
    }

    fn compact_sync(&self, revision: Revision) -> Result<()> {
        let mut st = self.shared.lock();
        if revision > st.revision {
            return Err(StorageError::FutureRevision {
                requested: revision,
                current: st.revision,
            });
        }
        if revision <= st.compacted {
            return Ok(());
        }
        let mut touched = Vec::new();
        while st.log.front().is_some_and(|e| e.revision <= revision) {
            if let Some(event) = st.log.pop_front() {
                touched.push(event.key);
            }
        }
        for key in touched {
            let Some(versions) = st.history.get_mut(&*key) else {
                continue;
            };
            // Keep the newest version at or below `revision` (if it is not a deletion) and
            // everything newer.
            let idx = versions.partition_point(|v| v.revision <= revision);
            let keep_from = match idx.checked_sub(1) {
                Some(i) if versions[i].value.is_some() => i,
                _ => idx,
            };
            versions.drain(..keep_from);
            if versions.is_empty() {
                st.history.remove(&*key);
            }
        }
        st.compacted = revision;
        Ok(())
    }
}

#[async_trait::async_trait]
impl EventLog for Shared {
    async fn read_log(&self, prefix: &str, after: Revision, limit: usize) -> Result<LogChunk> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if after < st.compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted: st.compacted,
            });
        }
        // The log holds revisions compacted+1 ..= revision at indexes 0.., contiguously.
        let skip = usize::try_from(after - st.compacted).unwrap_or(usize::MAX);
        let mut events = Vec::new();
        let mut scanned_to = after;
        let mut scanned = 0;
        for event in st.log.iter().skip(skip).take(limit) {
            scanned += 1;
            scanned_to = event.revision;
            if event.key.starts_with(prefix) {
                events.push(event.clone());
            }
        }
        Ok(LogChunk {
            events,
            scanned_to,
            complete: scanned < limit,
        })
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.shared.lock().current.get(key).cloned())
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
        self.list_sync(&opts)
    }

    async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue> {
        let check = |existing: Option<&KeyValue>| match existing {
            Some(_) => Err(StorageError::AlreadyExists(key.to_string())),
            None => Ok(()),
        };
        let event = self.write(key, EventType::Create, check, encode)?;
        Ok(KeyValue {
            key: event.key,
            value: event.value,
            create_revision: event.revision,
            mod_revision: event.revision,
        })
    }

    async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue> {
        let mut create_revision = 0;
        let check = |existing: Option<&KeyValue>| {
            let kv = cas(key, expected, existing)?;
            create_revision = kv.create_revision;
            Ok(())
        };
        let event = self.write(key, EventType::Update, check, encode)?;
        Ok(KeyValue {
            key: event.key,
            value: event.value,
            create_revision,
            mod_revision: event.revision,
        })
    }

    async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event> {
        let check = |existing: Option<&KeyValue>| cas(key, expected, existing).map(|_| ());
        self.write(key, EventType::Delete, check, encode)
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        // Subscribe first, then check: every event committed after the check is in `rx`.
        let rx = self.shared.events.subscribe();
        let compacted = self.shared.lock().compacted;
        if after < compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted,
            });
        }
        Ok(watch::watch_stream(self.shared.clone(), rx, prefix, after))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.compact_sync(revision)
    }

    fn current_revision(&self) -> Revision {
        self.shared.lock().revision
    }

    fn compacted_revision(&self) -> Revision {
        self.shared.lock().compacted
    }
}

/// The compare-and-swap check of update and delete.
fn cas<'a>(key: &str, expected: Revision, existing: Option<&'a KeyValue>) -> Result<&'a KeyValue> {
    let kv = existing.ok_or_else(|| StorageError::NotFound(key.to_string()))?;
    if kv.mod_revision != expected {
        return Err(StorageError::Conflict {
            key: key.to_string(),
            expected,
            actual: kv.mod_revision,
        });
    }
    Ok(kv)
}
