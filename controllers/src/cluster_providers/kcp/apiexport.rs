//! The kcp APIExport provider: endpoint URLs from an APIExportEndpointSlice, a wildcard watch
//! of APIBindings per URL, one engaged cluster per bound logical cluster, shared caches per URL.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    api_binding_kind, cluster_of, endpoint_slice_kind, endpoint_urls, object_is_ready, path_of,
    wildcard_url,
};
use crate::runtime::client::{cluster_prefix, scoped_client, PoolCounter};
use crate::runtime::providers::{follow, Observed};
use crate::runtime::{
    Cluster, ClusterName, ClusterProvider, ClusterSink, ProviderError, ResourceKind,
};

/// Where the virtual-workspace URLs come from.
#[derive(Clone, Debug)]
pub enum EndpointSource {
    /// The APIExportEndpointSlice of that name in the workspace the home config points to.
    Slice(String),
    /// Fixed URLs (a single shard known in advance, or tests).
    Urls(Vec<String>),
}

/// Decides whether a watched object makes its cluster ready to engage.
pub type ReadyFn = Arc<dyn Fn(&DynamicObject) -> bool + Send + Sync>;

/// Settings of the APIExport provider.
#[derive(Clone)]
pub struct ApiExportOptions {
    /// Where endpoint URLs come from.
    pub source: EndpointSource,
    /// The object watched at `<url>/clusters/*` (default `apis.kcp.io/v1alpha1` APIBinding).
    pub watched: ResourceKind,
    /// Which watched objects engage their cluster (default: `Ready=True` or phase `Bound`).
    pub ready: ReadyFn,
}

impl ApiExportOptions {
    /// Reads the endpoint slice `name`, watches APIBindings, engages ready ones.
    pub fn for_slice(name: &str) -> Self {
        Self::with_source(EndpointSource::Slice(name.to_string()))
    }

    /// Uses fixed URLs instead of an endpoint slice.
    pub fn for_urls(urls: Vec<String>) -> Self {
        Self::with_source(EndpointSource::Urls(urls))
    }

    /// Every logical cluster behind `urls`, found by watching LogicalClusters: for a server
    /// that serves the controller's kinds natively in every workspace (`platform-mesh serve`).
    pub fn every_workspace(urls: Vec<String>) -> Self {
        Self::for_urls(urls).watching(super::logical_cluster_kind(), |_| true)
    }

    fn with_source(source: EndpointSource) -> Self {
        ApiExportOptions {
            source,
            watched: api_binding_kind(),
            ready: Arc::new(object_is_ready),
        }
    }

    /// Watches another kind (e.g. LogicalClusters for an initializing-workspaces endpoint).
    pub fn watching(
        mut self,
        kind: ResourceKind,
        ready: impl Fn(&DynamicObject) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.watched = kind;
        self.ready = Arc::new(ready);
        self
    }
}

/// What to do with a cluster after a watched object changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Engage the cluster (first ready object seen).
    Engage(String),
    /// Disengage the cluster (its last watched object is gone).
    Disengage(String),
}

/// Watched objects per cluster and which clusters are engaged, as upstream does it: a cluster
/// is engaged on its first ready object and disengaged only when no watched object remains.
#[derive(Debug, Default)]
pub struct BindingIndex {
    objects: HashMap<String, HashSet<String>>,
    engaged: HashSet<String>,
    /// Workspace paths seen in `kcp.io/path` annotations, per cluster.
    paths: HashMap<String, String>,
}

impl BindingIndex {
    /// Records an added or changed object.
    ///
    /// ```
    /// use controllers::cluster_providers::kcp::apiexport::{BindingIndex, Decision};
    /// let b: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
    ///     "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
    ///     "metadata": {"name": "x", "annotations": {"kcp.io/cluster": "c1"}}})).unwrap();
    /// let mut index = BindingIndex::default();
    /// assert_eq!(index.apply(&b, false), None);
    /// assert_eq!(index.apply(&b, true), Some(Decision::Engage("c1".into())));
    /// assert_eq!(index.delete(&b), Some(Decision::Disengage("c1".into())));
    /// ```
    pub fn apply(&mut self, obj: &DynamicObject, ready: bool) -> Option<Decision> {
        let cluster = cluster_of(obj)?.to_string();
        if let Some(path) = path_of(obj) {
            self.paths.insert(cluster.clone(), path.to_string());
        }
        self.objects
            .entry(cluster.clone())
            .or_default()
            .insert(object_id(obj));
        (ready && self.engaged.insert(cluster.clone())).then_some(Decision::Engage(cluster))
    }

