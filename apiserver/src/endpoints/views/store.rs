//! A view as a read-only [`Store`]: keys `/<group>/<plural>/<cluster>/<name>`, whose values are
//! computed at the revision asked for. A list at a past revision computes the view at that
//! revision; a watch computes it at its start and then again after every change of what views
//! are made from (bindings, exports, ContentConfigurations, ProviderMetadata), sending the
//! difference as events at the revision of the change.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::FutureExt;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::json;

use super::{ViewKind, Views};
use crate::registry::objects::meta_mut;
use crate::storage::{
    check_revision, Encoder, Event, EventType, KeyValue, ListOptions, ListPage, Memo, Revision,
    StorageError, Store,
};

/// Where a change may alter a view.
const SOURCES: &[&str] = &[
    "/apis.kcp.io/apibindings/",
    "/apis.kcp.io/apiexports/",
    "/ui.platform-mesh.io/",
];

fn is_source(key: &str) -> bool {
    SOURCES.iter().any(|p| key.starts_with(p))
}

/// Events taken together before a view is computed again.
const EVENT_BATCH: usize = 1024;

/// One view served as a store.
pub struct ViewStore {
    views: Arc<Views>,
    kind: ViewKind,
    /// `/<group>/<plural>/`: the keys of every cluster's view.
    prefix: String,
}

/// A view's objects by key.
pub(super) type Keyed = BTreeMap<String, KeyValue>;

fn read_only() -> StorageError {
    StorageError::Backend("a virtual workspace view is read-only".into())
}

impl ViewStore {
    /// The store of view `kind`.
    pub fn new(views: Arc<Views>, kind: ViewKind) -> Self {
        let api = views.api(kind);
        let prefix = api
            .registry
            .resources()
            .first()
            .map(|r| r.all_clusters_prefix().to_string())
            .unwrap_or_default();
        ViewStore {
            views,
            kind,
            prefix,
        }
    }

    /// The cluster a key or a one-cluster prefix addresses.
    fn cluster_of<'a>(&self, key: &'a str) -> Result<&'a str, StorageError> {
        key.strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.split('/').next())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                StorageError::Backend(format!(
                    "a {} view is computed for one workspace, not for {key:?}",
                    self.kind.as_str()
                ))
            })
    }

    /// The view of `cluster` at `at`, each object with its own resourceVersion.
    async fn contents(&self, cluster: &str, at: Revision) -> Result<Arc<Keyed>, StorageError> {
        let cache_key = (self.kind, cluster.to_string(), at);
        if let Some(hit) = self.views.remembered(&cache_key) {
            return Ok(hit);
        }
        // One computation at a time: many watchers woken by one change (or many requests at
        // once) wait for the first to compute and take its result, instead of computing it again
        // each, so a tenant's watches cannot multiply the server's work.
        let _turn = self.views.computing.lock().await;
        if let Some(hit) = self.views.remembered(&cache_key) {
            return Ok(hit);
        }
        let computed = self.views.compute(self.kind, cluster, at).await?;
        let keyed: Keyed = computed
            .into_iter()
            .map(|(name, c)| {
                let key = format!("{}{cluster}/{name}", self.prefix);
                let kv = KeyValue {
                    key: key.as_str().into(),
                    value: c.value,
                    create_revision: c.revision,
                    mod_revision: c.revision,
                };
                (key, kv)
            })
            .collect();
        let keyed = Arc::new(keyed);
        self.views.remember(cache_key, keyed.clone());
        Ok(keyed)
    }

    fn base(&self) -> &dyn Store {
        self.views.store.as_ref()
    }
}

/// The events that turn view `old` into view `new` at revision `at`; changed objects carry `at`
/// as their resourceVersion, so a client resuming from any event's object misses nothing.
fn difference(old: &Keyed, new: &Keyed, at: Revision) -> Vec<Event> {
    let restamp = |kv: &KeyValue| -> Bytes {
        let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&kv.value) else {
            return kv.value.clone();
        };
        meta_mut(&mut v).insert("resourceVersion".into(), json!(at.to_string()));
        Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
    };
    let event = |kind, key: &str, value, prev_value| Event {
        kind,
        key: key.into(),
        value,
        prev_value,
        revision: at,
        memo: Memo::default(),
    };
    let mut out = Vec::new();
    for (key, kv) in new {
        match old.get(key) {
            None => out.push(event(EventType::Create, key, restamp(kv), None)),
            Some(before) if before.value != kv.value => out.push(event(
                EventType::Update,
                key,
                restamp(kv),
                Some(before.value.clone()),
            )),
            Some(_) => {}
        }
    }
    for (key, before) in old {
        if !new.contains_key(key) {
            out.push(event(
                EventType::Delete,
                key,
                restamp(before),
                Some(before.value.clone()),
            ));
        }
    }
    out
}

