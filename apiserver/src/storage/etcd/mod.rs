//! The etcd backend: the store on an etcd cluster (v3 API), as kube-apiserver and kcp keep theirs.
//!
//! - A revision is etcd's revision, so `resourceVersion`s match what `etcdctl` shows. Revisions
//!   strictly increase; they step by one only while nothing else writes to the same etcd.
//! - Keys live under a configurable prefix, so several servers (or a kcp) can share one etcd.
//! - Writes are compare-and-swap transactions on the key's mod revision.
//! - Objects carry their own `resourceVersion`: see [`envelope`].
//! - A delete whose final state is the stored state is one transaction. When the caller's final
//!   state differs (say, the last finalizer removed), the final state is written first and then
//!   deleted, so every watcher sees the same final object: two revisions instead of one.
//! - Watches resume after a broken stream (etcd restart, lost connection) from the last revision
//!   they delivered, without gap or duplicate; if that revision was compacted meanwhile they end
//!   with [`StorageError::Compacted`].
//! - The compacted revision is shared by every replica through etcd itself: each one learns it
//!   at start and from the errors etcd returns.

mod envelope;
#[cfg(test)]
mod faults;
pub mod testing;
mod tls;

pub use self::tls::EtcdTls;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType as EtcdEventType, GetOptions, PutOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use futures::stream::{self, BoxStream, StreamExt};

use self::envelope::{restore, Envelope};
use super::{
    start_bound, Encoder, Event, EventType, KeyValue, ListOptions, ListPage, Result, Revision,
    StorageError, Store,
};
use std::ops::Bound;

/// How to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Prepended to every key, e.g. `/platform-mesh`. May be empty.
    pub prefix: String,
    /// Limit on one request (a watch is not a request).
    pub request_timeout: Duration,
    /// How long a broken watch keeps trying to resume before it ends with an error.
    pub watch_resume_for: Duration,
    /// TLS towards `https://` endpoints.
    pub tls: Option<EtcdTls>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/platform-mesh".into(),
            request_timeout: Duration::from_secs(10),
            watch_resume_for: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// A store on etcd. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    options: EtcdOptions,
    /// The highest revision seen in any response.
    current: AtomicU64,
    /// The highest compacted revision known.
    compacted: AtomicU64,
}

/// Maps an etcd client error.
fn failure(err: etcd_client::Error) -> StorageError {
    StorageError::Backend(format!("etcd: {err}"))
}

fn is_compacted(err: &etcd_client::Error) -> bool {
    err.to_string()
        .contains("required revision has been compacted")
}

fn is_future(err: &etcd_client::Error) -> bool {
    err.to_string()
        .contains("required revision is a future revision")
}

/// The first key after every key starting with `prefix`.
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd reads "\0" as "to the end".
    vec![0]
}

fn rev(r: i64) -> Revision {
    r.max(0) as Revision
}

