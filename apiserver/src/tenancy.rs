//! kcp-style tenancy: the workspace tree and its path index, workspace initialization and
//! deletion, per-cluster CRDs, and APIExports/APIBindings that serve one workspace's resource
//! schemas in others. Hooks run in the write path so a client sees their effect right away.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::dispatch::AppState;
use crate::handlers::list_keys;
use crate::objects::{self, meta_mut};
use crate::registry::{Resource, TypeInfo};
use crate::request_info::{ClusterTarget, ROOT_CLUSTER};
use crate::status::{ApiError, Cause};
use crate::storage::StorageError;

/// Finalizer that holds a Workspace until its logical cluster is emptied.
pub const WORKSPACE_FINALIZER: &str = "tenancy.kcp.io/logical-cluster";
/// Annotation with a workspace's canonical path.
pub const PATH_ANNOTATION: &str = "kcp.io/path";
/// Label put on a bound APIBinding: the first 32 hex characters of the export's identity, so the
/// export's virtual workspace can select its bindings.
pub const BOUND_EXPORT_LABEL: &str = "apis.kcp.io/export-identity";

/// The workspaces created on first start, below `root`.
const INITIAL_WORKSPACES: &[&str] = &["orgs", "providers", "platform-mesh-system"];

/// Built-in workspace types: name, allowed parent types (empty = any), default child type.
const WORKSPACE_TYPES: &[(&str, &[&str])] = &[
    ("root", &[]),
    ("universal", &[]),
    ("organization", &["root", "universal"]),
    ("account", &["organization", "account"]),
    ("provider", &["root", "universal"]),
    ("team", &["organization", "account", "team"]),
];

fn is(r: &Resource, group: &str, plural: &str) -> bool {
    r.ty.group == group && r.ty.plural == plural
}

fn invalid(r: &Resource, name: &str, field: &str, message: String) -> ApiError {
    ApiError::invalid(
        r.kind(),
        &r.ty.group,
        name,
        vec![Cause {
            reason: "FieldValueInvalid".into(),
            message,
            field: field.into(),
        }],
    )
}

/// The workspace tree and the hooks of the tenancy types.
pub struct Tenancy {
    state: Weak<AppState>,
    /// path → logical cluster name, and back.
    paths: RwLock<(HashMap<String, String>, HashMap<String, String>)>,
}

impl Tenancy {
    pub fn new(state: Weak<AppState>) -> Self {
        let mut by_path = HashMap::new();
        let mut by_name = HashMap::new();
        by_path.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
        by_name.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
        Tenancy {
            state,
            paths: RwLock::new((by_path, by_name)),
        }
    }

    fn register(&self, path: &str, name: &str) {
        if let Ok(mut p) = self.paths.write() {
            p.0.insert(path.to_string(), name.to_string());
            p.1.insert(name.to_string(), path.to_string());
        }
    }

    fn forget(&self, name: &str) {
        if let Ok(mut p) = self.paths.write() {
            if let Some(path) = p.1.remove(name) {
                p.0.remove(&path);
            }
        }
    }

    /// The canonical path of a logical cluster.
    pub fn path_of(&self, name: &str) -> Option<String> {
        self.paths.read().ok()?.1.get(name).cloned()
    }

    /// The logical cluster a name or path addresses; unknown ones are refused with 403 as kcp's
    /// front proxy does.
    pub fn resolve(&self, target: ClusterTarget) -> Result<ClusterTarget, ApiError> {
        let ClusterTarget::Name(x) = target else {
            return Ok(ClusterTarget::Wildcard);
        };
        let p = self
            .paths
            .read()
            .map_err(|_| ApiError::internal("workspace index unavailable"))?;
        if p.1.contains_key(&x) {
            return Ok(ClusterTarget::Name(x));
        }
        if let Some(name) = p.0.get(&x) {
            return Ok(ClusterTarget::Name(name.clone()));
        }
        Err(ApiError::forbidden("workspace access not permitted"))
    }

    /// Number of known logical clusters.
    pub fn cluster_count(&self) -> usize {
        self.paths.read().map(|p| p.1.len()).unwrap_or(0)
    }

    fn state(&self) -> Option<Arc<AppState>> {
        self.state.upgrade()
    }

