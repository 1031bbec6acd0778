//! The watch cache: a [`Store`] in front of another that serves watches and latest lists from
//! memory, as kube-apiserver's cacher does.
//!
//! - One watch on the whole backing store feeds every cache, in revision order. `seen` is the
//!   revision it has processed through; every cache holds every change up to it.
//! - One cache per resource type (key prefix `/<group>/<resource>/`), built on first use from a
//!   list at `seen`: the current objects and a window of the latest events.
//! - Watchers get no copies of events. The watchers of one logical cluster share one feed
//!   (those across clusters share the type's): a log of the events they have yet to read, which
//!   each reads through its own cursor, woken after each event of the feed. A feed keeps an event
//!   until its slowest watcher has read it. An event is stored once, with its
//!   [`Memo`](super::Memo), where the serving layer keeps the encoded frame and the decoded
//!   object, whatever the number of watchers.
//! - A watch from a revision the window still covers is served from memory; an older one is
//!   passed to the backing store, which serves it from its history. Below the store's compacted
//!   revision both answer `Compacted`, as the store alone would.
//! - A latest list asks the backing store for its current revision (one cheap read on etcd),
//!   waits until `seen` reaches it, and then answers from memory; so a list on one replica sees
//!   every write acknowledged by any replica before it started. If the cache does not catch up
//!   in time the list goes to the backing store.
//! - A feed drops the events of a watcher that falls more than `max_lag` events, or more than
//!   `max_lag_bytes` bytes of events, behind its end; that watcher is cut off with
//!   [`StorageError::TooSlow`] when it next reads, as kube-apiserver's cacher cuts off a watcher
//!   whose queue stays full. So a watcher that stopped reading holds at most its feed's
//!   allowance, shared with its cluster's other watchers. The feeds do not depend on the window:
//!   a tenant filling the window's budget cannot cut other tenants' watchers off.
//! - The windows of all types together hold at most `window_bytes` of events (oldest dropped
//!   first, whichever type they belong to), so large objects written in a loop cannot grow the
//!   server's memory: a watch from before the window falls to the store or gets 410.
//! - A get is served like a latest list when the backing store knows its revision without a
//!   round trip (redb, memory); on etcd gets go to etcd. Past-revision lists, lists across
//!   types and all writes go to the backing store.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::watch;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::meta::metrics::ExtraMetrics;

use super::{
    start_bound, Encoder, Event, EventType, KeyValue, ListOptions, ListPage, Result, Revision,
    StorageError, Store,
};

/// Tuning of the watch cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// Events kept per resource type for watches that start in the past.
    pub window: usize,
    /// How many events a watcher may fall behind before it is cut off.
    pub max_lag: usize,
    /// Bytes of events (key, value and previous value) the windows of all types hold together.
    pub window_bytes: usize,
    /// Bytes of events a watcher may fall behind before it is cut off (a watcher with nothing
    /// else to read always takes the next event, however large).
    pub max_lag_bytes: usize,
    /// How long a latest list waits for the cache to catch up before it reads the store.
    pub consistent_wait: Duration,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            window: 10_000,
            max_lag: 1024,
            window_bytes: DEFAULT_WINDOW_BYTES,
            max_lag_bytes: DEFAULT_MAX_LAG_BYTES,
            consistent_wait: Duration::from_secs(3),
        }
    }
}

impl CacheOptions {
    fn lag(&self) -> Lag {
        Lag {
            events: self.max_lag,
            bytes: self.max_lag_bytes,
        }
    }
}

/// Default [`CacheOptions::window_bytes`].
pub const DEFAULT_WINDOW_BYTES: usize = 128 * 1024 * 1024;
/// Default [`CacheOptions::max_lag_bytes`].
pub const DEFAULT_MAX_LAG_BYTES: usize = 2 * 1024 * 1024;

/// What an event costs the memory of whoever holds it.
fn weight(event: &Event) -> usize {
    event.key.len() + event.value.len() + event.prev_value.as_ref().map_or(0, |p| p.len())
}

/// How many events one read of a watcher takes from its feed at most (bounds the time a reader
/// holds the type's lock and the events it holds outside the feed).
const READ_BATCH: usize = 256;

/// Every event in some type's window, oldest first, with its weight: the budget of all windows.
#[derive(Default)]
struct WindowLog {
    entries: VecDeque<(Arc<str>, Revision, usize)>,
    bytes: usize,
}

impl WindowLog {
    /// From now on the event at `revision`, which a type's count limit dropped, weighs nothing.
    /// The log is in revision order.
    fn forget(&mut self, revision: Revision) {
        let i = self.entries.partition_point(|e| e.1 < revision);
        if let Some(entry) = self.entries.get_mut(i).filter(|e| e.1 == revision) {
            self.bytes -= std::mem::take(&mut entry.2);
        }
    }
}

/// A [`CachedStore`] that may be gone.
#[derive(Clone)]
pub struct WeakCachedStore(std::sync::Weak<Shared>);

impl WeakCachedStore {
    /// The cache, while anything else holds it.
    pub fn upgrade(&self) -> Option<CachedStore> {
        self.0.upgrade().map(|shared| CachedStore { shared })
    }
}

/// The bytes a [`CachedStore`] holds, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Objects of every loaded type.
    pub objects: usize,
    /// Their keys and stored values.
    pub object_bytes: usize,
    /// Events in the windows.
    pub window_events: usize,
    /// The windows' values and previous values that only the windows hold (a value still
    /// current is the object's, counted in `object_bytes`).
    pub window_bytes: usize,
    /// Events of the windows whose objects a watcher has decoded (the decoded form is kept
    /// with the event).
    pub decoded_events: usize,
    /// Encoded watch frames the windows' events remember.
    pub frame_bytes: usize,
}

/// A store whose watches and latest lists are served from memory.
#[derive(Clone)]
pub struct CachedStore {
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn Store>,
    options: CacheOptions,
    /// Resource type prefix → its cache. Locked by the feeder around each event, so a cache
    /// created between two events gets every event after the revision it is loaded at.
    types: Mutex<HashMap<Arc<str>, Arc<TypeCache>>>,
    /// The revision the feeder has processed through.
    seen: watch::Sender<Revision>,
    /// The events of every window, for the byte budget across types. Locked under `types`.
    window_log: Mutex<WindowLog>,
}

struct TypeCache {
    state: RwLock<TypeState>,
    /// False while loading; true once loaded. Dropped (closed) if loading failed.
    ready: watch::Sender<Option<bool>>,
}

struct TypeState {
    /// Events that arrived while the initial list was read.
    pending: Option<Vec<Event>>,
    /// Set when the cache was dropped by a reset: it no longer receives events.
    dead: bool,
    objects: BTreeMap<Arc<str>, KeyValue>,
    /// Bytes of `objects`' keys and values.
    object_bytes: usize,
    /// The latest events of the type, oldest first, for watches that start in the past.
    window: VecDeque<Event>,
    /// Every event of this type after this revision is in `window`.
    window_start: Revision,
    /// The feed of the watchers across clusters.
    all: Feed,
    /// The feed of each logical cluster (the key segment after the type prefix) that has
    /// watchers, so that an event wakes only the watchers that can want it.
    clusters: HashMap<Arc<str>, Feed>,
}