impl EtcdStore {
    /// Connects and learns the current and compacted revisions.
    pub async fn connect(options: EtcdOptions) -> Result<Self> {
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = tls::client_config(&options)? {
            connect = connect.with_tls(tls);
        }
        let client = tokio::time::timeout(
            options.request_timeout,
            Client::connect(&options.endpoints, Some(connect)),
        )
        .await
        .map_err(|_| {
            StorageError::Backend(format!(
                "etcd: no answer from {} within {:?}",
                options.endpoints.join(","),
                options.request_timeout
            ))
        })?
        .map_err(failure)?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                prefix: options.prefix.clone(),
                options,
                current: AtomicU64::new(0),
                compacted: AtomicU64::new(0),
            }),
        };
        store.refresh_current().await?;
        store.refresh_compacted().await?;
        Ok(store)
    }

    fn full(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.inner.prefix.len() + key.len());
        k.extend_from_slice(self.inner.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// A key no object has (etcd refuses empty keys), for requests made only for their header.
    fn probe_key(&self) -> Vec<u8> {
        let mut k = self.full("");
        k.push(0);
        k
    }

    fn short(&self, key: &[u8]) -> Result<Arc<str>> {
        let rest = key
            .strip_prefix(self.inner.prefix.as_bytes())
            .ok_or_else(|| {
                StorageError::Backend("etcd returned a key outside the prefix".into())
            })?;
        std::str::from_utf8(rest)
            .map(Arc::from)
            .map_err(|_| StorageError::Backend("etcd returned a key that is not UTF-8".into()))
    }

    fn saw(&self, header: Option<&etcd_client::ResponseHeader>) -> Revision {
        let r = header.map_or(0, |h| rev(h.revision()));
        self.inner.current.fetch_max(r, Ordering::AcqRel);
        r
    }

    fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue> {
        let mod_revision = rev(kv.mod_revision());
        Ok(KeyValue {
            key: self.short(kv.key())?,
            value: restore(kv.value(), mod_revision),
            create_revision: rev(kv.create_revision()),
            mod_revision,
        })
    }

    /// Reads etcd's current revision.
    async fn refresh_current(&self) -> Result<Revision> {
        let resp = self
            .inner
            .client
            .kv_client()
            .get(self.probe_key(), None)
            .await
            .map_err(failure)?;
        self.saw(resp.header());
        Ok(self.current_revision())
    }

    /// Learns the compacted revision: reading at revision 1 succeeds unless etcd was compacted,
    /// and then a watch from revision 1 is cancelled with the compacted revision.
    async fn refresh_compacted(&self) -> Result<Revision> {
        let probe = self
            .inner
            .client
            .kv_client()
            .get(self.probe_key(), Some(GetOptions::new().with_revision(1)))
            .await;
        match probe {
            Ok(_) => return Ok(self.compacted_revision()),
            Err(e) if is_compacted(&e) => {}
            Err(e) => return Err(failure(e)),
        }
        let mut watch = self
            .inner
            .client
            .watch_client()
            .watch(
                self.probe_key(),
                Some(WatchOptions::new().with_start_revision(1)),
            )
            .await
            .map_err(failure)?;
        let deadline = tokio::time::Instant::now() + self.inner.options.request_timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, watch.message())
                .await
                .map_err(|_| StorageError::Backend("etcd: compaction probe timed out".into()))?
                .map_err(failure)?;
            match msg {
                Some(resp) if resp.compact_revision() > 0 => {
                    let r = rev(resp.compact_revision());
                    self.inner.compacted.fetch_max(r, Ordering::AcqRel);
                    return Ok(self.compacted_revision());
                }
                Some(resp) if resp.canceled() => {
                    return Err(StorageError::Backend(format!(
                        "etcd: compaction probe cancelled: {}",
                        resp.cancel_reason()
                    )))
                }
                Some(_) => {}
                None => return Err(StorageError::Backend("etcd: compaction probe ended".into())),
            }
        }
    }

    async fn compacted_error(&self, requested: Revision) -> StorageError {
        let compacted = self
            .refresh_compacted()
            .await
            .unwrap_or_else(|_| self.compacted_revision());
        StorageError::Compacted {
            requested,
            compacted,
        }
    }

    async fn future_error(&self, requested: Revision) -> StorageError {
        let current = self
            .refresh_current()
            .await
            .unwrap_or_else(|_| self.current_revision());
        StorageError::FutureRevision { requested, current }
    }

    /// Runs a transaction; the revision it was answered at.
    async fn txn(&self, txn: Txn) -> Result<(Revision, etcd_client::TxnResponse)> {
        let resp = self
            .inner
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(failure)?;
        Ok((self.saw(resp.header()), resp))
    }

    /// Compare-and-swap put: `expected` of `None` means "must not exist".
    async fn put(&self, key: &str, expected: Option<Revision>, env: &Envelope) -> Result<KeyValue> {
        let k = self.full(key);
        let when = match expected {
            None => vec![Compare::create_revision(k.clone(), CompareOp::Equal, 0)],
            Some(e) => vec![
                Compare::version(k.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(k.clone(), CompareOp::Equal, e as i64),
            ],
        };
        // An update reads the create revision back from the previous value; a create has none.
        let put = expected.map(|_| PutOptions::new().with_prev_key());
        let txn = Txn::new()
            .when(when)
            .and_then(vec![TxnOp::put(k.clone(), env.stored().to_vec(), put)])
            .or_else(vec![TxnOp::get(k, None)]);
        let (revision, resp) = self.txn(txn).await?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            let create_revision = match ops.first() {
                Some(TxnOpResponse::Put(put)) => put
                    .prev_key()
                    .map_or(revision, |p| rev(p.create_revision())),
                _ => revision,
            };
            return Ok(KeyValue {
                key: Arc::from(key),
                value: env.at(revision),
                create_revision,
                mod_revision: revision,
            });
        }
        let found = match ops.first() {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| rev(kv.mod_revision())),
            _ => None,
        };
        Err(match (expected, found) {
            (None, _) => StorageError::AlreadyExists(key.to_string()),
            (Some(_), None) => StorageError::NotFound(key.to_string()),
            (Some(expected), Some(actual)) => StorageError::Conflict {
                key: key.to_string(),
                expected,
                actual,
            },
        })
    }

    /// Deletes `key` if it is at `expected` and stored exactly as `env`; `None` if it is at
    /// `expected` but stored differently.
    async fn delete_exact(
        &self,
        key: &str,
        expected: Revision,
        env: &Envelope,
    ) -> Result<Option<Event>> {
        let k = self.full(key);
        let txn = Txn::new()
            .when(vec![
                Compare::version(k.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(k.clone(), CompareOp::Equal, expected as i64),
                Compare::value(k.clone(), CompareOp::Equal, env.stored().to_vec()),
            ])
            .and_then(vec![TxnOp::delete(
                k.clone(),
                Some(etcd_client::DeleteOptions::new().with_prev_key()),
            )])
            .or_else(vec![TxnOp::get(k, None)]);
        let (revision, resp) = self.txn(txn).await?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            return Ok(Some(Event {
                kind: EventType::Delete,
                key: Arc::from(key),
                value: env.at(revision),
                prev_value: Some(env.at(expected)),
                revision,
                memo: Default::default(),
            }));
        }
        let found = match ops.first() {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
            _ => None,
        };
        match found {
            None => Err(StorageError::NotFound(key.to_string())),
            Some(kv) if rev(kv.mod_revision()) != expected => Err(StorageError::Conflict {
                key: key.to_string(),
                expected,
                actual: rev(kv.mod_revision()),
            }),
            Some(_) => Ok(None),
        }
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self
            .inner
            .client
            .kv_client()
            .get(self.full(key), None)
            .await
            .map_err(failure)?;
        self.saw(resp.header());
        resp.kvs().first().map(|kv| self.key_value(kv)).transpose()
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage> {
        if let Some(at) = opts.revision {
            if at < self.compacted_revision() {
                return Err(StorageError::Compacted {
                    requested: at,
                    compacted: self.compacted_revision(),
                });
            }
            if at == 0 {
                // Before the first write: nothing (etcd reads revision 0 as "latest").
                return Ok(ListPage::default());
            }
        }
        let from = match start_bound(opts.prefix, opts.start_after) {
            Bound::Excluded(after) => {
                let mut k = self.full(after);
                k.push(0);
                k
            }
            Bound::Included(k) => self.full(k),
            Bound::Unbounded => self.full(opts.prefix),
        };
        let mut get = GetOptions::new().with_range(range_end(&self.full(opts.prefix)));
        if opts.limit > 0 {
            get = get.with_limit(opts.limit as i64);
        }
        if let Some(at) = opts.revision {
            get = get.with_revision(at as i64);
        }
        let resp = match self.inner.client.kv_client().get(from, Some(get)).await {
            Ok(resp) => resp,
            Err(e) if is_compacted(&e) => {
                return Err(self.compacted_error(opts.revision.unwrap_or(0)).await)
            }
            Err(e) if is_future(&e) => {
                return Err(self.future_error(opts.revision.unwrap_or(0)).await)
            }
            Err(e) => return Err(failure(e)),
        };
        let read_at = self.saw(resp.header());
        let items = resp
            .kvs()
            .iter()
            .map(|kv| self.key_value(kv))
            .collect::<Result<Vec<_>>>()?;
        Ok(ListPage {
            items,
            revision: opts.revision.unwrap_or(read_at),
            more: resp.more(),
        })
    }

    async fn create(&self, key: &str, mut encode: Encoder) -> Result<KeyValue> {
        let env = Envelope::encode(&mut encode)?;
        self.put(key, None, &env).await
    }

    async fn update(&self, key: &str, expected: Revision, mut encode: Encoder) -> Result<KeyValue> {
        let env = Envelope::encode(&mut encode)?;
        self.put(key, Some(expected), &env).await
    }

    async fn delete(&self, key: &str, expected: Revision, mut encode: Encoder) -> Result<Event> {
        let env = Envelope::encode(&mut encode)?;
        if let Some(event) = self.delete_exact(key, expected, &env).await? {
            return Ok(event);
        }
        // The final state differs from the stored one: store it, then delete it.
        let written = self.put(key, Some(expected), &env).await?;
        self.delete_exact(key, written.mod_revision, &env)
            .await?
            .ok_or_else(|| StorageError::Conflict {
                key: key.to_string(),
                expected: written.mod_revision,
                actual: written.mod_revision,
            })
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let compacted = self.compacted_revision();
        if after < compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted,
            });
        }
        let mut st = WatchState {
            store: self.clone(),
            prefix: self.full(prefix),
            last: after,
            stream: None,
            buffered: VecDeque::new(),
            done: false,
        };
        st.stream = Some(st.open().await?);
        Ok(stream::unfold(st, WatchState::next).boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if revision <= self.compacted_revision() {
            return Ok(());
        }
        match self
            .inner
            .client
            .kv_client()
            .compact(revision as i64, None)
            .await
        {
            Ok(resp) => {
                self.saw(resp.header());
                self.inner.compacted.fetch_max(revision, Ordering::AcqRel);
                Ok(())
            }
            // Another replica got there first.
            Err(e) if is_compacted(&e) => {
                self.refresh_compacted().await?;
                Ok(())
            }
            Err(e) if is_future(&e) => Err(self.future_error(revision).await),
            Err(e) => Err(failure(e)),
        }
    }

    fn current_revision(&self) -> Revision {
        self.inner.current.load(Ordering::Acquire)
    }

    fn compacted_revision(&self) -> Revision {
        self.inner.compacted.load(Ordering::Acquire)
    }

    fn revision_is_local(&self) -> bool {
        false
    }

    async fn latest_revision(&self) -> Result<Revision> {
        self.refresh_current().await
    }
}