    /// Records a deleted object.
    pub fn delete(&mut self, obj: &DynamicObject) -> Option<Decision> {
        let cluster = cluster_of(obj)?.to_string();
        let now_empty = match self.objects.get_mut(&cluster) {
            Some(set) => {
                set.remove(&object_id(obj));
                set.is_empty()
            }
            None => true,
        };
        if !now_empty {
            return None;
        }
        self.objects.remove(&cluster);
        self.paths.remove(&cluster);
        self.engaged
            .remove(&cluster)
            .then_some(Decision::Disengage(cluster))
    }

    /// Replaces everything after a (re)list of `(object, ready)`.
    pub fn replace(&mut self, listed: &[(DynamicObject, bool)]) -> Vec<Decision> {
        let mut fresh = BindingIndex::default();
        let mut out = Vec::new();
        for (obj, ready) in listed {
            if let Some(cluster) = cluster_of(obj) {
                if let Some(path) = path_of(obj) {
                    fresh.paths.insert(cluster.to_string(), path.to_string());
                }
                fresh
                    .objects
                    .entry(cluster.to_string())
                    .or_default()
                    .insert(object_id(obj));
                if *ready || self.engaged.contains(cluster) {
                    fresh.engaged.insert(cluster.to_string());
                }
            }
        }
        let mut gone: Vec<_> = self.engaged.difference(&fresh.engaged).cloned().collect();
        gone.sort();
        out.extend(gone.into_iter().map(Decision::Disengage));
        let mut new: Vec<_> = fresh.engaged.difference(&self.engaged).cloned().collect();
        new.sort();
        out.extend(new.into_iter().map(Decision::Engage));
        *self = fresh;
        out
    }

    /// The workspace path last seen on a watched object of `cluster`.
    pub fn path(&self, cluster: &str) -> Option<&str> {
        self.paths.get(cluster).map(String::as_str)
    }

    /// Clusters engaged through this index, sorted.
    pub fn engaged(&self) -> Vec<String> {
        let mut v: Vec<_> = self.engaged.iter().cloned().collect();
        v.sort();
        v
    }
}

/// What the index needs of a listed object (name, namespace, cluster and path annotations), so
/// a relist of many bindings does not hold their full bodies.
fn identity_only(obj: DynamicObject) -> DynamicObject {
    let mut meta = kube::api::ObjectMeta {
        name: obj.metadata.name,
        namespace: obj.metadata.namespace,
        ..Default::default()
    };
    meta.annotations = obj.metadata.annotations.map(|mut a| {
        a.retain(|k, _| k == super::CLUSTER_ANNOTATION || k == super::PATH_ANNOTATION);
        a
    });
    DynamicObject {
        types: obj.types,
        metadata: meta,
        data: serde_json::Value::Null,
    }
}

fn object_id(obj: &DynamicObject) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    )
}

type Engaged = Arc<Mutex<HashMap<ClusterName, Arc<Cluster>>>>;

/// Engages every logical cluster that binds an APIExport, through the export's virtual
/// workspaces: one wildcard watch per URL and type, per-cluster writes at `<url>/clusters/<name>`.
///
/// ```no_run
/// # fn f(home: kube::Config) {
/// use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider};
/// let provider = ApiExportProvider::new(home, ApiExportOptions::for_slice("core.platform-mesh.io"));
/// # }
/// ```
pub struct ApiExportProvider {
    home: kube::Config,
    options: ApiExportOptions,
    engaged: Engaged,
    pools: PoolCounter,
}

impl ApiExportProvider {
    /// A provider whose `home` config points at the workspace holding the endpoint slice; its
    /// credentials are used for every virtual-workspace URL.
    pub fn new(home: kube::Config, options: ApiExportOptions) -> Self {
        ApiExportProvider {
            home,
            options,
            engaged: Engaged::default(),
            pools: PoolCounter::default(),
        }
    }

    /// How many connection pools (HTTP clients with their own TLS config) the provider built:
    /// one per endpoint URL, however many clusters it engages there.
    pub fn connection_pools(&self) -> usize {
        self.pools.built()
    }

    fn start_endpoint(
        &self,
        url: &str,
        sink: &ClusterSink,
        stop: &CancellationToken,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let endpoint_stop = stop.child_token();
        let task = tokio::spawn(run_endpoint(
            url.to_string(),
            self.pools.pooled_client(&self.home, url),
            self.options.clone(),
            sink.clone(),
            self.engaged.clone(),
            endpoint_stop.clone(),
            stop.clone(),
        ));
        (endpoint_stop, task)
    }