/// The events a group of watchers has yet to read: one log, shared by the group, that each
/// watcher reads through its own cursor (a sequence number). An event is held once whatever
/// the number of watchers, and only until the slowest has read it or has fallen further behind
/// than its allowance (then it is cut off when it next reads).
struct Feed {
    /// Events with the bytes of the feed's events through each, oldest first.
    entries: VecDeque<(Event, u64)>,
    /// The sequence number of the first entry (each event takes the next).
    first_seq: u64,
    /// Bytes of every event of the feed so far.
    bytes: u64,
    /// Wakes the watchers after each event (the value: the next sequence number).
    wake: watch::Sender<u64>,
    /// Each watcher's cursor: the sequence number of the first event it has not read.
    readers: Vec<Arc<AtomicU64>>,
}

impl Feed {
    fn new() -> Self {
        Feed {
            entries: VecDeque::new(),
            first_seq: 0,
            bytes: 0,
            wake: watch::channel(0).0,
            readers: Vec::new(),
        }
    }

    /// The sequence number the next event will take.
    fn end_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    /// Adds a reader at the end of the feed.
    fn join(&mut self) -> (Arc<AtomicU64>, watch::Receiver<u64>) {
        let cursor = Arc::new(AtomicU64::new(self.end_seq()));
        self.readers.push(cursor.clone());
        (cursor, self.wake.subscribe())
    }

    /// Removes a reader; the feed forgets its events once nobody reads it.
    fn leave(&mut self, cursor: &Arc<AtomicU64>) {
        self.readers.retain(|c| !Arc::ptr_eq(c, cursor));
        if self.readers.is_empty() {
            self.first_seq = self.end_seq();
            self.entries.clear();
        }
    }

    /// Appends an event (if anyone reads the feed), drops what nobody may still read, and wakes
    /// the readers.
    fn push(&mut self, event: &Event, lag: Lag) {
        if self.readers.is_empty() {
            return;
        }
        self.bytes += weight(event) as u64;
        self.entries.push_back((event.clone(), self.bytes));
        let end = self.end_seq();
        let slowest = self
            .readers
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .min()
            .unwrap_or(end);
        while let Some((first, through)) = self.entries.front() {
            let unread = self.entries.len();
            let unread_bytes = self.bytes - (through - weight(first) as u64);
            if self.first_seq < slowest || lag.exceeded(unread, unread_bytes) {
                self.entries.pop_front();
                self.first_seq += 1;
            } else {
                break;
            }
        }
        self.wake.send_replace(end);
    }
}

/// How far behind its feed a watcher may fall before it is cut off.
#[derive(Clone, Copy)]
struct Lag {
    events: usize,
    bytes: usize,
}

impl Lag {
    /// Whether `events` unread events of `bytes` bytes are too many (a watcher that has nothing
    /// else to read always takes the next event, however large).
    fn exceeded(self, events: usize, bytes: u64) -> bool {
        events > self.events || (events > 1 && bytes > self.bytes as u64)
    }
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // Every critical section leaves the state consistent before anything can panic.
    m.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `/<group>/<resource>/` of a key or prefix, if it has one.
fn type_prefix(key: &str) -> Option<&str> {
    let mut slashes = key.match_indices('/').map(|(i, _)| i);
    let first = slashes.next()?;
    if first != 0 {
        return None;
    }
    slashes.nth(1).map(|third| &key[..=third])
}

/// The logical-cluster segment of a key or prefix, if it is complete (followed by `/`).
fn cluster_of<'a>(key: &'a str, type_prefix: &str) -> Option<&'a str> {
    let rest = key.get(type_prefix.len()..)?;
    rest.find('/').map(|end| &rest[..end])
}

impl TypeState {
    fn new() -> Self {
        TypeState {
            pending: Some(Vec::new()),
            dead: false,
            objects: BTreeMap::new(),
            object_bytes: 0,
            window: VecDeque::new(),
            window_start: 0,
            all: Feed::new(),
            clusters: HashMap::new(),
        }
    }

    /// Applies an event; returns the revision of the event the count limit of the window
    /// dropped to make room, if it did.
    fn apply(&mut self, event: Event, window: usize, lag: Lag) -> Option<Revision> {
        match event.kind {
            EventType::Delete => {
                if let Some(old) = self.objects.remove(&event.key) {
                    self.object_bytes -= old.key.len() + old.value.len();
                }
            }
            EventType::Create | EventType::Update => {
                let create_revision = match (event.kind, self.objects.get(&event.key)) {
                    (EventType::Update, Some(old)) => old.create_revision,
                    _ => event.revision,
                };
                self.object_bytes += event.key.len() + event.value.len();
                let replaced = self.objects.insert(
                    event.key.clone(),
                    KeyValue {
                        key: event.key.clone(),
                        value: event.value.clone(),
                        create_revision,
                        mod_revision: event.revision,
                    },
                );
                if let Some(old) = replaced {
                    self.object_bytes -= old.key.len() + old.value.len();
                }
            }
        }
        self.all.push(&event, lag);
        let prefix_len = type_prefix(&event.key).map_or(0, str::len);
        if let Some(feed) = cluster_of(&event.key, &event.key[..prefix_len])
            .and_then(|cluster| self.clusters.get_mut(cluster))
        {
            feed.push(&event, lag);
        }
        self.window.push_back(event);
        let mut dropped = None;
        while self.window.len() > window {
            if let Some(old) = self.window.pop_front() {
                self.window_start = old.revision;
                dropped = Some(old.revision);
            }
        }
        dropped
    }

    /// Drops the window's events up to and including `revision` (the byte budget's oldest).
    fn evict_through(&mut self, revision: Revision) {
        while self.window.front().is_some_and(|e| e.revision <= revision) {
            if let Some(old) = self.window.pop_front() {
                self.window_start = old.revision;
            }
        }
    }
}

impl CachedStore {
    /// Puts a watch cache in front of `store` and starts feeding it.
    pub fn new(store: Arc<dyn Store>, options: CacheOptions) -> Self {
        let (seen, _) = watch::channel(store.current_revision());
        let shared = Arc::new(Shared {
            store,
            options,
            types: Mutex::new(HashMap::new()),
            seen,
            window_log: Mutex::new(WindowLog::default()),
        });
        tokio::spawn(feed(Arc::downgrade(&shared)));
        CachedStore { shared }
    }

    /// The revision the cache has processed through.
    pub fn seen(&self) -> Revision {
        *self.shared.seen.borrow()
    }

    /// A handle that does not keep the cache alive.
    pub fn downgrade(&self) -> WeakCachedStore {
        WeakCachedStore(Arc::downgrade(&self.shared))
    }

    /// What the cache holds now, in bytes of stored data (not of the memory around it).
    pub fn footprint(&self) -> Footprint {
        let caches: Vec<Arc<TypeCache>> = lock(&self.shared.types).values().cloned().collect();
        let mut f = Footprint::default();
        for cache in caches {
            let st = read(&cache.state);
            f.objects += st.objects.len();
            f.object_bytes += st.object_bytes;
            f.window_events += st.window.len();
            for e in &st.window {
                // A value that is still current is the object's own bytes, not a copy.
                let current = st
                    .objects
                    .get(&e.key)
                    .is_some_and(|kv| kv.value.as_ptr() == e.value.as_ptr());
                if !current {
                    f.window_bytes += e.value.len();
                }
                f.window_bytes += e.prev_value.as_ref().map_or(0, |p| p.len());
                f.frame_bytes += e.memo.frame_bytes();
                f.decoded_events += usize::from(e.memo.decoded());
            }
        }
        f
    }

