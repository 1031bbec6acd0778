//! Shared watch caches: one list+watch per (endpoint, resource type), kept in memory by
//! cluster, feeding every subscribed controller; stopped when its last user goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, warn};

use super::cluster::{CacheSource, Cluster};
use super::request::{ClusterName, ResourceKind};

/// Failures reading from a cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache did not finish its initial list in time.
    #[error("cache of {gvr} for cluster {cluster} did not sync in time")]
    NotSynced {
        /// The watched resource.
        gvr: String,
        /// The cluster asked about.
        cluster: String,
    },
    /// A cached object does not fit the requested type.
    #[error("cached object does not decode: {0}")]
    Decode(String),
    /// The request's object was asked of a context whose controller has no primary kind.
    #[error("controller {0} has no primary kind to read the request's object from")]
    NoPrimary(String),
}

/// A change a cache saw, delivered to the subscribers of the object's cluster.
#[derive(Clone, Debug)]
pub enum CacheEvent {
    /// The object was added or changed (or listed when subscribing).
    Applied(Arc<DynamicObject>),
    /// The object was deleted; this is its last known state.
    Deleted(Arc<DynamicObject>),
}

impl CacheEvent {
    /// The object of the event.
    pub fn object(&self) -> &Arc<DynamicObject> {
        match self {
            CacheEvent::Applied(o) | CacheEvent::Deleted(o) => o,
        }
    }
}

/// Namespace and name of a cached object.
type ObjectKey = (Option<String>, String);

/// How objects are assigned to clusters.
#[derive(Clone, Debug)]
enum Assignment {
    /// Every object belongs to this cluster.
    Fixed(ClusterName),
    /// This annotation of each object names its cluster.
    ByAnnotation(Arc<str>),
}

impl Assignment {
    fn cluster_of(&self, obj: &DynamicObject) -> Option<ClusterName> {
        match self {
            Assignment::Fixed(c) => Some(c.clone()),
            Assignment::ByAnnotation(annotation) => obj
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotation.as_ref()))
                .filter(|c| !c.is_empty())
                .map(ClusterName::new),
        }
    }
}

/// Called with each event of one cluster, under the cache's lock (so it must not call back into
/// the cache); returns whether it still wants events.
type Handler = Box<dyn Fn(&CacheEvent) -> bool + Send + Sync>;

/// A cached object as compact JSON. A parsed `DynamicObject` costs several times its JSON in
/// small allocations (every map, string and option of its metadata and body); the cache holds
/// every object of every engaged cluster, so it keeps the bytes and parses on read. Readers get
/// a fresh `Arc<DynamicObject>`; events carry the object already parsed.
#[derive(Clone, PartialEq, Eq)]
struct Packed(Box<[u8]>);

impl Packed {
    fn pack(obj: &DynamicObject) -> Option<Packed> {
        match serde_json::to_vec(obj) {
            Ok(bytes) => Some(Packed(bytes.into_boxed_slice())),
            Err(e) => {
                warn!(name = ?obj.metadata.name, error = %e, "object does not encode; not cached");
                None
            }
        }
    }

    fn unpack(&self) -> Option<Arc<DynamicObject>> {
        match serde_json::from_slice(&self.0) {
            Ok(obj) => Some(Arc::new(obj)),
            Err(e) => {
                warn!(error = %e, "cached object does not decode");
                None
            }
        }
    }
}

/// The objects of one cluster by namespace and name.
type Objects = HashMap<ObjectKey, Packed>;

#[derive(Default)]
struct Store {
    objects: HashMap<ClusterName, Objects>,
    subscribers: HashMap<ClusterName, Vec<(u64, Handler)>>,
    next_subscriber: u64,
}

impl Store {
    fn add_subscriber(&mut self, cluster: &ClusterName, handler: Handler) -> u64 {
        self.next_subscriber += 1;
        let id = self.next_subscriber;
        self.subscribers
            .entry(cluster.clone())
            .or_default()
            .push((id, handler));
        id
    }

    fn remove_subscriber(&mut self, cluster: &ClusterName, id: u64) {
        if let Some(subs) = self.subscribers.get_mut(cluster) {
            subs.retain(|(i, _)| *i != id);
            if subs.is_empty() {
                self.subscribers.remove(cluster);
            }
        }
    }

    fn notify(&mut self, cluster: &ClusterName, event: CacheEvent) {
        if let Some(subs) = self.subscribers.get_mut(cluster) {
            subs.retain(|(_, handler)| handler(&event));
            if subs.is_empty() {
                self.subscribers.remove(cluster);
            }
        }
    }

