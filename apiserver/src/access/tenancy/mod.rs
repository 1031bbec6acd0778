//! kcp-style tenancy: the workspace tree and its path index, workspace initialization and
//! deletion, per-cluster CRDs, and APIExports/APIBindings that serve one workspace's resource
//! schemas in others. Hooks run in the write path so a client sees their effect right away.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use serde_json::{json, Value};

mod apis;
pub mod claims;
mod follow;
pub mod initializers;
mod lifecycle;
pub mod shards;
mod strategies;
pub mod unbinding;

use apis::exported_schemas;
pub(crate) use apis::types_from_spec;
pub use apis::{bound_clusters, export_view, is_bound, is_bound_in, reload_cluster_types};
pub use follow::follow;
pub use lifecycle::delete_cluster;
use lifecycle::{
    cluster_name_for, ensure_logical_cluster, finish_workspace_deletion, initialize_workspace,
};
pub use strategies::{ClaimLabels, PathAnnotation};

use crate::admission::namespaces::NamespaceLifecycle;
use crate::meta::status::{ApiError, Cause};
use crate::registry::catalog::Catalog;
use crate::registry::objects::{self, meta_mut};
use crate::registry::Place;
use crate::registry::{GenericStore, Resource};
use crate::request::identity::Identity;
use crate::request::request_info::{ClusterTarget, ROOT_CLUSTER};
use crate::storage::{key_cluster, list_all};
use crate::storage::{StorageError, Store};

/// Finalizer that holds a Workspace until its logical cluster is emptied.
pub const WORKSPACE_FINALIZER: &str = "tenancy.kcp.io/logical-cluster";
/// Annotation with a workspace's canonical path.
pub const PATH_ANNOTATION: &str = "kcp.io/path";
/// kcp's annotation naming who created a workspace (its owner), set by the server.
pub const OWNER_ANNOTATION: &str = "experimental.tenancy.kcp.io/owner";
/// kcp's mark of a logical cluster its administrators took out of service: `"true"` refuses
/// every request into it but those to its LogicalCluster.
pub const INACTIVE_ANNOTATION: &str = "internal.kcp.io/inactive";

/// kcp's value of [`OWNER_ANNOTATION`]: the creator's user info as JSON.
fn owner_value(who: &Identity) -> String {
    let mut v = json!({"username": who.user});
    if !who.uid.is_empty() {
        v["uid"] = json!(who.uid);
    }
    if !who.groups.is_empty() {
        v["groups"] = json!(who.groups);
    }
    if !who.extra.is_empty() {
        v["extra"] = json!(who.extra);
    }
    v.to_string()
}

/// The workspaces created on first start, below `root`, with their types.
const INITIAL_WORKSPACES: &[(&str, &str)] = &[
    ("orgs", "orgs"),
    ("providers", "providers"),
    ("platform-mesh-system", "universal"),
];

/// The types of `root` every user may use (kcp's bootstrap ClusterRole
/// `system:kcp:universal-workspacetype-use`, bound to `system:authenticated`).
const OPEN_ROOT_TYPES: &[&str] = &["universal", "organization", "team"];

/// Built-in workspace types: name, allowed parent types and allowed child types (empty = any).
/// They are written as WorkspaceType objects in `root` on first start; admission reads those.
const WORKSPACE_TYPES: &[(&str, &[&str], &[&str])] = &[
    ("root", &[], &[]),
    ("universal", &[], &[]),
    ("orgs", &["root"], &[]),
    ("providers", &["root"], &[]),
    (
        "organization",
        &["root", "universal", "orgs"],
        &["account", "team", "universal"],
    ),
    (
        "account",
        &["organization", "account"],
        &["account", "team", "universal"],
    ),
    ("provider", &["root", "universal", "providers"], &[]),
    (
        "team",
        &["organization", "account", "team"],
        &["team", "universal"],
    ),
];

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

/// The name the tenancy's own writes record in `managedFields`, as kcp's controllers' do.
const MANAGER: &str = "kcp";