    /// Whether writes of this type run tenancy hooks.
    pub fn interested(r: &Resource) -> bool {
        matches!(
            r.ty.group.as_str(),
            "tenancy.kcp.io" | "apiextensions.k8s.io" | "apis.kcp.io"
        )
    }

    /// After-write hook on stored bytes (decoded only for tenancy types).
    pub async fn after_write_bytes(
        &self,
        r: &Resource,
        cluster: &str,
        stored: &[u8],
        deleted: bool,
    ) {
        if !Self::interested(r) {
            return;
        }
        if let Ok(obj) = objects::decode_stored(stored) {
            self.after_write(r, cluster, &obj, deleted).await;
        }
    }

    /// Runs before an object of a tenancy type is stored: fills server-owned fields and refuses
    /// what cannot work.
    pub async fn prepare(
        &self,
        r: &Resource,
        cluster: &str,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        // As kcp's path annotation admission: these carry their workspace's canonical path.
        if is(r, "apis.kcp.io", "apiexports")
            || is(r, "apis.kcp.io", "apibindings")
            || is(r, "tenancy.kcp.io", "workspacetypes")
        {
            if let Some(path) = self.path_of(cluster) {
                let meta = meta_mut(obj);
                if !meta.get("annotations").is_some_and(Value::is_object) {
                    meta.insert("annotations".into(), json!({}));
                }
                if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    a.insert(PATH_ANNOTATION.into(), json!(path));
                }
            }
        }
        if is(r, "tenancy.kcp.io", "workspaces") {
            return self.prepare_workspace(r, cluster, obj, old).await;
        }
        if is(r, "apiextensions.k8s.io", "customresourcedefinitions") {
            return prepare_crd(r, obj);
        }
        if is(r, "apis.kcp.io", "apiresourceschemas") {
            if let Some(old) = old {
                if old.get("spec") != obj.get("spec") {
                    return Err(invalid(
                        r,
                        objects::name(obj),
                        "spec",
                        "Invalid value: \"object\": APIResourceSchema spec is immutable".into(),
                    ));
                }
            }
            return Ok(());
        }
        if is(r, "apis.kcp.io", "apiexports") {
            let identity = export_identity(cluster, objects::name(obj));
            obj["status"] = json!({"identityHash": identity});
            if let Some(s) = old.and_then(|o| o.get("status")) {
                if s.get("identityHash").is_some() {
                    obj["status"]["identityHash"] = s["identityHash"].clone();
                }
            }
            return Ok(());
        }
        if is(r, "apis.kcp.io", "apibindings") {
            return self.prepare_binding(cluster, obj).await;
        }
        Ok(())
    }

    async fn prepare_workspace(
        &self,
        r: &Resource,
        cluster: &str,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let name = objects::name(obj).to_string();
        if let Some(old) = old {
            // Spec fields the server set are immutable.
            for f in ["cluster", "URL", "type"] {
                if let Some(v) = old["spec"].get(f) {
                    obj["spec"][f] = v.clone();
                }
            }
            return Ok(());
        }
        let Some(state) = self.state() else {
            return Ok(());
        };
        let parent_path = self.path_of(cluster).unwrap_or_else(|| cluster.to_string());
        if obj.get("spec").is_none_or(|s| !s.is_object()) {
            obj["spec"] = json!({});
        }
        let type_name = obj["spec"]["type"]["name"]
            .as_str()
            .unwrap_or("universal")
            .to_string();
        let Some((_, parents)) = WORKSPACE_TYPES.iter().find(|(t, _)| *t == type_name) else {
            return Err(invalid(
                r,
                &name,
                "spec.type.name",
                format!(
                    "Unsupported value: {type_name:?}: supported values: {}",
                    WORKSPACE_TYPES
                        .iter()
                        .map(|(t, _)| format!("{t:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        if type_name == "root" {
            return Err(invalid(
                r,
                &name,
                "spec.type.name",
                "Invalid value: \"root\": only the root workspace is of type root".into(),
            ));
        }
        let parent_type = self.workspace_type_of(&state, cluster).await;
        if !parents.is_empty() && !parents.contains(&parent_type.as_str()) {
            return Err(invalid(
                r,
                &name,
                "spec.type",
                format!("Invalid value: {type_name:?}: workspace type root:{type_name} only allows parents of type {}; the parent is of type root:{parent_type}", parents.join(", ")),
            ));
        }
        let child_path = format!("{parent_path}:{name}");
        let child = cluster_name_for(&child_path);
        obj["spec"]["type"] = json!({"name": type_name, "path": "root"});
        obj["spec"]["cluster"] = json!(child);
        obj["spec"]["URL"] = json!(format!(
            "https://{}/clusters/{child_path}",
            state.advertise_address
        ));
        obj["status"] = json!({"phase": "Scheduling"});
        let meta = meta_mut(obj);
        let mut fins: Vec<Value> = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !fins.iter().any(|f| f == WORKSPACE_FINALIZER) {
            fins.push(json!(WORKSPACE_FINALIZER));
        }
        meta.insert("finalizers".into(), Value::Array(fins));
        Ok(())
    }

    /// The type of the workspace that is logical cluster `cluster` (`root` for root).
    async fn workspace_type_of(&self, state: &AppState, cluster: &str) -> String {
        if cluster == ROOT_CLUSTER {
            return "root".into();
        }
        let Some(path) = self.path_of(cluster) else {
            return "universal".into();
        };
        let Some((parent_path, name)) = path.rsplit_once(':') else {
            return "universal".into();
        };
        let Some(parent) = self
            .paths
            .read()
            .ok()
            .and_then(|p| p.0.get(parent_path).cloned())
        else {
            return "universal".into();
        };
        match state
            .store
            .get(&format!("/tenancy.kcp.io/workspaces/{parent}/{name}"))
            .await
        {
            Ok(Some(kv)) => objects::decode_stored(&kv.value)
                .ok()
                .and_then(|v| v["spec"]["type"]["name"].as_str().map(str::to_string))
                .unwrap_or_else(|| "universal".into()),
            _ => "universal".into(),
        }
    }

    async fn prepare_binding(&self, cluster: &str, obj: &mut Value) -> Result<(), ApiError> {
        let Some(state) = self.state() else {
            return Ok(());
        };
        let export_name = obj["spec"]["reference"]["export"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let export_path = obj["spec"]["reference"]["export"]["path"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let export_cluster = if export_path.is_empty() {
            Some(cluster.to_string())
        } else {
            match self.resolve(ClusterTarget::Name(export_path.clone())) {
                Ok(ClusterTarget::Name(n)) => Some(n),
                _ => None,
            }
        };
        let export = match &export_cluster {
            Some(c) => state
                .store
                .get(&format!("/apis.kcp.io/apiexports/{c}/{export_name}"))
                .await
                .ok()
                .flatten()
                .and_then(|kv| objects::decode_stored(&kv.value).ok()),
            None => None,
        };
        let now = objects::now_rfc3339();
        let Some(export) = export else {
            obj["status"] = json!({
                "phase": "Binding",
                "conditions": [{"type": "Ready", "status": "False", "reason": "APIExportNotFound",
                    "message": format!("APIExport {export_path}:{export_name} not found"), "lastTransitionTime": now}],
            });
            return Ok(());
        };
        let export_cluster = export_cluster.unwrap_or_default();
        let identity = export["status"]["identityHash"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let mut bound = Vec::new();
        for schema_name in export["spec"]["latestResourceSchemas"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let Some(schema_name) = schema_name.as_str() else {
                continue;
            };
            let Ok(Some(kv)) = state
                .store
                .get(&format!(
                    "/apis.kcp.io/apiresourceschemas/{export_cluster}/{schema_name}"
                ))
                .await
            else {
                continue;
            };
            let Ok(schema) = objects::decode_stored(&kv.value) else {
                continue;
            };
            bound.push(json!({
                "group": schema["spec"]["group"],
                "resource": schema["spec"]["names"]["plural"],
                "schema": {"name": schema_name, "UID": schema["metadata"]["uid"], "identityHash": identity},
                "storageVersions": schema["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
            }));
        }
        obj["status"] = json!({
            "phase": "Bound",
            "apiExportClusterName": export_cluster,
            "boundResources": bound,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bound", "message": "", "lastTransitionTime": now}],
        });
        let meta = meta_mut(obj);
        if !meta.get("labels").is_some_and(Value::is_object) {
            meta.insert("labels".into(), json!({}));
        }
        if let Some(l) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            l.insert(
                BOUND_EXPORT_LABEL.into(),
                json!(identity.get(..32).unwrap_or(&identity)),
            );
        }
        Ok(())
    }

    /// Runs after an object of a tenancy type was written (`deleted`: it is gone).
    pub async fn after_write(&self, r: &Resource, cluster: &str, obj: &Value, deleted: bool) {
        let Some(state) = self.state() else { return };
        if is(r, "tenancy.kcp.io", "workspaces") {
            let Some(child) = obj["spec"]["cluster"].as_str().map(str::to_string) else {
                return;
            };
            if deleted {
                return;
            }
            if objects::is_deleting(obj) {
                let (cluster, name) = (cluster.to_string(), objects::name(obj).to_string());
                let weak = self.state.clone();
                tokio::spawn(async move {
                    if let Some(state) = weak.upgrade() {
                        finish_workspace_deletion(&state, &cluster, &name, &child).await;
                    }
                });
                return;
            }
            if obj["status"]["phase"] == "Scheduling" {
                let parent_path = self.path_of(cluster).unwrap_or_else(|| cluster.to_string());
                let path = format!("{parent_path}:{}", objects::name(obj));
                self.register(&path, &child);
                let (cluster, name) = (cluster.to_string(), objects::name(obj).to_string());
                let weak = self.state.clone();
                tokio::spawn(async move {
                    if let Some(state) = weak.upgrade() {
                        if let Err(e) =
                            initialize_workspace(&state, &cluster, &name, &child, &path).await
                        {
                            tracing::warn!(cluster, workspace = name, error = %e, "workspace initialization");
                        }
                    }
                });
            }
            return;
        }
        if is(r, "apiextensions.k8s.io", "customresourcedefinitions")
            || is(r, "apis.kcp.io", "apibindings")
        {
            reload_cluster_types(&state, cluster).await;
            return;
        }
        if is(r, "apis.kcp.io", "apiexports") {
            let name = objects::name(obj).to_string();
            let key = format!("/apis.kcp.io/apiexportendpointslices/{cluster}/{name}");
            if deleted {
                if let Ok(Some(kv)) = state.store.get(&key).await {
                    if let Ok(slice) = objects::decode_stored(&kv.value) {
                        let _ = state
                            .store
                            .delete(&key, kv.mod_revision, objects::encoder(slice))
                            .await;
                    }
                }
                return;
            }
            if let Ok(None) = state.store.get(&key).await {
                let path = self.path_of(cluster).unwrap_or_else(|| cluster.to_string());
                let url = format!(
                    "https://{}/services/apiexport/{cluster}/{name}",
                    state.advertise_address
                );
                let mut slice = json!({
                    "apiVersion": "apis.kcp.io/v1alpha1",
                    "kind": "APIExportEndpointSlice",
                    "metadata": {"name": name},
                    "spec": {"export": {"path": path, "name": name}},
                    "status": {"endpoints": [{"url": url}]},
                });
                if let Some(res) = state.catalog.builtin_view().registry.lookup(
                    "apis.kcp.io",
                    "v1alpha1",
                    "apiexportendpointslices",
                ) {
                    objects::prepare_for_create(&mut slice, res, cluster);
                    slice["status"] = json!({"endpoints": [{"url": url}]});
                }
                let _ = state.store.create(&key, objects::encoder(slice)).await;
            }
            // Schemas of bound clusters may have changed.
            for c in bound_clusters(&state, cluster, &name).await {
                reload_cluster_types(&state, &c).await;
            }
        }
    }

    /// Brings a fresh data directory to the initial tree and rebuilds in-memory indexes.
    pub async fn bootstrap(&self) -> Result<(), StorageError> {
        let Some(state) = self.state() else {
            return Ok(());
        };
        // Index every logical cluster by path.
        let (clusters, _) =
            list_keys(state.store.as_ref(), "/core.kcp.io/logicalclusters/").await?;
        for kv in clusters {
            let Ok(lc) = objects::decode_stored(&kv.value) else {
                continue;
            };
            let name = lc["metadata"]["annotations"][objects::CLUSTER_ANNOTATION]
                .as_str()
                .unwrap_or("");
            let path = lc["metadata"]["annotations"][PATH_ANNOTATION]
                .as_str()
                .unwrap_or("");
            if !name.is_empty() && !path.is_empty() {
                self.register(path, name);
            }
        }
        ensure_logical_cluster(&state, ROOT_CLUSTER, ROOT_CLUSTER, "root").await?;
        for (t, parents) in WORKSPACE_TYPES {
            let key = format!("/tenancy.kcp.io/workspacetypes/{ROOT_CLUSTER}/{t}");
            if state.store.get(&key).await?.is_none() {
                if let Some(res) = state.catalog.builtin_view().registry.lookup(
                    "tenancy.kcp.io",
                    "v1alpha1",
                    "workspacetypes",
                ) {
                    let mut wt = json!({
                        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                        "metadata": {"name": t},
                        "spec": {"limitAllowedParents": if parents.is_empty() { Value::Null } else {
                            json!({"types": parents.iter().map(|p| json!({"name": p, "path": "root"})).collect::<Vec<_>>()})
                        }},
                    });
                    if let Some(s) = wt["spec"].as_object_mut() {
                        s.retain(|_, v| !v.is_null());
                    }
                    objects::prepare_for_create(&mut wt, res, ROOT_CLUSTER);
                    match state.store.create(&key, objects::encoder(wt)).await {
                        Ok(_) | Err(StorageError::AlreadyExists(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        if let Some(res) = state
            .catalog
            .builtin_view()
            .registry
            .lookup("tenancy.kcp.io", "v1alpha1", "workspaces")
            .cloned()
        {
            for ws in INITIAL_WORKSPACES {
                let key = res.key(ROOT_CLUSTER, None, ws);
                if state.store.get(&key).await?.is_some() {
                    continue;
                }
                let mut obj = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": ws}, "spec": {"type": {"name": "universal"}}});
                objects::prepare_for_create(&mut obj, &res, ROOT_CLUSTER);
                if self
                    .prepare(&res, ROOT_CLUSTER, &mut obj, None)
                    .await
                    .is_err()
                {
                    continue;
                }
                let kv = state.store.create(&key, objects::encoder(obj)).await?;
                if let Ok(v) = objects::decode_stored(&kv.value) {
                    let child = v["spec"]["cluster"].as_str().unwrap_or("").to_string();
                    let path = format!("{ROOT_CLUSTER}:{ws}");
                    self.register(&path, &child);
                    initialize_workspace(&state, ROOT_CLUSTER, ws, &child, &path).await?;
                }
            }
        }
        // Types of clusters with CRDs or bindings; resume deletions.
        let mut with_types = std::collections::BTreeSet::new();
        for prefix in [
            "/apiextensions.k8s.io/customresourcedefinitions/",
            "/apis.kcp.io/apibindings/",
        ] {
            for kv in list_keys(state.store.as_ref(), prefix).await?.0 {
                if let Some(c) = kv
                    .key
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.split('/').next())
                {
                    with_types.insert(c.to_string());
                }
            }
        }
        for c in with_types {
            reload_cluster_types(&state, &c).await;
        }
        for kv in list_keys(state.store.as_ref(), "/tenancy.kcp.io/workspaces/")
            .await?
            .0
        {
            let Ok(ws) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&ws) {
                let cluster = ws["metadata"]["annotations"][objects::CLUSTER_ANNOTATION]
                    .as_str()
                    .unwrap_or(ROOT_CLUSTER)
                    .to_string();
                let child = ws["spec"]["cluster"].as_str().unwrap_or("").to_string();
                let name = objects::name(&ws).to_string();
                let weak = self.state.clone();
                tokio::spawn(async move {
                    if let Some(state) = weak.upgrade() {
                        finish_workspace_deletion(&state, &cluster, &name, &child).await;
                    }
                });
            }
        }
        Ok(())
    }
}

/// An opaque logical-cluster name for a workspace path (stable, so a re-created workspace of the
/// same path gets the same name only if its path is reused; 16 base-36 characters like kcp's).
fn cluster_name_for(path: &str) -> String {
    let digest = Sha256::digest(format!("{path}/{}", uuid::Uuid::new_v4()).as_bytes());
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out: String = digest
        .iter()
        .take(16)
        .map(|b| ALPHABET[(*b as usize) % 36] as char)
        .collect();
    // Start with a letter so the name never looks like a number.
    out.replace_range(0..1, "c");
    out
}

/// The identity hash of an APIExport.
fn export_identity(cluster: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{cluster}/{name}/{}", uuid::Uuid::new_v4()).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn prepare_crd(r: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let name = objects::name(obj).to_string();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    let mut causes = Vec::new();
    let mut req = |field: &str| {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: field.into(),
        })
    };
    if group.is_empty() {
        req("spec.group");
    }
    if plural.is_empty() {
        req("spec.names.plural");
    }
    if spec["names"]["kind"].as_str().unwrap_or("").is_empty() {
        req("spec.names.kind");
    }
    if spec["versions"].as_array().is_none_or(|v| v.is_empty()) {
        req("spec.versions");
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(r.kind(), &r.ty.group, &name, causes));
    }
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            r,
            &name,
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let mut names = spec["names"].clone();
    if names.get("singular").is_none() {
        names["singular"] = json!(spec["names"]["kind"].as_str().unwrap_or("").to_lowercase());
    }
    if names.get("listKind").is_none() {
        names["listKind"] = json!(format!(
            "{}List",
            spec["names"]["kind"].as_str().unwrap_or("")
        ));
    }
    let now = objects::now_rfc3339();
    let stored: Vec<Value> = spec["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    obj["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
    Ok(())
}

/// A type description from a CRD-shaped spec (CRDs and APIResourceSchemas), one per served version.
fn types_from_spec(spec: &Value) -> Vec<TypeInfo> {
    let names = &spec["names"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let kind = s(&names["kind"]);
    let strings = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for v in spec["versions"].as_array().cloned().unwrap_or_default() {
        if v["served"] == false {
            continue;
        }
        // CRDs nest the schema under openAPIV3Schema; APIResourceSchemas do not.
        let mut schema = match v["schema"].get("openAPIV3Schema") {
            Some(s) => s.clone(),
            None => v["schema"].clone(),
        };
        if !schema.is_object() {
            schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        }
        if let Some(props) = schema
            .as_object_mut()
            .map(|m| m.entry("properties").or_insert_with(|| json!({})))
        {
            for (k, t) in [
                ("apiVersion", "string"),
                ("kind", "string"),
                ("metadata", "object"),
            ] {
                if props.get(k).is_none() {
                    props[k] = json!({"type": t});
                }
            }
        }
        let mut columns: Vec<api::serving::PrinterColumn> = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| {
                        let mut col = api::serving::PrinterColumn::json_path(
                            &s(&c["name"]),
                            &s(&c["type"]),
                            &s(&c["jsonPath"]),
                            &s(&c["description"]),
                        );
                        col.priority = c["priority"].as_i64().unwrap_or(0) as i32;
                        col
                    })
                    .collect()
            })
            .unwrap_or_default();
        if columns.is_empty() {
            columns.push(api::serving::PrinterColumn::age());
        }
        out.push(TypeInfo {
            group: s(&spec["group"]),
            version: s(&v["name"]),
            kind: kind.clone(),
            list_kind: names["listKind"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{kind}List")),
            plural: s(&names["plural"]),
            singular: names["singular"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| kind.to_lowercase()),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            namespaced: spec["scope"] != "Cluster",
            status_subresource: v["subresources"].get("status").is_some(),
            strategic_merge_patch: false,
            printer_columns: columns,
            schema,
        });
    }
    out
}

/// Recomputes the types a cluster serves beyond the built-ins: its CRDs and bound APIs.
pub async fn reload_cluster_types(state: &AppState, cluster: &str) {
    let mut extra = Vec::new();
    if let Ok((crds, _)) = list_keys(
        state.store.as_ref(),
        &format!("/apiextensions.k8s.io/customresourcedefinitions/{cluster}/"),
    )
    .await
    {
        for kv in crds {
            let Ok(crd) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&crd) {
                continue;
            }
            for t in types_from_spec(&crd["spec"]) {
                extra.push(Arc::new(Resource::new(t)));
            }
        }
    }
    if let Ok((bindings, _)) = list_keys(
        state.store.as_ref(),
        &format!("/apis.kcp.io/apibindings/{cluster}/"),
    )
    .await
    {
        for kv in bindings {
            let Ok(b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if b["status"]["phase"] != "Bound" {
                continue;
            }
            let export_cluster = b["status"]["apiExportClusterName"].as_str().unwrap_or("");
            for br in b["status"]["boundResources"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let schema_name = br["schema"]["name"].as_str().unwrap_or("");
                let identity = br["schema"]["identityHash"].as_str().unwrap_or("");
                let Ok(Some(skv)) = state
                    .store
                    .get(&format!(
                        "/apis.kcp.io/apiresourceschemas/{export_cluster}/{schema_name}"
                    ))
                    .await
                else {
                    continue;
                };
                let Ok(schema) = objects::decode_stored(&skv.value) else {
                    continue;
                };
                for t in types_from_spec(&schema["spec"]) {
                    let storage = format!("{}:{identity}", t.plural);
                    extra.push(Arc::new(Resource::with_storage_name(t, &storage)));
                }
            }
        }
    }
    state.catalog.set_cluster_resources(cluster, extra);
}

/// The API surface of an APIExport's virtual workspace: the exported resources (stored under
/// the export's identity) and the export's APIBindings (read-only, selected by label).
pub async fn export_view(
    state: &AppState,
    export_cluster: &str,
    export: &str,
) -> Result<(Arc<crate::catalog::ApiView>, String), ApiError> {
    let not_found = || {
        ApiError::not_found(
            &crate::status::GroupResource::new("apis.kcp.io", "apiexports"),
            export,
        )
    };
    let kv = state
        .store
        .get(&format!(
            "/apis.kcp.io/apiexports/{export_cluster}/{export}"
        ))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .ok_or_else(not_found)?;
    let exp = objects::decode_stored(&kv.value)?;
    let identity = exp["status"]["identityHash"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut resources = Vec::new();
    for schema_name in exp["spec"]["latestResourceSchemas"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let Some(schema_name) = schema_name.as_str() else {
            continue;
        };
        let Ok(Some(skv)) = state
            .store
            .get(&format!(
                "/apis.kcp.io/apiresourceschemas/{export_cluster}/{schema_name}"
            ))
            .await
        else {
            continue;
        };
        let Ok(schema) = objects::decode_stored(&skv.value) else {
            continue;
        };
        for t in types_from_spec(&schema["spec"]) {
            let storage = format!("{}:{identity}", t.plural);
            resources.push(Arc::new(Resource::with_storage_name(t, &storage)));
        }
    }
    if let Some(b) =
        state
            .catalog
            .builtin_view()
            .registry
            .lookup("apis.kcp.io", "v1alpha1", "apibindings")
    {
        resources.push(b.clone());
    }
    Ok((Arc::new(crate::catalog::ApiView::new(resources)), identity))
}

/// Clusters with an APIBinding to the export `cluster`/`name`.
pub async fn bound_clusters(state: &AppState, cluster: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok((bindings, _)) = list_keys(state.store.as_ref(), "/apis.kcp.io/apibindings/").await {
        for kv in bindings {
            let Ok(b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if b["status"]["apiExportClusterName"] == cluster
                && b["spec"]["reference"]["export"]["name"] == name
            {
                if let Some(c) = b["metadata"]["annotations"][objects::CLUSTER_ANNOTATION].as_str()
                {
                    out.push(c.to_string());
                }
            }
        }
    }
    out
}

async fn ensure_logical_cluster(
    state: &AppState,
    name: &str,
    path: &str,
    type_name: &str,
) -> Result<(), StorageError> {
    let key = format!("/core.kcp.io/logicalclusters/{name}/cluster");
    if state.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let Some(res) = state
        .catalog
        .builtin_view()
        .registry
        .lookup("core.kcp.io", "v1alpha1", "logicalclusters")
        .cloned()
    else {
        return Ok(());
    };
    let mut lc = json!({
        "apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
        "metadata": {"name": "cluster", "annotations": {PATH_ANNOTATION: path}},
        "spec": {"type": {"name": type_name, "path": "root"}},
    });
    objects::prepare_for_create(&mut lc, &res, name);
    lc["status"] = json!({"phase": "Ready", "URL": format!("https://{}/clusters/{path}", state.advertise_address)});
    match state.store.create(&key, objects::encoder(lc)).await {
        Ok(_) | Err(StorageError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn set_phase(
    state: &AppState,
    cluster: &str,
    name: &str,
    phase: &str,
) -> Result<(), StorageError> {
    let key = format!("/tenancy.kcp.io/workspaces/{cluster}/{name}");
    for _ in 0..8 {
        let Some(kv) = state.store.get(&key).await? else {
            return Ok(());
        };
        let Ok(mut ws) = objects::decode_stored(&kv.value) else {
            return Ok(());
        };
        if objects::is_deleting(&ws) {
            return Ok(());
        }
        ws["status"]["phase"] = json!(phase);
        match state
            .store
            .update(&key, kv.mod_revision, objects::encoder(ws))
            .await
        {
            Ok(_) => return Ok(()),
            Err(StorageError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Scheduling → Initializing → Ready: the logical cluster with its path, then Ready.
async fn initialize_workspace(
    state: &AppState,
    cluster: &str,
    name: &str,
    child: &str,
    path: &str,
) -> Result<(), StorageError> {
    set_phase(state, cluster, name, "Initializing").await?;
    let type_name = match state
        .store
        .get(&format!("/tenancy.kcp.io/workspaces/{cluster}/{name}"))
        .await?
    {
        Some(kv) => objects::decode_stored(&kv.value)
            .ok()
            .and_then(|v| v["spec"]["type"]["name"].as_str().map(str::to_string))
            .unwrap_or_else(|| "universal".into()),
        None => return Ok(()),
    };
    ensure_logical_cluster(state, child, path, &type_name).await?;
    set_phase(state, cluster, name, "Ready").await
}

/// Deletes everything in logical cluster `child` (child workspaces first), then lets the
/// Workspace go by removing its finalizer.
async fn finish_workspace_deletion(state: &AppState, cluster: &str, name: &str, child: &str) {
    if !child.is_empty() {
        delete_cluster(state, child).await;
    }
    let key = format!("/tenancy.kcp.io/workspaces/{cluster}/{name}");
    for _ in 0..8 {
        let Ok(Some(kv)) = state.store.get(&key).await else {
            return;
        };
        let Ok(ws) = objects::decode_stored(&kv.value) else {
            return;
        };
        let mut remaining = objects::finalizers(&ws);
        remaining.retain(|f| f != WORKSPACE_FINALIZER);
        let result = if remaining.is_empty() {
            state
                .store
                .delete(&key, kv.mod_revision, objects::encoder(ws))
                .await
                .map(|_| ())
        } else {
            let mut ws = ws;
            meta_mut(&mut ws).insert("finalizers".into(), json!(remaining));
            state
                .store
                .update(&key, kv.mod_revision, objects::encoder(ws))
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => return,
            Err(StorageError::Conflict { .. }) => continue,
            Err(_) => return,
        }
    }
}

/// Removes every object of a logical cluster and of the workspaces below it.
pub fn delete_cluster<'a>(
    state: &'a AppState,
    cluster: &'a str,
) -> futures::future::BoxFuture<'a, ()> {
    Box::pin(async move {
        // Children first, many at a time, so group commit batches their deletes.
        if let Ok((children, _)) = list_keys(
            state.store.as_ref(),
            &format!("/tenancy.kcp.io/workspaces/{cluster}/"),
        )
        .await
        {
            let mut pending = futures::stream::FuturesUnordered::new();
            for kv in children {
                let Ok(ws) = objects::decode_stored(&kv.value) else {
                    continue;
                };
                let child = ws["spec"]["cluster"].as_str().unwrap_or("").to_string();
                pending.push(async move {
                    if !child.is_empty() {
                        delete_cluster(state, &child).await;
                    }
                });
                if pending.len() >= 64 {
                    use futures::StreamExt;
                    pending.next().await;
                }
            }
            use futures::StreamExt;
            while pending.next().await.is_some() {}
        }
        let view = state.catalog.view(cluster);
        let mut deletes = futures::stream::FuturesUnordered::new();
        for r in view.registry.resources() {
            let Ok((items, _)) =
                list_keys(state.store.as_ref(), &r.prefix(Some(cluster), None)).await
            else {
                continue;
            };
            for kv in items {
                deletes.push(async move {
                    // Watchers see the final state at the deletion revision.
                    let Ok(obj) = objects::decode_stored(&kv.value) else {
                        return;
                    };
                    let _ = state
                        .store
                        .delete(&kv.key, kv.mod_revision, objects::encoder(obj))
                        .await;
                });
            }
        }
        use futures::StreamExt;
        while deletes.next().await.is_some() {}
        state.catalog.set_cluster_resources(cluster, Vec::new());
        state.tenancy.forget(cluster);
        state.namespaces.forget_cluster(cluster);
    })
}