    fn apply(&mut self, cluster: ClusterName, obj: Arc<DynamicObject>) {
        let Some(packed) = Packed::pack(&obj) else {
            return;
        };
        self.objects
            .entry(cluster.clone())
            .or_default()
            .insert(object_key(&obj), packed);
        self.notify(&cluster, CacheEvent::Applied(obj));
    }

    fn delete(&mut self, cluster: ClusterName, obj: Arc<DynamicObject>) {
        let key = object_key(&obj);
        if let Some(objs) = self.objects.get_mut(&cluster) {
            objs.remove(&key);
            if objs.is_empty() {
                self.objects.remove(&cluster);
            }
        }
        // The deletion carries the newest state of the object.
        self.notify(&cluster, CacheEvent::Deleted(obj));
    }

    /// Replaces everything after a (re)list: what vanished is deleted, what changed applied.
    /// An object listed again with the same bytes is unchanged (its resourceVersion is in them).
    fn replace(&mut self, listed: HashMap<ClusterName, Objects>) {
        let old = std::mem::take(&mut self.objects);
        for (cluster, objs) in &old {
            for (key, packed) in objs {
                let still = listed.get(cluster).is_some_and(|m| m.contains_key(key));
                if !still {
                    if let Some(obj) = packed.unpack() {
                        self.notify(cluster, CacheEvent::Deleted(obj));
                    }
                }
            }
        }
        for (cluster, objs) in &listed {
            for (key, packed) in objs {
                let unchanged = old
                    .get(cluster)
                    .and_then(|m| m.get(key))
                    .is_some_and(|prev| prev == packed);
                if !unchanged {
                    if let Some(obj) = packed.unpack() {
                        self.notify(cluster, CacheEvent::Applied(obj));
                    }
                }
            }
        }
        self.objects = listed;
    }
}

/// The form an object is kept in: without `metadata.managedFields`, which is often the larger
/// part of an object and which controllers read from the API when they need it (the cache
/// transform controller-runtime and kube-rs recommend for memory).
fn cached(mut obj: DynamicObject) -> Arc<DynamicObject> {
    obj.metadata.managed_fields = None;
    Arc::new(obj)
}