/// One watch: an etcd watch stream, re-opened from the last delivered revision when it breaks.
struct WatchState {
    store: EtcdStore,
    prefix: Vec<u8>,
    /// The last revision delivered (or the starting point).
    last: Revision,
    stream: Option<WatchStream>,
    buffered: VecDeque<Event>,
    done: bool,
}

impl WatchState {
    /// Opens an etcd watch for the revisions after `last` and waits until etcd confirms it.
    async fn open(&self) -> Result<WatchStream> {
        let options = WatchOptions::new()
            .with_range(range_end(&self.prefix))
            .with_start_revision(self.last as i64 + 1)
            .with_prev_key()
            .with_progress_notify();
        let inner = &self.store.inner;
        let mut watch = tokio::time::timeout(
            inner.options.request_timeout,
            inner
                .client
                .watch_client()
                .watch(self.prefix.clone(), Some(options)),
        )
        .await
        .map_err(|_| StorageError::Backend("etcd: watch not created in time".into()))?
        .map_err(failure)?;
        let first = tokio::time::timeout(inner.options.request_timeout, watch.message())
            .await
            .map_err(|_| StorageError::Backend("etcd: watch not confirmed in time".into()))?
            .map_err(failure)?;
        match first {
            Some(resp) if resp.compact_revision() > 0 => {
                let compacted = rev(resp.compact_revision());
                inner.compacted.fetch_max(compacted, Ordering::AcqRel);
                Err(StorageError::Compacted {
                    requested: self.last,
                    compacted,
                })
            }
            Some(resp) if resp.canceled() => Err(StorageError::Backend(format!(
                "etcd: watch cancelled: {}",
                resp.cancel_reason()
            ))),
            Some(_) => Ok(watch),
            None => Err(StorageError::Backend("etcd: watch stream closed".into())),
        }
    }

