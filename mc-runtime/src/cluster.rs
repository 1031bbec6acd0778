//! An engaged cluster (its client, where its watches come from, its in-flight reconciles) and
//! the context a reconciler gets: the cluster's client, typed APIs and cached reads.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::NamespaceResourceScope;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::cache::{CacheError, CacheRegistry, SharedCache};
use super::request::{ClusterName, ResourceKind};

static INSTANCES: AtomicU64 = AtomicU64::new(1);

/// Where the watch caches of a cluster come from.
#[derive(Clone)]
pub enum CacheSource {
    /// One watch per type through the cluster's own client (kubeconfig clusters).
    Own,
    /// One wildcard watch per type shared by every cluster with the same `key` (an endpoint
    /// that serves the objects of many clusters at once); each object belongs to the cluster
    /// its `cluster_annotation` names.
    Wildcard {
        /// Identifies the shared watch endpoint, e.g. the wildcard URL.
        key: String,
        /// A client whose base URL is the wildcard endpoint.
        client: kube::Client,
        /// The annotation that names each object's cluster.
        cluster_annotation: Arc<str>,
    },
}

impl fmt::Debug for CacheSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheSource::Own => f.write_str("Own"),
            CacheSource::Wildcard { key, .. } => {
                f.debug_struct("Wildcard").field("key", key).finish()
            }
        }
    }
}

/// How a cluster's requests reach it.
enum ClusterClient {
    /// A client of its own (kubeconfig clusters).
    Own(kube::Client),
    /// A path prefix over a client shared by every cluster of the same endpoint. The handle is
    /// made on each use and not kept: a `kube::Client` carries a request buffer of about 10 KB,
    /// which at 10,000 clusters would be 100 MB for clients most clusters rarely use (their
    /// reads come from the shared caches).
    Scoped {
        shared: kube::Client,
        prefix: Arc<str>,
    },
}

/// One cluster as a provider reports it: a name, a client for reads and writes in it, and
/// where its watches come from.
///
/// ```no_run
/// # async fn f(client: kube::Client) {
/// use mc_runtime::Cluster;
/// let cluster = Cluster::new("a", client).with_fingerprint("sha-of-kubeconfig");
/// assert_eq!(cluster.name().as_str(), "a");
/// # }
/// ```
pub struct Cluster {
    name: ClusterName,
    client: ClusterClient,
    source: CacheSource,
    fingerprint: String,
    aliases: Vec<String>,
    instance: u64,
    in_flight: AtomicUsize,
    idle: Notify,
    /// Caches started on demand by cached reads, kept while the cluster is alive.
    retained: Mutex<HashMap<String, Arc<SharedCache>>>,
    /// Until when a sharded replica may start reconciles here (its fence's renew deadline);
    /// `None` when no fence guards the cluster.
    fence: Mutex<Option<tokio::time::Instant>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

impl Cluster {
    /// A cluster with its own watches through `client`.
    pub fn new(name: impl Into<ClusterName>, client: kube::Client) -> Self {
        Self::with_client(name.into(), ClusterClient::Own(client))
    }

    /// A cluster reached through `shared` (the client of its endpoint, one connection pool for
    /// all its clusters) with `prefix` (e.g. `/clusters/<name>`) in front of every path; see
    /// [`scoped_client`](super::client::scoped_client).
    ///
    /// ```no_run
    /// # fn f(shared: kube::Client) {
    /// use mc_runtime::Cluster;
    /// let cluster = Cluster::scoped("abc", shared, "/clusters/abc");
    /// # }
    /// ```
    pub fn scoped(name: impl Into<ClusterName>, shared: kube::Client, prefix: &str) -> Self {
        Self::with_client(
            name.into(),
            ClusterClient::Scoped {
                shared,
                prefix: Arc::from(prefix),
            },
        )
    }

    fn with_client(name: ClusterName, client: ClusterClient) -> Self {
        Cluster {
            name,
            client,
            source: CacheSource::Own,
            fingerprint: String::new(),
            aliases: Vec::new(),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            retained: Mutex::new(HashMap::new()),
            fence: Mutex::new(None),
        }
    }

    /// Watches come from a wildcard endpoint shared with other clusters; `cluster_annotation`
    /// names the annotation by which that endpoint tells each object's cluster.
    pub fn with_shared_cache(
        mut self,
        key: impl Into<String>,
        wildcard: kube::Client,
        cluster_annotation: &str,
    ) -> Self {
        self.source = CacheSource::Wildcard {
            key: key.into(),
            client: wildcard,
            cluster_annotation: Arc::from(cluster_annotation),
        };
        self
    }

