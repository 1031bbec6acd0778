//! The API surface of every logical cluster: the built-in types plus the cluster's own CRDs and
//! bound APIs, each view with its discovery and OpenAPI documents computed once per change.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Bytes;
use serde_json::Value;

use crate::registry::discovery;
use crate::registry::openapi::OpenApi;
use crate::registry::{Registry, Resource};

/// Discovery documents of one view, encoded once.
#[derive(Debug)]
pub struct DiscoveryDocs {
    /// Aggregated discovery of `/api` as `apidiscovery.k8s.io/v2`.
    pub core_v2: Bytes,
    /// Aggregated discovery of `/api` as `apidiscovery.k8s.io/v2beta1`.
    pub core_v2beta1: Bytes,
    /// Aggregated discovery of `/apis` as `apidiscovery.k8s.io/v2`.
    pub apis_v2: Bytes,
    /// Aggregated discovery of `/apis` as `apidiscovery.k8s.io/v2beta1`.
    pub apis_v2beta1: Bytes,
    /// The legacy `APIGroupList` of `/apis`.
    pub group_list: Bytes,
}

/// What one logical cluster serves.
#[derive(Debug)]
pub struct ApiView {
    /// The types the cluster serves.
    pub registry: Registry,
    openapi: OnceLock<OpenApi>,
    discovery: OnceLock<DiscoveryDocs>,
}

fn encode(v: Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

impl ApiView {
    /// A view of these resources; its OpenAPI and discovery documents are built on first use.
    pub fn new(resources: Vec<Arc<Resource>>) -> Self {
        ApiView {
            registry: Registry::new(resources),
            openapi: OnceLock::new(),
            discovery: OnceLock::new(),
        }
    }

    /// The OpenAPI documents, built on first use.
    pub fn openapi(&self) -> &OpenApi {
        self.openapi.get_or_init(|| OpenApi::build(&self.registry))
    }

    /// The discovery documents, built on first use.
    pub fn discovery(&self) -> &DiscoveryDocs {
        self.discovery.get_or_init(|| DiscoveryDocs {
            core_v2: encode(discovery::aggregated(&self.registry, true, "v2")),
            core_v2beta1: encode(discovery::aggregated(&self.registry, true, "v2beta1")),
            apis_v2: encode(discovery::aggregated(&self.registry, false, "v2")),
            apis_v2beta1: encode(discovery::aggregated(&self.registry, false, "v2beta1")),
            group_list: encode(discovery::group_list(&self.registry)),
        })
    }
}

/// Every cluster's view. Clusters without types of their own share the built-in view.
#[derive(Debug)]
pub struct Catalog {
    builtin: Vec<Arc<Resource>>,
    default_view: Arc<ApiView>,
    clusters: RwLock<HashMap<String, Arc<ApiView>>>,
    /// Virtual-workspace views by `<cluster>/<export>`, with the export revision they were built at.
    exports: RwLock<HashMap<String, (u64, ExportView)>>,
}

/// An APIExport's virtual workspace: what it serves, the export's identity hash, and the label
/// selector every claimed resource (and the APIBindings) is filtered by.
#[derive(Debug)]
pub struct ExportApi {
    /// The exported resources, the claimed ones and the APIBindings.
    pub view: Arc<ApiView>,
    /// The export's identity hash.
    pub identity: String,
    /// `(group, plural, storage name)` of each filtered resource → its label selector.
    pub selectors: HashMap<(String, String, String), String>,
}

impl ExportApi {
    /// The selector objects of `resource` must match to be seen through the export (`None`
    /// for the export's own resources).
    pub fn selector_for(&self, resource: &Resource) -> Option<&str> {
        self.selectors
            .get(&Self::selector_key(resource))
            .map(String::as_str)
    }

    /// The key of [`ExportApi::selectors`] for `resource`.
    pub fn selector_key(resource: &Resource) -> (String, String, String) {
        (
            resource.ty.group.clone(),
            resource.ty.plural.clone(),
            resource.all_clusters_prefix().to_string(),
        )
    }
}

/// A kept virtual-workspace view.
pub type ExportView = Arc<ExportApi>;

impl Catalog {
    /// A catalog in which every cluster serves the `builtin` types until it gets types of its own.
    pub fn new(builtin: Vec<Arc<Resource>>) -> Self {
        Catalog {
            default_view: Arc::new(ApiView::new(builtin.clone())),
            builtin,
            clusters: RwLock::new(HashMap::new()),
            exports: RwLock::new(HashMap::new()),
        }
    }

    /// The view of the built-in types only.
    pub fn builtin_view(&self) -> Arc<ApiView> {
        self.default_view.clone()
    }

    /// The view of one cluster.
    pub fn view(&self, cluster: &str) -> Arc<ApiView> {
        self.clusters
            .read()
            .ok()
            .and_then(|m| m.get(cluster).cloned())
            .unwrap_or_else(|| self.default_view.clone())
    }

    /// Replaces the cluster's own types (CRDs, bound APIs); none returns it to the built-in view.
    pub fn set_cluster_resources(&self, cluster: &str, extra: Vec<Arc<Resource>>) {
        let Ok(mut m) = self.clusters.write() else {
            return;
        };
        if extra.is_empty() {
            m.remove(cluster);
            return;
        }
        let mut all = self.builtin.clone();
        all.extend(extra);
        m.insert(cluster.to_string(), Arc::new(ApiView::new(all)));
    }

    /// The cached view of an export, if it was built at `revision`.
    pub fn cached_export_view(&self, key: &str, revision: u64) -> Option<ExportView> {
        let m = self.exports.read().ok()?;
        m.get(key)
            .filter(|(r, _)| *r == revision)
            .map(|(_, v)| v.clone())
    }

    /// Remembers the view of an export at `revision`.
    pub fn cache_export_view(&self, key: String, revision: u64, view: ExportView) {
        if let Ok(mut m) = self.exports.write() {
            m.insert(key, (revision, view));
        }
    }

    /// The clusters that have types of their own.
    pub fn clusters_with_types(&self) -> Vec<String> {
        self.clusters
            .read()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A resource for a wildcard (`/clusters/*`) request: built in, or the first cluster that
    /// serves it.
    pub fn wildcard_lookup(
        &self,
        group: &str,
        version: &str,
        resource: &str,
    ) -> Option<Arc<Resource>> {
        if let Some(r) = self.default_view.registry.lookup(group, version, resource) {
            return Some(r.clone());
        }
        let m = self.clusters.read().ok()?;
        m.values()
            .find_map(|v| v.registry.lookup(group, version, resource).cloned())
    }
}