    /// The loaded cache of a resource type; `None` if it cannot be loaded (the caller then
    /// reads the backing store).
    async fn type_cache(&self, prefix: &str) -> Option<Arc<TypeCache>> {
        let (cache, load_at) = {
            let mut types = lock(&self.shared.types);
            if let Some(cache) = types.get(prefix) {
                (cache.clone(), None)
            } else {
                let cache = Arc::new(TypeCache {
                    state: RwLock::new(TypeState::new()),
                    ready: watch::channel(Some(false)).0,
                });
                types.insert(Arc::from(prefix), cache.clone());
                (cache, Some(*self.shared.seen.borrow()))
            }
        };
        if let Some(at) = load_at {
            self.load(prefix, &cache, at).await;
        } else if *cache.ready.borrow() == Some(true) {
            return Some(cache);
        }
        let mut ready = cache.ready.subscribe();
        let loaded = matches!(
            ready.wait_for(|r| *r != Some(false)).await.as_deref(),
            Ok(Some(true))
        );
        loaded.then_some(cache)
    }

    /// Reads a type's objects at `at` and applies what arrived meanwhile.
    async fn load(&self, prefix: &str, cache: &TypeCache, at: Revision) {
        let mut objects = BTreeMap::new();
        let mut start: Option<String> = None;
        let loaded = loop {
            let page = self
                .shared
                .store
                .list(ListOptions {
                    prefix,
                    start_after: start.as_deref(),
                    limit: 1000,
                    revision: Some(at),
                })
                .await;
            match page {
                Ok(page) => {
                    start = page.items.last().map(|kv| kv.key.to_string());
                    objects.extend(page.items.into_iter().map(|kv| (kv.key.clone(), kv)));
                    if !page.more || start.is_none() {
                        break true;
                    }
                }
                Err(err) => {
                    tracing::warn!(prefix, error = %err, "watch cache: loading failed");
                    break false;
                }
            }
        };
        if !loaded {
            lock(&self.shared.types).remove(prefix);
            cache.ready.send_replace(None);
            return;
        }
        let (window, lag) = (self.shared.options.window, self.shared.options.lag());
        let mut st = write(&cache.state);
        st.object_bytes = objects
            .values()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum();
        st.objects = objects;
        st.window_start = at;
        // What the writes made during the load add to the window (and what its count limit
        // dropped of them), for the budget's log.
        let (mut entered, mut dropped) = (Vec::new(), Vec::new());
        for event in st.pending.take().unwrap_or_default() {
            if event.revision > at {
                entered.push((event.revision, weight(&event)));
                dropped.extend(st.apply(event, window, lag));
            }
        }
        drop(st);
        enter_loaded(&self.shared, prefix, entered, &dropped);
        cache.ready.send_replace(Some(true));
    }

    /// Waits until the cache has every change the store had committed when this was called.
    async fn catch_up(&self) -> Result<bool> {
        let want = self.shared.store.latest_revision().await?;
        if *self.shared.seen.borrow() >= want {
            return Ok(true);
        }
        let mut seen = self.shared.seen.subscribe();
        let caught = tokio::time::timeout(
            self.shared.options.consistent_wait,
            seen.wait_for(|s| *s >= want),
        )
        .await;
        Ok(matches!(caught, Ok(Ok(_))))
    }
}

/// Follows the backing store from the cache's revision on, forever; on a broken stream the
/// caches are dropped (their watchers end) and rebuilt on demand.
async fn feed(shared: std::sync::Weak<Shared>) {
    let mut pause = Duration::from_millis(100);
    loop {
        let (store, after) = match shared.upgrade() {
            Some(s) => (s.store.clone(), *s.seen.borrow()),
            None => return,
        };
        let mut events = match store.watch("", after).await {
            Ok(events) => events,
            Err(err) => {
                tracing::warn!(error = %err, "watch cache: cannot follow the store");
                if let Some(s) = shared.upgrade() {
                    reset(&s).await;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(100);
        while let Some(item) = events.next().await {
            let Some(s) = shared.upgrade() else { return };
            match item {
                Ok(event) => dispatch(&s, event),
                Err(err) => {
                    tracing::warn!(error = %err, "watch cache: the store's watch broke");
                    reset(&s).await;
                    break;
                }
            }
        }
    }
}

/// Applies one event to its type's cache (if any) and advances `seen`.
fn dispatch(shared: &Shared, event: Event) {
    let revision = event.revision;
    let types = lock(&shared.types);
    let cache = type_prefix(&event.key).and_then(|p| types.get_key_value(p));
    match cache {
        Some((prefix, cache)) => {
            let w = weight(&event);
            let applied = {
                let mut st = write(&cache.state);
                let applied = match st.pending.as_mut() {
                    Some(pending) => {
                        pending.push(event);
                        None
                    }
                    None => Some(st.apply(event, shared.options.window, shared.options.lag())),
                };
                // Under the type's lock: a reader never sees `seen` behind the objects it reads.
                shared.seen.send_replace(revision);
                applied
            };
            if let Some(count_dropped) = applied {
                keep_within_budget(shared, &types, prefix.clone(), revision, w, count_dropped);
            }
        }
        None => {
            shared.seen.send_replace(revision);
        }
    }
}

/// Records an event that entered `prefix`'s window, forgets the weight of the event its count
/// limit dropped (`count_dropped`), and drops the oldest events of any window while all of them
/// together weigh more than the budget (or are more than the count windows allow, so the log
/// itself stays bounded).
fn keep_within_budget(
    shared: &Shared,
    types: &HashMap<Arc<str>, Arc<TypeCache>>,
    prefix: Arc<str>,
    revision: Revision,
    w: usize,
    count_dropped: Option<Revision>,
) {
    let mut log = lock(&shared.window_log);
    if let Some(r) = count_dropped {
        log.forget(r);
    }
    log.entries.push_back((prefix, revision, w));
    log.bytes += w;
    evict_over_budget(shared, types, &mut log);
}

/// Enters in the budget's log the events (revision, weight) that `prefix`'s window took from
/// the writes made while its first list was read, and forgets those its count limit `dropped`.
/// The log is in revision order, and other types' events went on entering it meanwhile, so the
/// two are merged.
fn enter_loaded(
    shared: &Shared,
    prefix: &str,
    entered: Vec<(Revision, usize)>,
    dropped: &[Revision],
) {
    if entered.is_empty() {
        return;
    }
    let types = lock(&shared.types);
    // A type forgotten meanwhile (a reset) has no window to account for.
    let Some((prefix, _)) = types.get_key_value(prefix) else {
        return;
    };
    let mut log = lock(&shared.window_log);
    let old = std::mem::take(&mut log.entries);
    let mut merged = VecDeque::with_capacity(old.len() + entered.len());
    let mut entered = entered.into_iter().peekable();
    for entry in old {
        while let Some((r, w)) = entered.next_if(|e| e.0 < entry.1) {
            merged.push_back((prefix.clone(), r, w));
            log.bytes += w;
        }
        merged.push_back(entry);
    }
    for (r, w) in entered {
        merged.push_back((prefix.clone(), r, w));
        log.bytes += w;
    }
    log.entries = merged;
    for r in dropped {
        log.forget(*r);
    }
    evict_over_budget(shared, &types, &mut log);
}

/// Drops the oldest events of any window while all of them together weigh more than the
/// budget (or are more than the count windows allow, so the log itself stays bounded).
fn evict_over_budget(
    shared: &Shared,
    types: &HashMap<Arc<str>, Arc<TypeCache>>,
    log: &mut WindowLog,
) {
    let max_entries = shared.options.window.saturating_mul(16).max(1);
    while log.bytes > shared.options.window_bytes || log.entries.len() > max_entries {
        let Some((p, r, w)) = log.entries.pop_front() else {
            break;
        };
        log.bytes -= w;
        if let Some(cache) = types.get(&p) {
            write(&cache.state).evict_through(r);
        }
    }
}

/// Forgets every cache (ending their watchers) and restarts from the store's current revision.
async fn reset(shared: &Shared) {
    let dropped: Vec<_> = {
        let mut types = lock(&shared.types);
        *lock(&shared.window_log) = WindowLog::default();
        types.drain().map(|(_, c)| c).collect()
    };
    for cache in dropped {
        let mut st = write(&cache.state);
        // Every watcher wakes, finds the cache dead and ends.
        st.dead = true;
        st.all.wake.send_modify(|_| {});
        st.all.entries.clear();
        st.clusters.clear();
    }
    let current = shared
        .store
        .latest_revision()
        .await
        .unwrap_or_else(|_| shared.store.current_revision());
    shared.seen.send_replace(current);
}

/// Which part of the watch cache a byte count is about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CachePart {
    part: &'static str,
}

/// The watch cache's footprint as metrics, measured when `/metrics` is read (so nothing is
/// spent on it between scrapes).
#[derive(Clone)]
struct FootprintCollector(WeakCachedStore);

impl std::fmt::Debug for FootprintCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FootprintCollector")
    }
}