    /// Sets what identifies this cluster's configuration (e.g. a kubeconfig hash): a provider
    /// re-engages a cluster only when it changes.
    pub fn with_fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.fingerprint = fingerprint.into();
        self
    }

    /// Adds another name the cluster is known by (e.g. a path in a hierarchy of clusters).
    pub fn with_alias(mut self, alias: impl Into<String>) -> Self {
        let alias = alias.into();
        if !alias.is_empty() && !self.aliases.contains(&alias) {
            self.aliases.push(alias);
        }
        self
    }

    /// Other names the cluster is known by.
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    /// The cluster's name.
    pub fn name(&self) -> &ClusterName {
        &self.name
    }

    /// The provider's fingerprint of the cluster's configuration.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A client for this cluster (cheap: for an endpoint's clusters, a path prefix over the
    /// endpoint's one connection pool; keep it for a reconcile, not for the cluster's lifetime).
    pub fn client(&self) -> kube::Client {
        match &self.client {
            ClusterClient::Own(client) => client.clone(),
            ClusterClient::Scoped { shared, prefix } => {
                super::client::scoped_client(shared, prefix)
            }
        }
    }

    /// Where this cluster's watches come from.
    pub fn cache_source(&self) -> &CacheSource {
        &self.source
    }

    /// A process-unique number of this cluster object (a re-engaged cluster gets a new one).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// A typed API for a namespaced kind in `namespace` of this cluster.
    pub fn namespaced<K>(&self, namespace: &str) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client(), namespace)
    }

    /// A typed API for a cluster-scoped kind, or a namespaced kind across namespaces (list and
    /// watch only).
    pub fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        Api::all(self.client())
    }

    /// A dynamic API for `api` in this cluster.
    pub fn dynamic_api(&self, api: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client(), ns, api),
            None => Api::all_with(self.client(), api),
        }
    }

    /// Lets reconciles start here only until `until` (`None`: no fence), as the sharding's
    /// fence renewals say: a replica whose renewals lag stops starting reconciles on its own,
    /// before another replica may take the cluster over.
    pub fn hold_fence_until(&self, until: Option<tokio::time::Instant>) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Whether a reconcile may start here now (see [`Cluster::hold_fence_until`]).
    pub fn fence_holds(&self) -> bool {
        self.fence
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|until| tokio::time::Instant::now() < until)
    }

    /// Marks a reconcile as running in this cluster until the guard drops.
    pub fn begin_reconcile(self: &Arc<Self>) -> ReconcileGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        ReconcileGuard {
            cluster: self.clone(),
        }
    }

    /// Reconciles running in this cluster now.
    pub fn reconciles_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no reconcile runs in this cluster or `deadline` passes; returns whether idle.
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.reconciles_in_flight() == 0 {
                return true;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => return self.reconciles_in_flight() == 0,
            }
        }
    }

    fn retain(&self, key: String, cache: Arc<SharedCache>) {
        self.retained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(cache);
    }
}

/// Held while a reconcile runs in a cluster (see [`Cluster::begin_reconcile`]).
pub struct ReconcileGuard {
    cluster: Arc<Cluster>,
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        if self.cluster.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.cluster.idle.notify_waiters();
        }
    }
}

/// What a reconciler gets with each request: the request's cluster, its client, and reads
/// from the shared watch caches of that cluster.
#[derive(Clone)]
pub struct ClusterContext {
    cluster: Arc<Cluster>,
    caches: CacheRegistry,
    controller: Arc<str>,
    sync_timeout: Duration,
    others: Option<crate::manager::Manager>,
    primary: Option<ResourceKind>,
}

impl ClusterContext {
    /// A context for `controller` reconciling in `cluster`.
    pub fn new(
        cluster: Arc<Cluster>,
        caches: CacheRegistry,
        controller: impl AsRef<str>,
        sync_timeout: Duration,
    ) -> Self {
        ClusterContext {
            cluster,
            caches,
            controller: Arc::from(controller.as_ref()),
            sync_timeout,
            others: None,
            primary: None,
        }
    }

    /// The same context for a controller whose requests name objects of `kind`
    /// ([`ClusterContext::requested_object`]).
    pub fn with_primary(mut self, kind: ResourceKind) -> Self {
        self.primary = Some(kind);
        self
    }

