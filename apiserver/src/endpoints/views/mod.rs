//! Platform Mesh's virtual workspaces: `contentconfigurations` (the portal's UI content a
//! workspace sees) and `marketplace` (what providers offer, and whether the workspace bound it).
//! Both are computed from other objects, as upstream's virtual-workspaces server computes them,
//! and served at `/services/<view>/clusters/<name|path>/...`.
//!
//! A view is served as a read-only [`Store`] ([`ViewStore`]) under the ordinary handlers, so a
//! GET, a LIST (selectors, limit/continue, resourceVersion, Table output) and a WATCH all answer
//! from the same computed contents; upstream computes only LIST and forwards GET and WATCH
//! unfiltered. The caller must be allowed to `list` the objects a view is made from in the
//! workspace (ContentConfigurations, or APIBindings for the marketplace); upstream admits anyone
//! authenticated and reads with its own identity.

mod compute;
pub mod mirror;
mod store;
pub mod upstream;

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use crate::meta::status::{ApiError, GroupResource};
use crate::registry::catalog::ApiView;
use crate::registry::objects;
use crate::registry::{Resource, TypeInfo};
pub use crate::request::request_info::ViewKind;
use crate::storage::Store;
pub use mirror::{Mirror, MirrorError, SourceKind};
pub use store::ViewStore;
pub use upstream::{Extension, Upstream, UpstreamError, Workspace, WorkspacePaths};

/// Upstream's flags, with the values its chart sets.
#[derive(Clone, Debug)]
pub struct ViewOptions {
    /// The label naming the entity type a ContentConfiguration is for (`--entity-label`).
    pub entity_label: String,
    /// The label naming the APIExport (or ProviderMetadata) content is for
    /// (`--content-for-label`).
    pub content_for_label: String,
    /// The entity type of an organization's workspace (`--main-entity-name`).
    pub main_entity: String,
    /// The entity type of an account's workspace (`--account-entity-name`).
    pub account_entity: String,
    /// The workspace of the core APIExport and of the platform's own content
    /// (`--resource-schema-workspace`).
    pub provider_workspace: String,
    /// The APIExport that serves ContentConfigurations and ProviderMetadata
    /// (`--resource-apiexport-endpointslice-name`).
    pub core_export: String,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            entity_label: "ui.platform-mesh.io/entity".into(),
            content_for_label: "ui.platform-mesh.io/content-for".into(),
            main_entity: "main".into(),
            account_entity: "core_platform-mesh_io_account".into(),
            provider_workspace: "root:platform-mesh-system".into(),
            core_export: "core.platform-mesh.io".into(),
        }
    }
}

/// The ContentConfiguration type, as the core export's schema declares it.
const CONTENT_SCHEMA: &str = include_str!(
    "../../../../manifests/kcp/01-platform-mesh-system/10-apiresourceschema-contentconfigurations.ui.platform-mesh.io.yaml"
);

/// What both views are computed from, and their API surfaces.
pub struct Views {
    store: Arc<dyn Store>,
    paths: Arc<dyn WorkspacePaths>,
    options: ViewOptions,
    content: OnceLock<Arc<ApiView>>,
    marketplace: OnceLock<Arc<ApiView>>,
    /// The last views computed, by view, cluster and revision: the pages of one list, and the
    /// watchers of one workspace, share one computation.
    computed: std::sync::Mutex<std::collections::VecDeque<(CacheKey, Arc<store::Keyed>)>>,
    /// Held while a view is computed (see `ViewStore::contents`).
    computing: tokio::sync::Mutex<()>,
    /// What the views need of each source object, by key and revision.
    summaries: std::sync::Mutex<compute::Summaries>,
    /// The marketplace entries last computed for each workspace, with what they were made from.
    entries: std::sync::Mutex<compute::EntryCache>,
}

/// What a computed view is remembered by.
type CacheKey = (ViewKind, String, crate::storage::Revision);

/// How many computed views are remembered.
const COMPUTED_VIEWS: usize = 4;

impl Views {
    /// The views over `store`, with workspace paths from `paths` (the server's tenancy, or the
    /// upstream kcp's in extension mode).
    pub fn new(
        store: Arc<dyn Store>,
        paths: Arc<dyn WorkspacePaths>,
        options: ViewOptions,
    ) -> Arc<Self> {
        Arc::new(Views {
            store,
            paths,
            options,
            content: OnceLock::new(),
            marketplace: OnceLock::new(),
            computed: std::sync::Mutex::default(),
            computing: tokio::sync::Mutex::new(()),
            summaries: std::sync::Mutex::default(),
            entries: std::sync::Mutex::default(),
        })
    }