impl Collector for FootprintCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(f) = self.0.upgrade().map(|c| c.footprint()) else {
            return Ok(());
        };
        let gauge = |v: usize| ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
        let mut bytes = encoder.encode_descriptor(
            "platform_mesh_watch_cache_bytes",
            "Bytes of stored data the watch cache holds, by part: current objects, what only the event windows hold, the windows' encoded watch frames",
            None,
            MetricType::Gauge,
        )?;
        for (part, v) in [
            ("objects", f.object_bytes),
            ("window", f.window_bytes),
            ("frames", f.frame_bytes),
        ] {
            gauge(v).encode(bytes.encode_family(&CachePart { part })?)?;
        }
        for (name, help, v) in [
            (
                "platform_mesh_watch_cache_objects",
                "Current objects the watch cache holds",
                f.objects,
            ),
            (
                "platform_mesh_watch_cache_window_events",
                "Events in the watch cache's windows",
                f.window_events,
            ),
            (
                "platform_mesh_watch_cache_decoded_events",
                "Events of the windows whose decoded objects are kept with them",
                f.decoded_events,
            ),
        ] {
            gauge(v).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}

/// `extra` and the watch cache's footprint: `platform_mesh_watch_cache_bytes` by part (objects,
/// window, frames), `platform_mesh_watch_cache_objects`, `…_window_events` and
/// `…_decoded_events`, while the cache lives.
pub fn footprint_metrics(cache: WeakCachedStore, extra: Option<ExtraMetrics>) -> ExtraMetrics {
    let collector = FootprintCollector(cache);
    ExtraMetrics::new(move |registry| {
        if let Some(extra) = &extra {
            extra.register(registry);
        }
        registry.register_collector(Box::new(collector.clone()));
    })
}

/// One cached watch: the window's events after its start revision, then its feed, read from
/// its cursor.
struct CachedWatch {
    cache: Weak<TypeCache>,
    prefix: Arc<str>,
    /// The cluster whose feed it reads; `None`: the type's feed across clusters.
    cluster: Option<Arc<str>>,
    /// Its position in the feed (shared with the feed, which trims what every reader has read).
    cursor: Arc<AtomicU64>,
    /// Wakes it after each event of its feed; `None` once it has let go of the feed.
    wake: Option<watch::Receiver<u64>>,
    /// Events taken from the feed (or replayed), not yet yielded.
    ready: VecDeque<Event>,
    /// The revision of the last event yielded.
    last: Revision,
    done: bool,
}

impl CachedWatch {
    async fn next(mut self) -> Option<(Result<Event>, Self)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.ready.pop_front() {
                self.last = event.revision;
                return Some((Ok(event), self));
            }
            let Some(wake) = self.wake.as_mut() else {
                let err = self.restarted();
                return self.fail(err);
            };
            // Marked seen before the read: an event that comes after it wakes the wait below.
            wake.borrow_and_update();
            if let Err(err) = self.read_feed() {
                return self.fail(err);
            }
            if !self.ready.is_empty() {
                continue;
            }
            let woken = match self.wake.as_mut() {
                Some(wake) => wake.changed().await.is_ok(),
                None => false,
            };
            if !woken {
                let err = self.restarted();
                return self.fail(err);
            }
        }
    }

    fn fail(mut self, err: StorageError) -> Option<(Result<Event>, Self)> {
        self.done = true;
        self.release();
        Some((Err(err), self))
    }

    fn restarted(&self) -> StorageError {
        StorageError::Backend(format!(
            "the watch cache restarted; watch again from revision {}",
            self.last
        ))
    }

    /// Takes the next events it wants from its feed, up to [`READ_BATCH`]; fails if the feed
    /// has dropped events it had not read (it fell further behind than its allowance).
    fn read_feed(&mut self) -> Result<()> {
        let Some(cache) = self.cache.upgrade() else {
            return Err(self.restarted());
        };
        let st = read(&cache.state);
        let feed = match &self.cluster {
            _ if st.dead => None,
            Some(cluster) => st.clusters.get(cluster),
            None => Some(&st.all),
        };
        let Some(feed) = feed else {
            return Err(self.restarted());
        };
        let mut next = self.cursor.load(Ordering::Acquire);
        if next < feed.first_seq {
            return Err(StorageError::TooSlow { last: self.last });
        }
        let from = (next - feed.first_seq) as usize;
        // A watch registered before the cache applied the revision it starts from finds that
        // revision (and older ones) still coming down the feed: they are not after it.
        let after = self.ready.back().map_or(self.last, |e| e.revision);
        for (event, _) in feed.entries.range(from..).take(READ_BATCH) {
            if event.revision > after && event.key.starts_with(&*self.prefix) {
                self.ready.push_back(event.clone());
            }
            next += 1;
        }
        self.cursor.store(next, Ordering::Release);
        Ok(())
    }

    /// Lets go of its feed: the last watcher of a cluster takes the cluster's feed with it.
    fn release(&mut self) {
        let Some(wake) = self.wake.take() else {
            return;
        };
        drop(wake);
        let Some(cache) = self.cache.upgrade() else {
            return;
        };
        let mut st = write(&cache.state);
        match &self.cluster {
            Some(cluster) => {
                if let Some(feed) = st.clusters.get_mut(cluster) {
                    feed.leave(&self.cursor);
                    if feed.readers.is_empty() {
                        st.clusters.remove(cluster);
                    }
                }
            }
            None => st.all.leave(&self.cursor),
        }
    }
}

impl Drop for CachedWatch {
    fn drop(&mut self) {
        self.release();
    }
}