/// Why one of the tenancy's own steps failed.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// Reading the store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The generic store refused or failed a write.
    #[error(transparent)]
    Write(#[from] ApiError),
    /// The server is going away: its generic store is gone.
    #[error("the server is shutting down")]
    Stopped,
    /// A type the tenancy writes is not served.
    #[error("{0} is not served")]
    Unserved(&'static str),
}

/// What the tenancy works with: narrow handles, not the whole server.
pub struct TenancyDeps {
    /// The store every object lives in (read here; written through `objects`).
    pub store: Arc<dyn Store>,
    /// The generic store the tenancy's own writes go through; it holds the tenancy's
    /// strategies, so the tenancy holds it weakly.
    pub objects: Weak<GenericStore>,
    /// What every logical cluster serves (its CRDs and bindings change it).
    pub catalog: Arc<Catalog>,
    /// `host:port` clients reach the server at (workspace URLs, endpoint slices).
    pub advertise_address: String,
    /// RBAC, for kcp's `bind` and `use` permissions.
    pub rbac: crate::access::authz::Rbac,
    /// Namespace bookkeeping, told when a logical cluster is gone.
    pub namespaces: Arc<NamespaceLifecycle>,
    /// The kept RBAC policies, invalidated by other replicas' changes ([`follow`]).
    pub policies: Arc<crate::access::rbac::PolicyCache>,
}

/// The workspace tree and the hooks of the tenancy types.
pub struct Tenancy {
    /// Itself, for the work it spawns (which ends when the tenancy is dropped).
    state: Weak<Tenancy>,
    store: Arc<dyn Store>,
    objects: Weak<GenericStore>,
    catalog: Arc<Catalog>,
    advertise_address: String,
    rbac: crate::access::authz::Rbac,
    namespaces: Arc<NamespaceLifecycle>,
    policies: Arc<crate::access::rbac::PolicyCache>,
    /// path → logical cluster name, and back.
    paths: RwLock<(HashMap<String, String>, HashMap<String, String>)>,
    /// The permission claims in force per logical cluster (see [`claims`]).
    claims: RwLock<HashMap<String, Arc<Vec<claims::AcceptedClaim>>>>,
    /// Logical clusters that are not Ready (initializing or terminating).
    not_ready: RwLock<std::collections::HashSet<String>>,
    /// Logical clusters an administrator marked inactive ([`INACTIVE_ANNOTATION`]).
    inactive: RwLock<std::collections::HashSet<String>>,
    /// One relabelling worker at a time per logical cluster, and its pending work.
    relabels: std::sync::Mutex<HashMap<String, claims::RelabelWork>>,
    /// The bindings (cluster, name) whose deletion is under way ([`unbinding`]).
    unbinding: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

impl Tenancy {
    /// The tenancy of a server, knowing only `root` until [`Tenancy::bootstrap`].
    pub fn new(deps: TenancyDeps) -> Arc<Self> {
        let mut by_path = HashMap::new();
        let mut by_name = HashMap::new();
        by_path.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
        by_name.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
        Arc::new_cyclic(|me| Tenancy {
            state: me.clone(),
            store: deps.store,
            objects: deps.objects,
            catalog: deps.catalog,
            advertise_address: deps.advertise_address,
            rbac: deps.rbac,
            namespaces: deps.namespaces,
            policies: deps.policies,
            paths: RwLock::new((by_path, by_name)),
            claims: RwLock::new(HashMap::new()),
            relabels: std::sync::Mutex::new(HashMap::new()),
            unbinding: std::sync::Mutex::new(std::collections::HashSet::new()),
            not_ready: RwLock::new(std::collections::HashSet::new()),
            inactive: RwLock::new(std::collections::HashSet::new()),
        })
    }

    pub(crate) fn register(&self, path: &str, name: &str) {
        if let Ok(mut p) = self.paths.write() {
            p.0.insert(path.to_string(), name.to_string());
            p.1.insert(name.to_string(), path.to_string());
        }
    }

    /// Forgets logical cluster `name`; its path stays taken if it already names another one
    /// (a workspace deleted and created again under the same name).
    pub(crate) fn forget(&self, name: &str) {
        if let Ok(mut c) = self.claims.write() {
            c.remove(name);
        }
        if let Ok(mut l) = self.relabels.lock() {
            l.remove(name);
        }
        self.note_phase(name, None);
        if let Ok(mut p) = self.paths.write() {
            if let Some(path) = p.1.remove(name) {
                if p.0.get(&path).is_some_and(|n| n == name) {
                    p.0.remove(&path);
                }
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
        Err(ApiError::workspace_forbidden())
    }

    /// Number of known logical clusters.
    pub fn cluster_count(&self) -> usize {
        self.paths.read().map(|p| p.1.len()).unwrap_or(0)
    }

    fn state(&self) -> Option<Arc<Tenancy>> {
        self.state.upgrade()
    }

    /// The generic store, for the tenancy's own writes.
    fn objects(&self) -> Result<Arc<GenericStore>, TenancyError> {
        self.objects.upgrade().ok_or(TenancyError::Stopped)
    }

    /// A built-in type the tenancy writes (`group/version/plural`).
    fn builtin(&self, gvr: &'static str) -> Result<Arc<Resource>, TenancyError> {
        let mut parts = gvr.rsplitn(3, '/');
        let (plural, version, group) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        self.catalog
            .builtin_view()
            .registry
            .lookup(group, version, plural)
            .cloned()
            .ok_or(TenancyError::Unserved(gvr))
    }

    /// Puts the canonical path of `cluster` in the object's path annotation, as kcp's path
    /// annotation admission does for APIExports, APIBindings and WorkspaceTypes.
    fn set_path_annotation(&self, cluster: &str, obj: &mut Value) {
        let Some(path) = self.path_of(cluster) else {
            return;
        };
        let meta = meta_mut(obj);
        if !meta.get("annotations").is_some_and(Value::is_object) {
            meta.insert("annotations".into(), json!({}));
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.insert(PATH_ANNOTATION.into(), json!(path));
        }
    }

    /// kcp's path annotation admission for every other object: an annotation, if present, must
    /// be the canonical path of the workspace the object is written to.
    fn check_path_annotation(
        &self,
        r: &Resource,
        cluster: &str,
        obj: &Value,
    ) -> Result<(), ApiError> {
        let Some(given) = obj["metadata"]["annotations"][PATH_ANNOTATION].as_str() else {
            return Ok(());
        };
        if self.path_of(cluster).as_deref() == Some(given) {
            return Ok(());
        }
        Err(invalid(
            r,
            objects::name(obj),
            &format!("metadata.annotations[{PATH_ANNOTATION}]"),
            format!(
                "Invalid value: {given:?}: the annotation must be the canonical path of the workspace the object is written to, or absent"
            ),
        ))
    }

    /// Prepares an APIBinding before it is stored: its path annotation, and its export resolved
    /// (phase Bound) or waited for (phase Binding: an export deleted and created again, or the
    /// server's own writes). A client's new binding (`requester`) must name an export that
    /// exists and hold `bind` on it, as kcp's APIBinding admission asks.
    pub(crate) async fn prepare_binding_write(
        &self,
        cluster: &str,
        obj: &mut Value,
        old: Option<&Value>,
        requester: Option<&Identity>,
    ) -> Result<(), ApiError> {
        self.set_path_annotation(cluster, obj);
        claims::default_binding_claims(obj);
        if let Some(who) = requester {
            let reference = &obj["spec"]["reference"]["export"];
            if old.is_none_or(|o| o["spec"]["reference"]["export"] != *reference) {
                self.check_bind(cluster, objects::name(obj), reference, who)
                    .await?;
            }
        }
        self.prepare_binding(cluster, obj, old).await
    }

    /// kcp's APIBinding admission: binding an export needs `bind` on `apiexports/<name>` in the
    /// export's workspace. A path that does not resolve and an export that does not exist get
    /// the same 403 as a refusal, so a tenant cannot probe what other workspaces hold.
    async fn check_bind(
        &self,
        cluster: &str,
        binding: &str,
        reference: &Value,
        who: &Identity,
    ) -> Result<(), ApiError> {
        let name = reference["name"].as_str().unwrap_or("");
        let path = reference["path"].as_str().filter(|p| !p.is_empty());
        let refused = || {
            ApiError::forbidden_object(
                &crate::meta::status::GroupResource::new("apis.kcp.io", "apibindings"),
                binding,
                format!(
                    "unable to create APIBinding: no permission to bind to export {}:{name}",
                    path.map(str::to_string)
                        .or_else(|| self.path_of(cluster))
                        .unwrap_or_else(|| cluster.to_string())
                ),
            )
        };
        let Some(state) = self.state() else {
            return Ok(());
        };
        let export_cluster = match path {
            None => cluster.to_string(),
            Some(p) => match self.resolve(ClusterTarget::Name(p.to_string())) {
                Ok(ClusterTarget::Name(c)) => c,
                _ => return Err(refused()),
            },
        };
        // An export that does not exist cannot be bound, by anyone (kcp's admission asks for
        // it before it asks whether the user may bind it).
        let key = format!("/apis.kcp.io/apiexports/{export_cluster}/{name}");
        if self
            .store
            .get(&key)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .is_none()
        {
            return Err(refused());
        }
        match crate::access::authz::allowed(
            &state.rbac,
            &export_cluster,
            who,
            "bind",
            "apis.kcp.io",
            "apiexports",
            name,
        )
        .await?
        {
            true => Ok(()),
            false => Err(refused()),
        }
    }

    /// kcp's workspace admission: creating a workspace of a type needs `use` on
    /// `workspacetypes/<name>` in the type's workspace, for the type and every type it extends.
    /// root's `universal`, `organization` and `team` are open to every user (kcp's bootstrap
    /// policy); a type answers the same 403 whether it is refused or absent.
    async fn check_type_use(
        &self,
        r: &Resource,
        name: &str,
        t: &TypeRef,
        who: &Identity,
    ) -> Result<(), ApiError> {
        let Some(state) = self.state() else {
            return Ok(());
        };
        let refused = || {
            ApiError::forbidden(format!(
                "{} {name:?} is forbidden: no permission to use workspace type {t}",
                r.gr
            ))
        };
        let type_cluster = match self.resolve(ClusterTarget::Name(t.path.clone())) {
            Ok(ClusterTarget::Name(c)) => c,
            _ => return Err(refused()),
        };
        if type_cluster == ROOT_CLUSTER && OPEN_ROOT_TYPES.contains(&t.name.as_str()) {
            return Ok(());
        }
        let allowed = crate::access::authz::allowed(
            &state.rbac,
            &type_cluster,
            who,
            "use",
            "tenancy.kcp.io",
            "workspacetypes",
            &t.name,
        )
        .await?;
        if allowed {
            Ok(())
        } else {
            Err(refused())
        }
    }

    async fn prepare_workspace(
        &self,
        r: &Resource,
        cluster: &str,
        obj: &mut Value,
        old: Option<&Value>,
        requester: Option<&Identity>,
    ) -> Result<(), ApiError> {
        let name = objects::name(obj).to_string();
        // Only the server itself and its unscoped administrators own nothing by creating and may
        // set the owner: a scoped `system:masters` (impersonated or admitted in one workspace)
        // is a tenant here.
        let privileged = requester.is_none_or(Identity::is_unscoped_admin);
        if let Some(old) = old {
            // Spec fields the server set are immutable.
            for f in ["cluster", "URL", "type"] {
                if let Some(v) = old["spec"].get(f) {
                    obj["spec"][f] = v.clone();
                }
            }
            // So is the owner, but for the server's administrators (kcp's reserved metadata).
            if !privileged {
                let was = old["metadata"]["annotations"][OWNER_ANNOTATION].clone();
                let annotations = meta_mut(obj)
                    .entry("annotations")
                    .or_insert_with(|| json!({}));
                if let Some(a) = annotations.as_object_mut() {
                    match was {
                        Value::String(v) => a.insert(OWNER_ANNOTATION.into(), json!(v)),
                        _ => a.remove(OWNER_ANNOTATION),
                    };
                }
            }
            if !privileged {
                shards::keep_placement(obj, old);
            }
            return Ok(());
        }
        // kcp records who created a workspace (a tenant cannot name another); the owner becomes
        // the workspace's administrator. The server's administrators own nothing by creating.
        if let Some(who) = requester.filter(|_| !privileged) {
            let annotations = meta_mut(obj)
                .entry("annotations")
                .or_insert_with(|| json!({}));
            if !annotations.is_object() {
                *annotations = json!({});
            }
            annotations[OWNER_ANNOTATION] = json!(owner_value(who));
        }
        let Some(state) = self.state() else {
            return Ok(());
        };
        let parent_path = self.path_of(cluster).unwrap_or_else(|| cluster.to_string());
        if obj.get("spec").is_none_or(|s| !s.is_object()) {
            obj["spec"] = json!({});
        }
        let parent_ref = self.workspace_type_of(&state, cluster, false).await;
        let parent_type = self.workspace_type_at(&state, &parent_ref).await;
        let given = &obj["spec"]["type"];
        let child_ref = match given["name"].as_str().filter(|n| !n.is_empty()) {
            Some(n) => TypeRef::new(n, given["path"].as_str().unwrap_or("")),
            // As kcp: the parent type's default child type, else universal.
            None => parent_type
                .as_ref()
                .and_then(|p| TypeRef::from_json(&p["spec"]["defaultChildWorkspaceType"]))
                .unwrap_or_else(|| TypeRef::new("universal", "")),
        };
        if let Some(who) = requester {
            self.check_type_use(r, &name, &child_ref, who).await?;
        }
        if child_ref.name == "root" {
            return Err(invalid(
                r,
                &name,
                "spec.type.name",
                "Invalid value: \"root\": only the root workspace is of type root".into(),
            ));
        }
        let Some(child_type) = self.workspace_type_at(&state, &child_ref).await else {
            return Err(invalid(
                r,
                &name,
                "spec.type.name",
                format!(
                    "Invalid value: {:?}: WorkspaceType {child_ref} does not exist",
                    child_ref.name
                ),
            ));
        };
        // Using a type uses every type it extends (kcp asks `use` of each).
        let child_chain = self.extended(&state, &child_ref, &child_type).await;
        if let Some(who) = requester {
            for (extended, _) in child_chain.iter().skip(1) {
                self.check_type_use(r, &name, extended, who).await?;
            }
        }
        // A type counts as every type it extends (kcp's aliases) for the limits below.
        let parent_aliases = match &parent_type {
            Some(p) => self.aliases(&state, &parent_ref, p).await,
            None => vec![parent_ref.name.clone()],
        };
        let child_aliases: Vec<String> = child_chain.into_iter().map(|(t, _)| t.name).collect();
        let allowed_parents = type_names(&child_type["spec"]["limitAllowedParents"]);
        if !allowed_parents.is_empty()
            && !parent_aliases.iter().any(|a| allowed_parents.contains(a))
        {
            return Err(invalid(
                r,
                &name,
                "spec.type",
                format!(
                    "Invalid value: {:?}: workspace type {child_ref} only allows parents of type {}; the parent is of type {parent_ref}",
                    child_ref.name,
                    allowed_parents.join(", ")
                ),
            ));
        }
        if let Some(parent) = &parent_type {
            let allowed_children = type_names(&parent["spec"]["limitAllowedChildren"]);
            if !allowed_children.is_empty()
                && !child_aliases.iter().any(|a| allowed_children.contains(a))
            {
                return Err(invalid(
                    r,
                    &name,
                    "spec.type",
                    format!(
                        "Invalid value: {:?}: workspace type {parent_ref} only allows children of type {}",
                        child_ref.name,
                        allowed_children.join(", ")
                    ),
                ));
            }
        }
        let child_path = format!("{parent_path}:{name}");
        let child = cluster_name_for(&child_path);
        obj["spec"]["type"] = json!({"name": child_ref.name, "path": child_ref.path});
        obj["spec"]["cluster"] = json!(child);
        obj["spec"]["URL"] = json!(format!(
            "https://{}/clusters/{child_path}",
            state.advertise_address
        ));
        obj["status"] = json!({"phase": "Scheduling"});
        shards::annotate_workspace(obj, &child);
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
    /// `cached` reads the Workspace as the watch cache last saw it (its type never changes once
    /// it exists), for paths that run on every request.
    async fn workspace_type_of(&self, state: &Tenancy, cluster: &str, cached: bool) -> TypeRef {
        let universal = TypeRef::new("universal", "");
        if cluster == ROOT_CLUSTER {
            return TypeRef::new("root", "");
        }
        let Some(path) = self.path_of(cluster) else {
            return universal;
        };
        let Some((parent_path, name)) = path.rsplit_once(':') else {
            return universal;
        };
        let Some(parent) = self
            .paths
            .read()
            .ok()
            .and_then(|p| p.0.get(parent_path).cloned())
        else {
            return universal;
        };
        let key = format!("/tenancy.kcp.io/workspaces/{parent}/{name}");
        let read = if cached {
            state.store.get_cached(&key).await
        } else {
            state.store.get(&key).await
        };
        match read {
            Ok(Some(kv)) => objects::decode_stored(&kv.value)
                .ok()
                .and_then(|v| TypeRef::from_json(&v["spec"]["type"]))
                .unwrap_or(universal),
            _ => universal,
        }
    }

    /// The WorkspaceType of the workspace that is logical cluster `cluster`, for its own
    /// authentication: the logical cluster the type lives in, the type, and the revision it was
    /// read at. `None` for `root` and for a workspace whose type cannot be read.
    pub async fn type_of_workspace(&self, cluster: &str) -> Option<(String, Value, u64)> {
        if cluster == ROOT_CLUSTER {
            return None;
        }
        let t = self.workspace_type_of(self, cluster, true).await;
        let ClusterTarget::Name(type_cluster) =
            self.resolve(ClusterTarget::Name(t.path.clone())).ok()?
        else {
            return None;
        };
        let kv = self
            .store
            .get_cached(&format!(
                "/tenancy.kcp.io/workspacetypes/{type_cluster}/{}",
                t.name
            ))
            .await
            .ok()??;
        let wt = objects::decode_stored(&kv.value).ok()?;
        Some((type_cluster, wt, kv.mod_revision))
    }

    /// The WorkspaceType a reference names, in the workspace of its path.
    pub(crate) async fn workspace_type_at(&self, state: &Tenancy, t: &TypeRef) -> Option<Value> {
        let ClusterTarget::Name(cluster) =
            self.resolve(ClusterTarget::Name(t.path.clone())).ok()?
        else {
            return None;
        };
        let kv = state
            .store
            .get(&format!(
                "/tenancy.kcp.io/workspacetypes/{cluster}/{}",
                t.name
            ))
            .await
            .ok()??;
        objects::decode_stored(&kv.value).ok()
    }

    /// A type and the types it extends (transitively, `extend.with`), as type names; the type
    /// itself first.
    async fn aliases(&self, state: &Tenancy, t: &TypeRef, wt: &Value) -> Vec<String> {
        self.extended(state, t, wt)
            .await
            .into_iter()
            .map(|(r, _)| r.name)
            .collect()
    }

    /// A type and every type it extends, with their objects, breadth first, each once (a cycle
    /// or a chain deeper than a few levels ends the walk).
    pub(crate) async fn extended(
        &self,
        state: &Tenancy,
        t: &TypeRef,
        wt: &Value,
    ) -> Vec<(TypeRef, Value)> {
        let mut out = vec![(t.clone(), wt.clone())];
        let mut i = 0;
        while i < out.len() && out.len() < 16 {
            let with = out[i].1["spec"]["extend"]["with"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for w in with {
                let Some(r) = TypeRef::from_json(&w) else {
                    continue;
                };
                if out.iter().any(|(o, _)| *o == r) {
                    continue;
                }
                if let Some(v) = self.workspace_type_at(state, &r).await {
                    out.push((r, v));
                }
            }
            i += 1;
        }
        out
    }

    async fn prepare_binding(
        &self,
        cluster: &str,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
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
        for (schema_name, schema) in exported_schemas(&state, &export_cluster, &export).await {
            bound.push(json!({
                "group": schema["spec"]["group"],
                "resource": schema["spec"]["names"]["plural"],
                "schema": {"name": schema_name, "UID": schema["metadata"]["uid"], "identityHash": identity},
                "storageVersions": schema["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
            }));
        }
        // kcp's conditions of a bound binding: the export is valid, the first binding is done
        // and the binding is current, hence Ready.
        let mut conditions = vec![
            json!({"type": "Ready", "status": "True", "reason": "Bound", "message": "", "lastTransitionTime": now}),
            json!({"type": "APIExportValid", "status": "True", "lastTransitionTime": now}),
            json!({"type": "BindingUpToDate", "status": "True", "lastTransitionTime": now}),
            json!({"type": "InitialBindingCompleted", "status": "True", "lastTransitionTime": now}),
        ];
        let (exported_claims, valid) = claims::claims_status(obj, &export, &now);
        obj["status"] = json!({
            "phase": "Bound",
            "apiExportClusterName": export_cluster,
            "boundResources": bound,
        });
        if let Some(valid) = valid {
            conditions.push(valid);
            obj["status"]["exportPermissionClaims"] = Value::Array(exported_claims);
            // What was applied stays until the relabelling after this write says otherwise.
            let old_status = old.map(|o| &o["status"]);
            if let Some(applied) = old_status.and_then(|s| s.get("appliedPermissionClaims")) {
                obj["status"]["appliedPermissionClaims"] = applied.clone();
            }
            // Carried over only while neither side's claims changed.
            let unchanged = old.is_some_and(|o| {
                o["spec"]["permissionClaims"] == obj["spec"]["permissionClaims"]
                    && o["status"]["exportPermissionClaims"]
                        == obj["status"]["exportPermissionClaims"]
            });
            let old_applied = old_status
                .filter(|_| unchanged)
                .and_then(|s| s["conditions"].as_array())
                .and_then(|cs| cs.iter().find(|c| c["type"] == "PermissionClaimsApplied"))
                .cloned();
            conditions.push(old_applied.unwrap_or_else(|| {
                json!({"type": "PermissionClaimsApplied", "status": "False", "severity": "Info",
                    "reason": "Applying", "message": "the claimed objects are being labelled",
                    "lastTransitionTime": now})
            }));
        }
        obj["status"]["conditions"] = Value::Array(conditions);
        // The claim labels (with the reflexive one the export's owner finds it by), also on the
        // server's own writes, which pass no admission.
        let claims = self.claims_of(cluster).await;
        claims::set_claim_labels(obj, &claims::binding_labels(&claims, obj));
        Ok(())
    }

    /// Runs after a Workspace was written: a new one is initialized, a deleting one emptied.
    async fn after_workspace_write(&self, cluster: &str, obj: &Value, deleted: bool) {
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
    }

    /// Runs after an APIExport was written: its endpoint slice follows it, bindings that waited
    /// for it bind, and the clusters bound to it serve its current schemas.
    async fn after_export_write(&self, cluster: &str, obj: &Value, deleted: bool) {
        let Some(state) = self.state() else { return };
        let name = objects::name(obj).to_string();
        let key = format!("/apis.kcp.io/apiexportendpointslices/{cluster}/{name}");
        let (Ok(slices), Ok(generic)) = (
            state.builtin("apis.kcp.io/v1alpha1/apiexportendpointslices"),
            state.objects(),
        ) else {
            return;
        };
        let own = generic.own(MANAGER);
        let place = Place::cluster(&slices, cluster);
        if deleted {
            if let Err(e) = own.delete(place, &name).await {
                tracing::warn!(cluster, export = name, error = %e, "deleting an endpoint slice");
            }
            return;
        }
        if let Ok(None) = state.store.get(&key).await {
            let path = self.path_of(cluster).unwrap_or_else(|| cluster.to_string());
            let url = format!(
                "https://{}/services/apiexport/{cluster}/{name}",
                state.advertise_address
            );
            let slice = json!({
                "apiVersion": "apis.kcp.io/v1alpha1",
                "kind": "APIExportEndpointSlice",
                "metadata": {"name": name},
                "spec": {"export": {"path": path, "name": name}},
                "status": {"endpoints": [{"url": url}]},
            });
            if let Err(e) = own.create_missing(place, slice).await {
                tracing::warn!(cluster, export = name, error = %e, "creating an endpoint slice");
            }
        }
        // Bindings that waited for this export bind now.
        self.retry_waiting_bindings(&state, &name).await;
        // Schemas of bound clusters may have changed.
        for c in bound_clusters(&state, cluster, &name).await {
            reload_cluster_types(&state, &c).await;
        }
    }

    /// Moves APIBindings still in phase Binding that name `export` to Bound if their export
    /// now resolves.
    async fn retry_waiting_bindings(&self, state: &Tenancy, export: &str) {
        let Ok((bindings, _)) = list_all(state.store.as_ref(), "/apis.kcp.io/apibindings/").await
        else {
            return;
        };
        let (Ok(res), Ok(generic)) = (
            state.builtin("apis.kcp.io/v1alpha1/apibindings"),
            state.objects(),
        ) else {
            return;
        };
        for kv in bindings {
            let Ok(b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if b["status"]["phase"] != "Binding"
                || b["spec"]["reference"]["export"]["name"] != export
            {
                continue;
            }
            let Some(cluster) = key_cluster(&kv.key).map(str::to_string) else {
                continue;
            };
            // Written again as it is: the binding's strategy binds it now that its export
            // resolves, and its hook reloads what the cluster serves.
            let place = Place::cluster(&res, &cluster);
            if let Err(e) = generic
                .own(MANAGER)
                .update(place, objects::name(&b), |_| true)
                .await
            {
                tracing::warn!(%cluster, binding = objects::name(&b), error = %e, "binding to a new export");
            }
        }
    }

    /// Brings a fresh data directory to the initial tree and rebuilds in-memory indexes.
    pub async fn bootstrap(&self) -> Result<(), TenancyError> {
        let Some(state) = self.state() else {
            return Ok(());
        };
        self.index_paths(&state).await?;
        self.index_phases(&state).await?;
        ensure_logical_cluster(
            &state,
            ROOT_CLUSTER,
            ROOT_CLUSTER,
            &TypeRef::new("root", ""),
            (&[], &[]),
        )
        .await?;
        // root waits for no one.
        self.advance(ROOT_CLUSTER).await?;
        self.ensure_root_content(&state).await?;
        self.ensure_root_shard().await?;
        self.reload_types(&state).await?;
        self.resume_unbinding().await?;
        // Resume deletions.
        for kv in list_all(state.store.as_ref(), "/tenancy.kcp.io/workspaces/")
            .await?
            .0
        {
            let Ok(ws) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if objects::is_deleting(&ws) {
                let Some(cluster) = key_cluster(&kv.key).map(str::to_string) else {
                    continue;
                };
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

    /// Re-reads the workspace tree and every cluster's types from the store (after a replica
    /// lost track of the store's changes).
    pub(crate) async fn reindex(&self, state: &Tenancy) -> Result<(), StorageError> {
        self.index_paths(state).await?;
        self.index_phases(state).await?;
        self.reload_types(state).await
    }

    /// Indexes every logical cluster by path, from the server's own placement records only:
    /// each Workspace is stored under its parent's logical cluster (the key says which) and
    /// carries the child cluster the server assigned (`spec.cluster`, which clients cannot
    /// set). Annotations, which tenants can write, play no part. The index is rebuilt whole, so
    /// entries of workspaces that are gone disappear.
    /// Which logical clusters are not Ready, from their LogicalClusters.
    async fn index_phases(&self, state: &Tenancy) -> Result<(), StorageError> {
        for kv in list_all(state.store.as_ref(), "/core.kcp.io/logicalclusters/")
            .await?
            .0
        {
            if let (Some(cluster), Ok(lc)) =
                (key_cluster(&kv.key), objects::decode_stored(&kv.value))
            {
                self.note_phase(cluster, Some(&lc));
            }
        }
        Ok(())
    }

    async fn index_paths(&self, state: &Tenancy) -> Result<(), StorageError> {
        let (workspaces, _) = list_all(state.store.as_ref(), WORKSPACES_PREFIX).await?;
        let mut children: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for kv in workspaces {
            let Some((parent, name)) = workspace_key(&kv.key) else {
                continue;
            };
            let Ok(ws) = objects::decode_stored(&kv.value) else {
                continue;
            };
            if let Some(child) = ws["spec"]["cluster"].as_str().filter(|c| !c.is_empty()) {
                children
                    .entry(parent.to_string())
                    .or_default()
                    .push((name.to_string(), child.to_string()));
            }
        }
        let (by_path, by_name) = placement_index(&children);
        if let Ok(mut p) = self.paths.write() {
            *p = (by_path, by_name);
        }
        Ok(())
    }

    /// The workspace types and initial workspaces of the root cluster.
    async fn ensure_root_content(&self, state: &Tenancy) -> Result<(), TenancyError> {
        let types = state.builtin("tenancy.kcp.io/v1alpha1/workspacetypes")?;
        let generic = state.objects()?;
        for (t, parents, children) in WORKSPACE_TYPES {
            let key = types.key(ROOT_CLUSTER, None, t);
            if state.store.get(&key).await?.is_some() {
                continue;
            }
            let mut wt = json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                "metadata": {"name": t},
                "spec": {
                    "limitAllowedParents": type_limit(parents),
                    "limitAllowedChildren": type_limit(children),
                },
            });
            if let Some(s) = wt["spec"].as_object_mut() {
                s.retain(|_, v| !v.is_null());
            }
            // Another replica on the same store may have created it meanwhile.
            generic
                .own(MANAGER)
                .create_missing(Place::cluster(&types, ROOT_CLUSTER), wt)
                .await?;
        }
        if let Some(res) = state
            .catalog
            .builtin_view()
            .registry
            .lookup("tenancy.kcp.io", "v1alpha1", "workspaces")
            .cloned()
        {
            for (ws, type_name) in INITIAL_WORKSPACES {
                let key = res.key(ROOT_CLUSTER, None, ws);
                if state.store.get(&key).await?.is_some() {
                    continue;
                }
                let mut obj = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": ws}, "spec": {"type": {"name": type_name}}});
                objects::prepare_for_create(&mut obj, &res, ROOT_CLUSTER);
                if self
                    .prepare_workspace(&res, ROOT_CLUSTER, &mut obj, None, None)
                    .await
                    .is_err()
                {
                    continue;
                }
                // Another replica on the same store may have created it meanwhile.
                let kv = match state.store.create(&key, objects::encoder(obj)).await {
                    Ok(kv) => kv,
                    Err(StorageError::AlreadyExists(_)) => continue,
                    Err(e) => return Err(e.into()),
                };
                if let Ok(v) = objects::decode_stored(&kv.value) {
                    let child = v["spec"]["cluster"].as_str().unwrap_or("").to_string();
                    let path = format!("{ROOT_CLUSTER}:{ws}");
                    self.register(&path, &child);
                    initialize_workspace(state, ROOT_CLUSTER, ws, &child, &path).await?;
                }
            }
        }
        Ok(())
    }

    /// Loads the types of every cluster with CRDs or bindings.
    async fn reload_types(&self, state: &Tenancy) -> Result<(), StorageError> {
        let mut with_types = std::collections::BTreeSet::new();
        for prefix in [
            "/apiextensions.k8s.io/customresourcedefinitions/",
            "/apis.kcp.io/apibindings/",
        ] {
            for kv in list_all(state.store.as_ref(), prefix).await?.0 {
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
            reload_cluster_types(state, &c).await;
        }
        Ok(())
    }
}

/// LogicalClusters are the server's: it creates one with each workspace and deletes it with the
/// workspace (requests to create or delete them are refused before they get here). An update
/// keeps the server-owned annotations (`kcp.io/*`) and the spec as they are.
fn prepare_logical_cluster(
    r: &Resource,
    obj: &mut Value,
    old: Option<&Value>,
    user: Option<&Identity>,
) -> Result<(), ApiError> {
    let Some(old) = old else {
        return Err(ApiError::forbidden(
            "logicalclusters are created by the server with their workspace",
        ));
    };
    // The spec is the server's: a client sends back what it read (a Go client without the
    // fields its type lacks and without empty lists), and gets the stored spec kept.
    let sent_type = obj["spec"].get("type").is_some_and(|t| !t.is_null());
    let stored = if sent_type {
        kcp_spec(&old["spec"])
    } else {
        let mut without = old["spec"].clone();
        if let Some(m) = without.as_object_mut() {
            m.remove("type");
        }
        kcp_spec(&without)
    };
    // (a client that sent no type, as a Go client of kcp's type, is not comparing it)
    if stored != kcp_spec(&obj["spec"]) {
        return Err(invalid(
            r,
            objects::name(obj),
            "spec",
            "Invalid value: \"object\": the spec of a LogicalCluster is set by the server".into(),
        ));
    }
    obj["spec"] = old["spec"].clone();
    let server_owned = |a: &Value| -> serde_json::Map<String, Value> {
        a.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| is_server_annotation(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut kept = server_owned(&old["metadata"]["annotations"]);
    // The server's administrators take a logical cluster out of service and back (kcp's
    // inactive mark, which only they may write).
    if user.is_none_or(Identity::is_unscoped_admin) {
        match obj["metadata"]["annotations"][INACTIVE_ANNOTATION].clone() {
            Value::String(v) => kept.insert(INACTIVE_ANNOTATION.into(), json!(v)),
            _ => kept.remove(INACTIVE_ANNOTATION),
        };
    }
    let meta = meta_mut(obj);
    if !meta.get("annotations").is_some_and(Value::is_object) {
        meta.insert("annotations".into(), json!({}));
    }
    if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        a.retain(|k, _| !is_server_annotation(k));
        a.extend(kept);
    }
    Ok(())
}

/// The fields of a LogicalCluster's spec that kcp's type has, as Go writes them: empty lists,
/// `false` and absent are one.
fn kcp_spec(spec: &Value) -> Value {
    let mut out = serde_json::Map::new();
    // The workspace type, which kcp keeps in an annotation: compared when there.
    if spec.get("type").is_some_and(|t| !t.is_null()) {
        out.insert("type".into(), spec["type"].clone());
    }
    for field in ["directlyDeletable", "owner", "initializers", "terminators"] {
        match &spec[field] {
            Value::Null | Value::Bool(false) => {}
            Value::Array(a) if a.is_empty() => {}
            Value::Object(o) if o.is_empty() => {}
            v => {
                out.insert(field.into(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Annotations only the server sets on a LogicalCluster: `kcp.io/...` and `*.kcp.io/...`.
fn is_server_annotation(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == "kcp.io" || prefix.ends_with(".kcp.io"))
}

/// Refuses the writes only the server makes: creating or deleting a LogicalCluster (it comes and
/// goes with its Workspace, as in kcp), and the status of the tenancy and API types, which
/// the server keeps and other objects' meaning rests on (an export's identity, what a binding
/// bound, a workspace's phase): kcp's system CRD authorizer refuses `apiexports/status` and
/// `apibindings/status` to all but `system:masters`, and its tenancy export's maximal
/// permission policy grants only reads of `workspaces/status` and `workspacetypes/status`.
pub fn check_request(
    rr: &crate::request::request_info::ResourceRequest,
    who: Option<&Identity>,
) -> Result<(), ApiError> {
    use crate::request::request_info::Verb;
    let masters = who.is_none_or(Identity::is_unscoped_admin);
    if !masters && rr.subresource.as_deref() == Some("status") {
        let refused = match (rr.group.as_str(), rr.resource.as_str()) {
            ("apis.kcp.io", "apibindings") => Some("apibinding status updates not permitted"),
            ("apis.kcp.io", "apiexports") => Some("apiexport status updates not permitted"),
            ("tenancy.kcp.io", "workspaces" | "workspacetypes")
                if !matches!(rr.verb, Verb::Get | Verb::List | Verb::Watch) =>
            {
                Some("the status of workspaces and their types is the server's")
            }
            _ => None,
        };
        if let Some(why) = refused {
            return Err(ApiError::forbidden_object(
                &crate::meta::status::GroupResource::new(&rr.group, &rr.resource),
                &rr.name.clone().unwrap_or_default(),
                why,
            ));
        }
    }
    if rr.group == "core.kcp.io"
        && rr.resource == "logicalclusters"
        && matches!(
            rr.verb,
            Verb::Create | Verb::Delete | Verb::DeleteCollection
        )
    {
        return Err(ApiError::forbidden(format!(
            "logicalclusters.core.kcp.io may not be {}d by clients: a LogicalCluster comes and goes with its Workspace",
            match rr.verb {
                Verb::Create => "create",
                _ => "delete",
            }
        )));
    }
    Ok(())
}

/// `{types: [{name, path: root}]}`, or null for no limit.
fn type_limit(names: &[&str]) -> Value {
    if names.is_empty() {
        Value::Null
    } else {
        json!({"types": names.iter().map(|n| json!({"name": n, "path": "root"})).collect::<Vec<_>>()})
    }
}

/// The type names of a `limitAllowedParents` / `limitAllowedChildren` value.
fn type_names(limit: &Value) -> Vec<String> {
    limit["types"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A reference to a WorkspaceType: its name and the path of the workspace holding it (`root`
/// when none is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeRef {
    /// The type's name.
    pub name: String,
    /// The path of its workspace.
    pub path: String,
}

impl TypeRef {
    /// A reference; an empty path means `root`.
    pub fn new(name: &str, path: &str) -> Self {
        TypeRef {
            name: name.to_string(),
            path: if path.is_empty() {
                ROOT_CLUSTER.to_string()
            } else {
                path.to_string()
            },
        }
    }

    /// `{name, path}` as JSON, if it has a name.
    pub fn from_json(v: &Value) -> Option<Self> {
        let name = v["name"].as_str().filter(|n| !n.is_empty())?;
        Some(TypeRef::new(name, v["path"].as_str().unwrap_or("")))
    }
}

impl std::fmt::Display for TypeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.path, self.name)
    }
}

/// Where Workspaces are stored: `/tenancy.kcp.io/workspaces/<parent cluster>/<name>`.
pub(crate) const WORKSPACES_PREFIX: &str = "/tenancy.kcp.io/workspaces/";

/// The parent logical cluster and the name of a Workspace, from its storage key.
pub(crate) fn workspace_key(key: &str) -> Option<(&str, &str)> {
    let (parent, name) = key.strip_prefix(WORKSPACES_PREFIX)?.split_once('/')?;
    (!parent.is_empty() && !name.is_empty() && !name.contains('/')).then_some((parent, name))
}

/// Path → cluster and cluster → path for the tree below `root`, given each cluster's child
/// workspaces as `(name, child cluster)`. A child reachable twice (which the server never
/// writes) keeps its first path.
fn placement_index(
    children: &HashMap<String, Vec<(String, String)>>,
) -> (HashMap<String, String>, HashMap<String, String>) {
    let mut by_path = HashMap::new();
    let mut by_name = HashMap::new();
    by_path.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
    by_name.insert(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string());
    let mut queue =
        std::collections::VecDeque::from([(ROOT_CLUSTER.to_string(), ROOT_CLUSTER.to_string())]);
    while let Some((cluster, path)) = queue.pop_front() {
        for (name, child) in children.get(&cluster).into_iter().flatten() {
            if by_name.contains_key(child) {
                continue;
            }
            let child_path = format!("{path}:{name}");
            by_path.insert(child_path.clone(), child.clone());
            by_name.insert(child.clone(), child_path.clone());
            queue.push_back((child.clone(), child_path));
        }
    }
    (by_path, by_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::request_info::{parse, Target};

    fn request(method: &str, path: &str) -> crate::request::request_info::ResourceRequest {
        let method = http::Method::from_bytes(method.as_bytes()).expect("method");
        match parse(&method, path, false).expect("parse").target {
            Target::Resource(rr) => rr,
            other => panic!("{path}: not a resource request: {other:?}"),
        }
    }

    #[test]
    fn the_status_the_server_keeps_is_not_a_tenants_to_write() {
        let tenant = Identity::new("user-1", vec!["system:authenticated".into()]);
        let masters = Identity::new("admin", vec!["system:masters".into()]);
        for (method, path) in [
            (
                "PATCH",
                "/clusters/org/apis/apis.kcp.io/v1alpha2/apiexports/e/status",
            ),
            (
                "PUT",
                "/clusters/org/apis/apis.kcp.io/v1alpha1/apibindings/b/status",
            ),
            (
                "GET",
                "/clusters/org/apis/apis.kcp.io/v1alpha1/apibindings/b/status",
            ),
            (
                "PUT",
                "/clusters/org/apis/tenancy.kcp.io/v1alpha1/workspaces/w/status",
            ),
            (
                "PATCH",
                "/clusters/org/apis/tenancy.kcp.io/v1alpha1/workspacetypes/t/status",
            ),
        ] {
            let rr = request(method, path);
            let refused = check_request(&rr, Some(&tenant)).expect_err(path);
            assert_eq!(refused.code, 403, "{method} {path}");
            assert!(
                check_request(&rr, Some(&masters)).is_ok(),
                "{method} {path}"
            );
            assert!(
                check_request(&rr, None).is_ok(),
                "the server's own {method} {path}"
            );
        }
        for (method, path) in [
            (
                "GET",
                "/clusters/org/apis/tenancy.kcp.io/v1alpha1/workspaces/w/status",
            ),
            (
                "PATCH",
                "/clusters/org/apis/apis.kcp.io/v1alpha2/apiexports/e",
            ),
        ] {
            assert!(
                check_request(&request(method, path), Some(&tenant)).is_ok(),
                "{method} {path}"
            );
        }
    }
}