    async fn watch_slice(
        &self,
        name: &str,
        sink: &ClusterSink,
        stop: &CancellationToken,
    ) -> Result<(), ProviderError> {
        let client = kube::Client::try_from(self.home.clone())?;
        let api: Api<DynamicObject> = Api::all_with(client, &endpoint_slice_kind().api);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut slices = follow(
            watcher(api, config).default_backoff(),
            format!("endpoint slice {name}"),
            |obj: DynamicObject| Some(endpoint_urls(&slice_json(&obj))),
        );
        let mut endpoints: HashMap<String, (CancellationToken, tokio::task::JoinHandle<()>)> =
            HashMap::new();
        while let Some(observed) = slices.next(stop).await {
            let urls = match observed {
                // One slice, by name: the list has it or not.
                Observed::Relisted(listed) => listed.into_iter().flatten().collect(),
                Observed::Applied(urls) => urls,
                Observed::Deleted(_) => Vec::new(),
            };
            endpoints.retain(|url, (token, _)| {
                let keep = urls.contains(url);
                if !keep {
                    info!(slice = %name, url = %url, "endpoint removed");
                    token.cancel();
                }
                keep
            });
            for url in urls {
                if let std::collections::hash_map::Entry::Vacant(slot) = endpoints.entry(url) {
                    info!(slice = %name, url = %slot.key(), "endpoint added");
                    let started = self.start_endpoint(slot.key(), sink, stop);
                    slot.insert(started);
                }
            }
        }
        for (_, (token, task)) in endpoints {
            token.cancel();
            let _ = task.await;
        }
        Ok(())
    }
}

fn slice_json(obj: &DynamicObject) -> serde_json::Value {
    serde_json::to_value(obj).unwrap_or_default()
}