#[async_trait::async_trait]
impl Store for ViewStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let cluster = self.cluster_of(key)?;
        let at = self.base().current_revision();
        Ok(self.contents(cluster, at).await?.get(key).cloned())
    }

    async fn list(&self, opts: ListOptions<'_>) -> Result<ListPage, StorageError> {
        let cluster = self.cluster_of(opts.prefix)?;
        let current = self.base().current_revision();
        let at = match opts.revision {
            Some(at) => {
                check_revision(at, self.base().compacted_revision(), current)?;
                at
            }
            None => current,
        };
        let contents = self.contents(cluster, at).await?;
        let start = match opts.start_after {
            Some(after) if after >= opts.prefix => std::ops::Bound::Excluded(after),
            _ => std::ops::Bound::Included(opts.prefix),
        };
        let take = if opts.limit == 0 {
            usize::MAX
        } else {
            opts.limit + 1
        };
        let mut items: Vec<KeyValue> = contents
            .range::<str, _>((start, std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(opts.prefix))
            .take(take)
            .map(|(_, kv)| kv.clone())
            .collect();
        let more = opts.limit > 0 && items.len() > opts.limit;
        if more {
            items.truncate(opts.limit);
        }
        Ok(ListPage {
            items,
            revision: at,
            more,
        })
    }

    async fn create(&self, _key: &str, _encode: Encoder) -> Result<KeyValue, StorageError> {
        Err(read_only())
    }

    async fn update(
        &self,
        _key: &str,
        _expected: Revision,
        _encode: Encoder,
    ) -> Result<KeyValue, StorageError> {
        Err(read_only())
    }

    async fn delete(
        &self,
        _key: &str,
        _expected: Revision,
        _encode: Encoder,
    ) -> Result<Event, StorageError> {
        Err(read_only())
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event, StorageError>>, StorageError> {
        let cluster = self.cluster_of(prefix)?.to_string();
        // Start from the view as it was at `after`; the base watch then brings every change since.
        let changes = self.base().watch("/", after).await?;
        let start = self.contents(&cluster, after).await?;
        let me = ViewStore {
            views: self.views.clone(),
            kind: self.kind,
            prefix: self.prefix.clone(),
        };
        let state = (me, cluster, start, changes);
        let events = stream::unfold(state, |(me, cluster, mut seen, mut changes)| async move {
            loop {
                let first = match changes.next().await? {
                    Ok(e) => e,
                    Err(e) => return Some((vec![Err(e)], (me, cluster, seen, changes))),
                };
                let mut last = first.revision;
                let mut relevant = is_source(&first.key);
                // Whatever else is ready joins this event: one computation for all of them.
                for _ in 1..EVENT_BATCH {
                    match changes.next().now_or_never() {
                        Some(Some(Ok(e))) => {
                            last = e.revision;
                            relevant |= is_source(&e.key);
                        }
                        Some(Some(Err(e))) => {
                            return Some((vec![Err(e)], (me, cluster, seen, changes)))
                        }
                        Some(None) | None => break,
                    }
                }
                if !relevant {
                    continue;
                }
                let now = match me.contents(&cluster, last).await {
                    Ok(now) => now,
                    Err(e) => return Some((vec![Err(e)], (me, cluster, seen, changes))),
                };
                let out = difference(&seen, &now, last);
                seen = now;
                if !out.is_empty() {
                    return Some((
                        out.into_iter().map(Ok).collect(),
                        (me, cluster, seen, changes),
                    ));
                }
            }
        })
        .flat_map(stream::iter);
        Ok(events.boxed())
    }

    async fn compact(&self, _revision: Revision) -> Result<(), StorageError> {
        Ok(())
    }

    fn current_revision(&self) -> Revision {
        self.base().current_revision()
    }

    async fn latest_revision(&self) -> Result<Revision, StorageError> {
        self.base().latest_revision().await
    }

    fn revision_is_local(&self) -> bool {
        self.base().revision_is_local()
    }

    fn compacted_revision(&self) -> Revision {
        self.base().compacted_revision()
    }
}