#[async_trait::async_trait]
impl Store for CachedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        // On a store of this process a consistent get is served from memory, as a latest list
        // is: a point read of the store can wait milliseconds behind a large commit, and
        // another tenant's large writes must not slow everyone's reads. On etcd the revision
        // costs a round trip, as much as the get itself, so the get goes to etcd.
        if self.shared.store.revision_is_local() {
            if let Some(tp) = type_prefix(key) {
                if self.catch_up().await? {
                    if let Some(cache) = self.type_cache(tp).await {
                        let st = read(&cache.state);
                        if !st.dead {
                            return Ok(st.objects.get(key).cloned());
                        }
                    }
                }
            }
        }
        self.shared.store.get(key).await
    }

    async fn get_cached(&self, key: &str) -> Result<Option<KeyValue>> {
        if let Some(tp) = type_prefix(key) {
            if let Some(cache) = self.type_cache(tp).await {
                let st = read(&cache.state);
                if let Some(kv) = st.objects.get(key).filter(|_| !st.dead) {
                    return Ok(Some(kv.clone()));
                }
            }
        }
        self.shared.store.get(key).await
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
        let Some(tp) = type_prefix(opts.prefix).filter(|_| opts.revision.is_none()) else {
            return self.shared.store.list(opts).await;
        };
        if !self.catch_up().await? {
            return self.shared.store.list(opts).await;
        }
        let Some(cache) = self.type_cache(tp).await else {
            return self.shared.store.list(opts).await;
        };
        let page = {
            let st = read(&cache.state);
            (!st.dead).then(|| {
                let revision = *self.shared.seen.borrow();
                let from = start_bound(opts.prefix, opts.start_after);
                let mut matching = st
                    .objects
                    .range::<str, _>((from, Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(opts.prefix))
                    .map(|(_, kv)| kv);
                let limit = if opts.limit == 0 {
                    usize::MAX
                } else {
                    opts.limit
                };
                let items: Vec<KeyValue> = matching.by_ref().take(limit).cloned().collect();
                let more = matching.next().is_some();
                ListPage {
                    items,
                    revision,
                    more,
                }
            })
        };
        match page {
            Some(page) => Ok(page),
            None => self.shared.store.list(opts).await,
        }
    }

    async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue> {
        self.shared.store.create(key, encode).await
    }

    async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue> {
        self.shared.store.update(key, expected, encode).await
    }

    async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event> {
        self.shared.store.delete(key, expected, encode).await
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let Some(tp) = type_prefix(prefix) else {
            return self.shared.store.watch(prefix, after).await;
        };
        // History is gone below the store's compaction, also where the window still has it: a
        // watch answers the same with and without the cache.
        let compacted = self.shared.store.compacted_revision();
        if after < compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted,
            });
        }
        let Some(cache) = self.type_cache(tp).await else {
            return self.shared.store.watch(prefix, after).await;
        };
        let cluster = cluster_of(prefix, tp).map(Arc::<str>::from);
        let registered = {
            let mut st = write(&cache.state);
            (!st.dead && after >= st.window_start).then(|| {
                let (cursor, wake) = match &cluster {
                    Some(cluster) => st
                        .clusters
                        .entry(cluster.clone())
                        .or_insert_with(Feed::new)
                        .join(),
                    None => st.all.join(),
                };
                let from = st.window.partition_point(|e| e.revision <= after);
                let replay: VecDeque<Event> = st
                    .window
                    .range(from..)
                    .filter(|e| e.key.starts_with(prefix))
                    .cloned()
                    .collect();
                (cursor, wake, replay)
            })
        };
        let Some((cursor, wake, ready)) = registered else {
            return self.shared.store.watch(prefix, after).await;
        };
        let watch = CachedWatch {
            cache: Arc::downgrade(&cache),
            prefix: Arc::from(prefix),
            cluster,
            cursor,
            wake: Some(wake),
            ready,
            last: after,
            done: false,
        };
        Ok(stream::unfold(watch, CachedWatch::next).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.shared.store.compact(revision).await
    }

    fn current_revision(&self) -> Revision {
        self.shared.store.current_revision().max(self.seen())
    }

    fn compacted_revision(&self) -> Revision {
        self.shared.store.compacted_revision()
    }

    async fn latest_revision(&self) -> Result<Revision> {
        self.shared.store.latest_revision().await
    }

    fn revision_is_local(&self) -> bool {
        self.shared.store.revision_is_local()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn tagged(tag: &str) -> Encoder {
        let tag = tag.to_string();
        Box::new(move |rev| format!("{tag}@{rev}").into_bytes())
    }

    fn options(window: usize, max_lag: usize) -> CacheOptions {
        CacheOptions {
            window,
            max_lag,
            consistent_wait: Duration::from_secs(3),
            ..CacheOptions::default()
        }
    }

    fn cached(opts: CacheOptions) -> (Arc<dyn Store>, CachedStore) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let cache = CachedStore::new(store.clone(), opts);
        (store, cache)
    }

    /// Loads the cache of a resource type (a latest list does).
    async fn load(cache: &CachedStore, type_prefix: &str) {
        let opts = ListOptions {
            prefix: type_prefix,
            ..Default::default()
        };
        cache.list(opts).await.expect("latest list");
    }

    async fn next(w: &mut BoxStream<'static, Result<Event>>) -> Result<Event> {
        tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("watch event timed out")
            .expect("watch ended")
    }

    async fn take(w: &mut BoxStream<'static, Result<Event>>, n: usize) -> Vec<Event> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(next(w).await.expect("watch error"));
        }
        out
    }

    const KEYS: [&str; 7] = [
        "/g/r/c1/ns1/a",
        "/g/r/c1/ns1/b",
        "/g/r/c1/ns2/a",
        "/g/r/c2/ns1/a",
        "/g/r/c10/ns1/a",
        "/g/s/c1/ns1/a",
        "/h/r/c1/ns1/a",
    ];

    const PREFIXES: [&str; 6] = [
        "/g/r/",
        "/g/r/c1/",
        "/g/r/c1/ns1/",
        "/g/r/c2/",
        "/g/s/",
        "/g/r/nothing/",
    ];

    async fn assert_lists_agree(store: &Arc<dyn Store>, cache: &CachedStore) {
        for prefix in PREFIXES {
            for limit in [0, 1, 2] {
                for start_after in [None, Some("/g/r/c1/ns1/a")] {
                    let opts = ListOptions {
                        prefix,
                        start_after,
                        limit,
                        revision: None,
                    };
                    let want = store.list(opts.clone()).await.unwrap();
                    let got = cache.list(opts).await.unwrap();
                    assert_eq!(got.items, want.items, "{prefix} {limit} {start_after:?}");
                    assert_eq!(got.more, want.more, "{prefix} {limit} {start_after:?}");
                    assert!(got.revision >= want.revision);
                }
            }
        }
    }

    /// The footprint metrics say what the cache holds at the moment `/metrics` is read.
    #[tokio::test]
    async fn the_footprint_metrics_are_measured_when_read() {
        let (store, cache) = cached(options(100, 100));
        let mut registry = prometheus_client::registry::Registry::default();
        footprint_metrics(cache.downgrade(), None).register(&mut registry);
        store.create("/g/r/c1/ns1/a", tagged("aa")).await.unwrap();
        load(&cache, "/g/r/").await;
        // A second write: its event is in the window, its old value only there.
        let kv = cache.get("/g/r/c1/ns1/a").await.unwrap().expect("object");
        store
            .update("/g/r/c1/ns1/a", kv.mod_revision, tagged("bbb"))
            .await
            .unwrap();
        load(&cache, "/g/r/").await;
        let f = cache.footprint();
        assert_eq!((f.objects, f.window_events), (1, 1), "{f:?}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "platform_mesh_watch_cache_objects 1".to_string(),
            "platform_mesh_watch_cache_window_events 1".to_string(),
            format!(
                "platform_mesh_watch_cache_bytes{{part=\"objects\"}} {}",
                f.object_bytes
            ),
            format!(
                "platform_mesh_watch_cache_bytes{{part=\"window\"}} {}",
                f.window_bytes
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert_eq!(f.object_bytes, "/g/r/c1/ns1/a".len() + "bbb@".len() + 1);
        assert_eq!(f.window_bytes, "aa@".len() + 1);
    }

    #[tokio::test]
    async fn latest_lists_agree_with_the_store_and_see_every_acknowledged_write() {
        let (store, cache) = cached(CacheOptions::default());
        for key in &KEYS[..4] {
            cache.create(key, tagged(key)).await.unwrap();
        }
        assert_lists_agree(&store, &cache).await;
        // Writes right before a list are in it (no waiting for the feeder by the caller).
        for key in &KEYS[4..] {
            let kv = cache.create(key, tagged("v")).await.unwrap();
            let page = cache
                .list(ListOptions {
                    prefix: key,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(page.items, [kv]);
        }
        let a = cache.get(KEYS[0]).await.unwrap().unwrap();
        cache
            .update(KEYS[0], a.mod_revision, tagged("a2"))
            .await
            .unwrap();
        let b = cache.get(KEYS[1]).await.unwrap().unwrap();
        cache
            .delete(KEYS[1], b.mod_revision, tagged(KEYS[1]))
            .await
            .unwrap();
        assert_lists_agree(&store, &cache).await;
        // Past revisions and cross-type prefixes go to the store.
        let past = ListOptions {
            prefix: "/g/r/",
            revision: Some(3),
            ..Default::default()
        };
        assert_eq!(
            cache.list(past.clone()).await.unwrap().items,
            store.list(past).await.unwrap().items
        );
        assert_eq!(
            cache
                .list(ListOptions::default())
                .await
                .unwrap()
                .items
                .len(),
            6
        );
    }

    /// A store that counts its point reads and knows its revision locally or not, as told.
    /// Its lists wait while a test holds `lists`.
    struct CountingGets {
        inner: MemoryStore,
        local: bool,
        gets: AtomicUsize,
        lists: tokio::sync::Mutex<()>,
    }

    impl CountingGets {
        fn new(local: bool) -> Self {
            CountingGets {
                inner: MemoryStore::new(),
                local,
                gets: AtomicUsize::new(0),
                lists: tokio::sync::Mutex::new(()),
            }
        }
    }

    #[async_trait::async_trait]
    impl Store for CountingGets {
        async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            self.inner.get(key).await
        }
        async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
            let _open = self.lists.lock().await;
            self.inner.list(opts).await
        }
        async fn create(&self, key: &str, encode: Encoder) -> Result<KeyValue> {
            self.inner.create(key, encode).await
        }
        async fn update(&self, key: &str, expected: Revision, encode: Encoder) -> Result<KeyValue> {
            self.inner.update(key, expected, encode).await
        }
        async fn delete(&self, key: &str, expected: Revision, encode: Encoder) -> Result<Event> {
            self.inner.delete(key, expected, encode).await
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
        fn compacted_revision(&self) -> Revision {
            self.inner.compacted_revision()
        }
        fn revision_is_local(&self) -> bool {
            self.local
        }
    }

    /// On a store of this process gets are answered from memory and see every write
    /// acknowledged before them; on a store whose revision costs a round trip they go to it.
    #[tokio::test]
    async fn gets_come_from_memory_only_where_the_revision_is_local_and_see_every_write() {
        for local in [true, false] {
            let store = Arc::new(CountingGets::new(local));
            let cache = CachedStore::new(store.clone(), CacheOptions::default());
            for (i, key) in KEYS.iter().enumerate() {
                // Each write is seen by the get right after it, whatever the feeder's pace.
                let kv = cache.create(key, tagged(&format!("v{i}"))).await.unwrap();
                assert_eq!(cache.get(key).await.unwrap(), Some(kv.clone()), "{key}");
                let kv = cache
                    .update(key, kv.mod_revision, tagged("again"))
                    .await
                    .unwrap();
                assert_eq!(cache.get(key).await.unwrap(), Some(kv), "{key}");
            }
            let a = cache.get(KEYS[0]).await.unwrap().unwrap();
            cache
                .delete(KEYS[0], a.mod_revision, tagged(KEYS[0]))
                .await
                .unwrap();
            assert_eq!(cache.get(KEYS[0]).await.unwrap(), None);
            assert_eq!(cache.get("/g/r/c1/ns1/never").await.unwrap(), None);
            let reads = store.gets.load(Ordering::SeqCst);
            if local {
                assert_eq!(reads, 0, "every get came from memory");
            } else {
                assert_eq!(reads, 2 * KEYS.len() + 3, "every get went to the store");
            }
        }
    }

    /// Every watch through the cache sees exactly what the same watch on the store sees.
    #[tokio::test]
    async fn watches_agree_with_the_store() {
        let (store, cache) = cached(options(1000, 1000));
        cache.create(KEYS[0], tagged("seed")).await.unwrap();
        // Load the caches, then watch from the start (in the window) and from now.
        load(&cache, "/g/r/").await;
        load(&cache, "/g/s/").await;
        let start = cache.current_revision();
        let mut watches = Vec::new();
        for prefix in PREFIXES {
            watches.push((
                prefix,
                cache.watch(prefix, start).await.unwrap(),
                store.watch(prefix, start).await.unwrap(),
            ));
        }
        let mut expected = BTreeMap::new();
        for round in 0..5 {
            for key in KEYS {
                match cache.get(key).await.unwrap() {
                    None => {
                        cache
                            .create(key, tagged(&format!("{round}")))
                            .await
                            .unwrap();
                    }
                    Some(kv) if round % 2 == 0 => {
                        cache
                            .update(key, kv.mod_revision, tagged(&format!("{round}")))
                            .await
                            .unwrap();
                    }
                    Some(kv) => {
                        let value = String::from_utf8_lossy(&kv.value)
                            .split('@')
                            .next()
                            .unwrap_or("")
                            .to_string();
                        cache
                            .delete(key, kv.mod_revision, tagged(&value))
                            .await
                            .unwrap();
                    }
                }
            }
        }
        for (prefix, _, _) in &watches {
            let n = store.list(ListOptions::default()).await.unwrap().revision;
            expected.insert(*prefix, n);
        }
        let late = cache.watch("/g/r/c1/", start).await.unwrap();
        watches.push((
            "/g/r/c1/",
            late,
            store.watch("/g/r/c1/", start).await.unwrap(),
        ));
        for (prefix, via_cache, via_store) in &mut watches {
            let n = KEYS.iter().filter(|k| k.starts_with(*prefix)).count() * 5;
            let want = take(via_store, n).await;
            let got = take(via_cache, n).await;
            assert_eq!(got, want, "{prefix}");
        }
    }

    /// A client that wrote through the store and watches from its write's revision at once,
    /// before the cache has applied that write, gets only what comes after it (the test's one
    /// thread lets the cache's feed run only once the watch is registered).
    #[tokio::test]
    async fn a_watch_from_a_revision_the_cache_has_not_applied_yet_starts_after_it() {
        let (store, cache) = cached(options(100, 100));
        load(&cache, "/g/r/").await;
        let written = store.create("/g/r/c1/ns/a", tagged("a")).await.unwrap();
        let mut w = cache.watch("/g/r/", written.mod_revision).await.unwrap();
        let later = store.create("/g/r/c1/ns/b", tagged("b")).await.unwrap();
        let first = next(&mut w).await.unwrap();
        assert_eq!(first.revision, later.mod_revision, "{first:?}");
    }

    #[tokio::test]
    async fn watches_older_than_the_window_are_served_by_the_store() {
        let (_, cache) = cached(options(3, 100));
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        for i in 0..10 {
            cache
                .create(&format!("/g/r/c1/ns/{i}"), tagged("v"))
                .await
                .unwrap();
        }
        let mut w = cache.watch("/g/r/", start).await.unwrap();
        let revs: Vec<_> = take(&mut w, 10).await.iter().map(|e| e.revision).collect();
        assert_eq!(revs, (start + 1..=start + 10).collect::<Vec<_>>());
        // Below the store's compaction the answer is 410, window or not.
        cache.compact(start + 9).await.unwrap();
        let err = cache.watch("/g/r/", start + 8).await.err();
        assert!(
            matches!(err, Some(StorageError::Compacted { .. })),
            "{err:?}"
        );
        let mut w = cache.watch("/g/r/", start + 9).await.unwrap();
        assert_eq!(next(&mut w).await.unwrap().revision, start + 10);
    }

    #[tokio::test]
    async fn a_slow_watcher_is_cut_off_and_the_others_go_on() {
        let (_, cache) = cached(options(1000, 8));
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        let mut slow = cache.watch("/g/r/c1/", start).await.unwrap();
        let mut fast = cache.watch("/g/r/c1/", start).await.unwrap();
        let reader = tokio::spawn(async move { take(&mut fast, 50).await.len() });
        for i in 0..50 {
            cache
                .create(&format!("/g/r/c1/ns/{i}"), tagged("v"))
                .await
                .unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(reader.await.unwrap(), 50);
        let mut delivered = 0;
        let err = loop {
            match next(&mut slow).await {
                Ok(_) => delivered += 1,
                Err(e) => break e,
            }
        };
        assert!(delivered <= 8, "{delivered}");
        assert!(matches!(err, StorageError::TooSlow { .. }), "{err:?}");
        assert!(err.to_string().contains("watch again from resourceVersion"));
        assert!(tokio::time::timeout(Duration::from_secs(5), slow.next())
            .await
            .unwrap()
            .is_none());
        // The cache let go of both, and of the index of their cluster with them.
        let cache_of = cache.type_cache("/g/r/").await.unwrap();
        assert!(read(&cache_of.state).clusters.is_empty());
        assert!(read(&cache_of.state).all.readers.is_empty());
    }

    /// An encoder of `n` bytes.
    fn sized(n: usize) -> Encoder {
        Box::new(move |_| vec![b'x'; n])
    }

    #[tokio::test]
    async fn the_windows_of_all_types_together_stay_within_their_byte_budget() {
        let (_, cache) = cached(CacheOptions {
            window_bytes: 64 * 1024,
            ..options(10_000, 1000)
        });
        load(&cache, "/g/a/").await;
        load(&cache, "/g/b/").await;
        let start = cache.current_revision();
        // 100 updates of 4 KiB objects (each event weighs value + previous value) across two
        // types: far more than the budget, far fewer than the count window.
        let mut revs = Vec::new();
        for i in 0..50 {
            for t in ["a", "b"] {
                let key = format!("/g/{t}/c1/ns/o{}", i % 5);
                let kv = match cache.get(&key).await.unwrap() {
                    Some(kv) => cache.update(&key, kv.mod_revision, sized(4096)).await,
                    None => cache.create(&key, sized(4096)).await,
                };
                revs.push(kv.unwrap().mod_revision);
            }
        }
        assert!(cache.catch_up().await.unwrap());
        let mut held = 0;
        for t in ["/g/a/", "/g/b/"] {
            let tc = cache.type_cache(t).await.unwrap();
            held += read(&tc.state).window.iter().map(weight).sum::<usize>();
        }
        assert!(held <= 64 * 1024, "{held} bytes held");
        assert!(held > 32 * 1024, "the budget is used, not emptied: {held}");
        // The latest events are still served from memory, older ones by the store, in order.
        let mut w = cache.watch("/g/a/", start).await.unwrap();
        let got: Vec<_> = take(&mut w, 50).await.iter().map(|e| e.revision).collect();
        let want: Vec<_> = revs.iter().step_by(2).copied().collect();
        assert_eq!(got, want);
    }

    /// The budget counts what the windows hold: an event a type's count limit dropped no
    /// longer weighs on it.
    #[tokio::test]
    async fn the_budget_weighs_only_what_the_windows_hold() {
        let (_, cache) = cached(options(3, 1000));
        load(&cache, "/g/a/").await;
        load(&cache, "/g/b/").await;
        for i in 0..20 {
            let t = if i < 15 { "a" } else { "b" };
            cache
                .create(&format!("/g/{t}/c1/ns/o{i}"), sized(100 + i))
                .await
                .unwrap();
        }
        assert!(cache.catch_up().await.unwrap());
        let mut held = 0;
        for t in ["/g/a/", "/g/b/"] {
            let tc = cache.type_cache(t).await.unwrap();
            held += read(&tc.state).window.iter().map(weight).sum::<usize>();
        }
        assert_eq!(lock(&cache.shared.window_log).bytes, held);
    }

    /// The writes made while a type's first list is read reach its window when the list is
    /// done; the budget's log counts them too, in revision order among the other types' events.
    #[tokio::test]
    async fn the_budget_counts_the_writes_made_while_a_type_loads() {
        // A window of 2 drops one of the three writes to the loading type at once.
        for window in [1000, 2] {
            let store = Arc::new(CountingGets::new(true));
            let cache = CachedStore::new(store.clone(), options(window, 1000));
            load(&cache, "/g/b/").await;
            let gate = store.lists.lock().await;
            let loading = tokio::spawn({
                let cache = cache.clone();
                async move { load(&cache, "/g/a/").await }
            });
            while !lock(&cache.shared.types).contains_key("/g/a/") {
                tokio::task::yield_now().await;
            }
            let mut last = 0;
            for i in 0..6 {
                let t = if i % 2 == 0 { "a" } else { "b" };
                let kv = cache
                    .create(&format!("/g/{t}/c1/ns/o{i}"), sized(100 + i))
                    .await
                    .unwrap();
                last = kv.mod_revision;
            }
            while *cache.shared.seen.borrow() < last {
                tokio::task::yield_now().await;
            }
            drop(gate);
            loading.await.unwrap();
            let mut held = 0;
            for t in ["/g/a/", "/g/b/"] {
                let tc = cache.type_cache(t).await.unwrap();
                held += read(&tc.state).window.iter().map(weight).sum::<usize>();
            }
            let log = lock(&cache.shared.window_log);
            assert_eq!(log.bytes, held, "window {window}");
            assert_eq!(log.entries.len(), 6);
            assert!(log
                .entries
                .iter()
                .zip(log.entries.iter().skip(1))
                .all(|(a, b)| a.1 < b.1));
        }
    }

    #[tokio::test]
    async fn a_watcher_behind_by_more_bytes_than_allowed_is_cut_off() {
        let (_, cache) = cached(CacheOptions {
            max_lag_bytes: 16 * 1024,
            ..options(1000, 1000)
        });
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        let mut slow = cache.watch("/g/r/c1/", start).await.unwrap();
        // One event larger than the whole allowance still gets through to a watcher that has
        // nothing else to read.
        cache
            .create("/g/r/c1/ns/big", sized(64 * 1024))
            .await
            .unwrap();
        assert_eq!(next(&mut slow).await.unwrap().value.len(), 64 * 1024);
        for i in 0..3 {
            cache
                .create(&format!("/g/r/c1/ns/{i}"), sized(4096))
                .await
                .unwrap();
        }
        // 12 KiB behind: within the allowance.
        assert_eq!(take(&mut slow, 3).await.len(), 3);
        // Writes to another cluster do not count against it.
        for i in 0..20 {
            cache
                .create(&format!("/g/r/c2/ns/{i}"), sized(4096))
                .await
                .unwrap();
        }
        cache.create("/g/r/c1/ns/small", sized(10)).await.unwrap();
        assert_eq!(next(&mut slow).await.unwrap().value.len(), 10);
        for i in 0..5 {
            cache
                .create(&format!("/g/r/c1/ns/more-{i}"), sized(4096))
                .await
                .unwrap();
        }
        let err = next(&mut slow).await.err();
        assert!(matches!(err, Some(StorageError::TooSlow { .. })), "{err:?}");
    }

    /// A watcher's feed does not depend on the window: one behind by more events than the
    /// window keeps, but within its allowance, gets every event.
    #[tokio::test]
    async fn a_watcher_within_its_allowance_gets_events_the_window_dropped() {
        let (_, cache) = cached(options(4, 1000));
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        let mut across = cache.watch("/g/r/", start).await.unwrap();
        let mut one = cache.watch("/g/r/c1/", start).await.unwrap();
        let mut written = Vec::new();
        for i in 0..10 {
            let kv = cache
                .create(&format!("/g/r/c1/ns/{i}"), tagged("v"))
                .await
                .unwrap();
            written.push(kv.mod_revision);
        }
        assert!(cache.catch_up().await.unwrap());
        for w in [&mut across, &mut one] {
            let got: Vec<_> = take(w, 10).await.iter().map(|e| e.revision).collect();
            assert_eq!(got, written);
        }
    }

    /// A feed holds what its slowest watcher has not read, at most the allowance; a watcher
    /// beyond it is cut off; the last watcher of a cluster takes the cluster's feed with it.
    #[tokio::test]
    async fn a_feed_holds_only_what_its_watchers_may_still_read() {
        let (_, cache) = cached(options(8, 10));
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        let mut c1 = Vec::new();
        for _ in 0..3 {
            c1.push(cache.watch("/g/r/c1/", start).await.unwrap());
        }
        let mut c2 = cache.watch("/g/r/c2/ns/", start).await.unwrap();
        let write = |i: usize| {
            let cache = cache.clone();
            async move {
                let cluster = if i.is_multiple_of(2) { "c1" } else { "c2" };
                cache
                    .create(&format!("/g/r/{cluster}/ns/{i}"), tagged("v"))
                    .await
                    .unwrap();
            }
        };
        for i in 0..6 {
            write(i).await;
        }
        assert!(cache.catch_up().await.unwrap());
        let tc = cache.type_cache("/g/r/").await.unwrap();
        let held = |cluster: &str| read(&tc.state).clusters[cluster].entries.len();
        assert_eq!((held("c1"), held("c2")), (3, 3), "nobody has read yet");
        for w in &mut c1 {
            assert_eq!(take(w, 3).await.len(), 3);
        }
        write(6).await;
        assert!(cache.catch_up().await.unwrap());
        assert_eq!(held("c1"), 1, "only the event nobody has read");
        for i in 7..40 {
            write(i).await;
        }
        assert!(cache.catch_up().await.unwrap());
        assert_eq!(
            held("c2"),
            10,
            "the allowance, for a watcher that does not read"
        );
        let err = next(&mut c2).await.err();
        assert!(matches!(err, Some(StorageError::TooSlow { .. })), "{err:?}");
        drop(c2);
        assert!(!read(&tc.state).clusters.contains_key("c2"));
        c1.truncate(1);
        assert_eq!(read(&tc.state).clusters["c1"].readers.len(), 1);
        drop(c1);
        assert!(read(&tc.state).clusters.is_empty());
    }

    #[tokio::test]
    async fn watchers_share_one_encoding_per_event() {
        let (_, cache) = cached(CacheOptions::default());
        load(&cache, "/g/r/").await;
        let start = cache.current_revision();
        let mut a = cache.watch("/g/r/", start).await.unwrap();
        let mut b = cache.watch("/g/r/c1/", start).await.unwrap();
        cache.create("/g/r/c1/ns/x", tagged("v")).await.unwrap();
        let (ea, eb) = (next(&mut a).await.unwrap(), next(&mut b).await.unwrap());
        let encodings = AtomicUsize::new(0);
        let encode = || {
            encodings.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(bytes::Bytes::from_static(b"frame"))
        };
        assert_eq!(
            ea.memo.frame(0, encode),
            Ok(bytes::Bytes::from_static(b"frame"))
        );
        assert_eq!(
            eb.memo.frame(0, encode),
            Ok(bytes::Bytes::from_static(b"frame"))
        );
        assert_eq!(encodings.load(Ordering::SeqCst), 1);
    }

    /// Two replicas, each with its own cache, on one etcd: a list on one sees every write the
    /// other acknowledged, and watches on one see the other's writes in order.
    #[cfg(feature = "etcd")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_on_one_etcd_read_each_others_writes() {
        let etcd = crate::storage::etcd::testing::EtcdProcess::start()
            .await
            .unwrap();
        let a = CachedStore::new(
            Arc::new(etcd.store("/pm").await.unwrap()),
            CacheOptions::default(),
        );
        let b = CachedStore::new(
            Arc::new(etcd.store("/pm").await.unwrap()),
            CacheOptions::default(),
        );
        let listing = |prefix: &'static str| ListOptions {
            prefix,
            ..Default::default()
        };
        b.list(listing("/g/r/")).await.unwrap();
        let start = b.current_revision();
        let mut watch_b = b.watch("/g/r/c1/", start).await.unwrap();
        let mut written = Vec::new();
        for i in 0..20 {
            let key = format!("/g/r/c1/ns/{i:02}");
            let kv = a.create(&key, tagged("v")).await.unwrap();
            // Read-your-writes across replicas: B's list right after A's acknowledgement.
            let page = b.list(listing("/g/r/c1/")).await.unwrap();
            assert_eq!(
                page.items.last(),
                Some(&kv),
                "write {i} missing on the other replica"
            );
            written.push(kv.mod_revision);
        }
        let seen: Vec<_> = take(&mut watch_b, 20)
            .await
            .iter()
            .map(|e| e.revision)
            .collect();
        assert_eq!(seen, written);
    }

    #[test]
    fn key_parts() {
        assert_eq!(type_prefix("/g/r/c/ns/n"), Some("/g/r/"));
        assert_eq!(type_prefix("//configmaps/root/"), Some("//configmaps/"));
        assert_eq!(type_prefix("/g/r/"), Some("/g/r/"));
        assert_eq!(type_prefix("/g/r"), None);
        assert_eq!(type_prefix(""), None);
        assert_eq!(type_prefix("g/r/c/"), None);
        assert_eq!(cluster_of("/g/r/c1/ns/n", "/g/r/"), Some("c1"));
        assert_eq!(cluster_of("/g/r/c1/", "/g/r/"), Some("c1"));
        assert_eq!(cluster_of("/g/r/c1", "/g/r/"), None);
        assert_eq!(cluster_of("/g/r/", "/g/r/"), None);
    }
}