fn object_key(obj: &DynamicObject) -> ObjectKey {
    (
        obj.metadata.namespace.clone(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

struct CacheInner {
    kind: ResourceKind,
    scope: String,
    assignment: Assignment,
    store: RwLock<Store>,
    synced: watch::Sender<bool>,
}

/// One list+watch of a resource type at one endpoint, with its objects by cluster. Dropping
/// the last handle stops the watch.
pub struct SharedCache {
    inner: Arc<CacheInner>,
    _stop: DropGuard,
}

impl SharedCache {
    /// The watched resource.
    pub fn kind(&self) -> &ResourceKind {
        &self.inner.kind
    }

    /// Where the watch runs (a cluster instance or a wildcard endpoint).
    pub fn scope(&self) -> &str {
        &self.inner.scope
    }

    /// Registers for the events of `cluster` and returns the objects it has now; both under one
    /// lock, so nothing is missed or seen twice.
    pub fn subscribe(
        &self,
        cluster: &ClusterName,
    ) -> (mpsc::UnboundedReceiver<CacheEvent>, Vec<Arc<DynamicObject>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut store = self.inner.store.write().unwrap_or_else(|p| p.into_inner());
        store.add_subscriber(cluster, Box::new(move |e| tx.send(e.clone()).is_ok()));
        let snapshot = store
            .objects
            .get(cluster)
            .map(|m| m.values().filter_map(Packed::unpack).collect())
            .unwrap_or_default();
        (rx, snapshot)
    }

    /// Calls `handler` with every object `cluster` has now (as `Applied`) and then with each
    /// event of that cluster until the returned subscription drops. No task or channel per
    /// subscriber: the cache's one watch calls the handlers of the event's cluster directly, under
    /// the cache's lock, so `handler` must be quick and must not use this cache.
    ///
    /// ```no_run
    /// # fn f(cache: std::sync::Arc<mc_runtime::SharedCache>) {
    /// use mc_runtime::{CacheEvent, ClusterName, SharedCache};
    /// let sub = SharedCache::subscribe_with(&cache, &ClusterName::from("a"), |e: &CacheEvent| {
    ///     println!("{:?}", e.object().metadata.name);
    /// });
    /// drop(sub); // no more calls
    /// # }
    /// ```
    pub fn subscribe_with(
        this: &Arc<SharedCache>,
        cluster: &ClusterName,
        handler: impl Fn(&CacheEvent) + Send + Sync + 'static,
    ) -> Subscription {
        let mut store = this.inner.store.write().unwrap_or_else(|p| p.into_inner());
        if let Some(objs) = store.objects.get(cluster) {
            for obj in objs.values().filter_map(Packed::unpack) {
                handler(&CacheEvent::Applied(obj));
            }
        }
        let id = store.add_subscriber(
            cluster,
            Box::new(move |e| {
                handler(e);
                true
            }),
        );
        Subscription {
            cache: this.clone(),
            cluster: cluster.clone(),
            id,
        }
    }

    /// One object of `cluster`.
    pub fn get(
        &self,
        cluster: &ClusterName,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Arc<DynamicObject>> {
        let store = self.inner.store.read().unwrap_or_else(|p| p.into_inner());
        store
            .objects
            .get(cluster)?
            .get(&(namespace.map(str::to_string), name.to_string()))?
            .unpack()
    }

    /// Objects of `cluster`, in one namespace or all.
    pub fn list(&self, cluster: &ClusterName, namespace: Option<&str>) -> Vec<Arc<DynamicObject>> {
        let store = self.inner.store.read().unwrap_or_else(|p| p.into_inner());
        store
            .objects
            .get(cluster)
            .map(|m| {
                m.iter()
                    .filter(|((ns, _), _)| namespace.is_none() || ns.as_deref() == namespace)
                    .filter_map(|(_, o)| o.unpack())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Clusters that have at least one object in the cache.
    pub fn clusters(&self) -> Vec<ClusterName> {
        let store = self.inner.store.read().unwrap_or_else(|p| p.into_inner());
        store.objects.keys().cloned().collect()
    }

    /// Whether the initial list finished.
    pub fn is_synced(&self) -> bool {
        *self.inner.synced.borrow()
    }

    /// Waits for the initial list, up to `timeout`; returns whether synced.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.synced.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

/// A registration made by [`SharedCache::subscribe_with`]; dropping it ends the calls. It keeps
/// the cache (and its watch) running.
pub struct Subscription {
    cache: Arc<SharedCache>,
    cluster: ClusterName,
    id: u64,
}

impl Subscription {
    /// The cache subscribed to.
    pub fn cache(&self) -> &Arc<SharedCache> {
        &self.cache
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.cache
            .inner
            .store
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove_subscriber(&self.cluster, self.id);
    }
}

/// The caches of a manager, shared per (scope, resource type) while anyone uses them.
#[derive(Clone, Default)]
pub struct CacheRegistry {
    caches: Arc<Mutex<HashMap<CacheKey, Weak<SharedCache>>>>,
}

/// Group, version, plural, and whether the cache holds metadata only.
type ResourceKindKey = (String, String, String, bool);
/// A cache's scope (cluster instance or wildcard endpoint) and resource.
type CacheKey = (String, ResourceKindKey);

impl CacheRegistry {
    /// The running cache of `kind` that serves `cluster`, started if there is none.
    pub fn get_or_start(&self, cluster: &Cluster, kind: &ResourceKind) -> Arc<SharedCache> {
        let (scope, client, assignment) = match cluster.cache_source() {
            CacheSource::Own => (
                format!("cluster/{}/{}", cluster.name(), cluster.instance()),
                cluster.client(),
                Assignment::Fixed(cluster.name().clone()),
            ),
            CacheSource::Wildcard {
                key,
                client,
                cluster_annotation,
            } => (
                key.clone(),
                client.clone(),
                Assignment::ByAnnotation(cluster_annotation.clone()),
            ),
        };
        let kind_key = (
            kind.api.group.clone(),
            kind.api.version.clone(),
            kind.api.plural.clone(),
            kind.metadata_only,
        );
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = caches
            .get(&(scope.clone(), kind_key.clone()))
            .and_then(Weak::upgrade)
        {
            return existing;
        }
        let cache = start_cache(scope.clone(), kind.clone(), client, assignment);
        caches.insert((scope, kind_key), Arc::downgrade(&cache));
        cache
    }

    /// How many caches are running.
    pub fn running(&self) -> usize {
        let caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.values().filter(|w| w.strong_count() > 0).count()
    }
}

fn start_cache(
    scope: String,
    kind: ResourceKind,
    client: kube::Client,
    assignment: Assignment,
) -> Arc<SharedCache> {
    let (synced, _) = watch::channel(false);
    let inner = Arc::new(CacheInner {
        kind: kind.clone(),
        scope,
        assignment,
        store: RwLock::new(Store::default()),
        synced,
    });
    let stop = CancellationToken::new();
    tokio::spawn(run_watch(inner.clone(), client, stop.clone()));
    Arc::new(SharedCache {
        inner,
        _stop: stop.drop_guard(),
    })
}

/// Pauses between attempts of a failing watch: from 0.8 s, doubling, at most 10 s.
struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_BACKOFF_FIRST,
        }
    }
}

const WATCH_BACKOFF_FIRST: Duration = Duration::from_millis(800);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(now)
    }
}

/// A metadata-only watch's event as the cache keeps objects: a DynamicObject with the
/// metadata and no content.
fn metadata_event(
    event: Event<PartialObjectMeta<DynamicObject>>,
    kind: &kube::discovery::ApiResource,
) -> Event<DynamicObject> {
    let object = |meta: PartialObjectMeta<DynamicObject>| {
        let mut obj = DynamicObject::new("", kind);
        obj.metadata = meta.metadata;
        obj
    };
    match event {
        Event::Apply(m) => Event::Apply(object(m)),
        Event::Delete(m) => Event::Delete(object(m)),
        Event::Init => Event::Init,
        Event::InitApply(m) => Event::InitApply(object(m)),
        Event::InitDone => Event::InitDone,
    }
}

/// Whether a watch failed because the server does not serve the kind (404 on its list).
fn not_served(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 404
    )
}

async fn run_watch(inner: Arc<CacheInner>, client: kube::Client, stop: CancellationToken) {
    let gvr = inner.kind.gvr();
    debug!(gvr = %gvr, scope = %inner.scope, "cache started");
    let kind = inner.kind.api.clone();
    let stream = if inner.kind.metadata_only {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &kind);
        watcher(api, watcher::Config::default())
            .map_ok(move |event| metadata_event(event, &kind))
            .boxed()
    } else {
        let api: Api<DynamicObject> = Api::all_with(client, &kind);
        watcher(api, watcher::Config::default()).boxed()
    };
    futures::pin_mut!(stream);
    let mut relist: Option<HashMap<ClusterName, Objects>> = None;
    // Pauses between failed attempts, from 0.8 s doubling to 10 s (not kube-runtime's 30 s: a
    // kind whose CRD is installed later, such as Flux, OCM or Argo CD, is picked up soon after).
    // The watcher starts every attempt with `Init` before its list, so only what the server
    // answered (a listed object, the end of a list, an event) counts as working again: taking
    // `Init` as success would retry a 404 every 0.8 s and report it every time.
    let mut backoff = WatchBackoff::default();
    // A failing watch (e.g. a kind whose CRD is not installed yet) is reported once, then
    // retried quietly until it works again.
    let mut failing = false;
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break,
            next = stream.next() => next,
        };
        let event = match next {
            None => break,
            Some(Err(e)) => {
                if failing {
                    debug!(gvr = %gvr, scope = %inner.scope, error = %e, "watch still failing");
                } else if not_served(&e) {
                    // An optional kind (Flux, OCM, Argo CD) whose CRD is not installed: normal,
                    // said once, and picked up when it appears.
                    tracing::info!(
                        gvr = %gvr,
                        scope = %inner.scope,
                        "this kind is not served (its CRD is not installed); watched again quietly until it is"
                    );
                    failing = true;
                } else {
                    warn!(gvr = %gvr, scope = %inner.scope, error = %e, "watch failed; retrying with backoff");
                    failing = true;
                }
                let pause = backoff.next().unwrap_or(WATCH_BACKOFF_MAX);
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
                continue;
            }
            Some(Ok(Event::Init)) => Event::Init,
            Some(Ok(event)) => {
                if failing {
                    debug!(gvr = %gvr, scope = %inner.scope, "watch works again");
                }
                failing = false;
                backoff = WatchBackoff::default();
                event
            }
        };
        match event {
            Event::Init => relist = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let Some(cluster) = inner.assignment.cluster_of(&obj) {
                    let key = object_key(&obj);
                    if let Some(packed) = Packed::pack(&cached(obj)) {
                        relist
                            .get_or_insert_with(HashMap::new)
                            .entry(cluster)
                            .or_default()
                            .insert(key, packed);
                    }
                }
            }
            Event::InitDone => {
                let listed = relist.take().unwrap_or_default();
                inner
                    .store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(listed);
                inner.synced.send_replace(true);
            }
            Event::Apply(obj) => match inner.assignment.cluster_of(&obj) {
                Some(cluster) => inner
                    .store
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .apply(cluster, cached(obj)),
                None => {
                    debug!(gvr = %gvr, name = ?obj.metadata.name, "object without cluster annotation skipped")
                }
            },
            Event::Delete(obj) => {
                if let Some(cluster) = inner.assignment.cluster_of(&obj) {
                    inner
                        .store
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .delete(cluster, cached(obj));
                }
            }
        }
    }
    debug!(gvr = %gvr, scope = %inner.scope, "cache stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The annotation the tests' shared watches place objects by.
    const CLUSTER: &str = "example.com/cluster";

    fn obj(cluster: &str, ns: &str, name: &str, rv: &str) -> Arc<DynamicObject> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                             "annotations": {CLUSTER: cluster}}
            }))
            .unwrap(),
        )
    }

    fn channel(tx: mpsc::UnboundedSender<CacheEvent>) -> Handler {
        Box::new(move |e| tx.send(e.clone()).is_ok())
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<CacheEvent>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            let kind = match e {
                CacheEvent::Applied(_) => "applied",
                CacheEvent::Deleted(_) => "deleted",
            };
            out.push(format!(
                "{kind} {}",
                e.object().metadata.name.clone().unwrap_or_default()
            ));
        }
        out.sort();
        out
    }

    #[test]
    fn events_go_only_to_the_subscribers_of_the_objects_cluster() {
        let mut store = Store::default();
        let (tx_a, mut rx_a) = mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = mpsc::unbounded_channel();
        store.add_subscriber(&"a".into(), channel(tx_a));
        store.add_subscriber(&"b".into(), channel(tx_b));
        store.apply("a".into(), obj("a", "default", "x", "1"));
        store.delete("a".into(), obj("a", "default", "x", "2"));
        assert_eq!(drain(&mut rx_a), vec!["applied x", "deleted x"]);
        assert!(drain(&mut rx_b).is_empty());
        assert!(store.objects.is_empty(), "empty clusters are dropped");
    }

    #[test]
    fn relist_reports_vanished_and_changed_objects_only() {
        let mut store = Store::default();
        store.apply("a".into(), obj("a", "default", "keep", "1"));
        store.apply("a".into(), obj("a", "default", "change", "1"));
        store.apply("a".into(), obj("a", "default", "gone", "1"));
        let (tx, mut rx) = mpsc::unbounded_channel();
        store.add_subscriber(&"a".into(), channel(tx));
        let mut listed: HashMap<ClusterName, Objects> = HashMap::new();
        for o in [
            obj("a", "default", "keep", "1"),
            obj("a", "default", "change", "2"),
            obj("a", "default", "new", "3"),
        ] {
            listed
                .entry("a".into())
                .or_default()
                .insert(object_key(&o), Packed::pack(&o).unwrap());
        }
        store.replace(listed);
        assert_eq!(
            drain(&mut rx),
            vec!["applied change", "applied new", "deleted gone"]
        );
    }

    #[test]
    fn objects_are_placed_by_annotation_or_fixed_cluster() {
        let o = obj("root:x", "default", "n", "1");
        assert_eq!(
            Assignment::ByAnnotation(CLUSTER.into()).cluster_of(&o),
            Some(ClusterName::from("root:x"))
        );
        assert_eq!(
            Assignment::Fixed("mine".into()).cluster_of(&o),
            Some(ClusterName::from("mine"))
        );
        let bare: DynamicObject = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n"}}),
        )
        .unwrap();
        assert_eq!(
            Assignment::ByAnnotation(CLUSTER.into()).cluster_of(&bare),
            None
        );
    }

    #[test]
    fn packed_objects_read_back_as_applied() {
        let mut o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.io/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"a": "b"}, "managedFields": [{"manager": "m"}]},
            "spec": {"color": "red", "sizes": [1, 2.5, null]}
        }))
        .unwrap();
        let packed = Packed::pack(&cached(o.clone())).unwrap();
        o.metadata.managed_fields = None;
        assert_eq!(
            serde_json::to_value(&*packed.unpack().unwrap()).unwrap(),
            serde_json::to_value(&o).unwrap()
        );
        let mut store = Store::default();
        store.apply("a".into(), Arc::new(o));
        let back = store.objects[&ClusterName::from("a")][&(Some("ns".into()), "w".into())]
            .unpack()
            .unwrap();
        assert_eq!(back.data["spec"]["color"], "red");
    }

    #[test]
    fn closed_subscribers_are_pruned() {
        let mut store = Store::default();
        let (tx, rx) = mpsc::unbounded_channel();
        store.add_subscriber(&"a".into(), channel(tx));
        drop(rx);
        store.apply("a".into(), obj("a", "default", "x", "1"));
        assert!(store.subscribers.is_empty());
    }
}