    fn remembered(&self, key: &CacheKey) -> Option<Arc<store::Keyed>> {
        let computed = self.computed.lock().ok()?;
        computed
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn remember(&self, key: CacheKey, view: Arc<store::Keyed>) {
        if let Ok(mut computed) = self.computed.lock() {
            computed.retain(|(k, _)| *k != key);
            if computed.len() >= COMPUTED_VIEWS {
                computed.pop_front();
            }
            computed.push_back((key, view));
        }
    }

    /// The options the views were built with.
    pub fn options(&self) -> &ViewOptions {
        &self.options
    }

    /// The API surface of a view: its one type, for discovery, OpenAPI and the handlers.
    pub fn api(&self, kind: ViewKind) -> Arc<ApiView> {
        let (cell, ty) = match kind {
            ViewKind::ContentConfigurations => (&self.content, content_type as fn() -> TypeInfo),
            ViewKind::Marketplace => (&self.marketplace, marketplace_type as fn() -> TypeInfo),
        };
        cell.get_or_init(|| Arc::new(ApiView::new(vec![Arc::new(Resource::new(ty()))])))
            .clone()
    }

    /// The read-only store that serves `kind`.
    pub fn store(self: &Arc<Self>, kind: ViewKind) -> Arc<dyn Store> {
        Arc::new(ViewStore::new(self.clone(), kind))
    }

    /// The group and resource whose `list` permission a caller needs to read `kind`.
    pub fn source(kind: ViewKind) -> GroupResource {
        match kind {
            ViewKind::ContentConfigurations => {
                GroupResource::new("ui.platform-mesh.io", "contentconfigurations")
            }
            ViewKind::Marketplace => GroupResource::new("apis.kcp.io", "apibindings"),
        }
    }

    /// Refuses a workspace a view cannot be computed for, with a Status saying why: one with no
    /// parent (the entity type comes from it), or one without a binding to the core export.
    pub async fn check(&self, kind: ViewKind, cluster: &str) -> Result<(), ApiError> {
        let path = self
            .paths
            .path_of(cluster)
            .unwrap_or_else(|| cluster.into());
        if kind == ViewKind::ContentConfigurations && self.entity_type(cluster).is_none() {
            return Err(ApiError::bad_request(format!(
                "the contentconfigurations view of {path} cannot be computed: the workspace has no parent, which decides the entity type"
            )));
        }
        let core = self.core().await?;
        let bound = crate::access::tenancy::is_bound_in(
            self.store.as_ref(),
            cluster,
            &core.cluster,
            &self.options.core_export,
        )
        .await?;
        if !bound {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "the {} view of {path} is empty by definition: the workspace has no Bound APIBinding to the {} APIExport of {}",
                    kind.as_str(),
                    self.options.core_export,
                    self.options.provider_workspace
                ),
            ));
        }
        Ok(())
    }

    /// The entity type of a workspace's content: the main entity for a workspace right below
    /// `orgs`, the account entity below that; `None` for a workspace without a parent.
    fn entity_type(&self, cluster: &str) -> Option<&str> {
        let path = self.paths.path_of(cluster)?;
        let (parent, _) = path.rsplit_once(':')?;
        let parent_name = parent.rsplit(':').next().unwrap_or(parent);
        Some(if parent_name == "orgs" {
            &self.options.main_entity
        } else {
            &self.options.account_entity
        })
    }

    /// The core export: its logical cluster and its identity (which names its objects' storage).
    async fn core(&self) -> Result<CoreExport, ApiError> {
        let missing = || {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the {} APIExport of {} does not exist yet; the virtual workspaces are computed from it",
                    self.options.core_export, self.options.provider_workspace
                ),
            )
        };
        let cluster = self
            .paths
            .name_of(&self.options.provider_workspace)
            .ok_or_else(missing)?;
        let key = format!(
            "/apis.kcp.io/apiexports/{cluster}/{}",
            self.options.core_export
        );
        let kv = self
            .store
            .get(&key)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .ok_or_else(missing)?;
        let export = objects::decode_stored(&kv.value)?;
        let identity = export["status"]["identityHash"]
            .as_str()
            .ok_or_else(missing)?
            .to_string();
        Ok(CoreExport { cluster, identity })
    }
}

/// The export ContentConfigurations and ProviderMetadata are bound from.
struct CoreExport {
    cluster: String,
    identity: String,
}

impl CoreExport {
    /// The storage prefix of a resource of the core export in every cluster.
    fn prefix(&self, group: &str, plural: &str) -> String {
        format!("/{group}/{plural}:{}/", self.identity)
    }
}

fn content_type() -> TypeInfo {
    let schema: Value = serde_saphyr::from_str(CONTENT_SCHEMA).unwrap_or(Value::Null);
    crate::access::tenancy::types_from_spec(&schema["spec"])
        .into_iter()
        .next()
        .unwrap_or_else(|| TypeInfo {
            group: "ui.platform-mesh.io".into(),
            version: "v1alpha1".into(),
            kind: "ContentConfiguration".into(),
            list_kind: "ContentConfigurationList".into(),
            plural: "contentconfigurations".into(),
            singular: "contentconfiguration".into(),
            short_names: vec![],
            categories: vec![],
            namespaced: false,
            status_subresource: true,
            strategic_merge_patch: false,
            printer_columns: vec![api::serving::PrinterColumn::age()],
            schema: json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        })
}

fn marketplace_type() -> TypeInfo {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    TypeInfo {
        group: "marketplace.platform-mesh.io".into(),
        version: "v1alpha1".into(),
        kind: "MarketplaceEntry".into(),
        list_kind: "MarketplaceEntryList".into(),
        plural: "marketplaceentries".into(),
        singular: "marketplaceentry".into(),
        short_names: vec![],
        categories: vec![],
        namespaced: false,
        status_subresource: true,
        strategic_merge_patch: false,
        printer_columns: vec![
            api::serving::PrinterColumn::json_path(
                "Provider",
                "string",
                ".spec.providerMetadata.spec.displayName",
                "The provider's display name",
            ),
            api::serving::PrinterColumn::json_path(
                "Export",
                "string",
                ".spec.apiExport.metadata.name",
                "The APIExport offered",
            ),
            api::serving::PrinterColumn::json_path(
                "Binding",
                "string",
                ".spec.apiBindingName",
                "The workspace's APIBinding to the export, if installed",
            ),
            api::serving::PrinterColumn::age(),
        ],
        schema: json!({
            "type": "object",
            "description": "One offer of a provider: its ProviderMetadata with one of its APIExports, and the workspace's binding to it.",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "properties": {
                        "apiBindingName": {"type": "string", "description": "The workspace's APIBinding to the export; absent when it is not installed."},
                        "providerMetadata": open,
                        "apiExport": open,
                    },
                },
                "status": open,
            },
        }),
    }
}