    /// Re-opens a broken watch, retrying until `watch_resume_for` has passed.
    async fn resume(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.store.inner.options.watch_resume_for;
        let mut pause = Duration::from_millis(50);
        loop {
            match self.open().await {
                Ok(stream) => {
                    self.stream = Some(stream);
                    return Ok(());
                }
                Err(e @ StorageError::Compacted { .. }) => return Err(e),
                Err(e) if tokio::time::Instant::now() + pause > deadline => {
                    return Err(StorageError::Backend(format!(
                        "etcd: watch could not be resumed after revision {}: {e}",
                        self.last
                    )))
                }
                Err(e) => {
                    tracing::debug!(error = %e, after = self.last, "resuming etcd watch");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    fn convert(&self, ev: &etcd_client::Event) -> Result<Option<Event>> {
        let Some(kv) = ev.kv() else { return Ok(None) };
        let revision = rev(kv.mod_revision());
        let key = self.store.short(kv.key())?;
        let prev = ev.prev_kv();
        let prev_value = prev.map(|p| restore(p.value(), rev(p.mod_revision())));
        let event = match ev.event_type() {
            EtcdEventType::Put => Event {
                kind: if kv.version() == 1 {
                    EventType::Create
                } else {
                    EventType::Update
                },
                key,
                value: restore(kv.value(), revision),
                prev_value,
                revision,
                memo: Default::default(),
            },
            EtcdEventType::Delete => Event {
                kind: EventType::Delete,
                key,
                value: prev.map_or_else(Bytes::new, |p| restore(p.value(), revision)),
                prev_value,
                revision,
                memo: Default::default(),
            },
        };
        Ok(Some(event))
    }

    async fn next(mut self) -> Option<(Result<Event>, Self)> {
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Some((Ok(event), self));
            }
            if self.done {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Err(e) = self.resume().await {
                    self.done = true;
                    return Some((Err(e), self));
                }
                continue;
            };
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.compact_revision() > 0 {
                        let compacted = rev(resp.compact_revision());
                        self.store
                            .inner
                            .compacted
                            .fetch_max(compacted, Ordering::AcqRel);
                        self.done = true;
                        let err = StorageError::Compacted {
                            requested: self.last,
                            compacted,
                        };
                        return Some((Err(err), self));
                    }
                    if resp.canceled() {
                        self.stream = None;
                        continue;
                    }
                    self.store.saw(resp.header());
                    for ev in resp.events() {
                        match self.convert(ev) {
                            Ok(Some(event)) if event.revision > self.last => {
                                self.last = event.revision;
                                self.buffered.push_back(event);
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "skipping an etcd watch event"),
                        }
                    }
                }
                Ok(None) | Err(_) => self.stream = None,
            }
        }
    }
}