    /// The object a request names, as the controller's own watch cache holds it (without
    /// `metadata.managedFields`): what controller-runtime's client reads for a reconciler, with
    /// no request to the API server. `None` when the cache has no such object (it was deleted).
    /// The cache is the one the controller's events come from, so it has seen at least the
    /// change that queued the request.
    pub async fn requested_object(
        &self,
        req: &crate::request::Request,
    ) -> Result<Option<Arc<DynamicObject>>, CacheError> {
        let Some(kind) = &self.primary else {
            return Err(CacheError::NoPrimary(self.controller.to_string()));
        };
        let cache = self.cache(kind).await?;
        let namespace = req.namespace.as_deref().filter(|_| kind.namespaced);
        Ok(cache.get(self.cluster.name(), namespace, &req.name))
    }

    /// [`ClusterContext::requested_object`] as a typed object.
    pub async fn requested<K: DeserializeOwned>(
        &self,
        req: &crate::request::Request,
    ) -> Result<Option<K>, CacheError> {
        match self.requested_object(req).await? {
            Some(obj) => Ok(Some(decode(&obj)?)),
            None => Ok(None),
        }
    }

    /// The same context, able to reach the manager's other engaged clusters
    /// ([`ClusterContext::engaged_cluster`]).
    pub fn with_manager(mut self, manager: crate::manager::Manager) -> Self {
        self.others = Some(manager);
        self
    }

    /// Another engaged cluster, by name or by any other name the provider resolves (a path,
    /// for a provider that knows paths), as multicluster-runtime's `GetCluster`: a reconcile
    /// that writes into a second cluster reaches it through the same provider, so with the same
    /// credentials and the same route as its own. `None` when no such cluster is engaged (yet).
    pub fn engaged_cluster(&self, name: &str) -> Option<Arc<Cluster>> {
        if self.cluster.name().as_ref() == name {
            return Some(self.cluster.clone());
        }
        self.others.as_ref()?.cluster(name)
    }

    /// Another cluster to write into, as [`ClusterContext::engaged_cluster`], or, with a sharded
    /// provider, one that another replica engages: the group knows it, this replica only does
    /// not reconcile there. A parent's reconcile reaching its child's workspace uses this, so
    /// that it works whichever replica owns the child.
    pub fn reachable_cluster(&self, name: &str) -> Option<Arc<Cluster>> {
        if self.cluster.name().as_ref() == name {
            return Some(self.cluster.clone());
        }
        self.others.as_ref()?.reachable(name)
    }

    /// The cluster of the request.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The cluster's name.
    pub fn cluster_name(&self) -> &ClusterName {
        self.cluster.name()
    }

    /// The name of the controller running the reconcile.
    pub fn controller(&self) -> &str {
        &self.controller
    }

    /// A client for the request's cluster.
    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    /// A typed API for a namespaced kind in the request's cluster.
    pub fn namespaced<K>(&self, namespace: &str) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        self.cluster.namespaced(namespace)
    }

    /// A typed API for a cluster-scoped kind in the request's cluster.
    pub fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        self.cluster.all()
    }

    /// The shared watch cache of `kind` for this cluster, started on first use and synced.
    pub async fn cache(&self, kind: &ResourceKind) -> Result<Arc<SharedCache>, CacheError> {
        let cache = self.caches.get_or_start(&self.cluster, kind);
        self.cluster.retain(kind.gvr(), cache.clone());
        if !cache.wait_synced(self.sync_timeout).await {
            return Err(CacheError::NotSynced {
                gvr: kind.gvr(),
                cluster: self.cluster.name().to_string(),
            });
        }
        Ok(cache)
    }

    /// Reads one object of type `K` from the cache of this cluster.
    pub async fn get_cached<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<K>, CacheError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
        K::Scope: 'static,
    {
        let kind = ResourceKind::of::<K>();
        let cache = self.cache(&kind).await?;
        let namespace = namespace.filter(|_| kind.namespaced);
        match cache.get(self.cluster.name(), namespace, name) {
            Some(obj) => Ok(Some(decode(&obj)?)),
            None => Ok(None),
        }
    }

    /// Lists objects of type `K` in this cluster (one namespace or all) from the cache.
    pub async fn list_cached<K>(&self, namespace: Option<&str>) -> Result<Vec<K>, CacheError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
        K::Scope: 'static,
    {
        let kind = ResourceKind::of::<K>();
        let cache = self.cache(&kind).await?;
        cache
            .list(self.cluster.name(), namespace)
            .iter()
            .map(|o| decode(o))
            .collect()
    }
}

/// Turns a cached dynamic object into a typed one.
fn decode<K: DeserializeOwned>(obj: &DynamicObject) -> Result<K, CacheError> {
    let value = serde_json::to_value(obj).map_err(|e| CacheError::Decode(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| CacheError::Decode(e.to_string()))
}