/// Watches one virtual-workspace URL and engages the clusters it serves.
async fn run_endpoint(
    url: String,
    shared: Result<kube::Client, ProviderError>,
    options: ApiExportOptions,
    sink: ClusterSink,
    engaged: Engaged,
    stop: CancellationToken,
    global_stop: CancellationToken,
) {
    // One connection pool for the endpoint; the wildcard watch and every cluster of it are
    // path prefixes over it.
    let shared = match shared {
        Ok(c) => c,
        Err(e) => {
            warn!(url = %url, error = %e, "cannot use endpoint");
            return;
        }
    };
    let wildcard_base = wildcard_url(&url);
    let wildcard = scoped_client(&shared, &cluster_prefix("*"));
    let api: Api<DynamicObject> = Api::all_with(wildcard.clone(), &options.watched.api);
    let ready = options.ready.clone();
    let mut bindings = follow(
        watcher(api, watcher::Config::default()).default_backoff(),
        format!("{} at {url}", options.watched.gvr()),
        // The index needs the object's identity and whether it is ready, not its body.
        move |obj: DynamicObject| {
            let is_ready = ready(&obj);
            Some((identity_only(obj), is_ready))
        },
    );
    let mut index = BindingIndex::default();
    while let Some(observed) = bindings.next(&stop).await {
        let decisions = match observed {
            Observed::Relisted(listed) => index.replace(&listed),
            Observed::Applied((obj, ready)) => index.apply(&obj, ready).into_iter().collect(),
            Observed::Deleted((obj, _)) => index.delete(&obj).into_iter().collect(),
        };
        for decision in decisions {
            let sent = match decision {
                Decision::Engage(name) => {
                    let mut cluster =
                        Cluster::scoped(name.as_str(), shared.clone(), &cluster_prefix(&name))
                            .with_shared_cache(
                                wildcard_base.clone(),
                                wildcard.clone(),
                                super::CLUSTER_ANNOTATION,
                            )
                            .with_fingerprint(url.clone());
                    if let Some(path) = index.path(&name) {
                        cluster = cluster.with_alias(path);
                    }
                    let cluster = Arc::new(cluster);
                    engaged
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(ClusterName::from(name.as_str()), cluster.clone());
                    debug!(cluster = %name, url = %url, "binding ready; engaging");
                    sink.engage(cluster).await
                }
                Decision::Disengage(name) => {
                    let name = ClusterName::from(name);
                    engaged
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&name);
                    sink.disengage(&name).await
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }
    // An endpoint that went away takes its clusters with it; at shutdown the manager does that.
    if !global_stop.is_cancelled() {
        for name in index.engaged() {
            let name = ClusterName::from(name);
            engaged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
            if sink.disengage(&name).await.is_err() {
                return;
            }
        }
    }
}

#[async_trait::async_trait]
impl ClusterProvider for ApiExportProvider {
    async fn run(&self, sink: ClusterSink, stop: CancellationToken) -> Result<(), ProviderError> {
        match &self.options.source {
            EndpointSource::Slice(name) => self.watch_slice(name, &sink, &stop).await,
            EndpointSource::Urls(urls) => {
                let tasks: Vec<_> = urls
                    .iter()
                    .map(|u| self.start_endpoint(u, &sink, &stop))
                    .collect();
                stop.cancelled().await;
                for (_, task) in tasks {
                    let _ = task.await;
                }
                Ok(())
            }
        }
    }

    fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.engaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ClusterName::from(name))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(cluster: &str, name: &str) -> DynamicObject {
        serde_json::from_value(
            json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": name, "annotations": {"kcp.io/cluster": cluster}}}),
        )
        .unwrap()
    }

    #[test]
    fn a_cluster_is_engaged_once_on_its_first_ready_binding() {
        let mut index = BindingIndex::default();
        assert_eq!(index.apply(&binding("c1", "a"), false), None);
        assert_eq!(
            index.apply(&binding("c1", "a"), true),
            Some(Decision::Engage("c1".into()))
        );
        assert_eq!(
            index.apply(&binding("c1", "b"), true),
            None,
            "engaged once per name"
        );
        assert_eq!(
            index.apply(&binding("c2", "a"), true),
            Some(Decision::Engage("c2".into()))
        );
        assert_eq!(index.engaged(), vec!["c1", "c2"]);
    }

    #[test]
    fn a_cluster_is_disengaged_only_when_its_last_binding_goes() {
        let mut index = BindingIndex::default();
        index.apply(&binding("c1", "a"), true);
        index.apply(&binding("c1", "b"), false);
        assert_eq!(index.delete(&binding("c1", "a")), None);
        assert_eq!(
            index.delete(&binding("c1", "b")),
            Some(Decision::Disengage("c1".into()))
        );
        assert_eq!(index.delete(&binding("c1", "b")), None);
        // Not-ready bindings never engaged anything, so their deletion disengages nothing.
        index.apply(&binding("c3", "x"), false);
        assert_eq!(index.delete(&binding("c3", "x")), None);
    }

    #[test]
    fn paths_are_remembered_per_cluster_until_it_goes() {
        let mut index = BindingIndex::default();
        let with_path: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "apis.kcp.io/v1alpha1",
            "kind": "APIBinding", "metadata": {"name": "a", "annotations": {
                "kcp.io/cluster": "c1", "kcp.io/path": "root:orgs:acme"}}}))
            .unwrap();
        index.apply(&with_path, true);
        assert_eq!(index.path("c1"), Some("root:orgs:acme"));
        index.delete(&with_path);
        assert_eq!(index.path("c1"), None);
    }

    #[test]
    fn objects_without_a_cluster_annotation_are_ignored() {
        let mut index = BindingIndex::default();
        let bare: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "apis.kcp.io/v1alpha1",
            "kind": "APIBinding", "metadata": {"name": "x"}}))
            .unwrap();
        assert_eq!(index.apply(&bare, true), None);
        assert!(index.engaged().is_empty());
    }

    #[test]
    fn relist_disengages_vanished_clusters_and_engages_new_ready_ones() {
        let mut index = BindingIndex::default();
        index.apply(&binding("keep", "a"), true);
        index.apply(&binding("gone", "a"), true);
        let decisions = index.replace(&[
            (binding("keep", "a"), false),
            (binding("new", "a"), true),
            (binding("pending", "a"), false),
        ]);
        assert_eq!(
            decisions,
            vec![
                Decision::Disengage("gone".into()),
                Decision::Engage("new".into())
            ]
        );
        assert_eq!(
            index.engaged(),
            vec!["keep", "new"],
            "an engaged cluster stays engaged"
        );
    }

    #[test]
    fn options_default_to_api_bindings_and_readiness() {
        let o = ApiExportOptions::for_slice("core.platform-mesh.io");
        assert_eq!(o.watched, api_binding_kind());
        let ready: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "apis.kcp.io/v1alpha1",
            "kind": "APIBinding", "metadata": {"name": "x"}, "status": {"phase": "Bound"}}))
            .unwrap();
        assert!((o.ready)(&ready));
        assert!(!(o.ready)(&binding("c", "x")));
    }

    #[test]
    fn relisted_bindings_keep_only_what_the_index_needs() {
        let full: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
            "metadata": {"name": "a", "annotations": {"kcp.io/cluster": "c1",
                "kcp.io/path": "root:x", "other": "big"}, "labels": {"l": "v"}},
            "spec": {"reference": {}}, "status": {"phase": "Bound"}}))
        .unwrap();
        let slim = identity_only(full.clone());
        assert_eq!(cluster_of(&slim), Some("c1"));
        assert_eq!(path_of(&slim), Some("root:x"));
        assert_eq!(object_id(&slim), object_id(&full));
        assert_eq!(slim.metadata.annotations.as_ref().map(|a| a.len()), Some(2));
        assert!(slim.metadata.labels.is_none() && slim.data.is_null());
    }
}
